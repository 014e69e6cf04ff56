"""Low-latency GPU checks against ep_rt.reference_ll, shared by the GPU tests and `python -m ep_rt`.

ep_rt's LL layout is deterministic (blocks by source rank, rows in token-major order, as the reference),
so counts, layout ranges, source indices, payload bits, scales and the combined output (a weighted sum in
a fixed order, no FMA) are all compared exactly. The one exception is a LogFMT combine, whose kernels use
the approximate lg2 / ex2 instructions: see check_logfmt_combined for its tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import reference_ll
from .checker import Checker, reference_device_of


@dataclass(frozen=True)
class LLCase:
    name: str
    max_tokens: int = 128  # T
    num_tokens: int = 100  # per rank (rank 0 gets 0 tokens when zero_rank0)
    hidden: int = 1024
    num_topk: int = 8
    num_experts: int = 32
    use_fp8: bool = True
    round_scale: bool = False
    use_ue8m0: bool = False
    hook: bool = False
    async_finish: bool = False
    zero_copy: bool = False
    out: bool = False
    stats: bool = False
    holes: bool = True  # -1 entries in topk_idx
    zero_rank0: bool = False
    rounds: int = 1  # consecutive dispatch+combine pairs (both buffers in turn)
    use_logfmt: bool = False  # LogFMT combine of logfmt_expert_outputs (every division kind in every row)
    topk_idx_dtype: str = "int64"  # what topk_idx is passed as (int32 is read in place)


def ll_cases(num_ranks: int) -> list[LLCase]:
    return [
        LLCase("bf16", use_fp8=False),
        LLCase("fp8", rounds=3),
        LLCase("int32 topk_idx", topk_idx_dtype="int32", rounds=2),
        LLCase("int32 topk_idx, hooks, bf16", topk_idx_dtype="int32", hook=True, use_fp8=False),
        LLCase("fp8 round_scale", round_scale=True),
        LLCase("fp8 ue8m0", round_scale=True, use_ue8m0=True, hidden=2048),
        LLCase("hooks", hook=True, rounds=2),
        LLCase("async", async_finish=True),
        LLCase("zero_copy + out", zero_copy=True, out=True),
        LLCase("stats", stats=True),
        LLCase("a rank with zero tokens", zero_rank0=True),
        LLCase("no -1 entries, top-16", holes=False, num_topk=16, num_experts=64),
        LLCase("hidden 1152 (not a multiple of 512)", hidden=1152),
        LLCase("hidden 16384", hidden=16384, num_tokens=32, max_tokens=32),
        LLCase("T=1024", max_tokens=1024, num_tokens=1000, hidden=1024, num_topk=4),
        # More (expert, rank) cells than the receive kernels scan at once (kShareTileCells in share.cuh).
        LLCase("4096 experts, stats", max_tokens=16, num_tokens=16, num_experts=4096, stats=True),
        LLCase("LL reference shape (128 x 7168, top-8, 288 experts)", hidden=7168, num_tokens=128, num_experts=288),
        LLCase(
            "LogFMT, LL reference shape (128 x 7168, top-8, 288 experts)",
            hidden=7168,
            num_tokens=128,
            num_experts=288,
            use_logfmt=True,
        ),
        LLCase("LogFMT, hidden 1152", hidden=1152, use_logfmt=True),
        LLCase("LogFMT + hooks", hook=True, rounds=2, use_logfmt=True),
        LLCase(
            "LogFMT + async + out, top-16, no -1 entries",
            async_finish=True,
            out=True,
            holes=False,
            num_topk=16,
            num_experts=64,
            use_logfmt=True,
        ),
    ]


def ll_inputs(case: LLCase, seed: int, num_ranks: int, device):
    xs, idxs, ws = [], [], []
    for r in range(num_ranks):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        n = 0 if (case.zero_rank0 and r == 0) else case.num_tokens
        x = torch.randn(n, case.hidden, generator=g).to(torch.bfloat16)
        scores = torch.rand(n, case.num_experts, generator=g)
        idx = (
            torch.topk(scores, case.num_topk, dim=1).indices if n else torch.empty(0, case.num_topk, dtype=torch.int64)
        )
        if case.holes and n:
            idx = torch.where(torch.rand(idx.shape, generator=g) < 0.15, torch.full_like(idx, -1), idx)
        w = torch.rand(n, case.num_topk, generator=g)
        xs.append(x.to(device))
        idxs.append(idx.to(getattr(torch, case.topk_idx_dtype)).to(device))
        ws.append(w.to(device))
    return xs, idxs, ws


def expert_outputs(seed: int, rank: int, L: int, R: int, T: int, H: int, device) -> torch.Tensor:
    """Rank `rank`'s expert output for (local expert, source rank, source token), identical on every process."""
    g = torch.Generator(device=device).manual_seed(seed * 7 + 11 + rank)
    return torch.randn(L, R, T, H, generator=g, device=device).to(torch.bfloat16)


