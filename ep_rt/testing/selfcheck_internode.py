"""Internode high-throughput GPU checks against ep_rt.reference.internode_* (emulated nodes on one host).

As selfcheck_ht: every rank builds every rank's inputs from one shared seed, runs the collective, runs the
reference for all ranks and compares its own results bit for bit: layout, every dispatch output, all ten handle
fields, cached dispatch, combine (weights, bias) and CUDA-graph replays. Routing families: the intranode ones plus
all tokens to one node, a node that receives nothing, and tokens whose experts span every node.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import reference
from .checker import Checker
from .selfcheck_ht import Case, as_topk_idx_t, check_combine, make_inputs, replay_inputs

HANDLE = reference.INTERNODE_HANDLE_FIELDS


def _route(case: Case, idxs, num_ranks: int, G: int, seed: int):
    """Node-level routing families on top of make_inputs' expert choices."""
    if case.routing not in ("one_node", "empty_node", "span_nodes"):
        return idxs
    E, N = case.num_experts, num_ranks // G
    per_node = E // N
    out = []
    for r, idx in enumerate(idxs):
        g = torch.Generator().manual_seed(seed * 7919 + r)
        n, K = idx.shape
        if n == 0:
            out.append(idx)
            continue
        if case.routing == "one_node":  # every token's experts on node 1 only
            new = torch.randint(0, per_node, (n, K), generator=g) + per_node * (1 % N)
        elif case.routing == "empty_node":  # nobody sends to the last node
            new = torch.randint(0, E - per_node, (n, K), generator=g)
        else:  # expert k of a token on node k % N: every token with K >= N reaches every node
            k = torch.arange(K).unsqueeze(0).expand(n, K)
            new = (k % N) * per_node + torch.randint(0, per_node, (n, K), generator=g)
        out.append(new.to(idx.dtype).to(idx.device))
    return out


