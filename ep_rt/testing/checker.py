"""What every GPU check shares: one fresh seed per run, agreed by all ranks, a strict case filter, and a bit-exact
comparer (dtype and shape first) that collects failures instead of stopping at the first."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def shared_seed(group) -> int:
    seed = [int.from_bytes(os.urandom(4), "little") if dist.get_rank(group) == 0 else 0]
    dist.broadcast_object_list(seed, src=dist.get_global_rank(group, 0), group=group)
    return seed[0]


def expert_recv_counts(idxs, rank: int, num_local_experts: int, device) -> torch.Tensor:
    """int64 [L]: rows each local expert of `rank` receives, from every rank's topk_idx in `idxs` (no host sync)."""
    L = num_local_experts
    want = torch.zeros(L, dtype=torch.int64, device=device)
    for r_idx in idxs:
        flat = r_idx.flatten()
        mine = (flat >= rank * L) & (flat < (rank + 1) * L)
        want.index_add_(0, torch.where(mine, flat - rank * L, torch.zeros_like(flat)), mine.to(torch.int64))
    return want


def reference_device_of(buffer, reference_device):
    """Where a check makes its inputs and runs the reference: reference_device, or by default the Buffer's GPU.
    "cpu" where many ranks share one GPU: their thousands of small reference ops and syncs per rank queue behind
    every other rank's there. The references are elementwise arithmetic in a fixed order (integer prefix sums,
    f32 adds and multiplies, the fp8 cast), the same bits on either device (tests/gpu/test_reference_devices_gpu.py;
    LogFMT's log2/exp2 aside, which its tolerance covers)."""
    return buffer.device if reference_device is None else torch.device(reference_device)


def _bits(t):
    """The same bytes as integers of the same width, so equal bits compare equal (NaN payloads, -0.0 too)."""
    return (
        t.contiguous().view(torch.uint8)
        if t.element_size() == 1
        else t.contiguous().view(
            torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4 else torch.int64
        )
    )


def select(cases, names, also=()):
    """The cases whose names are in `names`, in the cases' own order; `also`: further names the caller handles
    itself (a graph case, say). A name that is neither raises, listing the known names, so a renamed case cannot
    drop out of a filtered run unseen. names None: every case."""
    if names is None:
        return list(cases)
    names = [names] if isinstance(names, str) else list(names)
    known = [c.name for c in cases] + list(also)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown case names {unknown}; known: {known}")
    return [c for c in cases if c.name in names]


class Checker:
    def __init__(self, case):
        self.case, self.failures, self.checks = case, [], 0
        self.notes = []  # measurements worth logging on every run (e.g. how many LogFMT outputs differ)

    def equal(self, what: str, got, want, rows=None) -> None:
        """got must be want bit for bit, with want's dtype and shape. rows: only the first `rows` rows are defined
        (the API leaves the rest undefined, e.g. past num_recv with num_worst_tokens): both must still have want's
        whole shape, and only those rows are compared."""
        self.checks += 1
        if got is None or want is None:
            if (got is None) != (want is None):
                self.failures.append(
                    f"{what}: got {'None' if got is None else 'a tensor'}, want "
                    f"{'None' if want is None else 'a tensor'}"
                )
            return
        if isinstance(want, list):
            if list(got) != want:
                self.failures.append(f"{what}: got {list(got)[:8]}..., want {want[:8]}...")
            return
        if not isinstance(got, torch.Tensor):
            self.failures.append(f"{what}: got a {type(got).__name__}, want a tensor")
            return
        if got.dtype != want.dtype:
            self.failures.append(f"{what}: dtype {got.dtype} != {want.dtype}")
            return
        if got.shape != want.shape:
            self.failures.append(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        got = got.to(want.device)
        if rows is not None:
            if want.dim() == 0 or not 0 <= rows <= want.size(0):
                self.failures.append(
                    f"{what}: {rows} defined rows, but the expected tensor has shape {tuple(want.shape)}"
                )
                return
            got, want = got[:rows], want[:rows]
        if not torch.equal(_bits(got), _bits(want)):
            bad = (_bits(got) != _bits(want)).nonzero()
            self.failures.append(f"{what}: {bad.size(0)} elements differ, first at {bad[0].tolist()}")
