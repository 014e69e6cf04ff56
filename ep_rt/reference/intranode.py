"""Reference intranode dispatch, cached dispatch and combine (deepep-v1-reference.md 2.2-2.3)."""

import torch

from ._checks import _check_tensor, _given_expert_counts, _split_x
from .layout import channel_ranges, dispatch_inputs


# ----------------------------------------------------------------------------------------
# Intranode dispatch / combine
# ----------------------------------------------------------------------------------------
def _send_pos(is_token_in_rank):
    """send_pos[t, r] = position of token t among this rank's tokens sent to r, or -1."""
    routed = is_token_in_rank.to(torch.int32)
    pos = torch.cumsum(routed, dim=0, dtype=torch.int32) - 1
    return torch.where(is_token_in_rank, pos, torch.full_like(pos, -1))


def intranode_dispatch(
    xs,
    topk_idxs,
    topk_weights,
    num_experts,
    num_channels,
    expert_alignment=1,
    num_worst_tokens=0,
    is_token_in_ranks=None,
    num_tokens_per_experts=None,
):
    """Simulates a (non-cached) intranode dispatch on all R = len(xs) ranks.

    xs[r]: bf16 [N_r, H] or (fp8 e4m3 [N_r, H], scales f32/int32 [N_r, S]).
    topk_idxs[r]: int64 or int32 [N_r, K] or None (then is_token_in_ranks[r] gives the routing).
    topk_weights[r]: f32 [N_r, K] or None (only allowed without topk_idxs).
    is_token_in_ranks[r]: bool [N_r, R]; when given it is the routing (as in DeepEP, whose
    kernel routes by is_token_in_rank), otherwise the routing is derived from topk_idxs.
    num_tokens_per_experts[r]: int32 [E], the counts rank r passes to dispatch; when given they make
    num_recv_tokens_per_expert_list (as in DeepEP, with or without top-k), otherwise the counts come from
    topk_idxs, and without either the list is empty (DeepEP's dispatch always takes the counts).
    Returns one dict per rank (see module docs / DeepEP handle semantics).
    """
    R, L, datas, scaless, has_topk, H, K, routes, tokens_per_expert, topk_idxs, topk_weights = dispatch_inputs(
        xs, topk_idxs, topk_weights, is_token_in_ranks, num_experts, num_channels, expert_alignment, num_worst_tokens
    )
    tokens_per_expert = _given_expert_counts(num_tokens_per_experts, tokens_per_expert, R, num_experts)

    dev = datas[0].device
    # rank_prefix_matrix[i][j] = tokens sent by ranks 0..i to rank j.
    sent = torch.stack([rt.sum(dim=0) for rt in routes]).to(torch.int32)  # [src, dst]
    rank_prefix_matrix = torch.cumsum(sent, dim=0, dtype=torch.int32).to(dev)
    # channel_prefix_matrix of every source: cpm[src][dst][c] = src's tokens in channels 0..c for dst.
    cpms = []
    for r in range(R):
        ends = [end for _, end in channel_ranges(routes[r].shape[0], num_channels)]
        prefix = torch.cat(
            [
                torch.zeros(1, R, dtype=torch.int32, device=dev),
                torch.cumsum(routes[r].to(torch.int32), dim=0, dtype=torch.int32),
            ]
        )
        cpms.append(prefix[ends].t().contiguous())  # [R(dst), C]

    results = []
    for me in range(R):
        rows = [routes[src][:, me].nonzero().flatten() for src in range(R)]  # source token ids
        num_recv = sum(len(ix) for ix in rows)
        if num_worst_tokens > 0 and num_recv > num_worst_tokens:
            raise ValueError(f"rank {me} receives {num_recv} tokens > num_worst_tokens ({num_worst_tokens})")
        num_rows = num_worst_tokens if num_worst_tokens > 0 else num_recv

        def gather(tensors, fill=0):
            """Concatenate rows of tensors[src] selected by rows[src], padded to num_rows."""
            out = torch.cat([t.index_select(0, ix) for t, ix in zip(tensors, rows)]).contiguous()
            if num_rows > num_recv:
                pad = torch.full(
                    (num_rows - num_recv,) + tuple(out.shape[1:]), fill, dtype=out.dtype, device=out.device
                )
                out = torch.cat([out, pad])
            return out

        res = {
            "recv_x": gather(datas),
            "recv_x_scales": None,
            "recv_topk_idx": None,
            "recv_topk_weights": None,
            "num_recv_tokens_per_expert_list": [],
        }
        if scaless[0] is not None:
            res["recv_x_scales"] = gather(scaless)
        if has_topk:
            idx = gather(topk_idxs, fill=-1)
            local = (idx >= me * L) & (idx < (me + 1) * L)
            res["recv_topk_idx"] = torch.where(local, idx - me * L, torch.full_like(idx, -1))
            w = gather(topk_weights)
            res["recv_topk_weights"] = torch.where(local, w, torch.zeros_like(w))
        if num_worst_tokens == 0 and tokens_per_expert:
            counts = torch.stack([tpe[me * L : (me + 1) * L].cpu() for tpe in tokens_per_expert]).sum(0)
            a = expert_alignment
            res["num_recv_tokens_per_expert_list"] = [(int(c) + a - 1) // a * a for c in counts]
        recv_cpm = torch.zeros(R, num_channels, dtype=torch.int32, device=dev)
        for src in range(R):
            recv_cpm[src, 1:] = cpms[src][me, :-1]
        res.update(
            {
                "rank_prefix_matrix": rank_prefix_matrix.clone(),
                "channel_prefix_matrix": cpms[me].clone(),
                "recv_channel_prefix_matrix": recv_cpm,
                "recv_src_idx": gather([torch.arange(d.shape[0], dtype=torch.int32, device=dev) for d in datas]),
                "is_token_in_rank": routes[me].clone(),
                "send_pos": _send_pos(routes[me]),
                "num_recv": num_recv,
            }
        )
        results.append(res)
    return results


def intranode_cached_dispatch(xs, handles):
    """Dispatch reusing the handles of a previous dispatch (uses is_token_in_rank and send_pos).

    Returns per rank {"recv_x", "recv_x_scales"} with exactly num_recv rows, equal to the
    first num_recv rows of the non-cached dispatch outputs.
    """
    R = len(xs)
    if len(handles) != R:
        raise ValueError(f"need one handle per rank ({R}), got {len(handles)}")
    datas, scaless = zip(*[_split_x(x, f"xs[{r}]") for r, x in enumerate(xs)])
    for r in range(R):
        itr = handles[r]["is_token_in_rank"]
        if itr.shape != (datas[r].shape[0], R):
            raise ValueError(
                f"handles[{r}] is_token_in_rank shape {tuple(itr.shape)} does not match {(datas[r].shape[0], R)}"
            )
    results = []
    for me in range(R):
        rpm = handles[me]["rank_prefix_matrix"]
        num_recv = int(rpm[R - 1, me])
        res = {"recv_x": None, "recv_x_scales": None}
        for key, tensors in (("recv_x", datas), ("recv_x_scales", scaless)):
            if tensors[0] is None:
                continue
            out = torch.zeros(
                (num_recv,) + tuple(tensors[0].shape[1:]), dtype=tensors[0].dtype, device=tensors[0].device
            )
            for src in range(R):
                mask = handles[src]["is_token_in_rank"][:, me]
                base = int(rpm[src - 1, me]) if src > 0 else 0
                dst_rows = base + handles[src]["send_pos"][mask, me].long()
                out[dst_rows] = tensors[src][mask]
            res[key] = out
        results.append(res)
    return results


def intranode_combine(xs, handles, topk_weights=None, biases=None):
    """Simulates intranode combine on all ranks (the reverse of dispatch, summing copies).

    xs[r]: bf16 [>= num_recv_r, H] in rank r's dispatch receive order. handles[r]: dispatch
    dicts. topk_weights[r]: f32 [>= num_recv_r, K] or None. biases[r]: None, bf16 [N_r, H] or
    a pair (b0, b1) of such tensors / None. Per token t of rank me, in float32 and in exactly
    this order: acc = 0; acc += b0[t]; acc += b1[t]; acc += xs[r][row(t, r)] for r ascending
    with is_token_in_rank[t, r]; combined_x[t] = bf16(acc).
    """
    R = len(xs)
    if len(handles) != R:
        raise ValueError(f"need one handle per rank ({R}), got {len(handles)}")
    if topk_weights is not None and len(topk_weights) != R:
        raise ValueError(f"topk_weights must have one entry per rank ({R})")
    if biases is not None and len(biases) != R:
        raise ValueError(f"biases must have one entry per rank ({R})")
    H = None
    for r in range(R):
        _check_tensor(xs[r], f"xs[{r}]", torch.bfloat16, 2)
        H = xs[r].shape[1] if H is None else H
        if xs[r].shape[1] != H:
            raise ValueError(f"xs[{r}] hidden {xs[r].shape[1]} != {H}")
        if xs[r].shape[0] < handles[r]["num_recv"]:
            raise ValueError(f"xs[{r}] has {xs[r].shape[0]} rows < num_recv {handles[r]['num_recv']}")
        if topk_weights is not None:
            _check_tensor(topk_weights[r], f"topk_weights[{r}]", torch.float32, 2)
            if (
                topk_weights[r].shape[0] < handles[r]["num_recv"]
                or topk_weights[r].shape[1] != topk_weights[0].shape[1]
            ):
                raise ValueError(f"topk_weights[{r}] shape {tuple(topk_weights[r].shape)} is invalid")

    results = []
    for me in range(R):
        itr = handles[me]["is_token_in_rank"]
        send_pos = handles[me]["send_pos"]
        rpm = handles[me]["rank_prefix_matrix"]
        N = itr.shape[0]
        bias = biases[me] if biases is not None else None
        pair = tuple(bias) if isinstance(bias, (tuple, list)) else (bias, None)
        if len(pair) != 2:
            raise ValueError(f"biases[{me}] must be a tensor or a pair of tensors")
        acc = torch.zeros(N, H, dtype=torch.float32, device=xs[me].device)
        for j, b in enumerate(pair):
            if b is not None:
                _check_tensor(b, f"biases[{me}][{j}]", torch.bfloat16, 2)
                if b.shape != (N, H):
                    raise ValueError(f"biases[{me}][{j}] shape {tuple(b.shape)} != {(N, H)}")
                acc += b.float()
        w_acc = None
        if topk_weights is not None:
            w_acc = torch.zeros(N, topk_weights[0].shape[1], dtype=torch.float32, device=xs[me].device)
        for r in range(R):  # one rank at a time, ascending: fixes the f32 summation order
            mask = itr[:, r]
            base = int(rpm[me - 1, r]) if me > 0 else 0
            rows = base + send_pos[mask, r].long()
            acc[mask] += xs[r][rows].float()
            if w_acc is not None:
                w_acc[mask] += topk_weights[r][rows]
        results.append({"combined_x": acc.to(torch.bfloat16), "combined_topk_weights": w_acc})
    return results
