#!/usr/bin/env python3
"""How many LogFMT combine outputs should differ from the reference? A CPU model of the kernels' codec.

The LL combine kernels encode and decode LogFMT-10 (kernels_src/include/ep_rt/logfmt.cuh) with the approximate
lg2.approx / ex2.approx instructions; the oracle (ep_rt/reference/logfmt.py) uses float32 log2 / exp2. This tool
emulates logfmt.cuh's float32 sequence step by step (the same IEEE round-to-nearest operations as its __f*_rn
intrinsics, the reciprocal of step, the order of every add) with lg2 / ex2 replaced by the exact function plus an
error drawn uniformly from +-E (absolute for lg2, relative for ex2; optionally also +-U ulps of the result), runs
the reference's combine on the emulated round trips of the GPU tests' LogFMT cases, and counts the output
elements that differ from the reference's LogFMT combine. It prints them per (output element, coded term) pair,
the unit of ep_rt.testing.selfcheck_ll's LogFMT allowance (LOGFMT_PAIR_RATE is taken from this model), and what a
rounding offset of 1.5 (a wrong oracle, exact otherwise) does to the same count.

    python tools/logfmt_rate_model.py                    # E = 2^-22 for both instructions
    python tools/logfmt_rate_model.py --error-log2 -21 --ulps 2 --seeds 3

The error bound is the documented accuracy rounded up (PTX ISA: lg2.approx.f32 absolute error about 2^-22.6 for
the mantissa; CUDA's exp2f, one ex2.approx, 2 ulp); the real instructions are deterministic functions, not noise,
so this gives a rate to expect, not a measurement: the GPU tests log the measured fraction on every run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ep_rt import reference_ll  # noqa: E402
from ep_rt.testing.selfcheck_ll import (
    LLCase,
    ll_cases,
    ll_inputs,
    logfmt_bf16_channels,  # noqa: E402
    logfmt_expert_outputs,
    logfmt_num_pairs,
    to_packed,
)


class Approx:
    """lg2 / ex2 with a uniform error: lg2(x) = f32(log2(x) + e), |e| <= abs_error + ulps * ulp(result);
    ex2(x) = f32(2^x * (1 + e)), |e| <= rel_error + ulps * 2^-24."""

    def __init__(self, gen: torch.Generator, abs_error: float, rel_error: float, ulps: float = 0.0):
        self.gen, self.abs_error, self.rel_error, self.ulps = gen, abs_error, rel_error, ulps

    def _noise(self, shape):
        return torch.rand(shape, generator=self.gen, dtype=torch.float64) * 2 - 1

    def lg2(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.log2(x.double())
        finite = torch.isfinite(y)
        _, exponent = torch.frexp(torch.where(finite, y, torch.ones_like(y)).float())
        bound = self.abs_error + self.ulps * torch.exp2(exponent.double() - 24)
        return torch.where(finite, y + self._noise(y.shape) * bound, y).float()

    def ex2(self, x: torch.Tensor) -> torch.Tensor:
        bound = self.rel_error + self.ulps * 2.0**-24
        return (torch.exp2(x.double()) * (1 + self._noise(x.shape) * bound)).float()


def emulated_roundtrip(y: torch.Tensor, approx: Approx) -> torch.Tensor:
    """bf16 [..., H]: logfmt.cuh's encode then decode of y, in float32, with approx's lg2 / ex2."""
    shape, D = y.shape, y.shape[-1] // 128
    g = y.float().reshape(*shape[:-1], D, 128)
    a = g.abs()
    amax = a.amax(-1)
    amin = torch.where(a == 0, torch.full_like(a, float("inf")), a).amin(-1)
    castable = (amax > 0) & (amax < 1) & (amin < amax)  # logfmt_castable: exact comparisons
    # logfmt_division (the same on both sides: computed from the bf16 meta, which holds amax / amin exactly)
    log_amax = approx.lg2(torch.where(castable, amax, torch.ones_like(amax)))
    log_amin = torch.maximum(approx.lg2(torch.where(castable, amin, torch.ones_like(amin) / 2)), log_amax - 32.0)
    step = torch.where(castable, (log_amax - log_amin) / 510.0, torch.ones_like(log_amax))
    # logfmt_encode8
    inv_step = (1.0 / step.double()).float()  # __frcp_rn
    rho = 2.0 - approx.lg2((1.0 + approx.ex2(step)) * 0.5) * inv_step
    q = (approx.lg2(a) - log_amin.unsqueeze(-1)) * inv_step.unsqueeze(-1) + rho.unsqueeze(-1)
    code = torch.floor(torch.clamp(q, min=0)).clamp(max=511)  # __float2uint_rd, min(., 511)
    # logfmt_decode
    e = approx.ex2((code - 1) * step.unsqueeze(-1) + log_amin.unsqueeze(-1))
    mag = torch.where(code == 0, torch.zeros_like(e), e)
    value = torch.where(torch.signbit(g), -mag, mag).to(torch.bfloat16).float()
    return torch.where(castable.unsqueeze(-1), value, g).reshape(shape).to(torch.bfloat16)


def reference_with_offset(y: torch.Tensor, offset: float) -> torch.Tensor:
    """The reference's round trip with the rounding offset rho replaced by a constant (a wrong oracle)."""
    enc = reference_ll.logfmt_encode(y)
    castable, log_amin, step = reference_ll.logfmt_params(enc["amax"], enc["amin"])
    D = castable.shape[-1]
    a = y.float().abs().reshape(*y.shape[:-1], D, 128)
    q = (torch.log2(a) - log_amin.unsqueeze(-1)) / step.unsqueeze(-1) + offset
    code = torch.floor(torch.clamp(q, min=0)).clamp(max=511)
    enc["codes"] = torch.where(castable.unsqueeze(-1), code, torch.zeros_like(code)).to(torch.int16)
    return reference_ll.logfmt_decode(enc)


