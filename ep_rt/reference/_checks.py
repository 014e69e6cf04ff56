"""Argument checks shared by the reference modules (the oracle validates its inputs like the real API)."""

import torch


# ----------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------
def _check_tensor(t, name, dtype=None, ndim=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def _check_topk_idx(topk_idx, num_experts, name="topk_idx"):
    _check_tensor(topk_idx, name, (torch.int64, torch.int32), 2)
    if topk_idx.numel() > 0 and (topk_idx.min() < -1 or topk_idx.max() >= num_experts):
        raise ValueError(
            f"{name} values must lie in [-1, {num_experts}), got range [{int(topk_idx.min())}, {int(topk_idx.max())}]"
        )


def _check_experts(num_experts, num_ranks):
    if num_ranks < 1 or num_experts < 1:
        raise ValueError(f"need num_experts >= 1 and num_ranks >= 1, got {num_experts}, {num_ranks}")
    if num_experts % num_ranks != 0:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by num_ranks ({num_ranks})")


def _split_x(x, name):
    """Returns (data, scales-or-None) for a bf16 tensor or an (fp8, scales) tuple."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"{name} must be a bf16 tensor or an (fp8, scales) pair")
        data, scales = x
        _check_tensor(data, f"{name}[0]", torch.float8_e4m3fn, 2)
        _check_tensor(scales, f"{name}[1]", (torch.float32, torch.int32), 2)
        if scales.shape[0] != data.shape[0]:
            raise ValueError(f"{name}: scales rows ({scales.shape[0]}) != x rows ({data.shape[0]})")
        return data, scales
    _check_tensor(x, name, torch.bfloat16, 2)
    return x, None


# ----------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------
def _check_per_rank(lst, name, R):
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{name} must be a list with one entry per rank, got {type(lst).__name__}")
    if len(lst) != R:
        raise ValueError(f"{name} must have one entry per rank ({R}), got {len(lst)}")


def _check_masked(masked_ranks, R):
    masked = set(int(r) for r in masked_ranks)
    bad = sorted(r for r in masked if not 0 <= r < R)
    if bad:
        raise ValueError(f"masked_ranks must lie in [0, {R}), got {bad}")
    return masked


def _check_ranks(ranks, R):
    """A set of ranks to compute results for, each in [0, R), at least one."""
    chosen = set(int(r) for r in ranks)
    bad = sorted(r for r in chosen if not 0 <= r < R)
    if bad or not chosen:
        raise ValueError(f"ranks must be one or more ranks in [0, {R}), got {sorted(chosen)}")
    return chosen


def _pack_range(begin, count):
    return (int(begin) << 32) | int(count)


def _given_expert_counts(num_tokens_per_experts, derived, num_ranks, num_experts):
    """The per-expert counts each rank passes to dispatch (num_tokens_per_experts, checked), which make
    num_recv_tokens_per_expert_list as in DeepEP with or without top-k; `derived` (from topk_idx) when None."""
    if num_tokens_per_experts is None:
        return derived
    if len(num_tokens_per_experts) != num_ranks:
        raise ValueError(
            f"num_tokens_per_experts must have one entry per rank ({num_ranks}), got {len(num_tokens_per_experts)}"
        )
    for r, counts in enumerate(num_tokens_per_experts):
        _check_tensor(counts, f"num_tokens_per_experts[{r}]", torch.int32, 1)
        if counts.shape != (num_experts,):
            raise ValueError(f"num_tokens_per_experts[{r}] shape {tuple(counts.shape)} != {(num_experts,)}")
    return list(num_tokens_per_experts)
