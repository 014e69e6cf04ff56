"""Torch tensors over device memory that a transport owns (no copy, no ownership taken): the caller's part of an
NVL or symmetric buffer, a staging area, control words read by tests."""

from __future__ import annotations

import torch


class _CudaArray:
    def __init__(self, ptr: int, shape: tuple, typestr: str, strides):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
            "strides": strides,
        }


def device_tensor(
    ptr: int, shape: tuple, device: torch.device, typestr: str = "|u1", strides: tuple | None = None
) -> torch.Tensor:
    """A tensor of `shape` at device address `ptr` (typestr as __cuda_array_interface__: "|u1" bytes, "<i2", "<i8";
    strides in bytes, None for contiguous). It does not keep the memory alive: its owner must outlive it."""
    return torch.as_tensor(_CudaArray(ptr, shape, typestr, strides), device=device)