def measure(case: LLCase, seed: int, roundtrip, num_ranks: int = 2) -> dict:
    """Differing LogFMT outputs (castable channels, every rank) when every rank's expert outputs go through
    roundtrip instead of the reference's codec; with the number of elements and of (element, term) pairs."""
    R, T, H, E = num_ranks, case.max_tokens, case.hidden, case.num_experts
    L = E // R
    xs, idxs, ws = ll_inputs(case, seed, R, "cpu")
    want = reference_ll.low_latency_dispatch(xs, idxs, T, E, use_fp8=False)
    ys = [logfmt_expert_outputs(seed, r, L, R, T, H, "cpu") for r in range(R)]
    ref_in = [
        to_packed(ys[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], T) for r in range(R)
    ]
    ref = reference_ll.low_latency_combine(ref_in, idxs, ws, want, use_logfmt=True)
    got = reference_ll.low_latency_combine([roundtrip(y) for y in ref_in], idxs, ws, want)
    coded = ~logfmt_bf16_channels(H, "cpu")
    out = {"elements": 0, "differing": 0, "pairs": 0}
    for me in range(R):
        a, b = got[me]["combined_x"][:, coded], ref[me]["combined_x"][:, coded]
        out["elements"] += a.numel()
        out["differing"] += int((a.view(torch.int16) != b.view(torch.int16)).sum())
        out["pairs"] += logfmt_num_pairs(idxs[me], int(coded.sum()))
    return out


def model_cases(max_experts: int) -> list:
    """The GPU tests' LogFMT cases, bf16 dispatch, at most max_experts experts (the rate per pair does not depend
    on the expert count; 288 experts x 7168 channels would not fit a CPU run)."""
    out = []
    for c in ll_cases(2):
        if c.use_logfmt:
            out.append(
                LLCase(
                    c.name,
                    max_tokens=c.max_tokens,
                    num_tokens=c.num_tokens,
                    hidden=c.hidden,
                    num_topk=c.num_topk,
                    num_experts=min(c.num_experts, max_experts),
                    use_fp8=False,
                    holes=c.holes,
                    use_logfmt=True,
                )
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--error-log2", type=float, default=-22.0, help="log2 of E (default -22)")
    ap.add_argument("--ulps", type=float, default=0.0, help="extra error in ulps of each result (default 0)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-experts", type=int, default=32)
    args = ap.parse_args(argv)
    E = 2.0**args.error_log2
    print(
        f"error model: lg2 +-2^{args.error_log2:g} absolute, ex2 +-2^{args.error_log2:g} relative, "
        f"+-{args.ulps:g} ulp of the result; {args.seeds} seeds x 2 ranks per case"
    )
    print(f"{'case':<62} {'elements':>9} {'differ':>7} {'per element':>12} {'per pair':>9} {'offset 1.5':>11}")
    for case in model_cases(args.max_experts):
        tot = {"elements": 0, "differing": 0, "pairs": 0}
        wrong = {"elements": 0, "differing": 0, "pairs": 0}
        for seed in range(args.seeds):
            approx = Approx(torch.Generator().manual_seed(seed), E, E, args.ulps)
            for k, v in measure(case, seed, lambda y: emulated_roundtrip(y, approx)).items():
                tot[k] += v
            for k, v in measure(case, seed, lambda y: reference_with_offset(y, 1.5)).items():
                wrong[k] += v
        print(
            f"{case.name:<62} {tot['elements']:>9} {tot['differing']:>7} "
            f"{tot['differing'] / tot['elements']:>12.2e} {tot['differing'] / tot['pairs']:>9.2e} "
            f"{wrong['differing'] / wrong['pairs']:>11.2e}"
        )
    print(
        "(per pair: differing elements / (element, coded term) pairs, the unit of LOGFMT_PAIR_RATE; "
        "offset 1.5: the same for an oracle with that offset)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
