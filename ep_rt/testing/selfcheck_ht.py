"""High-throughput GPU checks against ep_rt.reference, shared by the GPU tests and `python -m ep_rt`.

Every rank builds every rank's inputs from one seed (drawn fresh per run by rank 0 and shared), runs
the collective on its GPU, runs the reference for all ranks, and compares its own results bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .. import reference, topk_idx_t
from .checker import Checker, reference_device_of


def as_topk_idx_t(t):
    """The reference's recv_topk_idx (in its input's type) in ep_rt.topk_idx_t, the type ep_rt returns."""
    return None if t is None else t.to(topk_idx_t)


@dataclass(frozen=True)
class Case:
    name: str
    num_tokens: int = 512
    hidden: int = 1024
    num_topk: int = 8  # 0: dispatch without top-k (routing from is_token_in_rank only)
    num_experts: int = 64
    dtype: str = "bf16"  # bf16 | fp8 | fp8_colmajor | fp8_ue8m0
    routing: str = "uniform"  # uniform | holes | hot_expert | empty_rank | one_rank
    num_worst_tokens: bool = False
    async_finish: bool = False
    previous_event: bool = False
    bias: str = "none"  # none | one | pair
    num_sms: int = 20
    expert_alignment: int = 1
    tokens_by_rank: tuple = field(default=())  # overrides num_tokens per rank when given
    topk_idx_dtype: str = "int64"  # what topk_idx is passed as (int32 is read in place); outputs are topk_idx_t


INTRANODE_HANDLE = (
    "rank_prefix_matrix",
    "channel_prefix_matrix",
    "recv_channel_prefix_matrix",
    "recv_src_idx",
    "is_token_in_rank",
    "send_pos",
)


@dataclass(frozen=True)
class Mode:
    """What the intranode and the internode checks differ in: the reference, the handle's fields (and which of
    them have one row per received token), the layout's node size, and node-level routing families."""

    G: int = 0  # ranks per node of a group across nodes; 0: one node (intranode)
    route: Optional[Callable] = None  # (case, idxs, num_ranks, seed) -> idxs (selfcheck_internode's families)

    @property
    def internode(self) -> bool:
        return self.G > 0

    @property
    def handle_fields(self) -> tuple:
        return reference.INTERNODE_HANDLE_FIELDS if self.internode else INTRANODE_HANDLE

    def layout(self, topk_idx, num_experts: int, num_ranks: int):
        if self.internode:
            return reference.dispatch_layout(topk_idx, num_experts, num_ranks, self.G)
        return reference.dispatch_layout(topk_idx, num_experts, num_ranks)

    def inputs(self, case: Case, seed: int, num_ranks: int, device):
        xs, idxs, weights = make_inputs(case, seed, num_ranks, device)
        if self.route is not None:
            idxs = self.route(case, idxs, num_ranks, seed)
        return xs, idxs, weights

    def dispatch(
        self,
        xs,
        idxs,
        weights,
        num_experts: int,
        num_channels: int,
        expert_alignment: int,
        num_worst: int,
        with_topk: bool = True,
    ):
        """The reference dispatch of every rank; the routing comes from idxs even without top-k."""
        R = len(xs)
        layouts = [self.layout(i, num_experts, R) for i in idxs]
        routes = [lay[3] for lay in layouts]
        if not with_topk:
            idxs = weights = None
        counts = [lay[2] for lay in layouts]  # what each rank passes as num_tokens_per_expert
        if self.internode:
            return reference.internode_dispatch(
                xs,
                idxs,
                weights,
                num_experts,
                num_channels,
                self.G,
                expert_alignment,
                num_worst,
                is_token_in_ranks=routes,
                num_tokens_per_experts=counts,
            )
        return reference.intranode_dispatch(
            xs,
            idxs,
            weights,
            num_experts,
            num_channels,
            expert_alignment,
            num_worst,
            is_token_in_ranks=routes,
            num_tokens_per_experts=counts,
        )

    def combine(self, *args):
        return (reference.internode_combine if self.internode else reference.intranode_combine)(*args)

    def per_node_kwargs(self, per_node) -> dict:
        return {"num_tokens_per_rdma_rank": per_node} if self.internode else {}

    @staticmethod
    def handle_rows(key: str, mine: dict):
        """Rows of a handle field that are defined (the rest is num_worst_tokens padding); None: all."""
        if key in ("recv_src_idx", "recv_src_meta"):
            return mine["num_recv"]
        if key == "send_nvl_head":
            return mine["num_rdma_recv"]
        return None

    def check_handle(self, chk: Checker, prefix: str, handle, mine: dict) -> None:
        chk.equal(f"{prefix}handle has {len(self.handle_fields)} fields", [len(handle)], [len(self.handle_fields)])
        for i, key in enumerate(self.handle_fields):
            chk.equal(f"{prefix}handle[{i}] {key}", handle[i], mine[key], rows=self.handle_rows(key, mine))


