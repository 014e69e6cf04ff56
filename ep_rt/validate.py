"""Input checks that run before any kernel: each failure is a TypeError / ValueError saying what is wrong."""

from __future__ import annotations

import torch

from . import env
from .errors import GroupError, NoGpuError
from .transport import nvl_layout

# DeepEP's topk_idx_t, chosen here at import (EP_RT_TOPK_IDX_BITS) instead of at build time: the type of the
# top-k outputs (recv_topk_idx). Inputs may be int64 or int32 whatever it is; the kernels read both in place.
topk_idx_t = torch.int32 if env.topk_idx_bits() == 32 else torch.int64
TOPK_IDX_DTYPES = (torch.int64, torch.int32)
FP8_DTYPE = torch.float8_e4m3fn


def tensor(name: str, t, *, dtype=None, dtypes=None, ndim=None, device=None, contiguous=True, rows=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have one of dtypes {list(dtypes)}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (this Buffer's GPU), got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    if rows is not None and t.size(0) != rows:
        raise ValueError(f"{name} must have {rows} rows, got {t.size(0)}")
    return t


def topk_idx(t, device, rows=None) -> None:
    """Shape and dtype. The values are checked by the kernels, without a device sync (issue 23): an id outside
    [-1, num_experts) is treated as -1 and raised as a KernelError at the end of the call (ops/layout.py)."""
    tensor("topk_idx", t, dtypes=TOPK_IDX_DTYPES, ndim=2, device=device, rows=rows)
    if t.size(1) > nvl_layout.MAX_TOPK:
        raise ValueError(f"top-k is at most {nvl_layout.MAX_TOPK}, got {t.size(1)}")


def bits(t) -> int:
    """The width of a topk_idx tensor as the kernels' topk_idx_bits fields take it (64 for an absent one)."""
    return 64 if t is None else t.element_size() * 8


def experts(num_experts: int, num_ranks: int) -> int:
    if not isinstance(num_experts, int) or num_experts <= 0:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if num_experts % num_ranks:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by the number of ranks ({num_ranks})")
    local = num_experts // num_ranks
    if local > nvl_layout.MAX_LOCAL_EXPERTS:
        raise ValueError(f"at most {nvl_layout.MAX_LOCAL_EXPERTS} experts per rank, got {local}")
    return local


def dispatch_x(x, device):
    """Split x into (data, scales or None) and check it: bf16 [N, H], or (fp8 [N, H], scales [N, S])."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError("x as a tuple must be (fp8 tensor, scales)")
        data, scales = x
        tensor("x[0]", data, dtype=FP8_DTYPE, ndim=2, device=device)
        tensor(
            "x[1] (scales)",
            scales,
            dtypes=(torch.float32, torch.int32),
            ndim=2,
            device=device,
            contiguous=False,
            rows=data.size(0),
        )
        if scales.size(1) == 0:
            raise ValueError("x[1] (scales) has no columns")
    else:
        data, scales = x, None
        tensor("x", data, dtypes=(torch.bfloat16,), ndim=2, device=device)
    hidden_bytes = data.size(1) * data.element_size()
    if hidden_bytes == 0 or hidden_bytes % 16:
        raise ValueError(
            f"hidden size times element size must be a positive multiple of 16 bytes, got "
            f"{data.size(1)} x {data.element_size()}"
        )
    if data.data_ptr() % 16:
        raise ValueError("x must start at a 16-byte aligned address (slice it less, or .clone() it)")
    return data, scales


def process_group(group) -> None:
    """Buffer's `group`: a torch.distributed process group. None is what dist.group.WORLD is before
    init_process_group, so say that."""
    if group is not None:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise GroupError(
            "Buffer needs a torch.distributed process group, got None: torch.distributed is not "
            "initialised yet (dist.group.WORLD is None until torch.distributed.init_process_group() "
            "has run). Call init_process_group first, then pass dist.group.WORLD or a group of yours"
        )
    raise GroupError(
        "Buffer needs a torch.distributed process group, got None: pass dist.group.WORLD or a group "
        "from torch.distributed.new_group()"
    )


def cuda_available() -> None:
    """Before anything touches CUDA: say in ep_rt's words why there is no GPU to run on."""
    if torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        raise NoGpuError(
            f"ep_rt needs a CUDA GPU, and this torch ({torch.__version__}) is a CPU-only build: "
            f"install a CUDA build of torch (README 'Installing'); ep_rt.reference runs on the CPU"
        )
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise NoGpuError(
        f"ep_rt needs a CUDA GPU, and torch {torch.__version__} (CUDA {torch.version.cuda}) sees none "
        f"(CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}): check nvidia-smi, "
        f"the driver, and CUDA_VISIBLE_DEVICES; `python -m ep_rt doctor` says more"
    )
