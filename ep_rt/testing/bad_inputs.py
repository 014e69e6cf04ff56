"""A catalogue of bad inputs across every public call, run on a live Buffer (issue 15's reliability suite).

Each case makes one bad call and names the exception it must raise and a fragment of its message. Every case
raises before any kernel runs, on every rank alike (so no rank is left waiting): the process's ep_rt launch
counter (runtime.launch.launch_count) must not move between the bad call and its error. The few cases that
launch by design say why in `launches`, and for them the counter must move: those marked `completes` (the call
runs on every rank and the kernel reports the caller's error at the next call, after which the Buffer stays
usable), and the internode dispatch whose stream sizes only its notify kernel can count (docs/INTERNODE_DESIGN.md
"Errors"). A case whose bad call follows calls that launch (a hook's dispatch) marks the bad call with Ctx.bad.
After every batch of cases a good high-throughput and low-latency round is checked against the reference: the
Buffer stayed usable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import Buffer, Config
from ..errors import BufferTooSmallError, EpRtError, GroupError, KernelError
from ..runtime.launch import launch_count

N, H, K, E = 64, 256, 4, 16  # the HT inputs of the catalogue
LL_T, LL_H, LL_E = 128, 1024, 32  # the LL inputs (selfcheck_ll's default case shape)


@dataclass(frozen=True)
class BadInput:
    name: str
    call: Callable  # call(ctx) makes the bad call
    error: type
    match: str  # a fragment of the message
    completes: bool = False  # the call runs; the error comes from the kernel at the next call (raise_if_failed)
    only_rank0: bool = False  # only rank 0's input is bad (the others must see no error)
    launches: str = ""  # why ep_rt kernels run between the bad call and its error, by design; empty: none may

    def __post_init__(self):
        if self.completes and not self.launches:
            raise ValueError(f"{self.name}: a case that completes launches kernels; say why in `launches`")


class Ctx:
    """Valid inputs and handles on a live Buffer, from one seed shared by the ranks."""

    def __init__(self, buf: Buffer, seed: int):
        self.buf, dev, R = buf, buf.device, buf.group_size
        self.mark = self.at_error = None  # launch counts around the bad call (Ctx.bad), for cases with setup calls
        g = torch.Generator().manual_seed(seed + buf.rank)
        self.x = torch.randn(N, H, generator=g).to(torch.bfloat16).to(dev)
        self.idx = torch.topk(torch.rand(N, E, generator=g), K).indices.to(dev)
        self.w = torch.rand(N, K, generator=g).to(dev)
        self.internode = buf.is_internode
        self.per_rank, self.per_node, self.per_expert, self.in_rank, _ = buf.get_dispatch_layout(self.idx, E)
        self.recv_x, _, self.recv_w, _, self.handle, _ = buf.dispatch(self.x, **self.dispatch_kwargs())
        self.rows = self.recv_x.size(0)
        self.y = torch.randn(self.rows, H, generator=g).to(torch.bfloat16).to(dev)
        if not buf.low_latency_mode:
            torch.cuda.synchronize()
            return
        self.ll_x = torch.randn(100, LL_H, generator=g).to(torch.bfloat16).to(dev)
        self.ll_idx = torch.topk(torch.rand(100, LL_E, generator=g), 8).indices.to(dev)
        self.ll_w = torch.rand(100, 8, generator=g).to(dev)
        recv, _, self.ll_handle, _, _ = buf.low_latency_dispatch(self.ll_x, self.ll_idx, LL_T, LL_E)
        L = LL_E // R
        self.ll_y = torch.zeros(L, R * LL_T, LL_H, dtype=torch.bfloat16, device=dev)
        buf.low_latency_combine(self.ll_y, self.ll_idx, self.ll_w, self.ll_handle)
        torch.cuda.synchronize()

    def bad(self, call, *args, **kwargs):
        """Make the case's bad call after setup calls that launch kernels: the launch check then counts from here
        to its error only."""
        self.mark = launch_count()
        try:
            return call(*args, **kwargs)
        except Exception:
            self.at_error = launch_count()
            raise

    def dispatch_kwargs(self, **over):
        kw = dict(
            num_tokens_per_rank=self.per_rank,
            is_token_in_rank=self.in_rank,
            num_tokens_per_expert=self.per_expert,
            topk_idx=self.idx,
            topk_weights=self.w,
        )
        if self.internode:
            kw["num_tokens_per_rdma_rank"] = self.per_node
        kw.update(over)
        return kw

    def dispatch(self, x=None, **over):
        return self.buf.dispatch(self.x if x is None else x, **self.dispatch_kwargs(**over))

    def combine(self, x=None, handle=None, **over):
        return self.buf.combine(self.y if x is None else x, self.handle if handle is None else handle, **over)

    def ll_dispatch(self, x=None, idx=None, T=LL_T, E_=LL_E, **over):
        return self.buf.low_latency_dispatch(
            self.ll_x if x is None else x, self.ll_idx if idx is None else idx, T, E_, **over
        )

    def ll_combine(self, x=None, idx=None, w=None, handle=None, **over):
        return self.buf.low_latency_combine(
            self.ll_y if x is None else x,
            self.ll_idx if idx is None else idx,
            self.ll_w if w is None else w,
            self.ll_handle if handle is None else handle,
            **over,
        )


def _replaced(handle, i):
    """The handle with entry i swapped for a copy, as if the caller had replaced a tensor inside it."""
    entries = list(handle)
    entries[i] = entries[i].clone()
    new = type(handle)(*entries)
    new.facts = handle.facts
    return new


def _bf16(*shape, dev="cuda"):
    return torch.zeros(*shape, dtype=torch.bfloat16, device=dev)


_LL_IDS = "the LL send kernel checks the ids (a host check would sync every decode step and break graph capture)"
_HT_IDS = "the layout family's kernels check the ids (no device sync); the call completes and raises at its end"


def _cases() -> list[BadInput]:
    B, V, T, KE, NI = BufferTooSmallError, ValueError, TypeError, KernelError, NotImplementedError
    cuda = "cuda"
    cases = [
        # ---- construction (every check runs before the first collective) ----
        BadInput("Buffer(group=None)", lambda c: Buffer(None), GroupError, "process group"),
        BadInput("Buffer(num_nvl_bytes=-128)", lambda c: Buffer(c.buf.group, -128), V, "num_nvl_bytes"),
        BadInput("Buffer(num_nvl_bytes=100)", lambda c: Buffer(c.buf.group, 100), V, "multiple of 128"),
        BadInput("Buffer(num_nvl_bytes=1.5e6)", lambda c: Buffer(c.buf.group, 1.5e6), V, "num_nvl_bytes"),
        BadInput("Buffer(num_rdma_bytes=-1)", lambda c: Buffer(c.buf.group, 0, -1), V, "num_rdma_bytes"),
        BadInput("Buffer(rdma without LL, one node)", lambda c: Buffer(c.buf.group, 0, 1 << 20), V, "num_rdma_bytes=0"),
        BadInput(
            "Buffer(LL, rdma 0)", lambda c: Buffer(c.buf.group, 0, 0, low_latency_mode=True), V, "num_rdma_bytes > 0"
        ),
        BadInput(
            "Buffer(num_qps_per_rank=0)",
            lambda c: Buffer(c.buf.group, 0, 1 << 20, low_latency_mode=True, num_qps_per_rank=0),
            V,
            "num_qps_per_rank",
        ),
        BadInput(
            "Buffer(num_qps_per_rank=2.0)",
            lambda c: Buffer(c.buf.group, 0, 1 << 20, low_latency_mode=True, num_qps_per_rank=2.0),
            V,
            "num_qps_per_rank",
        ),
        BadInput("Buffer(use_fabric=True)", lambda c: Buffer(c.buf.group, 1 << 20, use_fabric=True), NI, "fabric"),
        BadInput("Buffer(timeout_s=0)", lambda c: Buffer(c.buf.group, 1 << 20, timeout_s=0), V, "timeout_s"),
        BadInput("Buffer(timeout_s=-5)", lambda c: Buffer(c.buf.group, 1 << 20, timeout_s=-5), V, "timeout_s"),
        # ---- static API and Config ----
        BadInput("set_num_sms(0)", lambda c: Buffer.set_num_sms(0), V, "num_sms"),
        BadInput("set_num_sms(3)", lambda c: Buffer.set_num_sms(3), V, "even"),
        BadInput("set_num_sms(2.0)", lambda c: Buffer.set_num_sms(2.0), V, "num_sms"),
        BadInput("rdma hint tokens 0", lambda c: Buffer.get_low_latency_rdma_size_hint(0, 7168, 2, 16), V, "positive"),
        BadInput(
            "rdma hint ranks -2", lambda c: Buffer.get_low_latency_rdma_size_hint(128, 7168, -2, 16), V, "positive"
        ),
        BadInput(
            "rdma hint experts 0", lambda c: Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 0), V, "positive"
        ),
        BadInput(
            "rdma hint hidden 100",
            lambda c: Buffer.get_low_latency_rdma_size_hint(128, 100, 2, 16),
            V,
            "multiple of 128",
        ),
        BadInput(
            "rdma hint float tokens",
            lambda c: Buffer.get_low_latency_rdma_size_hint(128.0, 7168, 2, 16),
            V,
            "positive int",
        ),
        BadInput(
            "dispatch config for 12 ranks in nodes of 8",
            lambda c: Buffer.get_dispatch_config(12, num_ranks_per_node=8),
            V,
            "multiple of the ranks per node",
        ),
        BadInput("combine config for 0 ranks", lambda c: Buffer.get_combine_config(0), V, "positive int"),
        BadInput("Config(num_sms=0)", lambda c: Config(0), V, "num_sms"),
        BadInput("Config(num_sms=129)", lambda c: Config(129), V, "num_sms"),
        BadInput("Config(num_sms=True)", lambda c: Config(True), T, "int"),
        BadInput("Config(nvl send >= recv)", lambda c: Config(24, 256, 256), V, "nvl_chunked_send"),
        BadInput("Config(rdma send > recv/2)", lambda c: Config(24, 6, 256, 200, 128), V, "half"),
        BadInput("Config(rdma recv 0)", lambda c: Config(24, 6, 256, 6, 0), V, "RDMA chunk"),
        BadInput("nvl hint tokens 0", lambda c: Config().get_nvl_buffer_size_hint(256, 2, 0), V, "positive"),
        BadInput("nvl hint hidden 15", lambda c: Config().get_nvl_buffer_size_hint(15, 2), V, "multiple of 16"),
        BadInput("nvl hint hidden -16", lambda c: Config().get_nvl_buffer_size_hint(-16, 2), V, "positive"),
        BadInput(
            "nvl hint 9 ranks",
            lambda c: Config().get_nvl_buffer_size_hint(256, 9, num_ranks_per_node=8),
            V,
            "multiple of the ranks per node",
        ),
        BadInput("rdma hint (Config) -1", lambda c: Config().get_rdma_buffer_size_hint(-1, 2), V, "positive"),
        # ---- get_local_buffer_tensor ----
        BadInput(
            "local tensor offset -1", lambda c: c.buf.get_local_buffer_tensor(torch.int32, offset=-1), V, "outside"
        ),
        BadInput(
            "local tensor offset past the end",
            lambda c: c.buf.get_local_buffer_tensor(torch.int32, offset=c.buf.num_nvl_bytes + 1),
            V,
            "outside",
        ),
        BadInput(
            "local tensor too large",
            lambda c: c.buf.get_local_buffer_tensor(torch.int32, size=(c.buf.num_nvl_bytes,)),
            V,
            "needs",
        ),
        BadInput("local tensor dtype 'int32'", lambda c: c.buf.get_local_buffer_tensor("int32"), T, "torch.dtype"),
        BadInput(
            "local tensor offset 1.0", lambda c: c.buf.get_local_buffer_tensor(torch.int32, offset=1.0), T, "offset"
        ),
        BadInput(
            "rdma local tensor too large",
            lambda c: c.buf.get_local_buffer_tensor(torch.int32, size=(c.buf.num_rdma_bytes,), use_rdma_buffer=True),
            V,
            "needs",
        ),
        # ---- get_dispatch_layout ----
        BadInput("layout int16 topk_idx", lambda c: c.buf.get_dispatch_layout(c.idx.short(), E), T, "dtype"),
        BadInput("layout 1-D topk_idx", lambda c: c.buf.get_dispatch_layout(c.idx[:, 0].contiguous(), E), V, "2-D"),
        BadInput("layout strided topk_idx", lambda c: c.buf.get_dispatch_layout(c.idx.t(), E), V, "contiguous"),
        BadInput("layout CPU topk_idx", lambda c: c.buf.get_dispatch_layout(c.idx.cpu(), E), V, "must be on"),
        BadInput(
            "layout id == num_experts",
            lambda c: _layout_bad_id(c, E),
            KE,
            "get_dispatch_layout (checking topk_idx): topk_idx holds expert id",
            completes=True,
            launches=_HT_IDS,
        ),
        BadInput(
            "layout id -2",
            lambda c: _layout_bad_id(c, -2),
            KE,
            "get_dispatch_layout (checking topk_idx): topk_idx holds expert id -2",
            completes=True,
            launches=_HT_IDS,
        ),
        BadInput("layout experts not divisible", lambda c: c.buf.get_dispatch_layout(c.idx, E + 1), V, "divisible"),
        BadInput("layout experts 0", lambda c: c.buf.get_dispatch_layout(c.idx, 0), V, "positive"),
        BadInput("layout experts 16.0", lambda c: c.buf.get_dispatch_layout(c.idx, 16.0), V, "positive int"),
        BadInput(
            "layout top-33",
            lambda c: c.buf.get_dispatch_layout(torch.zeros(N, 33, dtype=torch.int64, device=cuda), 64),
            V,
            "at most 32",
        ),
        BadInput(
            "layout 1025 experts per rank",
            lambda c: c.buf.get_dispatch_layout(c.idx, 1025 * c.buf.group_size),
            V,
            "experts per rank",
        ),
        BadInput(
            "layout previous_event not an event",
            lambda c: c.buf.get_dispatch_layout(c.idx, E, previous_event=3),
            T,
            "EventOverlap",
        ),
        BadInput(
            "layout allocate_on_comm_stream alone",
            lambda c: c.buf.get_dispatch_layout(c.idx, E, allocate_on_comm_stream=True),
            V,
            "allocate_on_comm_stream",
        ),
        # ---- dispatch ----
        BadInput("dispatch f32 x", lambda c: c.dispatch(x=c.x.float()), T, "dtype"),
        BadInput("dispatch 3-D x", lambda c: c.dispatch(x=c.x.view(N, 2, H // 2)), V, "2-D"),
        BadInput("dispatch strided x", lambda c: c.dispatch(x=_bf16(H, N).t()), V, "contiguous"),
        BadInput("dispatch hidden 7 bf16", lambda c: c.dispatch(x=_bf16(N, 7)), V, "multiple of 16"),
        BadInput("dispatch CPU x", lambda c: c.dispatch(x=c.x.cpu()), V, "must be on"),
        BadInput("dispatch misaligned x", lambda c: c.dispatch(x=_bf16(N * H + 4)[4:].view(N, H)), V, "aligned"),
        BadInput("dispatch fp8 tuple of 1", lambda c: c.dispatch(x=(c.x.to(torch.float8_e4m3fn),)), V, "tuple"),
        BadInput(
            "dispatch fp8 with f64 scales",
            lambda c: c.dispatch(
                x=(c.x.to(torch.float8_e4m3fn), torch.ones(N, H // 128, dtype=torch.float64, device=cuda))
            ),
            T,
            "dtypes",
        ),
        BadInput(
            "dispatch fp8 scales rows",
            lambda c: c.dispatch(x=(c.x.to(torch.float8_e4m3fn), torch.ones(N + 1, H // 128, device=cuda))),
            V,
            "rows",
        ),
        BadInput(
            "dispatch fp8 scales with 0 columns",
            lambda c: c.dispatch(x=(c.x.to(torch.float8_e4m3fn), torch.ones(N, 0, device=cuda))),
            V,
            "no columns",
        ),
        BadInput("dispatch int16 topk_idx", lambda c: c.dispatch(topk_idx=c.idx.short()), T, "dtype"),
        BadInput(
            "dispatch topk_idx rows",
            lambda c: c.dispatch(topk_idx=c.idx[:-1].contiguous(), topk_weights=c.w[:-1].contiguous()),
            V,
            "rows",
        ),
        BadInput(
            "dispatch topk id == num_experts",
            lambda c: c.dispatch(topk_idx=torch.full_like(c.idx, E)),
            KE,
            "dispatch (checking topk_idx): topk_idx holds expert id",
            completes=True,
            launches=_HT_IDS,
        ),
        BadInput(
            "dispatch topk id -5",
            lambda c: c.dispatch(topk_idx=torch.full_like(c.idx, -5)),
            KE,
            "dispatch (checking topk_idx): topk_idx holds expert id -5",
            completes=True,
            launches=_HT_IDS,
        ),
        BadInput("dispatch f64 weights", lambda c: c.dispatch(topk_weights=c.w.double()), T, "float32"),
        BadInput(
            "dispatch weights shape",
            lambda c: c.dispatch(topk_weights=torch.rand(N, K + 1, device=cuda)),
            V,
            "shape of topk_idx",
        ),
        BadInput("dispatch weights without ids", lambda c: c.dispatch(topk_idx=None), V, "together"),
        BadInput(
            "dispatch per-rank counts shape",
            lambda c: c.dispatch(num_tokens_per_rank=torch.zeros(c.buf.group_size + 1, dtype=torch.int32, device=cuda)),
            V,
            "rows",
        ),
        BadInput(
            "dispatch per-rank counts int64", lambda c: c.dispatch(num_tokens_per_rank=c.per_rank.long()), T, "int32"
        ),
        BadInput("dispatch no layout", lambda c: c.dispatch(num_tokens_per_rank=None), V, "get_dispatch_layout"),
        BadInput("dispatch is_token_in_rank int", lambda c: c.dispatch(is_token_in_rank=c.in_rank.int()), T, "bool"),
        BadInput(
            "dispatch is_token_in_rank columns",
            lambda c: c.dispatch(is_token_in_rank=torch.zeros(N, c.buf.group_size + 1, dtype=torch.bool, device=cuda)),
            V,
            "is_token_in_rank",
        ),
        BadInput(
            "dispatch per-expert counts missing",
            lambda c: c.dispatch(num_tokens_per_expert=None),
            V,
            "num_tokens_per_expert",
        ),
        BadInput(
            "dispatch experts not divisible",
            lambda c: c.dispatch(num_tokens_per_expert=torch.zeros(E + 1, dtype=torch.int32, device=cuda)),
            V,
            "divisible",
        ),
        BadInput("dispatch expert_alignment 0", lambda c: c.dispatch(expert_alignment=0), V, "expert_alignment"),
        BadInput("dispatch expert_alignment 1.5", lambda c: c.dispatch(expert_alignment=1.5), V, "expert_alignment"),
        BadInput("dispatch num_worst_tokens -1", lambda c: c.dispatch(num_worst_tokens=-1), V, "num_worst_tokens"),
        BadInput(
            "dispatch num_worst_tokens without top-k",
            lambda c: c.dispatch(topk_idx=None, topk_weights=None, num_worst_tokens=8),
            V,
            "needs topk_idx",
        ),
        BadInput("dispatch config 'fast'", lambda c: c.dispatch(config="fast"), T, "Config"),
        BadInput("dispatch previous_event 'x'", lambda c: c.dispatch(previous_event="x"), T, "EventOverlap"),
        BadInput(
            "dispatch allocate_on_comm_stream without async",
            lambda c: c.dispatch(previous_event=Buffer.capture(), allocate_on_comm_stream=True),
            V,
            "allocate_on_comm_stream",
        ),
        # ---- cached dispatch ----
        BadInput(
            "cached dispatch with topk",
            lambda c: c.buf.dispatch(c.x, handle=c.handle, topk_idx=c.idx, topk_weights=c.w),
            V,
            "no topk_idx",
        ),
        BadInput(
            "cached dispatch handle of 5", lambda c: c.buf.dispatch(c.x, handle=tuple(c.handle)[:5]), V, "6-tuple"
        ),
        BadInput("cached dispatch LL handle", lambda c: c.buf.dispatch(c.x, handle=c.ll_handle), V, "low-latency"),
        BadInput(
            "cached dispatch x rows",
            lambda c: c.buf.dispatch(c.x[:-1].contiguous(), handle=c.handle),
            V,
            "tokens but the handle",
        ),
        BadInput(
            "cached dispatch replaced tensor",
            lambda c: c.buf.dispatch(c.x, handle=_replaced(c.handle, 0)),
            V,
            "replaced",
        ),
        BadInput(
            "cached dispatch too large for the NVL buffer",
            lambda c: c.buf.dispatch(_bf16(N, _huge_hidden(c, c.handle.facts.max_dispatch_rows)), handle=c.handle),
            B,
            "num_nvl_bytes",
        ),
        # ---- combine ----
        BadInput("combine f32 x", lambda c: c.combine(x=c.y.float()), T, "bfloat16"),
        BadInput("combine x rows", lambda c: c.combine(x=_bf16(c.rows + 1, H)), V, "rows"),
        BadInput("combine hidden 12", lambda c: c.combine(x=_bf16(c.rows, 12)), V, "multiple of 8"),
        BadInput(
            "combine misaligned x", lambda c: c.combine(x=_bf16(c.rows * H + 4)[4:].view(c.rows, H)), V, "aligned"
        ),
        BadInput(
            "combine weights rows", lambda c: c.combine(topk_weights=torch.rand(c.rows + 1, K, device=cuda)), V, "rows"
        ),
        BadInput(
            "combine f64 weights",
            lambda c: c.combine(topk_weights=torch.rand(c.rows, K, device=cuda, dtype=torch.float64)),
            T,
            "float32",
        ),
        BadInput("combine f32 bias", lambda c: c.combine(bias=torch.zeros(N, H, device=cuda)), T, "bfloat16"),
        BadInput("combine bias tuple of 1", lambda c: c.combine(bias=(_bf16(N, H),)), V, "2-tuple"),
        BadInput("combine bias rows", lambda c: c.combine(bias=(None, _bf16(N + 1, H))), V, "rows"),
        BadInput("combine bias hidden", lambda c: c.combine(bias=_bf16(N, H + 8)), V, "must be"),
        BadInput("combine handle of 5", lambda c: c.combine(handle=tuple(c.handle)[:5]), V, "6-tuple"),
        BadInput("combine LL handle", lambda c: c.combine(handle=c.ll_handle), V, "low-latency"),
        BadInput("combine handle None", lambda c: c.buf.combine(c.y, None), V, "6-tuple"),
        BadInput("combine replaced tensor", lambda c: c.combine(handle=_replaced(c.handle, 3)), V, "replaced"),
        BadInput("combine config 3", lambda c: c.combine(config=3), T, "Config"),
        BadInput(
            "combine too large for the NVL buffer",
            lambda c: c.combine(x=_bf16(c.rows, _huge_hidden(c, c.handle.facts.max_combine_rows))),
            B,
            "num_nvl_bytes",
        ),
        # ---- low-latency dispatch ----
        BadInput("LL f32 x", lambda c: c.ll_dispatch(x=c.ll_x.float()), T, "bfloat16"),
        BadInput("LL hidden 1000", lambda c: c.ll_dispatch(x=_bf16(100, 1000)), V, "multiple of 128"),
        BadInput(
            "LL hidden 16512", lambda c: c.ll_dispatch(x=_bf16(4, 16512), idx=c.ll_idx[:4].contiguous()), V, "16384"
        ),
        BadInput("LL T 0", lambda c: c.ll_dispatch(T=0), V, "num_max_dispatch_tokens_per_rank"),
        BadInput("LL T 1025", lambda c: c.ll_dispatch(T=1025), V, "num_max_dispatch_tokens_per_rank"),
        BadInput("LL more tokens than T", lambda c: c.ll_dispatch(T=64), V, "more than"),
        BadInput("LL experts not divisible", lambda c: c.ll_dispatch(E_=LL_E + 1), V, "multiple of"),
        BadInput("LL experts 2**17", lambda c: c.ll_dispatch(E_=1 << 17), V, "multiple of"),
        BadInput("LL int16 topk_idx", lambda c: c.ll_dispatch(idx=c.ll_idx.short()), T, "dtype"),
        BadInput("LL topk_idx rows", lambda c: c.ll_dispatch(idx=c.ll_idx[:-1].contiguous()), V, "rows"),
        BadInput(
            "LL top-17",
            lambda c: c.ll_dispatch(idx=torch.zeros(100, 17, dtype=torch.int64, device=cuda)),
            V,
            "at most 16",
        ),
        BadInput("LL ue8m0 without round_scale", lambda c: c.ll_dispatch(use_ue8m0=True), V, "round_scale"),
        BadInput(
            "LL ue8m0 hidden 896",
            lambda c: c.ll_dispatch(x=_bf16(100, 896), round_scale=True, use_ue8m0=True),
            V,
            "multiple of 512",
        ),
        BadInput(
            "LL stats rows",
            lambda c: c.ll_dispatch(cumulative_local_expert_recv_stats=torch.zeros(3, dtype=torch.int32, device=cuda)),
            V,
            "rows",
        ),
        BadInput(
            "LL wait stats int32",
            lambda c: c.ll_dispatch(
                dispatch_wait_recv_cost_stats=torch.zeros(c.buf.group_size, dtype=torch.int32, device=cuda)
            ),
            T,
            "int64",
        ),
        BadInput(
            "LL async + hook",
            lambda c: c.ll_dispatch(async_finish=True, return_recv_hook=True),
            V,
            "cannot be used together",
        ),
        BadInput(
            "LL too large for the RDMA buffer",
            lambda c: c.ll_dispatch(x=_bf16(100, 8192), E_=4096),
            B,
            "get_low_latency_rdma_size_hint",
        ),
        # ---- low-latency combine ----
        BadInput("LL combine x shape", lambda c: c.ll_combine(x=_bf16(1, 1, LL_H)), V, "must be"),
        BadInput(
            "LL combine topk rows > T",
            lambda c: c.ll_combine(
                idx=torch.zeros(LL_T + 1, 8, dtype=torch.int64, device=cuda), w=torch.zeros(LL_T + 1, 8, device=cuda)
            ),
            V,
            "at most",
        ),
        BadInput(
            "LL combine weights shape",
            lambda c: c.ll_combine(w=torch.zeros(100, 7, device=cuda)),
            V,
            "shape of topk_idx",
        ),
        BadInput("LL combine f64 weights", lambda c: c.ll_combine(w=c.ll_w.double()), T, "float32"),
        BadInput("LL combine HT handle", lambda c: c.ll_combine(handle=c.handle), V, "high-throughput"),
        BadInput("LL combine handle of 3", lambda c: c.ll_combine(handle=(1, 2, 3)), V, "5-tuple"),
        BadInput(
            "LL combine replaced src_info", lambda c: c.ll_combine(handle=_replaced(c.ll_handle, 0)), V, "replaced"
        ),
        BadInput("LL combine out shape", lambda c: c.ll_combine(out=_bf16(100, LL_H + 128)), V, "out must be"),
        BadInput(
            "LL combine logfmt + zero_copy",
            lambda c: c.ll_combine(use_logfmt=True, zero_copy=True),
            V,
            "use_logfmt and zero_copy",
        ),
        BadInput(
            "LL combine async + hook",
            lambda c: c.ll_combine(async_finish=True, return_recv_hook=True),
            V,
            "cannot be used together",
        ),
        BadInput(
            "LL combine wait stats rows",
            lambda c: c.ll_combine(
                combine_wait_recv_cost_stats=torch.zeros(c.buf.group_size + 1, dtype=torch.int64, device=cuda)
            ),
            V,
            "rows",
        ),
        BadInput(
            "next combine buffer with an HT handle",
            lambda c: c.buf.get_next_low_latency_combine_buffer(c.handle),
            V,
            "high-throughput",
        ),
        BadInput(
            "next combine buffer with garbage", lambda c: c.buf.get_next_low_latency_combine_buffer(7), V, "5-tuple"
        ),
        # ---- clean, masks ----
        BadInput(
            "clean 2**20 experts", lambda c: c.buf.clean_low_latency_buffer(LL_T, LL_H, 1 << 20), V, "multiple of"
        ),
        BadInput("clean hidden 100", lambda c: c.buf.clean_low_latency_buffer(LL_T, 100, LL_E), V, "multiple of 128"),
        BadInput(
            "clean T 0", lambda c: c.buf.clean_low_latency_buffer(0, LL_H, LL_E), V, "num_max_dispatch_tokens_per_rank"
        ),
        BadInput(
            "clean shape too large",
            lambda c: c.buf.clean_low_latency_buffer(1024, 16384, 4096),
            B,
            "get_low_latency_rdma_size_hint",
        ),
        BadInput(
            "mask without enable_shrink",
            lambda c: c.buf.low_latency_update_mask_buffer(0, True),
            EpRtError,
            "enable_shrink",
        ),
        BadInput(
            "query mask without enable_shrink",
            lambda c: c.buf.low_latency_query_mask_buffer(
                torch.zeros(c.buf.group_size, dtype=torch.int32, device=cuda)
            ),
            EpRtError,
            "enable_shrink",
        ),
        BadInput(
            "clean mask without enable_shrink",
            lambda c: c.buf.low_latency_clean_mask_buffer(),
            EpRtError,
            "enable_shrink",
        ),
        # ---- hooks ----
        BadInput("a receive hook called twice", _hook_twice, EpRtError, "already called"),
        BadInput("a call whose buffer still has an uncalled hook", _hook_pending, EpRtError, "never called"),
        # ---- caller errors the kernels report (the call completes on every rank; the Buffer stays usable) ----
        BadInput(
            "LL expert id == num_experts",
            lambda c: _ll_bad_id(c, LL_E),
            KE,
            "topk_idx holds expert id",
            completes=True,
            only_rank0=True,
            launches=_LL_IDS,
        ),
        BadInput(
            "LL expert id -3",
            lambda c: _ll_bad_id(c, -3),
            KE,
            "topk_idx holds expert id",
            completes=True,
            only_rank0=True,
            launches=_LL_IDS,
        ),
        BadInput(
            "num_worst_tokens too small",
            _worst_too_small,
            KE,
            "num_worst_tokens",
            completes=True,
            launches="with num_worst_tokens the host never reads the receive counts: the kernels find it",
        ),
    ]
    return cases


def _huge_hidden(c, max_rows: int) -> int:
    """A bf16 hidden size whose `max_rows` rows (the call's largest count on any rank) overflow the NVL buffer."""
    return (c.buf.num_nvl_bytes // max(max_rows, 1) // 2 + 1024) // 8 * 8


def _hook_twice(c):
    _, _, _, _, hook = c.ll_dispatch(return_recv_hook=True)
    hook()
    try:
        c.bad(hook)
    finally:
        c.ll_combine()  # a good combine on the other buffer keeps both buffers in use alike on every rank


def _hook_pending(c):
    hook1 = c.ll_dispatch(return_recv_hook=True)[4]
    # (the combine takes the earlier, finished handle: this dispatch's outputs exist only once its hook ran)
    hook2 = c.buf.low_latency_combine(c.ll_y, c.ll_idx, c.ll_w, c.ll_handle, return_recv_hook=True)[2]
    try:
        c.bad(c.ll_dispatch)  # the first call's buffer: its hook was never called
    finally:
        hook1()
        hook2()


def _ll_bad_id(c, bad):
    idx = c.ll_idx.clone()
    if c.buf.rank == 0:
        idx[0, 0] = bad
    c.ll_dispatch(idx=idx)
    torch.cuda.synchronize()
    c.buf.raise_if_failed()  # only rank 0 raises (its send kernel saw the id); nothing is launched here


def _layout_bad_id(c, bad):
    c.buf.get_dispatch_layout(torch.full_like(c.idx, bad), E)
    torch.cuda.synchronize()
    c.buf.raise_if_failed()  # the layout kernel's report (its own call cannot see it without a sync)


def _worst_too_small(c):
    c.dispatch(num_worst_tokens=1)
    torch.cuda.synchronize()
    c.buf.raise_if_failed()  # ranks that received more than one row raise


CASES = _cases()

# The cases above that hold for an internode Buffer as they stand; those that name the intranode handle, the NVL
# buffer's dispatch limit or the LL handle have internode counterparts below.
_SHARED_PREFIXES = (
    "local tensor",
    "rdma local tensor",
    "layout ",
    "dispatch ",
    "cached dispatch ",
    "combine ",
    "num_worst_tokens too small",
)
_INTRANODE_ONLY = {
    "cached dispatch handle of 5",
    "cached dispatch LL handle",
    "cached dispatch too large for the NVL buffer",
    "combine handle of 5",
    "combine LL handle",
    "combine handle None",
    "combine too large for the NVL buffer",
}


def _rebuilt(handle, i, change):
    """The handle as a plain tuple (as DeepEP code may rebuild it: no facts), entry i changed."""
    entries = list(handle)
    entries[i] = change(entries[i])
    return tuple(entries)


def _intranode_handle(c):
    from ..handles import IntranodeHandle

    return IntranodeHandle(*[torch.zeros(1, dtype=torch.int32, device=c.buf.device)] * 6)


def _rdma_hidden(c) -> int:
    """A hidden size (multiple of 16) whose bf16 rows alone, times the handle's longest (rank -> node) stream (the
    same on every rank), exceed the whole RDMA buffer: any record layout overflows a node's area."""
    return (c.buf.num_rdma_bytes // (2 * max(c.handle.facts.max_stream, 1)) + 1024) // 16 * 16


def _rdma_hidden_below_one_round(c) -> int:
    """A dispatch hidden size (bf16) whose rows alone exceed a node's area of the RDMA buffer (at most half of it over
    the nodes): not even one token from each rank fits a round, the one size a call in rounds still refuses."""
    area = c.buf.num_rdma_bytes // 2 // c.buf.topology.num_nodes
    return (area // 2 + 1024) // 16 * 16


def _nvl_hidden_below_one_round(c) -> int:
    """A dispatch hidden size (bf16) of which the NVL buffer holds fewer rows than there are ranks (a round's least:
    a token from each rank), while a node's RDMA area holds several records, so the NVL buffer is the one named."""
    hidden = (c.buf.num_nvl_bytes // c.buf.group_size // 2 + 1024) // 16 * 16
    area = c.buf.num_rdma_bytes // 4 // c.buf.topology.num_nodes  # (under the area whatever its alignment)
    assert 4 * hidden < area, "the catalogue's RDMA buffer is too small for its NVL case"
    return hidden


def _nvl_hidden(c) -> int:
    """A combine hidden size whose input rows overflow the NVL buffer while its RDMA streams fit with a 2x margin
    (a node's area is under num_rdma_bytes / 2 / nodes), so the NVL limit is the one that must be reported."""
    f = c.handle.facts
    hidden = (c.buf.num_nvl_bytes // max(f.max_combine_rows, 1) // 2 + 64) // 8 * 8
    per_node = c.buf.num_rdma_bytes // 2 // c.buf.topology.num_nodes
    assert 2 * f.max_stream * (2 * hidden + 16) <= per_node, "the catalogue's RDMA buffer is too small for its NVL case"
    return hidden


def _internode_only_cases() -> list[BadInput]:
    B, V, T, cuda = BufferTooSmallError, ValueError, TypeError, "cuda"
    return [
        BadInput(
            "internode rdma counts int64", lambda c: c.dispatch(num_tokens_per_rdma_rank=c.per_node.long()), T, "int32"
        ),
        BadInput(
            "internode rdma counts rows",
            lambda c: c.dispatch(
                num_tokens_per_rdma_rank=torch.zeros(c.buf.topology.num_nodes + 1, dtype=torch.int32, device=cuda)
            ),
            V,
            "rows",
        ),
        BadInput(
            "internode cached dispatch handle of 9",
            lambda c: c.buf.dispatch(c.x, handle=tuple(c.handle)[:9]),
            V,
            "10-tuple",
        ),
        BadInput("internode combine handle of 6", lambda c: c.combine(handle=tuple(c.handle)[:6]), V, "10-tuple"),
        BadInput("internode combine handle None", lambda c: c.buf.combine(c.y, None), V, "10-tuple"),
        BadInput(
            "internode combine intranode handle",
            lambda c: c.combine(handle=_intranode_handle(c)),
            V,
            "comes from a high-throughput (intranode)",
        ),
        BadInput(
            "internode cached dispatch rebuilt handle, wrong rows",
            lambda c: c.buf.dispatch(c.x, handle=_rebuilt(c.handle, 2, lambda t: t[:-1].contiguous())),
            V,
            "gbl_channel_prefix_matrix",
        ),
        BadInput(
            "internode combine rebuilt handle, send_nvl_head columns",
            lambda c: c.combine(handle=_rebuilt(c.handle, 9, lambda t: t[:, :1].contiguous())),
            V,
            "ranks per node",
        ),
        # A dispatch larger than the buffers goes in rounds (issue 22): only one below a round's least is refused.
        BadInput(
            "internode dispatch too large for the RDMA buffer",
            lambda c: c.dispatch(x=_bf16(N, _rdma_hidden_below_one_round(c))),
            B,
            "num_rdma_bytes",
            launches="the notify kernel counts the (rank -> node) streams; on the counts the data kernels run "
            "told to skip (nothing moves) and the host raises, finding not even a round fits (internode_rounds)",
        ),
        BadInput(
            "internode cached dispatch too large for the RDMA buffer",
            lambda c: c.buf.dispatch(_bf16(N, _rdma_hidden(c)), handle=c.handle),
            B,
            "num_rdma_bytes",
        ),
        BadInput(
            "internode combine too large for the RDMA buffer",
            lambda c: c.combine(x=_bf16(c.rows, _rdma_hidden(c))),
            B,
            "num_rdma_bytes",
        ),
        BadInput(
            "internode combine too large for the NVL buffer",
            lambda c: c.combine(x=_bf16(c.rows, _nvl_hidden(c))),
            B,
            "num_nvl_bytes",
        ),
        BadInput(
            "internode dispatch too large for the NVL buffer",
            lambda c: c.dispatch(x=_bf16(N, _nvl_hidden_below_one_round(c))),
            B,
            "num_nvl_bytes",
            launches="the notify kernel counts the rows each rank receives (the records its "
            "node's forwarders push into its NVL buffer); on the counts the data kernels run told to skip "
            "(nothing moves) and the host raises, finding not even a round fits (internode_rounds)",
        ),
        BadInput(
            "internode Buffer without LL: low_latency_dispatch",
            lambda c: c.buf.low_latency_dispatch(c.x, c.idx, N, E),
            EpRtError,
            "low_latency_mode=True",
        ),
    ]


def internode_cases() -> list[BadInput]:
    """The catalogue for a Buffer whose ranks span several nodes (no LL mode)."""
    shared = [c for c in CASES if c.name.startswith(_SHARED_PREFIXES) and c.name not in _INTRANODE_ONLY]
    return shared + _internode_only_cases()


def catalogue_problems(results: list, check_every: int = 25) -> list[str]:
    """What went wrong on any rank of run_catalogue's results: a case without its error, a missing good round, a
    good round with no checks or with a mismatch (empty: the catalogue passed)."""
    problems = []
    for rank, res in enumerate(results):
        problems += [f"rank {rank} {name}: {detail}" for name, ok, detail in res["outcomes"] if not ok]
        if len(res["rounds"]) < res["num_cases"] // check_every:
            problems.append(f"rank {rank}: {len(res['rounds'])} good rounds for {res['num_cases']} cases")
        problems += [
            f"rank {rank} good round after case {i}: {checks} checks, {failures[:5]}"
            for i, checks, failures in res["rounds"]
            if checks <= 0 or failures
        ]
    return problems


def case_outcome(case: BadInput, error, launched: int, expect_error: bool = True) -> tuple[bool, str]:
    """(ok, detail) of one case on one rank: `error` the exception its call raised (None: none), `launched` the
    ep_rt kernels launched between its bad call and the error."""
    if error is None:
        return (not expect_error), "no error raised"
    detail = f"{type(error).__name__}: {error}"
    if not expect_error:
        return False, f"raised where no error was expected: {detail}"
    if not isinstance(error, case.error) or case.match.lower() not in str(error).lower():
        return False, f"expected {case.error.__name__} with {case.match!r}, got {detail}"
    if launched and not case.launches:
        return False, f"{launched} kernel(s) launched before the error, which must come before any kernel: {detail}"
    if case.launches and not launched:
        return False, f"no kernel launched, though the case says it launches ({case.launches}): {detail}"
    return True, detail


def run_catalogue(rank: int, num_ranks: int, seed: int, check_every: int = 25, internode: bool = False) -> dict:
    """Every case on this rank's Buffer, with good rounds in between; returns per-case outcomes. internode: the
    internode catalogue on a Buffer across (emulated) nodes, its good rounds checked against the internode
    reference."""
    import torch.distributed as dist

    from . import selfcheck_ht, selfcheck_internode, selfcheck_ll

    if internode:  # a small NVL buffer beside a large RDMA one, so either limit can be the one exceeded
        buf = Buffer(dist.group.WORLD, 2 << 20, 64 << 20, explicitly_destroy=True, timeout_s=60.0)
        if buf.topology.num_nodes < 2:
            raise EpRtError("the internode catalogue needs ranks on several nodes (EP_RT_RANKS_PER_NODE)")
        cases = internode_cases()
    else:
        need_ll = Buffer.get_low_latency_rdma_size_hint(LL_T, LL_H, num_ranks, LL_E)
        buf = Buffer(
            dist.group.WORLD, 16 << 20, need_ll, low_latency_mode=True, explicitly_destroy=True, timeout_s=60.0
        )
        cases = CASES
    ctx = Ctx(buf, seed)
    outcomes, rounds = [], []

    def good_round(i):
        ht_case = selfcheck_ht.Case("good HT round", num_tokens=N, hidden=H, num_experts=E, num_topk=K)
        if internode:
            ht = selfcheck_internode.run_case(buf, ht_case, seed + 7 * i, buf.topology.node_size)
            rounds.append((i, ht.checks, ht.failures))
            return
        ht = selfcheck_ht.run_case(buf, ht_case, seed + 7 * i)
        ll = selfcheck_ll.run_ll_case(buf, selfcheck_ll.LLCase("good LL round"), seed + 7 * i + 1)
        rounds.append((i, ht.checks + ll.checks, ht.failures + ll.failures))

    for i, case in enumerate(cases):
        expect_error = not (case.only_rank0 and rank != 0)
        ctx.mark = ctx.at_error = None
        before, error = launch_count(), None
        try:
            case.call(ctx)
        except Exception as e:  # the case passes when it raised the right error with a clear message
            error = e
        at_error = launch_count() if ctx.at_error is None else ctx.at_error
        launched = at_error - (before if ctx.mark is None else ctx.mark)
        outcomes.append((case.name, *case_outcome(case, error, launched, expect_error)))
        if case.completes:
            dist.barrier()
        if (i + 1) % check_every == 0:
            good_round(i)
    good_round(len(cases))
    buf.destroy()
    return {"outcomes": outcomes, "rounds": rounds, "num_cases": len(cases)}
