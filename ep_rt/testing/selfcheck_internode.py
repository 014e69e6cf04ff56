"""Internode high-throughput GPU checks against ep_rt.reference.internode_* (emulated nodes on one host).

As selfcheck_ht: every rank builds every rank's inputs from one shared seed, runs the collective, runs the
reference for all ranks and compares its own results bit for bit: layout, every dispatch output, all ten handle
fields, cached dispatch, combine (weights, bias) and CUDA-graph replays. Routing families: the intranode ones plus
all tokens to one node, a node that receives nothing, and tokens whose experts span every node.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import selfcheck_ht
from .checker import Checker
from .selfcheck_ht import Case, Mode


def _route(case: Case, idxs, num_ranks: int, G: int, seed: int):
    """Node-level routing families on top of make_inputs' expert choices."""
    if case.routing not in ("one_node", "empty_node", "span_nodes", "quiet_head"):
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
            if case.routing == "quiet_head":  # the first half of the tokens go nowhere (calls in rounds: a round
                new[: n // 2] = -1  # sized from a quiet range's counts meets the busy half and is tried again)
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


def mode(G: int) -> Mode:
    """selfcheck_ht's checks for nodes of G ranks: the internode reference, handle and routing families."""
    return Mode(G=G, route=lambda case, idxs, num_ranks, seed: _route(case, idxs, num_ranks, G, seed))


def run_case(buffer, case: Case, seed: int, G: int, reference_device=None) -> Checker:
    return selfcheck_ht.run_case(buffer, case, seed, mode(G), reference_device)


def run_graph_case(buffer, seed: int, G: int, replays: int = 3, reference_device=None) -> Checker:
    """selfcheck_ht's CUDA-graph case (num_worst_tokens dispatch, cached dispatch and combine, replayed with fresh
    routing and data, an eager round between replays) on nodes of G ranks (reference_device: as run_case's)."""
    R = buffer.group_size
    case = Case("cuda graph", num_tokens=256, hidden=1024, num_experts=16 * R, num_worst_tokens=True, bias="one")
    return selfcheck_ht.run_graph_case(
        buffer,
        seed,
        replays,
        mode(G),
        case,
        replace(case, name="eager between replays", num_worst_tokens=False),
        reference_device,
    )
