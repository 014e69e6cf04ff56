"""Reference internode (several nodes) dispatch, cached dispatch and combine.

Mirrors DeepEP V1's host-visible internode semantics (shared/docs/INTERNODE.md 1.3) for ep_rt's design
(INTERNODE.md 4.1-4.4), for any node size G = num_ranks_per_node in 1..8 and any node count. Like the rest of
``ep_rt.reference`` it simulates all ranks at once: ``xs[r]`` is what rank r passes, ``out[me]`` what rank me
gets. It is the oracle of the GPU tests, written for obviousness, not speed.

Notation. R ranks, G ranks per node, NN = R // G nodes (DeepEP's "RDMA ranks"); rank r is local rank r % G of
node r // G. C channels: channel c of a rank with T tokens is the token range ``channel_ranges(T, C)[c]``
(contiguous, as intranode). Rank me is (node m, local j). The *rail peer* of me on node s is rank s*G + j: the
only rank of node s that me exchanges network traffic with. "t hits node n" = token t has at least one
destination rank on node n. A token of rank src travels to node n once (hop 1: src -> its rail peer
f = n*G + src % G on node n, the *forwarder*), then f hands it to every destination rank of node n (hop 2, over
NVLink; for f itself and for G = 1 this hop is a local copy).

Outputs (receive side) match intranode: rows grouped by global source rank ascending, inside by source token
ascending; recv_topk_idx = local expert id (idx - me*L) where the expert is on me, else -1; recv_topk_weights =
the weight there, else 0; num_recv_tokens_per_expert_list[l] = sum over sources of their tokens-per-expert for
expert me*L + l, rounded up to expert_alignment, with or without topk (empty with num_worst_tokens).

Handle: DeepEP's 10-tuple, field order ``INTERNODE_HANDLE_FIELDS``; int32 unless noted; on rank me:

 [0] is_token_in_rank  bool [T_me, R]: the routing.
 [1] rdma_channel_prefix_matrix  [NN, C]: [n][c] = my tokens in channels 0..c that hit node n (a token counts
     once per node; n = m included).
 [2] gbl_channel_prefix_matrix  [R, C]: [d][c] = my tokens in channels 0..c sent to rank d.
 [3] recv_rdma_channel_prefix_matrix  [NN, C]: [s][c] = row m of the [1] of my rail peer on node s, i.e. that
     peer's tokens in its channels 0..c that hit my node (the tokens I forward, by channel).
 [4] recv_rdma_rank_prefix_sum  [NN]: [s] = tokens I forward from the rail peers of nodes 0..s (inclusive);
     [4][-1] = num_rdma_recv.
 [5] recv_gbl_channel_prefix_matrix  [R, C]: [src][c] = row of recv_x where the block of (source rank src,
     channel c) starts = [6][src-1] + [2] of src at [me][c-1] (each term 0 for src = 0 / c = 0).
 [6] recv_gbl_rank_prefix_sum  [R]: [src] = rows I receive from ranks 0..src (inclusive); [6][-1] = num_recv.
 [7] recv_src_meta  uint8 [rows, 8]: per received row, bytes 0-3 = source node, bytes 4-7 = mask, both int32
     little-endian; bit l of mask set iff the token also goes to rank m*G + l (the ranks of my node; bit j is
     set on every real row). See ``decode_source_meta``.
 [8] send_rdma_head  [T_me, NN]: [t][n] = position of token t in the stream (my channel of t -> node n) = the
     number of tokens t' < t of the same channel that hit node n; -1 if t does not hit node n.
 [9] send_nvl_head  [rows_fwd, G]: one row per token I forward, ordered by source node ascending, then source
     token ascending (so the block of node s starts at [4][s-1], and inside it the block of channel c at
     [3][s][c-1]); [i][l] = position of that token in the stream (source rank -> rank m*G + l), i.e. the
     number of earlier tokens of the source (my rail peer on node s) sent to rank m*G + l; -1 if not sent
     there. The token's row in rank m*G + l's recv_x is therefore [6]_{m*G+l}[src - 1] + [9][i][l].

Following the chain (used by cached dispatch and combine, as the kernels will): token t of rank src in channel
c, destination rank d = n*G + l, forwarder f = n*G + src % G, source node s = src // G:
    i   = [4]_f[s-1] + [3]_f[s][c-1] + [8]_src[t][n]            (row of t in f's [9])
    row = [6]_d[src-1] + [9]_f[i][l]                            (row of t in d's recv_x)

Where a field's meaning differs from DeepEP V1:
 * [9] DeepEP stores a per-(channel, destination local rank) counter of the forwarder warp that counts tokens
   of all source nodes in the order its round-robin polling met them (timing-dependent); ep_rt stores the
   deterministic position in the (source rank -> destination rank) stream over the whole call. Columns = G
   (DeepEP: always 8).
 * [8], [9] DeepEP's combine rewrites their -1 entries in place (to -(next head) - 1); ep_rt's handles are
   never written after dispatch.
 * [1]-[7] have DeepEP's meaning; with G < 8 the shapes use NN = R / G nodes and masks use bits 0..G-1.
 * num_worst_tokens: every row-sized output (recv_x, scales, topk, [7]) and [9] have num_worst_tokens rows
   as in DeepEP; the tail rows are defined here (0, recv_topk_idx -1, [9] -1) where DeepEP leaves all but
   recv_topk_idx uninitialised: GPU tests compare the first num_recv (num_rdma_recv for [9]) rows.
 * Without topk the per-expert list is still filled from num_tokens_per_expert, as DeepEP (whose
   tests/test_internode.py checks it in its first case).

Combine rounding (INTERNODE.md 1.3, 4.2): for token t of rank me, all adds in f32, in exactly this order:
    acc = f32(b0[t]) + f32(b1[t])                      (a missing bias is +0)
    for each node n hit by t, ascending:
        p = +0; for each local l ascending with is_token_in_rank[t, n*G+l]: p += f32(x_{n*G+l}[row])
        acc += f32(bf16(p))                             (the forwarder's partial is rounded to bf16)
    combined_x[t] = bf16(acc)
combined_topk_weights[t] has the same two-level order in f32 without any rounding:
    w = +0; for n ascending: q = +0; for l ascending: q += topk_weights_{n*G+l}[row]; w += q.
A token sent nowhere gets bf16(f32(b0) + f32(b1)) and weights 0.
"""