INTRANODE = Mode()


def make_inputs(case: Case, seed: int, num_ranks: int, device):
    """Per-rank inputs (x as given to dispatch, topk_idx, topk_weights), identical on every process."""
    xs, idxs, weights = [], [], []
    for r in range(num_ranks):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        n = case.tokens_by_rank[r] if case.tokens_by_rank else case.num_tokens
        x = (torch.randn(n, case.hidden, generator=g) * (1 + r)).to(torch.bfloat16)
        E, K = case.num_experts, max(case.num_topk, 1)
        scores = torch.rand(n, E, generator=g)
        if case.routing == "empty_rank":  # nobody sends to the last rank
            scores[:, E - E // num_ranks :] = -1
        if case.routing == "one_rank":  # every token to rank 0's experts only (needs E / R >= top-k)
            scores[:, E // num_ranks :] = -1
        idx = torch.topk(scores, K, dim=1).indices if n else torch.empty(0, K, dtype=torch.int64)
        if case.routing == "hot_expert":
            idx[:, 0] = 0
            idx[:, 1:] = torch.where(idx[:, 1:] == 0, torch.ones_like(idx[:, 1:]), idx[:, 1:])
        if case.routing == "holes":
            idx = torch.where(torch.rand(idx.shape, generator=g) < 0.2, torch.full_like(idx, -1), idx)
        w = torch.rand(n, K, generator=g)
        xs.append(_as_dispatch_x(x.to(device), case.dtype))
        idxs.append(idx.to(getattr(torch, case.topk_idx_dtype)).to(device))
        weights.append(w.to(device))
    return xs, idxs, weights


def _as_dispatch_x(x, dtype: str):
    if dtype == "bf16":
        return x
    if x.size(0) == 0:
        s = torch.empty(
            0,
            x.size(1) // (512 if dtype == "fp8_ue8m0" else 128),
            device=x.device,
            dtype=torch.int32 if dtype == "fp8_ue8m0" else torch.float32,
        )
        return x.to(torch.float8_e4m3fn), s
    if dtype == "fp8_ue8m0":
        return reference.per_token_cast_to_fp8(x, round_scale=True, use_ue8m0=True)
    fp8, scales = reference.per_token_cast_to_fp8(x)
    if dtype == "fp8_colmajor":  # same values, column-major strides
        scales = scales.t().contiguous().t()
    return fp8, scales


def on_device(x, device):
    """x (a tensor, dispatch's (fp8, scales) pair, or None) on `device`, strides kept (column-major scales stay so)."""
    if isinstance(x, tuple):
        return tuple(on_device(t, device) for t in x)
    return None if x is None else x.to(device)


def run_case(buffer, case: Case, seed: int, mode: Mode = INTRANODE, reference_device=None) -> Checker:
    """One full round on this rank: layout, dispatch, cached dispatch, combine; each against the reference
    (inputs made and the reference run on reference_device_of(buffer, reference_device))."""
    from .. import Config

    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    rdev = reference_device_of(buffer, reference_device)
    chk = Checker(case)
    xs, idxs, weights = mode.inputs(case, seed, R, rdev)
    x, topk_idx, topk_w = on_device(xs[me], dev), idxs[me].to(dev), weights[me].to(dev)
    has_topk = case.num_topk > 0

    # Layout (with the case's stream options too).
    prev = buffer.capture() if case.previous_event else None
    per_rank, per_node, per_expert, in_rank, event = buffer.get_dispatch_layout(
        topk_idx,
        case.num_experts,
        previous_event=prev,
        async_finish=case.async_finish,
        allocate_on_comm_stream=case.async_finish and case.previous_event,
    )
    if case.async_finish:
        event.current_stream_wait()
    ref_layout = mode.layout(idxs[me], case.num_experts, R)
    for name, got, want in zip(
        ("num_tokens_per_rank", "num_tokens_per_rdma_rank", "num_tokens_per_expert", "is_token_in_rank"),
        (per_rank, per_node, per_expert, in_rank),
        ref_layout,
    ):
        chk.equal(f"layout.{name}", got, want)

    # Dispatch.
    num_worst = 0
    if case.num_worst_tokens:
        num_worst = sum(case.tokens_by_rank) if case.tokens_by_rank else case.num_tokens * R
    config = Config(case.num_sms, 6, 256, 6, 128)
    prev = buffer.capture() if case.previous_event else None
    kwargs = dict(
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=topk_idx if has_topk else None,
        topk_weights=topk_w if has_topk else None,
        expert_alignment=case.expert_alignment,
        num_worst_tokens=num_worst,
        config=config,
        previous_event=prev,
        async_finish=case.async_finish,
        allocate_on_comm_stream=case.async_finish and case.previous_event,
        **mode.per_node_kwargs(per_node),
    )
    recv_x, recv_idx, recv_w, per_expert_list, handle, event = buffer.dispatch(x, **kwargs)
    if case.async_finish:
        event.current_stream_wait()
    ref = mode.dispatch(
        xs, idxs, weights, case.num_experts, case.num_sms, case.expert_alignment, num_worst, with_topk=has_topk
    )
    mine = ref[me]
    n = mine["num_recv"]
    got_x, got_s = recv_x if isinstance(recv_x, tuple) else (recv_x, None)
    chk.equal("dispatch.recv_x", got_x, mine["recv_x"], rows=n)
    chk.equal("dispatch.recv_x_scales", got_s, mine["recv_x_scales"], rows=n)
    chk.equal("dispatch.recv_topk_idx", recv_idx, as_topk_idx_t(mine["recv_topk_idx"]))
    if recv_idx is not None:
        chk.equal("dispatch.recv_topk_idx dtype is ep_rt.topk_idx_t", [str(recv_idx.dtype)], [str(topk_idx_t)])
    chk.equal("dispatch.recv_topk_weights", recv_w, mine["recv_topk_weights"], rows=n)
    chk.equal("dispatch.num_recv_tokens_per_expert_list", per_expert_list, mine["num_recv_tokens_per_expert_list"])
    mode.check_handle(chk, "dispatch.", handle, mine)
    if num_worst:
        chk.equal("dispatch.recv_x rows = num_worst_tokens", [got_x.size(0)], [num_worst])

    # Cached dispatch reuses the layout.
    cached_x, *rest = buffer.dispatch(x, handle=handle, config=config)
    cx, cs = cached_x if isinstance(cached_x, tuple) else (cached_x, None)
    chk.equal("cached_dispatch.recv_x", cx, mine["recv_x"], rows=n)
    chk.equal("cached_dispatch.recv_x_scales", cs, mine["recv_x_scales"], rows=n)
    chk.equal("cached_dispatch returns no topk/handle", [v is None for v in rest[:4]], [True] * 4)

    check_combine(buffer, case, chk, seed, xs, ref, handle, config, mode.combine, rdev)
    return chk


def combine_inputs(case: Case, seed: int, xs, ref, device):
    """Every rank's combine inputs: expert outputs (one row per row the reference dispatch delivered, drawn from the
    seed, so combine is checked on its own), the delivered weights, the case's bias."""
    comb_xs, comb_ws, biases = [], [], []
    for r in range(len(xs)):
        g = torch.Generator().manual_seed(seed * 1000 + 500 + r)
        rows = ref[r]["recv_x"].size(0)
        comb_xs.append(torch.randn(rows, case.hidden, generator=g).to(torch.bfloat16).to(device))
        comb_ws.append(ref[r]["recv_topk_weights"] if case.num_topk > 0 else None)
        nr = xs[r][0].size(0) if isinstance(xs[r], tuple) else xs[r].size(0)
        b0 = torch.randn(nr, case.hidden, generator=g).to(torch.bfloat16).to(device)
        b1 = torch.randn(nr, case.hidden, generator=g).to(torch.bfloat16).to(device)
        biases.append({"none": None, "one": b0, "pair": (b0, b1)}[case.bias])
    return comb_xs, comb_ws, biases


def check_combine(
    buffer, case: Case, chk: Checker, seed: int, xs, ref, handle, config, reference_combine, reference_device=None
) -> None:
    """Combine with the case's stream options against reference_combine (intranode or internode), bit for bit
    (its inputs made, and the reference run, on reference_device: by default the Buffer's GPU)."""
    me, dev = buffer.rank, buffer.device
    comb_xs, comb_ws, biases = combine_inputs(case, seed, xs, ref, reference_device_of(buffer, reference_device))
    prev = buffer.capture() if case.previous_event else None
    combined, combined_w, event = buffer.combine(
        comb_xs[me].to(dev),
        handle,
        topk_weights=on_device(comb_ws[me], dev),
        bias=on_device(biases[me], dev),
        config=config,
        previous_event=prev,
        async_finish=case.async_finish,
        allocate_on_comm_stream=case.async_finish and case.previous_event,
    )
    if case.async_finish:
        event.current_stream_wait()
    ref_c = reference_combine(comb_xs, ref, comb_ws if case.num_topk > 0 else None, biases)[me]
    chk.equal("combine.combined_x", combined, ref_c["combined_x"])
    chk.equal("combine.combined_topk_weights", combined_w, ref_c["combined_topk_weights"])
    torch.cuda.synchronize()
    buffer.raise_if_failed()


def replay_inputs(seed: int, num_ranks: int, rows: int, num_tokens: int, hidden: int, device):
    """Expert outputs [rows, hidden] and biases [num_tokens, hidden] of every rank for one graph replay."""
    ys, biases = [], []
    for r in range(num_ranks):
        g = torch.Generator().manual_seed(seed * 1000 + 500 + r)
        ys.append(torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(device))
        biases.append(torch.randn(num_tokens, hidden, generator=g).to(torch.bfloat16).to(device))
    return ys, biases


GRAPH_CASE = Case("cuda graph", num_tokens=384, hidden=2048, num_experts=64, num_worst_tokens=True, bias="one")


def run_graph_case(
    buffer,
    seed: int,
    replays: int = 4,
    mode: Mode = INTRANODE,
    case: Case = GRAPH_CASE,
    eager_case: Case = Case("eager between replays", num_tokens=200),
    reference_device=None,
) -> Checker:
    """Layout, num_worst_tokens dispatch, cached dispatch and combine captured in one CUDA graph, replayed with
    new routing and data copied in; every replay checked against the reference. An eager round (`eager_case`)
    runs between replays, so graph replays and eager calls must agree on the call numbering."""
    from .. import Config

    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    rdev = reference_device_of(buffer, reference_device)
    N, H, E, W = case.num_tokens, case.hidden, case.num_experts, case.num_tokens * R
    config = Config(case.num_sms, 6, 256, 6, 128)
    chk = Checker(case)
    xs, idxs, ws = mode.inputs(case, seed, R, rdev)
    x_in, idx_in, w_in = (t[me].to(dev).clone() for t in (xs, idxs, ws))  # the captured inputs, refilled per replay
    y_in = torch.zeros(W, H, dtype=torch.bfloat16, device=dev)
    bias_in = torch.zeros(N, H, dtype=torch.bfloat16, device=dev)

    def step():
        per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx_in, E)
        recv_x, recv_idx, recv_w, _, handle, _ = buffer.dispatch(
            x_in,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx_in,
            topk_weights=w_in,
            num_worst_tokens=W,
            config=config,
            **mode.per_node_kwargs(per_node),
        )
        cached_x, *_ = buffer.dispatch(x_in, handle=handle, config=config)
        combined, combined_w, _ = buffer.combine(y_in, handle, topk_weights=recv_w, bias=bias_in, config=config)
        return recv_x, recv_idx, recv_w, handle, cached_x, combined, combined_w

    step()  # warm-up outside the graph, as torch recommends
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    recv_x, recv_idx, recv_w, handle, cached_x, combined, combined_w = out
    for rep in range(replays):
        s = seed * 31 + rep
        xs, idxs, ws = mode.inputs(case, s, R, rdev)
        ref = mode.dispatch(xs, idxs, ws, E, case.num_sms, 1, W)
        ys, biases = replay_inputs(s, R, W, N, H, rdev)
        ref_c = mode.combine(ys, ref, [ref[r]["recv_topk_weights"] for r in range(R)], biases)[me]
        x_in.copy_(xs[me])
        idx_in.copy_(idxs[me])
        w_in.copy_(ws[me])
        y_in.copy_(ys[me])
        bias_in.copy_(biases[me])
        graph.replay()
        torch.cuda.synchronize()
        mine, n = ref[me], ref[me]["num_recv"]
        chk.equal(f"replay {rep} recv_x", recv_x, mine["recv_x"], rows=n)
        chk.equal(f"replay {rep} recv_topk_idx", recv_idx, as_topk_idx_t(mine["recv_topk_idx"]))
        chk.equal(f"replay {rep} recv_topk_weights", recv_w, mine["recv_topk_weights"], rows=n)
        mode.check_handle(chk, f"replay {rep} ", handle, mine)
        chk.equal(f"replay {rep} cached recv_x", cached_x, mine["recv_x"], rows=n)
        chk.equal(f"replay {rep} combined_x", combined, ref_c["combined_x"])
        chk.equal(f"replay {rep} combined_topk_weights", combined_w, ref_c["combined_topk_weights"])
        if rep == 1:  # an eager round between replays
            eager = run_case(buffer, eager_case, seed * 31 + 99, mode, reference_device)
            chk.checks += eager.checks
            chk.failures += [f"eager between replays: {f}" for f in eager.failures]
    del graph
    buffer.raise_if_failed()
    return chk


def standard_cases(num_ranks: int) -> list[Case]:
    """The GPU suite's cases: dtypes, options, routings and shapes (kept small except the HT shape)."""
    R = num_ranks
    return [
        Case("bf16 uniform", num_tokens=1024, hidden=2048),
        Case("bf16 HT shape", num_tokens=4096, hidden=7168, num_experts=256, num_sms=24),
        Case("fp8 row scales", dtype="fp8", hidden=7168, num_experts=256),
        Case("fp8 column-major scales", dtype="fp8_colmajor", hidden=4096),
        Case("fp8 ue8m0 packed scales", dtype="fp8_ue8m0", hidden=2048),
        Case("no top-k", num_topk=0, expert_alignment=4),
        Case("int32 topk_idx", topk_idx_dtype="int32", routing="holes"),
        Case("int32 topk_idx, num_worst_tokens", topk_idx_dtype="int32", num_worst_tokens=True),
        Case("async + previous_event", async_finish=True, previous_event=True),
        Case("async only", async_finish=True),
        Case("previous_event only", previous_event=True),
        Case("num_worst_tokens", num_worst_tokens=True),
        Case("num_worst_tokens fp8", num_worst_tokens=True, dtype="fp8"),
        Case("holes (-1 in topk_idx)", routing="holes"),
        Case("one hot expert", routing="hot_expert"),
        Case("a rank receives nothing", routing="empty_rank"),
        Case("one token", num_tokens=1, hidden=256),
        Case("zero tokens on one rank", tokens_by_rank=tuple(0 if r == 0 else 300 for r in range(R))),
        Case("uneven token counts", tokens_by_rank=tuple(37 * (r + 1) for r in range(R))),
        Case("odd hidden 1032, top-1", hidden=1032, num_topk=1),
        Case("hidden 8 (16 bytes)", hidden=8, num_topk=2, num_experts=8),
        Case("top-32", num_topk=32, num_experts=128),
        Case("1024 local experts", num_experts=1024 * R, num_topk=8),
        Case("bias tensor", bias="one"),
        Case("bias pair", bias="pair"),
        Case("expert_alignment 128", expert_alignment=128),
        Case("many channels (64 SMs)", num_sms=64, num_tokens=2048),
        Case("2 SMs", num_sms=2),
    ]
