"""Exact comparison for the reference's CPU tests: same dtype, same shape, same bits (as the GPU checker compares)."""

import torch


def T(data, dtype):
    return torch.tensor(data, dtype=dtype)


def _bits(t):
    """Floating tensors as their bit patterns (so -0.0 != 0.0 and NaN == NaN, as the GPU checker compares)."""
    if not t.is_floating_point():
        return t
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_eq(a, b):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(_bits(a), _bits(b)), f"\n{a}\n!=\n{b}"
