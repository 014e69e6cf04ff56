"""Reference FP8 casts: e4m3 with one scale per 128 channels, UE8M0 packing (deepep-v1-reference.md 2.7)."""

import torch

from ._checks import _check_tensor

FP8_MAX = 448.0
FP8_MARGIN = 1e-4


# ----------------------------------------------------------------------------------------
# FP8 helpers (per 128 channels along the last dim)
# ----------------------------------------------------------------------------------------
def _f32_bits(x):
    return x.contiguous().view(torch.int32)


def _bits_f32(bits):
    return bits.to(torch.int32).contiguous().view(torch.float32)


def per_token_cast_to_fp8(x, round_scale=False, use_ue8m0=False):
    """Casts x [..., H] to fp8 e4m3 with one scale per 128 channels (DeepEP LL kernel semantics).

    amax = max(1e-4, max |x| of the group) in f32. Default: scale_inv = amax * f32(1/448)
    (a multiply by f32(1/448)), scale = 448 / amax as one correctly rounded f32 division. round_scale: scale_inv =
    2**ceil(log2(amax * f32(1/448))) computed exactly from the float bits, scale = 1 / scale_inv.
    Returns (fp8 [..., H], scale_inv f32 [..., H/128]) or, with use_ue8m0, packed int32 [..., H/512].
    """
    _check_tensor(x, "x")
    if not x.is_floating_point() or x.dtype == torch.float8_e4m3fn or x.dim() < 1:
        raise TypeError(f"x must be a floating tensor (bf16/f16/f32) with >= 1 dim, got {x.dtype}")
    H = x.shape[-1]
    if H % 128 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 128")
    if use_ue8m0 and not round_scale:
        raise ValueError("use_ue8m0 requires round_scale=True")
    if use_ue8m0 and H % 512 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 512 with use_ue8m0")
    groups = x.float().reshape(*x.shape[:-1], H // 128, 128)
    amax = groups.abs().amax(dim=-1).clamp(min=FP8_MARGIN)
    inv_max = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=x.device)
    if round_scale:
        bits = _f32_bits(amax * inv_max)
        exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # ceil(log2)
        scale_inv = _bits_f32((exponent + 127) << 23)
        scale = _bits_f32((127 - exponent) << 23)
    else:
        scale_inv = amax * inv_max
        # A true f32 division (torch's `scalar / tensor` is reciprocal-then-multiply, one ulp off at times).
        scale = torch.full_like(amax, FP8_MAX) / amax
    values = (groups * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    values = values.reshape(x.shape)
    return values, (pack_ue8m0(scale_inv) if use_ue8m0 else scale_inv)


def pack_ue8m0(scale_inv):
    """Packs f32 power-of-two scales [..., S] into int32 [..., S/4]: byte = bits >> 23,
    byte j of each group of 4 goes to bits 8j..8j+7 (little-endian)."""
    _check_tensor(scale_inv, "scale_inv", torch.float32)
    if scale_inv.dim() < 1 or scale_inv.shape[-1] % 4 != 0:
        raise ValueError(f"last dim of scale_inv must be a multiple of 4, got {tuple(scale_inv.shape)}")
    if scale_inv.numel() == 0:
        return torch.empty(*scale_inv.shape[:-1], scale_inv.shape[-1] // 4, dtype=torch.int32, device=scale_inv.device)
    bits = _f32_bits(scale_inv)
    exp = (bits >> 23) & 0xFF
    ok = (bits >= 0) & ((bits & 0x7FFFFF) == 0) & (exp > 0) & (exp < 255)
    if not bool(ok.all()):
        raise ValueError("pack_ue8m0 requires positive, normal, power-of-two scales")
    b = exp.to(torch.int64).reshape(*scale_inv.shape[:-1], -1, 4)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)  # in [0, 2**32)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack_ue8m0(packed):
    """Inverse of pack_ue8m0: int32 [..., P] -> f32 [..., 4P] with bits = byte << 23."""
    _check_tensor(packed, "packed", torch.int32)
    if packed.dim() < 1:
        raise ValueError("packed must have at least one dim")
    word = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(4, device=packed.device, dtype=torch.int64) * 8
    b = (word.unsqueeze(-1) >> shifts) & 0xFF
    return _bits_f32(b << 23).reshape(*packed.shape[:-1], packed.shape[-1] * 4)


def per_token_cast_back(x_fp8, scales):
    """bf16(x.float() * scale_inv) with one scale per 128 channels (f32 or packed UE8M0 int32)."""
    _check_tensor(x_fp8, "x_fp8", torch.float8_e4m3fn)
    _check_tensor(scales, "scales", (torch.float32, torch.int32))
    if scales.dtype == torch.int32:
        scales = unpack_ue8m0(scales)
    H = x_fp8.shape[-1]
    if H % 128 != 0 or tuple(scales.shape) != tuple(x_fp8.shape[:-1]) + (H // 128,):
        raise ValueError(
            f"scales shape {tuple(scales.shape)} does not match x {tuple(x_fp8.shape)} (one scale per 128 channels)"
        )
    groups = x_fp8.float().reshape(*x_fp8.shape[:-1], H // 128, 128)
    return (groups * scales.unsqueeze(-1)).reshape(x_fp8.shape).to(torch.bfloat16)