def internode_cases(num_ranks: int, G: int) -> list[Case]:
    R = num_ranks
    E = 16 * R
    return [
        Case("bf16 uniform", num_tokens=512, hidden=1024, num_experts=E),
        Case("bf16 HT shape", num_tokens=4096, hidden=7168, num_experts=256 if 256 % R == 0 else E, num_sms=24),
        Case("fp8 row scales", dtype="fp8", hidden=2048, num_experts=E),
        Case("fp8 column-major scales", dtype="fp8_colmajor", hidden=2048, num_experts=E),
        Case("fp8 ue8m0 packed scales", dtype="fp8_ue8m0", hidden=2048, num_experts=E),
        Case("no top-k", num_topk=0, num_experts=E, expert_alignment=4),
        Case("holes (-1 in topk_idx)", routing="holes", num_experts=E),
        Case("int32 topk_idx", topk_idx_dtype="int32", num_experts=E),
        Case("num_worst_tokens", num_worst_tokens=True, num_experts=E),
        Case("num_worst_tokens fp8", num_worst_tokens=True, dtype="fp8", num_experts=E),
        Case("async + previous_event", async_finish=True, previous_event=True, num_experts=E),
        Case("all tokens to one node", routing="one_node", num_experts=E),
        Case("a node receives nothing", routing="empty_node", num_experts=E),
        Case("every token spans every node", routing="span_nodes", num_experts=E, num_topk=max(8, R // G)),
        Case("a rank receives nothing", routing="empty_rank", num_experts=E),
        Case("one hot expert", routing="hot_expert", num_experts=E),
        Case("zero tokens on one rank", tokens_by_rank=tuple(0 if r == 0 else 300 for r in range(R)), num_experts=E),
        Case("uneven token counts", tokens_by_rank=tuple(37 * (r + 1) for r in range(R)), num_experts=E),
        Case("one token", num_tokens=1, hidden=256, num_experts=E),
        Case("top-1, hidden 1032", hidden=1032, num_topk=1, num_experts=E),
        Case("bias tensor", bias="one", num_experts=E),
        Case("bias pair", bias="pair", num_experts=E),
        Case("expert_alignment 128", expert_alignment=128, num_experts=E),
        Case("many channels (64 SMs)", num_sms=64, num_tokens=2048, num_experts=E),
        Case("2 SMs", num_sms=2, num_experts=E),
    ]


def run_case(buffer, case: Case, seed: int, G: int) -> Checker:
    from .. import Config

    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    chk = Checker(case)
    xs, idxs, weights = make_inputs(case, seed, R, dev)
    idxs = _route(case, idxs, R, G, seed)
    x, topk_idx, topk_w = xs[me], idxs[me], weights[me]
    has_topk = case.num_topk > 0

    prev = buffer.capture() if case.previous_event else None
    per_rank, per_node, per_expert, in_rank, event = buffer.get_dispatch_layout(
        topk_idx, case.num_experts, previous_event=prev, async_finish=case.async_finish,
        allocate_on_comm_stream=case.async_finish and case.previous_event)
    if case.async_finish:
        event.current_stream_wait()
    ref_layout = reference.dispatch_layout(topk_idx, case.num_experts, R, G)
    for name, got, want in zip(("num_tokens_per_rank", "num_tokens_per_rdma_rank", "num_tokens_per_expert",
                                "is_token_in_rank"), (per_rank, per_node, per_expert, in_rank), ref_layout):
        chk.equal(f"layout.{name}", got, want)

    num_worst = 0
    if case.num_worst_tokens:
        num_worst = sum(case.tokens_by_rank) if case.tokens_by_rank else case.num_tokens * R
    config = Config(case.num_sms, 6, 256, 6, 128)
    prev = buffer.capture() if case.previous_event else None
    recv_x, recv_idx, recv_w, per_expert_list, handle, event = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx if has_topk else None,
        topk_weights=topk_w if has_topk else None, expert_alignment=case.expert_alignment,
        num_worst_tokens=num_worst, config=config, previous_event=prev, async_finish=case.async_finish,
        allocate_on_comm_stream=case.async_finish and case.previous_event)
    if case.async_finish:
        event.current_stream_wait()
    routes = [reference.dispatch_layout(i, case.num_experts, R, G)[3] for i in idxs]
    ref = reference.internode_dispatch(xs, idxs if has_topk else None, weights if has_topk else None,
                                       case.num_experts, case.num_sms, G, case.expert_alignment, num_worst,
                                       is_token_in_ranks=routes)
    mine = ref[me]
    n, n_fwd = mine["num_recv"], mine["num_rdma_recv"]
    got_x, got_s = recv_x if isinstance(recv_x, tuple) else (recv_x, None)
    chk.equal("dispatch.recv_x", got_x, mine["recv_x"], rows=n)
    chk.equal("dispatch.recv_x_scales", got_s, mine["recv_x_scales"], rows=n)
    chk.equal("dispatch.recv_topk_idx", recv_idx, as_topk_idx_t(mine["recv_topk_idx"]))
    chk.equal("dispatch.recv_topk_weights", recv_w, mine["recv_topk_weights"], rows=n)
    chk.equal("dispatch.num_recv_tokens_per_expert_list", per_expert_list, mine["num_recv_tokens_per_expert_list"])
    chk.equal("dispatch.handle has 10 fields", [len(handle)], [10])
    for i, key in enumerate(HANDLE):
        rows = n if key == "recv_src_meta" else n_fwd if key == "send_nvl_head" else None
        chk.equal(f"dispatch.handle[{i}] {key}", handle[i], mine[key], rows=rows)
    if num_worst:
        chk.equal("dispatch.recv_x rows = num_worst_tokens", [got_x.size(0)], [num_worst])

    cached_x, *rest = buffer.dispatch(x, handle=handle, config=config)
    cx, cs = cached_x if isinstance(cached_x, tuple) else (cached_x, None)
    chk.equal("cached_dispatch.recv_x", cx, mine["recv_x"], rows=n)
    chk.equal("cached_dispatch.recv_x_scales", cs, mine["recv_x_scales"], rows=n)
    chk.equal("cached_dispatch returns no topk/handle", [v is None for v in rest[:4]], [True] * 4)

    check_combine(buffer, case, chk, seed, xs, ref, handle, config, reference.internode_combine)
    return chk


def run_graph_case(buffer, seed: int, G: int, replays: int = 3) -> Checker:
    """Layout, num_worst_tokens dispatch, cached dispatch and combine in one CUDA graph, replayed with fresh routing
    and data each time, an eager round between replays; every replay checked against the reference."""
    from .. import Config

    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    case = Case("cuda graph", num_tokens=256, hidden=1024, num_experts=16 * R, num_worst_tokens=True, bias="one")
    T, H, E, W = case.num_tokens, case.hidden, case.num_experts, case.num_tokens * R
    config = Config(case.num_sms, 6, 256, 6, 128)
    chk = Checker(case)
    xs, idxs, ws = make_inputs(case, seed, R, dev)
    x_in, idx_in, w_in = xs[me].clone(), idxs[me].clone(), ws[me].clone()
    y_in = torch.zeros(W, H, dtype=torch.bfloat16, device=dev)
    bias_in = torch.zeros(T, H, dtype=torch.bfloat16, device=dev)

    def step():
        per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx_in, E)
        recv_x, recv_idx, recv_w, _, handle, _ = buffer.dispatch(
            x_in, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx_in, topk_weights=w_in, num_worst_tokens=W, config=config)
        cached_x, *_ = buffer.dispatch(x_in, handle=handle, config=config)
        combined, combined_w, _ = buffer.combine(y_in, handle, topk_weights=recv_w, bias=bias_in, config=config)
        return recv_x, recv_idx, recv_w, handle, cached_x, combined, combined_w

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    recv_x, recv_idx, recv_w, handle, cached_x, combined, combined_w = out
    for rep in range(replays):
        s = seed * 31 + rep
        xs, idxs, ws = make_inputs(case, s, R, dev)
        ref = reference.internode_dispatch(xs, idxs, ws, E, case.num_sms, G, 1, W)
        ys, biases = replay_inputs(s, R, W, T, H, dev)
        ref_c = reference.internode_combine(ys, ref, [ref[r]["recv_topk_weights"] for r in range(R)], biases)[me]
        x_in.copy_(xs[me])
        idx_in.copy_(idxs[me])
        w_in.copy_(ws[me])
        y_in.copy_(ys[me])
        bias_in.copy_(biases[me])
        graph.replay()
        torch.cuda.synchronize()
        mine, n, n_fwd = ref[me], ref[me]["num_recv"], ref[me]["num_rdma_recv"]
        chk.equal(f"replay {rep} recv_x", recv_x, mine["recv_x"], rows=n)
        chk.equal(f"replay {rep} recv_topk_idx", recv_idx, as_topk_idx_t(mine["recv_topk_idx"]))
        chk.equal(f"replay {rep} recv_topk_weights", recv_w, mine["recv_topk_weights"], rows=n)
        for i, key in enumerate(HANDLE):
            rows = n if key == "recv_src_meta" else n_fwd if key == "send_nvl_head" else None
            chk.equal(f"replay {rep} handle[{i}] {key}", handle[i], mine[key], rows=rows)
        chk.equal(f"replay {rep} cached recv_x", cached_x, mine["recv_x"], rows=n)
        chk.equal(f"replay {rep} combined_x", combined, ref_c["combined_x"])
        chk.equal(f"replay {rep} combined_topk_weights", combined_w, ref_c["combined_topk_weights"])
        if rep == 1:
            eager = run_case(buffer, replace(case, name="eager between replays", num_worst_tokens=False), s + 99, G)
            chk.checks += eager.checks
            chk.failures += [f"eager between replays: {f}" for f in eager.failures]
    del graph
    buffer.raise_if_failed()
    return chk