# Division kinds of the LogFMT cases' expert outputs, cycling over the 128-channel divisions of every row, so
# every warp of the kernels meets two kinds and the kinds that travel as bf16 can be checked exactly per channel.
LOGFMT_KINDS = ("small", "small with zeros", "wide range", "large", "zero", "constant")
LOGFMT_BF16_KINDS = ("large", "zero", "constant")  # not castable: on the wire as plain bf16


def logfmt_expert_outputs(seed: int, rank: int, L: int, R: int, T: int, H: int, device) -> torch.Tensor:
    """expert_outputs reshaped into LOGFMT_KINDS, one kind per division (division d has kind d % 6):
    small: 0.05 * randn (all |x| < 1, castable); small with zeros: the same with 10% exact zeros (codes 0, some
    -0.0); wide range: small * 2^-U(0, 40), wider than LogFMT's 32 octaves (log_amin clipped, the smallest
    values become code 0); large: randn with one channel 2.0 (|x| >= 1: bf16); zero: all zero (bf16);
    constant: +-0.25 (amin == amax: bf16)."""
    y = expert_outputs(seed, rank, L, R, T, H, device).float().reshape(L, R, T, H // 128, 128)
    g = torch.Generator(device=device).manual_seed(seed * 7 + 13 + rank)
    u = torch.rand(y.shape, generator=g, device=device)
    small = 0.05 * y
    large = y.clone()
    large[..., 0] = 2.0
    variants = {
        "small": small,
        "small with zeros": torch.where(u < 0.1, 0.0 * small, small),
        "wide range": small * torch.exp2(-40.0 * u),
        "large": large,
        "zero": torch.zeros_like(y),
        "constant": torch.where(y < 0, -0.25, 0.25),
    }
    kind = (torch.arange(H // 128, device=device) % len(LOGFMT_KINDS)).view(1, 1, 1, -1, 1)
    out = torch.zeros_like(y)
    for i, name in enumerate(LOGFMT_KINDS):
        out = torch.where(kind == i, variants[name], out)
    return out.reshape(L, R, T, H).to(torch.bfloat16)


def logfmt_bf16_channels(H: int, device) -> torch.Tensor:
    """bool [H]: channels whose division kind travels as bf16 in logfmt_expert_outputs."""
    bf16_kinds = torch.tensor([k in LOGFMT_BF16_KINDS for k in LOGFMT_KINDS], device=device)
    return bf16_kinds[(torch.arange(H, device=device) // 128) % len(LOGFMT_KINDS)]


def to_packed(y: torch.Tensor, src_info: torch.Tensor, layout_range: torch.Tensor, T: int) -> torch.Tensor:
    """Place y[l, s, t] at the packed rows that (src_info, layout_range) describe; other rows are zero."""
    L, R = layout_range.shape
    out = torch.zeros(L, R * T, y.size(-1), dtype=y.dtype, device=y.device)
    ranges = layout_range.tolist()  # one read of the ranges, not one device sync per block
    for l in range(L):
        for s in range(R):
            begin, n = ranges[l][s] >> 32, ranges[l][s] & 0xFFFFFFFF
            if n:
                t = src_info[l, begin : begin + n].long()
                out[l, begin : begin + n] = y[l, s, t]
    return out


def _blocks(chk: Checker, what: str, got_x, got_scales, got_src, got_range, want, L: int, R: int) -> None:
    """Compare the valid rows of every local expert (rows past the count are undefined on the GPU); the whole
    [R * T, ...] block of each expert must still have the reference's shape and dtype."""
    for l in range(L):
        n = int(want["packed_recv_count"][l])
        chk.equal(f"{what} src_info[{l}]", got_src[l], want["packed_recv_src_info"][l], rows=n)
        chk.equal(f"{what} x[{l}]", got_x[l], want["packed_recv_x"][l], rows=n)
        if got_scales is not None or want["packed_recv_x_scales"] is not None:
            chk.equal(
                f"{what} scales[{l}]",
                None if got_scales is None else got_scales[l],
                want["packed_recv_x_scales"][l] if want["packed_recv_x_scales"] is not None else None,
                rows=n,
            )


def _logfmt_term_slack(y: torch.Tensor) -> torch.Tensor:
    """Per element of bf16 expert outputs y [..., H]: how far the GPU's decoded value may lie from
    reference_ll.logfmt_roundtrip(y). lg2/ex2.approx (error about 2^-22) move a code only when it sits that
    close to a code boundary, and then by one step, a relative change of 2^step - 1 (at most 2^(32/510) - 1,
    4.4%, typically about 1%); the decoded value can also round to the neighbouring bf16 (relative 2^-7 at
    most), and at the bottom of a clipped division code 1 (2^log_amin) can become code 0. Zero where the
    division is not castable (bf16 on the wire, exact)."""
    enc = reference_ll.logfmt_encode(y)
    castable, log_amin, step = reference_ll.logfmt_params(enc["amax"], enc["amin"])
    D = castable.shape[-1]
    decoded = reference_ll.logfmt_decode(enc).float().abs().reshape(*y.shape[:-1], D, 128)
    slack = decoded * (torch.exp2(step) - 1 + 2.0**-7).unsqueeze(-1) + torch.exp2(log_amin).unsqueeze(-1)
    return torch.where(castable.unsqueeze(-1), slack, torch.zeros_like(slack)).reshape(y.shape)


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 values at |x| (0 at 0)."""
    _, exponent = torch.frexp(x.float().abs())
    return torch.where(x == 0, torch.zeros_like(x, dtype=torch.float32), torch.exp2(exponent.float() - 8))


def logfmt_error_bound(ref_in, idxs, ws, dispatch_results, me: int) -> torch.Tensor:
    """f32 [N, H]: per output element of rank me, the sum over its terms of |w| * _logfmt_term_slack (the
    reference's combine run over the slacks, 1% up for the bf16 roundings of slack and sum)."""
    slack_in = [(_logfmt_term_slack(y) * 1.01).to(torch.bfloat16) for y in ref_in]
    abs_ws = [w.abs() for w in ws]
    slack = reference_ll.low_latency_combine(slack_in, idxs, abs_ws, dispatch_results, ranks=(me,))[me]["combined_x"]
    return slack.float() * 1.01


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepEP's similarity measure: 1 - 2 <x, y> / (<x, x> + <y, y>), 0 for identical tensors."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator) if denominator > 0 else 0.0


# Tolerances of a LogFMT combine against reference_ll (castable channels).
# Expected differences. The kernels' lg2/ex2.approx differ from the reference's float32 log2/exp2 by about 2^-22
# (PTX ISA: lg2.approx absolute error about 2^-22.6 on the mantissa; exp2f, one ex2.approx, 2 ulp), and they
# multiply by 1/step where the reference divides. A coded term therefore decodes differently only where its
# q = (log2|x| - log_amin) / step + rho lies within that error of a code boundary (probability about 2 |dq|,
# |dq| ~ 2^-22 (1 + |u|) / step + ulp(q) ~ 1e-5: a one-step change) or where its decoded float32 lies that close to
# a bf16 rounding midpoint (about 2^-22 / 2^-8 ~ 3e-5: one bf16 ulp): about 4e-5 of the terms. An output element
# differs when one of its terms does and the change survives the sum's bf16 rounding (about 0.4 of the time).
# tools/logfmt_rate_model.py emulates the kernels' float32 sequence with errors uniform in +-2^-22 on these cases:
# 1.7e-5 to 2.5e-5 differing elements per (output element, coded term) pair; 3.8e-5 to 4.8e-5 with an extra 2 ulp
# on every lg2/ex2 result (pessimistic).
# Allowed: LOGFMT_ALLOWED_FACTOR x the expected count at LOGFMT_PAIR_RATE (2.1 to 2.6x the pessimistic model), and
# at least LOGFMT_MIN_ALLOWED elements (a small sample expects less than one; Poisson noise alone gives a few). A
# rounding offset of 1.5 instead of rho (exact otherwise) gives 7e-4 to 1e-3 per pair, 7 to 10x the allowance; a
# systematic off-by-one code far more. Every element must also lie within logfmt_error_bound (a wrong high bit or
# sign, even in one element, is far outside it), and DeepEP's calc_diff must stay below 1e-6 (rare one-step changes
# of about 1% give about 1e-9; its LL combine test allows 1e-5 against the unencoded values).
# check_logfmt_combined logs the measured count on every run (Checker.notes), so the GPU logs show the real rate.
LOGFMT_PAIR_RATE = 2e-5
LOGFMT_ALLOWED_FACTOR = 5
LOGFMT_MIN_ALLOWED = 8
LOGFMT_MAX_CALC_DIFF = 1e-6


def logfmt_num_pairs(topk_idx: torch.Tensor, coded_channels: int) -> int:
    """(output element, coded term) pairs of one rank's LogFMT combine: its selections (topk_idx >= 0, no masked
    ranks) times the channels compared with a tolerance."""
    return int((topk_idx >= 0).sum()) * int(coded_channels)


def logfmt_allowed_differing(num_pairs: int) -> int:
    """Output elements of a LogFMT combine that may differ from the reference (see the derivation above)."""
    if num_pairs < 0:
        raise ValueError(f"num_pairs must be >= 0, got {num_pairs}")
    return max(LOGFMT_MIN_ALLOWED, math.ceil(LOGFMT_ALLOWED_FACTOR * LOGFMT_PAIR_RATE * num_pairs))


def check_logfmt_combined(chk: Checker, what: str, got, ref, bound, bf16_channels, num_pairs: int) -> None:
    """LogFMT combined output against the reference: exact on bf16_channels (divisions that travel as bf16),
    within the tolerances above elsewhere (num_pairs: logfmt_num_pairs of the call). Logs the measured fraction
    in chk.notes."""
    got = got.to(ref.device)
    chk.equal(f"{what}, channels sent as bf16", got[:, bf16_channels], ref[:, bf16_channels])
    got, ref, bound = got[:, ~bf16_channels], ref[:, ~bf16_channels], bound[:, ~bf16_channels]
    if got.numel() == 0:
        return
    err = (got.float() - ref.float()).abs()
    # Plus one bf16 ulp: both outputs are the same kind of sum rounded to bf16 once.
    limit = bound + _bf16_ulp(torch.maximum(got.float().abs(), ref.float().abs()))
    differing = int((got.view(torch.int16) != ref.view(torch.int16)).sum())
    allowed = logfmt_allowed_differing(num_pairs)
    diff = calc_diff(got, ref)
    chk.notes.append(
        f"{what}: {differing} of {got.numel()} LogFMT elements differ from the reference "
        f"({differing / got.numel():.4%}; {differing / max(num_pairs, 1):.2e} per coded term, expected "
        f"about {LOGFMT_PAIR_RATE:g}; allowed {allowed}), calc_diff {diff:.2e}"
    )
    for ok, message in (
        (
            bool((err <= limit).all()),
            lambda: (
                f"{int((err > limit).sum())} elements beyond one LogFMT step per term "
                f"(worst excess {float((err - limit).max()):.3g})"
            ),
        ),
        (
            differing <= allowed,
            lambda: (
                f"{differing} of {got.numel()} elements differ from the reference "
                f"({differing / max(num_pairs, 1):.2e} per coded term; allowed {allowed}, "
                f"{LOGFMT_ALLOWED_FACTOR}x the expected {LOGFMT_PAIR_RATE:g})"
            ),
        ),
        (diff <= LOGFMT_MAX_CALC_DIFF, lambda: f"calc_diff {diff:.3g} > {LOGFMT_MAX_CALC_DIFF:g}"),
    ):
        chk.checks += 1
        if not ok:
            chk.failures.append(f"{what}: {message()}")


def run_ll_case(buffer, case: LLCase, seed: int, reference_device=None) -> Checker:
    """One case on this rank, every round against ep_rt.reference_ll, its inputs made and the reference run on
    checker.reference_device_of(buffer, reference_device)."""
    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    rdev = reference_device_of(buffer, reference_device)
    chk = Checker(case)
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // R
    stats = torch.zeros(L, dtype=torch.int32, device=dev) if case.stats else None
    wait_stats = torch.zeros(R, dtype=torch.int64, device=dev) if case.stats else None
    for rnd in range(case.rounds):
        s = seed * 31 + rnd
        xs, idxs, ws = ll_inputs(case, s, R, rdev)
        want = reference_ll.low_latency_dispatch(
            xs, idxs, T, E, use_fp8=case.use_fp8, round_scale=case.round_scale, use_ue8m0=case.use_ue8m0
        )
        x_me, idx_me, w_me = xs[me].to(dev), idxs[me].to(dev), ws[me].to(dev)
        recv, count, handle, event, hook = buffer.low_latency_dispatch(
            x_me,
            idx_me,
            T,
            E,
            cumulative_local_expert_recv_stats=stats,
            dispatch_wait_recv_cost_stats=wait_stats,
            use_fp8=case.use_fp8,
            round_scale=case.round_scale,
            use_ue8m0=case.use_ue8m0,
            async_finish=case.async_finish,
            return_recv_hook=case.hook,
        )
        if case.hook:
            hook()
        if case.async_finish:
            event.current_stream_wait()
        recv_x, scales = recv if case.use_fp8 else (recv, None)
        mine = want[me]
        chk.equal(f"round {rnd} packed_recv_count", count, mine["packed_recv_count"])
        chk.equal(f"round {rnd} layout_range", handle[1], mine["packed_recv_layout_range"])
        _blocks(chk, f"round {rnd}", recv_x, scales, handle[0], handle[1], mine, L, R)
        if case.stats:
            chk.equal("cumulative_local_expert_recv_stats", stats, mine["packed_recv_count"] * (rnd + 1))
            chk.equal("dispatch_wait_recv_cost_stats counted for every source", [bool((wait_stats > 0).all())], [True])

        # Combine: outputs defined per (l, source, token), placed at each side's own packed rows.
        make_outputs = logfmt_expert_outputs if case.use_logfmt else expert_outputs
        ys = [make_outputs(s, r, L, R, T, H, rdev) for r in range(R)]
        ref_in = [
            to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(R)
        ]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, use_logfmt=case.use_logfmt, ranks=(me,))[me][
            "combined_x"
        ]
        x = to_packed(ys[me], handle[0].to(rdev), handle[1].to(rdev), T).to(dev)  # at the kernel's own rows
        out = torch.empty(x_me.size(0), H, dtype=torch.bfloat16, device=dev) if case.out else None
        if case.zero_copy:
            buffer.get_next_low_latency_combine_buffer(handle).copy_(x)
        combined, event, hook = buffer.low_latency_combine(
            x,
            idx_me,
            w_me,
            handle,
            use_logfmt=case.use_logfmt,
            zero_copy=case.zero_copy,
            async_finish=case.async_finish,
            return_recv_hook=case.hook,
            out=out,
        )
        if case.hook:
            hook()
        if case.async_finish:
            event.current_stream_wait()
        if out is not None:
            chk.equal("combine returns out", [combined.data_ptr() == out.data_ptr()], [True])
        if case.use_logfmt:
            bf16_channels = logfmt_bf16_channels(H, rdev)
            check_logfmt_combined(
                chk,
                f"round {rnd} combined_x",
                combined,
                ref,
                logfmt_error_bound(ref_in, idxs, ws, want, me),
                bf16_channels,
                logfmt_num_pairs(idxs[me], int((~bf16_channels).sum())),
            )
        else:
            chk.equal(f"round {rnd} combined_x", combined, ref)
    torch.cuda.synchronize()
    buffer.raise_if_failed()
    return chk


def run_ll_graph(buffer, seed: int, replays: int = 5, reference_device=None) -> Checker:
    """Capture dispatch + combine in one CUDA graph; replay with new inputs copied in, check every replay
    (reference_device: as run_ll_case's)."""
    case = LLCase("cuda graph", num_tokens=64, max_tokens=64, hidden=2048, num_experts=16)
    R, me, dev = buffer.group_size, buffer.rank, buffer.device
    rdev = reference_device_of(buffer, reference_device)
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // R
    chk = Checker(case)
    xs, idxs, ws = ll_inputs(case, seed, R, rdev)
    x_in, idx_in, w_in = (t[me].to(dev).clone() for t in (xs, idxs, ws))  # the captured inputs, refilled per replay
    y_in = torch.zeros(L, R * T, H, dtype=torch.bfloat16, device=dev)
    # Warm up (both buffers), then capture.
    for _ in range(2):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x_in, idx_in, T, E)
        buffer.low_latency_combine(y_in, idx_in, w_in, handle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x_in, idx_in, T, E)
        combined, _, _ = buffer.low_latency_combine(y_in, idx_in, w_in, handle)
    for rep in range(replays):
        s = seed * 17 + rep
        xs, idxs, ws = ll_inputs(case, s, R, rdev)
        want = reference_ll.low_latency_dispatch(xs, idxs, T, E)
        ys = [expert_outputs(s, r, L, R, T, H, rdev) for r in range(R)]
        ref_in = [
            to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(R)
        ]
        ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, ranks=(me,))[me]["combined_x"]
        # New inputs into the captured tensors; the layout is deterministic, so the expert outputs can be
        # placed before the replay runs the dispatch that produces that layout.
        x_in.copy_(xs[me])
        idx_in.copy_(idxs[me])
        w_in.copy_(ws[me])
        y_in.copy_(ref_in[me])
        graph.replay()
        torch.cuda.synchronize()
        recv_x, scales = recv
        chk.equal(f"replay {rep} count", count, want[me]["packed_recv_count"])
        chk.equal(f"replay {rep} layout_range", handle[1], want[me]["packed_recv_layout_range"])
        _blocks(chk, f"replay {rep}", recv_x, scales, handle[0], handle[1], want[me], L, R)
        chk.equal(f"replay {rep} combined_x", combined, ref)
    buffer.raise_if_failed()
    return chk
