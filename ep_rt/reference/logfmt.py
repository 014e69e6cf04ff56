"""Reference LogFMT-10 codec (per 128-channel division along the last dim; deepep-v1-reference.md 2.8)."""

import torch

from ._checks import _check_tensor

LOGFMT_DIVISION = 128  # channels per LogFMT division (and per FP8 scale)
LOGFMT_MAX_CODE = 511  # 9-bit codes; code 0 encodes zero
LOGFMT_NUM_STEPS = 510  # step = (log2 amax - log_amin) / 510
LOGFMT_MAX_LOG_RANGE = 32.0


# ----------------------------------------------------------------------------------------
# LogFMT-10 codec (per 128-channel division along the last dim)
# ----------------------------------------------------------------------------------------
def logfmt_params(amax, amin):
    """castable, log_amin, step (float32) from the bf16 amax / nonzero-amin of each division (public: the LL
    self-check and tools/logfmt_rate_model.py model the GPU's rounding from them)."""
    amax, amin = amax.float(), amin.float()
    log_amax = torch.log2(amax)
    log_amin_raw = torch.log2(amin)
    castable = (amax > 0) & (log_amax < 0) & (log_amin_raw < log_amax)
    log_amin = torch.maximum(log_amin_raw, log_amax - LOGFMT_MAX_LOG_RANGE)
    step = (log_amax - log_amin) / LOGFMT_NUM_STEPS
    # Neutral values where not castable (avoids inf/nan that are never used).
    log_amin = torch.where(castable, log_amin, torch.zeros_like(log_amin))
    step = torch.where(castable, step, torch.ones_like(step))
    return castable, log_amin, step


def logfmt_encode(x):
    """Encodes a bf16 tensor [..., H] (H % 128 == 0) with LogFMT-10, per 128-channel division.

    For each division: amax = max |x|, amin = min of the nonzero |x| (bf16 values). The division is
    encoded iff some value is nonzero, log2(amax) < 0 (all |x| < 1) and log2(amin) < log2(amax).
    Then log_amin = max(log2 amin, log2 amax - 32), step = (log2 amax - log_amin) / 510,
    rho = 2 - log2((1 + 2**step) / 2) / step, and
    code = min(floor(max((log2|x| - log_amin) / step + rho, 0)), 511) (9 bits, 0 = zero) plus a sign bit.
    Returns a dict: castable bool [..., D], amax / amin bf16 [..., D] (the meta; amin = inf
    for an all-zero division), codes int16
    [..., D, 128], signs bool [..., D, 128] and fallback bf16 [..., H] (x in non-castable divisions,
    0 elsewhere). All math in float32.
    """
    _check_tensor(x, "x", torch.bfloat16)
    if x.dim() < 1 or x.shape[-1] % LOGFMT_DIVISION != 0:
        raise ValueError(f"last dim of x must be a multiple of {LOGFMT_DIVISION}, got {tuple(x.shape)}")
    D = x.shape[-1] // LOGFMT_DIVISION
    g = x.float().reshape(*x.shape[:-1], D, LOGFMT_DIVISION)
    a = g.abs()
    amax = a.amax(dim=-1)
    amin = torch.where(a == 0, torch.full_like(a, float("inf")), a).amin(dim=-1)  # inf if all zero
    castable, log_amin, step = logfmt_params(amax, amin)
    step_, log_amin_ = step.unsqueeze(-1), log_amin.unsqueeze(-1)
    rho = 2 - torch.log2((1 + torch.exp2(step_)) / 2) / step_
    q = (torch.log2(a) - log_amin_) / step_ + rho  # -inf for zeros
    code = torch.floor(torch.clamp(q, min=0)).clamp(max=LOGFMT_MAX_CODE)
    code = torch.where(castable.unsqueeze(-1), code, torch.zeros_like(code)).to(torch.int16)
    signs = torch.signbit(g) & castable.unsqueeze(-1)
    keep = (~castable).unsqueeze(-1).expand_as(g).reshape(x.shape)
    fallback = torch.where(keep, x, torch.zeros_like(x))
    return {
        "castable": castable,
        "amax": amax.to(torch.bfloat16),
        "amin": amin.to(torch.bfloat16),
        "codes": code,
        "signs": signs,
        "fallback": fallback,
    }


def logfmt_decode(enc):
    """Decodes logfmt_encode's output to bf16: value = bf16(±2**((code - 1) * step + log_amin)),
    0 for code 0; non-castable divisions are returned unchanged (bf16)."""
    castable, codes, signs, fallback = enc["castable"], enc["codes"], enc["signs"], enc["fallback"]
    _, log_amin, step = logfmt_params(enc["amax"], enc["amin"])  # only used where castable
    c = codes.float()
    mag = torch.exp2((c - 1) * step.unsqueeze(-1) + log_amin.unsqueeze(-1))
    mag = torch.where(codes == 0, torch.zeros_like(mag), mag)
    val = torch.where(signs, -mag, mag).reshape(fallback.shape).to(torch.bfloat16)
    keep = castable.unsqueeze(-1).expand_as(c).reshape(fallback.shape)
    return torch.where(keep, val, fallback)


def logfmt_roundtrip(x):
    """decode(encode(x)): what a LogFMT combine delivers for a bf16 row (float32 math; the GPU uses
    lg2/ex2.approx, so compare GPU LogFMT results with a tolerance)."""
    return logfmt_decode(logfmt_encode(x))