import torch

from ._checks import _check_tensor, _given_expert_counts, _split_x
from .layout import NUM_RANKS_PER_NODE, channel_ranges, dispatch_inputs

INTERNODE_HANDLE_FIELDS = (
    "is_token_in_rank",
    "rdma_channel_prefix_matrix",
    "gbl_channel_prefix_matrix",
    "recv_rdma_channel_prefix_matrix",
    "recv_rdma_rank_prefix_sum",
    "recv_gbl_channel_prefix_matrix",
    "recv_gbl_rank_prefix_sum",
    "recv_src_meta",
    "send_rdma_head",
    "send_nvl_head",
)
SOURCE_META_BYTES = 8


# ----------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------
def _num_nodes(num_ranks, num_ranks_per_node):
    G = num_ranks_per_node
    if not isinstance(G, int) or not 1 <= G <= NUM_RANKS_PER_NODE:
        raise ValueError(f"num_ranks_per_node must be an int in [1, {NUM_RANKS_PER_NODE}], got {G!r}")
    if num_ranks < 1 or num_ranks % G != 0:
        raise ValueError(f"num_ranks ({num_ranks}) must be a positive multiple of num_ranks_per_node ({G})")
    return num_ranks // G


def _node_hits(is_token_in_rank, G):
    """bool [T, NN]: token t has a destination rank on node n."""
    T, R = is_token_in_rank.shape
    return is_token_in_rank.view(T, R // G, G).any(dim=2)


def _channel_prefix(flags, num_channels):
    """int32 [X, C]: [x][c] = number of tokens t in channels 0..c with flags[t, x] (flags bool [T, X])."""
    ends = [end for _, end in channel_ranges(flags.shape[0], num_channels)]
    prefix = torch.cat(
        [
            torch.zeros(1, flags.shape[1], dtype=torch.int32, device=flags.device),
            torch.cumsum(flags.to(torch.int32), dim=0, dtype=torch.int32),
        ]
    )
    return prefix[ends].t().contiguous()


def _stream_positions(flags):
    """int32 [T, X]: [t][x] = number of t' < t with flags[t', x] if flags[t, x], else -1."""
    pos = torch.cumsum(flags.to(torch.int32), dim=0, dtype=torch.int32) - 1
    return torch.where(flags, pos, torch.full_like(pos, -1))


def _channel_stream_positions(flags, num_channels):
    """Like _stream_positions, but counting restarts at the start of every channel."""
    out = torch.full(flags.shape, -1, dtype=torch.int32, device=flags.device)
    for begin, end in channel_ranges(flags.shape[0], num_channels):
        out[begin:end] = _stream_positions(flags[begin:end])
    return out


def encode_source_meta(src_node, mask):
    """uint8 [M, 8] from int32-range tensors src_node [M] and mask [M]: two little-endian int32 words."""
    words = torch.stack([src_node.to(torch.int64), mask.to(torch.int64)], dim=1) & 0xFFFFFFFF  # [M, 2]
    shifts = torch.arange(4, dtype=torch.int64, device=words.device) * 8
    return ((words.unsqueeze(-1) >> shifts) & 0xFF).reshape(-1, SOURCE_META_BYTES).to(torch.uint8)


def decode_source_meta(meta):
    """(src_node int32 [M], mask int32 [M]) from recv_src_meta uint8 [M, 8]."""
    _check_tensor(meta, "recv_src_meta", torch.uint8, 2)
    if meta.shape[1] != SOURCE_META_BYTES:
        raise ValueError(f"recv_src_meta must have {SOURCE_META_BYTES} bytes per row, got {meta.shape[1]}")
    b = meta.to(torch.int64).view(-1, 2, 4)
    shifts = torch.arange(4, dtype=torch.int64, device=meta.device) * 8
    words = (b << shifts).sum(dim=2)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words[:, 0], words[:, 1]


def _pad_rows(t, num_rows, fill):
    if t.shape[0] >= num_rows:
        return t
    pad = torch.full((num_rows - t.shape[0],) + tuple(t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad])


def handle_tuple(result):
    """The 10-tuple handle (DeepEP's order) of one rank's internode_dispatch result dict."""
    return tuple(result[name] for name in INTERNODE_HANDLE_FIELDS)


def _fields(handle, r):
    """A handle given as a dispatch result dict or as the 10-tuple -> dict of the 10 fields."""
    if isinstance(handle, dict):
        missing = [name for name in INTERNODE_HANDLE_FIELDS if name not in handle]
        if missing:
            raise ValueError(f"handles[{r}] lacks {missing}")
        return {name: handle[name] for name in INTERNODE_HANDLE_FIELDS}
    if isinstance(handle, (tuple, list)) and len(handle) == len(INTERNODE_HANDLE_FIELDS):
        return dict(zip(INTERNODE_HANDLE_FIELDS, handle))
    raise ValueError(f"handles[{r}] must be an internode dispatch result or its 10-tuple handle")


# ----------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------
def internode_dispatch(
    xs,
    topk_idxs,
    topk_weights,
    num_experts,
    num_channels,
    num_ranks_per_node,
    expert_alignment=1,
    num_worst_tokens=0,
    is_token_in_ranks=None,
    num_tokens_per_experts=None,
):
    """Simulates a (non-cached) internode dispatch on all R = len(xs) ranks, G = num_ranks_per_node per node.

    xs[r]: bf16 [T_r, H] or (fp8 e4m3 [T_r, H], scales f32 or UE8M0-packed int32 [T_r, S], any strides).
    topk_idxs[r]: int64 [T_r, K] in [-1, E), or None on every rank (then is_token_in_ranks is the routing).
    topk_weights[r]: f32 [T_r, K] (None without topk_idxs). is_token_in_ranks[r]: bool [T_r, R]; when given
    it is the routing (DeepEP routes by is_token_in_rank), otherwise it is derived from topk_idxs.
    num_worst_tokens > 0: every rank's outputs get exactly that many rows (it must cover both num_recv and
    num_rdma_recv), the per-expert list is empty. num_tokens_per_experts[r]: int32 [E], the counts rank r passes to
    dispatch; they make num_recv_tokens_per_expert_list (with or without top-k), else it comes from topk_idxs.

    Returns one dict per rank: recv_x, recv_x_scales (contiguous, input dtype), recv_topk_idx,
    recv_topk_weights, num_recv_tokens_per_expert_list, the ten handle fields by name (module docstring),
    "handle" (the 10-tuple), num_recv, num_rdma_recv (rows I forward).
    """
    R = len(xs)
    NN = _num_nodes(R, num_ranks_per_node)
    G = num_ranks_per_node
    R, L, datas, scaless, has_topk, H, K, routes, tokens_per_expert, topk_idxs, topk_weights = dispatch_inputs(
        xs, topk_idxs, topk_weights, is_token_in_ranks, num_experts, num_channels, expert_alignment, num_worst_tokens, G
    )
    tokens_per_expert = _given_expert_counts(num_tokens_per_experts, tokens_per_expert, R, num_experts)
    dev = datas[0].device

    # ---- sender-side fields of every rank --------------------------------------------
    hits = [_node_hits(rt, G) for rt in routes]  # [T_r, NN]
    rdma_cpm = [_channel_prefix(h, num_channels) for h in hits]  # [NN, C]
    gbl_cpm = [_channel_prefix(rt, num_channels) for rt in routes]  # [R, C]
    send_rdma_head = [_channel_stream_positions(h, num_channels) for h in hits]  # [T_r, NN]

    # ---- one table of every rank's tokens, in (source rank, source token) order ----------
    # Selecting rows of it keeps that order, which is the receive order.
    all_route = torch.cat(routes)  # [sum T, R]
    all_hits = torch.cat(hits)  # [sum T, NN]
    all_src = torch.cat(
        [torch.full((d.shape[0],), r, dtype=torch.int64, device=dev) for r, d in enumerate(datas)]
    )  # source rank
    all_pos = torch.cat([_stream_positions(rt) for rt in routes])  # [sum T, R]: position in
    #                                                                              (source -> rank) stream
    bits = 2 ** torch.arange(G, dtype=torch.int64, device=dev)
    all_mask = (all_route.view(-1, NN, G).to(torch.int64) * bits).sum(dim=2)  # [sum T, NN]: local ranks
    sent = torch.stack([rt.sum(dim=0) for rt in routes]).to(torch.int32)  # [src, dst] tokens sent
    node_sent = torch.stack([h.sum(dim=0) for h in hits]).to(torch.int32)  # [src, node] tokens sent
    all_gbl_cpm = torch.stack(gbl_cpm)  # [src, dst, C]
    all_rdma_cpm = torch.stack(rdma_cpm)  # [src, node, C]

    table = {
        "x": torch.cat(list(datas)),
        "scales": torch.cat(list(scaless)) if scaless[0] is not None else None,
        "idx": torch.cat(topk_idxs) if has_topk else None,
        "weights": torch.cat(topk_weights) if has_topk else None,
    }

    results = []
    for me in range(R):
        m, j = divmod(me, G)

        # -- receiver role: rows by source rank ascending, then source token ascending --
        rows = all_route[:, me].nonzero().flatten()  # rows of the table
        num_recv = len(rows)
        recv_gbl_rank_prefix_sum = torch.cumsum(sent[:, me], dim=0, dtype=torch.int32)
        recv_gbl_cpm = torch.zeros(R, num_channels, dtype=torch.int32, device=dev)
        recv_gbl_cpm[1:] += recv_gbl_rank_prefix_sum[:-1].unsqueeze(1)  # the source's block start
        recv_gbl_cpm[:, 1:] += all_gbl_cpm[:, me, :-1]  # + its earlier channels

        # -- forwarder role: the tokens of my rail peers (s*G + j) that hit my node -------
        fwd = (all_hits[:, m] & (all_src % G == j)).nonzero().flatten()  # by source node, token
        num_rdma_recv = len(fwd)
        recv_rdma_rank_prefix_sum = torch.cumsum(node_sent[j::G, m], dim=0, dtype=torch.int32)
        recv_rdma_cpm = all_rdma_cpm[j::G, m].contiguous()
        send_nvl_head = all_pos[fwd, m * G : (m + 1) * G].contiguous()

        if num_worst_tokens > 0 and max(num_recv, num_rdma_recv) > num_worst_tokens:
            raise ValueError(
                f"rank {me} receives {num_recv} tokens and forwards {num_rdma_recv} > "
                f"num_worst_tokens ({num_worst_tokens})"
            )
        num_rows = num_worst_tokens if num_worst_tokens > 0 else num_recv

        def gather(name, fill=0):
            """My rows of the table's column `name`, padded to num_rows."""
            return _pad_rows(table[name].index_select(0, rows).contiguous(), num_rows, fill)

        src_node = (all_src[rows] // G).to(torch.int32)
        recv_src_meta = _pad_rows(encode_source_meta(src_node, all_mask[rows, m]), num_rows, 0)

        res = {
            "recv_x": gather("x"),
            "recv_x_scales": None,
            "recv_topk_idx": None,
            "recv_topk_weights": None,
            "num_recv_tokens_per_expert_list": [],
        }
        if scaless[0] is not None:
            res["recv_x_scales"] = gather("scales")
        if has_topk:
            idx = gather("idx", fill=-1)
            local = (idx >= me * L) & (idx < (me + 1) * L)
            res["recv_topk_idx"] = torch.where(local, idx - me * L, torch.full_like(idx, -1))
            w = gather("weights")
            res["recv_topk_weights"] = torch.where(local, w, torch.zeros_like(w))
        if num_worst_tokens == 0 and tokens_per_expert:  # with or without top-k, as DeepEP (and intranode)
            counts = torch.stack([tpe[me * L : (me + 1) * L].cpu() for tpe in tokens_per_expert]).sum(0)
            a = expert_alignment
            res["num_recv_tokens_per_expert_list"] = [(int(c) + a - 1) // a * a for c in counts]
        res.update(
            {
                "is_token_in_rank": routes[me].clone(),
                "rdma_channel_prefix_matrix": rdma_cpm[me].clone(),
                "gbl_channel_prefix_matrix": gbl_cpm[me].clone(),
                "recv_rdma_channel_prefix_matrix": recv_rdma_cpm,
                "recv_rdma_rank_prefix_sum": recv_rdma_rank_prefix_sum,
                "recv_gbl_channel_prefix_matrix": recv_gbl_cpm,
                "recv_gbl_rank_prefix_sum": recv_gbl_rank_prefix_sum,
                "recv_src_meta": recv_src_meta,
                "send_rdma_head": send_rdma_head[me].clone(),
                "send_nvl_head": _pad_rows(send_nvl_head, num_worst_tokens, -1),
                "num_recv": num_recv,
                "num_rdma_recv": num_rdma_recv,
            }
        )
        res["handle"] = handle_tuple(res)
        results.append(res)
    return results


# ----------------------------------------------------------------------------------------
# The handle chain: where each (token, destination rank) copy lives
# ----------------------------------------------------------------------------------------
def _check_handles(handles):
    """Field dicts of all ranks and (R, G, NN, C), checked for shape consistency."""
    R = len(handles)
    if R < 1:
        raise ValueError("need at least one handle")
    hs = [_fields(h, r) for r, h in enumerate(handles)]
    NN = hs[0]["send_rdma_head"].shape[1]
    C = hs[0]["rdma_channel_prefix_matrix"].shape[1]
    if NN < 1 or R % NN != 0:
        raise ValueError(f"handles: {NN} nodes do not divide {R} ranks")
    G = R // NN
    for r, h in enumerate(hs):
        T = h["is_token_in_rank"].shape[0]
        shapes = {
            "is_token_in_rank": (T, R),
            "rdma_channel_prefix_matrix": (NN, C),
            "gbl_channel_prefix_matrix": (R, C),
            "recv_rdma_channel_prefix_matrix": (NN, C),
            "recv_rdma_rank_prefix_sum": (NN,),
            "recv_gbl_channel_prefix_matrix": (R, C),
            "recv_gbl_rank_prefix_sum": (R,),
            "send_rdma_head": (T, NN),
        }
        for name, shape in shapes.items():
            if tuple(h[name].shape) != shape:
                raise ValueError(f"handles[{r}].{name} shape {tuple(h[name].shape)} != {shape}")
        num_recv = int(h["recv_gbl_rank_prefix_sum"][-1])
        num_rdma_recv = int(h["recv_rdma_rank_prefix_sum"][-1])
        meta, nvl = h["recv_src_meta"], h["send_nvl_head"]
        if meta.dim() != 2 or meta.shape[1] != SOURCE_META_BYTES or meta.shape[0] < num_recv:
            raise ValueError(f"handles[{r}].recv_src_meta shape {tuple(meta.shape)} is invalid")
        if nvl.dim() != 2 or nvl.shape[1] != G or nvl.shape[0] < num_rdma_recv:
            raise ValueError(f"handles[{r}].send_nvl_head shape {tuple(nvl.shape)} is invalid (G = {G})")
    return hs, R, G, NN, C


def _as_lists(hs):
    """The handle fields the chain reads, as Python lists (read once per call)."""
    names = (
        "is_token_in_rank",
        "send_rdma_head",
        "recv_rdma_rank_prefix_sum",
        "recv_rdma_channel_prefix_matrix",
        "send_nvl_head",
        "recv_gbl_rank_prefix_sum",
    )
    return [{name: h[name].tolist() for name in names} for h in hs]


def _destination_rows(hs, lists, src, G, C):
    """int64 [T_src, R]: row of src's token t in rank d's recv_x, -1 if not sent; followed through the handle
    chain (send_rdma_head -> forwarder's prefix sums -> send_nvl_head -> receiver's prefix sum).
    Also checks that the chain reaches exactly the ranks of is_token_in_rank."""
    R = len(hs)
    s, src_local = divmod(src, G)
    T = hs[src]["is_token_in_rank"].shape[0]
    rdma_head = lists[src]["send_rdma_head"]
    rows = [[-1] * R for _ in range(T)]
    for c, (begin, end) in enumerate(channel_ranges(T, C)):
        for t in range(begin, end):
            for n in range(R // G):
                p = rdma_head[t][n]
                if p < 0:
                    continue
                f = lists[n * G + src_local]  # the forwarder: my rail peer on node n
                i = (
                    (f["recv_rdma_rank_prefix_sum"][s - 1] if s > 0 else 0)
                    + (f["recv_rdma_channel_prefix_matrix"][s][c - 1] if c > 0 else 0)
                    + p
                )
                for l in range(G):
                    q = f["send_nvl_head"][i][l]
                    if q >= 0:
                        d = n * G + l
                        prefix = lists[d]["recv_gbl_rank_prefix_sum"]
                        rows[t][d] = (prefix[src - 1] if src > 0 else 0) + q
    if [[r >= 0 for r in row] for row in rows] != lists[src]["is_token_in_rank"]:
        raise ValueError(
            f"handles: the chain of rank {src}'s send_rdma_head / send_nvl_head does not reach "
            f"exactly the ranks of its is_token_in_rank"
        )
    return torch.tensor(rows, dtype=torch.int64).reshape(T, R).to(hs[src]["is_token_in_rank"].device)


# ----------------------------------------------------------------------------------------
# Cached dispatch
# ----------------------------------------------------------------------------------------
def internode_cached_dispatch(xs, handles):
    """Dispatch reusing the handles of a previous internode dispatch (no topk), on all ranks.

    xs[r]: as in internode_dispatch. handles[r]: rank r's dispatch result dict or its 10-tuple. Every row is
    placed by following the handle chain (module docstring). Returns per rank {"recv_x", "recv_x_scales"}
    with recv_src_meta.shape[0] rows (DeepEP's num_recv_tokens, = num_worst_tokens when the handle came from
    such a dispatch; tail rows 0): equal to the non-cached dispatch's recv_x / recv_x_scales.
    """
    hs, R, G, NN, C = _check_handles(handles)
    if len(xs) != R:
        raise ValueError(f"need one x per handle ({R}), got {len(xs)}")
    datas, scaless = zip(*[_split_x(x, f"xs[{r}]") for r, x in enumerate(xs)])
    for r in range(R):
        if datas[r].shape[0] != hs[r]["is_token_in_rank"].shape[0]:
            raise ValueError(f"xs[{r}] has {datas[r].shape[0]} tokens, its handle {hs[r]['is_token_in_rank'].shape[0]}")
        if (
            datas[r].dtype != datas[0].dtype
            or datas[r].shape[1] != datas[0].shape[1]
            or (scaless[r] is None) != (scaless[0] is None)
        ):
            raise ValueError(f"xs[{r}] dtype/hidden/scales differ from xs[0]")
    lists = _as_lists(hs)
    # Every rank's tokens in one table (source rank, token order), with each token's row on every rank.
    dest = torch.cat([_destination_rows(hs, lists, src, G, C) for src in range(R)])  # [sum T, R]
    tables = {
        "recv_x": torch.cat(list(datas)),
        "recv_x_scales": torch.cat(list(scaless)) if scaless[0] is not None else None,
    }
    results = []
    for me in range(R):
        num_rows = hs[me]["recv_src_meta"].shape[0]
        sent = dest[:, me] >= 0
        res = {"recv_x": None, "recv_x_scales": None}
        for key, table in tables.items():
            if table is None:
                continue
            out = torch.zeros((num_rows,) + tuple(table.shape[1:]), dtype=table.dtype, device=table.device)
            out[dest[sent, me]] = table[sent]
            res[key] = out
        results.append(res)
    return results


# ----------------------------------------------------------------------------------------
# Combine
# ----------------------------------------------------------------------------------------
def internode_combine(xs, handles, topk_weights=None, biases=None):
    """Simulates internode combine on all ranks: the reverse of dispatch, summing the copies of each token
    in two levels (per node over local ranks, rounded to bf16, then over nodes; module docstring).

    xs[r]: bf16 [>= num_recv_r, H] in rank r's dispatch receive order. handles[r]: dispatch result dict or
    10-tuple. topk_weights[r]: f32 [>= num_recv_r, K] or None. biases[r]: None, bf16 [T_r, H], or a pair
    (b0, b1) of such tensors / None. Returns per rank {"combined_x" bf16 [T_r, H],
    "combined_topk_weights" f32 [T_r, K] or None}.
    """
    hs, R, G, NN, C = _check_handles(handles)
    if len(xs) != R:
        raise ValueError(f"need one x per handle ({R}), got {len(xs)}")
    if topk_weights is not None and len(topk_weights) != R:
        raise ValueError(f"topk_weights must have one entry per rank ({R})")
    if biases is not None and len(biases) != R:
        raise ValueError(f"biases must have one entry per rank ({R})")
    H = xs[0].shape[1] if isinstance(xs[0], torch.Tensor) and xs[0].dim() == 2 else None
    for r in range(R):
        _check_tensor(xs[r], f"xs[{r}]", torch.bfloat16, 2)
        num_recv = int(hs[r]["recv_gbl_rank_prefix_sum"][-1])
        if xs[r].shape[1] != H:
            raise ValueError(f"xs[{r}] hidden {xs[r].shape[1]} != {H}")
        if xs[r].shape[0] < num_recv:
            raise ValueError(f"xs[{r}] has {xs[r].shape[0]} rows < num_recv {num_recv}")
        if topk_weights is not None:
            _check_tensor(topk_weights[r], f"topk_weights[{r}]", torch.float32, 2)
            if topk_weights[r].shape[0] < num_recv or topk_weights[r].shape[1] != topk_weights[0].shape[1]:
                raise ValueError(f"topk_weights[{r}] shape {tuple(topk_weights[r].shape)} is invalid")

    lists = _as_lists(hs)
    results = []
    for me in range(R):
        rows = _destination_rows(hs, lists, me, G, C)  # [T, R]
        T = rows.shape[0]
        dev = xs[me].device
        bias = biases[me] if biases is not None else None
        pair = tuple(bias) if isinstance(bias, (tuple, list)) else (bias, None)
        if len(pair) != 2:
            raise ValueError(f"biases[{me}] must be a tensor or a pair of tensors")
        terms = []
        for k, b in enumerate(pair):
            if b is None:
                terms.append(torch.zeros(T, H, dtype=torch.float32, device=dev))
                continue
            _check_tensor(b, f"biases[{me}][{k}]", torch.bfloat16, 2)
            if b.shape != (T, H):
                raise ValueError(f"biases[{me}][{k}] shape {tuple(b.shape)} != {(T, H)}")
            terms.append(b.float())
        acc = terms[0] + terms[1]
        w_acc = None
        if topk_weights is not None:
            w_acc = torch.zeros(T, topk_weights[0].shape[1], dtype=torch.float32, device=dev)
        for n in range(NN):  # nodes ascending
            node_mask = (rows[:, n * G : (n + 1) * G] >= 0).any(dim=1)
            partial = torch.zeros(T, H, dtype=torch.float32, device=dev)
            w_partial = torch.zeros_like(w_acc) if w_acc is not None else None
            for l in range(G):  # local ranks ascending: the forwarder's sum
                d = n * G + l
                mask = rows[:, d] >= 0
                partial[mask] += xs[d][rows[mask, d]].float()
                if w_acc is not None:
                    w_partial[mask] += topk_weights[d][rows[mask, d]]
            acc[node_mask] += partial[node_mask].to(torch.bfloat16).float()
            if w_acc is not None:
                w_acc[node_mask] += w_partial[node_mask]
        results.append({"combined_x": acc.to(torch.bfloat16), "combined_topk_weights": w_acc})
    return results
