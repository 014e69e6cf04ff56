"""Per-rank bodies of the multi-GPU tests (module level so spawned processes can import them)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ep_rt import Buffer, Config, selfcheck
from ep_rt import _driver
from ep_rt.errors import BufferTooSmallError, CommTimeoutError, EpRtError

MB = 1 << 20


def buffer_basics(rank, num_ranks):
    buf = Buffer(dist.group.WORLD, 64 * MB, explicitly_destroy=True)
    assert (buf.rank, buf.group_size, buf.num_nvl_bytes) == (rank, num_ranks, 64 * MB)
    assert buf.low_latency_mode is False and buf.explicitly_destroy is True
    assert isinstance(buf.get_comm_stream(), torch.cuda.Stream)
    assert Buffer.is_sm90_compiled()
    # Peer mapping: each rank writes a pattern into its own buffer; every rank reads every peer's.
    local = buf.get_local_buffer_tensor(torch.int32, size=(1024,), offset=256)
    local.copy_(torch.arange(1024, dtype=torch.int32, device=buf.device) * (rank + 1) + 7)
    torch.cuda.synchronize()
    buf.runtime.barrier(buf.comm_stream)
    seen = []
    for peer in range(num_ranks):
        view = buf.runtime.data_tensor(peer)[256:256 + 4096].view(torch.int32)
        want = torch.arange(1024, dtype=torch.int32, device=buf.device) * (peer + 1) + 7
        seen.append(bool(torch.equal(view, want)))
    assert all(seen), f"rank {rank} read wrong bytes from peers: {seen}"
    # Device barrier several times in a row.
    for _ in range(5):
        buf.runtime.barrier(buf.comm_stream)
    ev = Buffer.capture()
    ev.current_stream_wait()
    buf.destroy()
    buf.destroy()  # idempotent
    try:
        buf.get_dispatch_layout(torch.zeros(1, 1, dtype=torch.int64, device=buf.device), 2)
        raise AssertionError("a destroyed Buffer accepted a call")
    except EpRtError as e:
        assert "destroyed" in str(e)
    implicit = Buffer(dist.group.WORLD, 1 * MB)
    try:
        implicit.destroy()
        raise AssertionError("destroy() on a Buffer without explicitly_destroy must raise")
    except EpRtError:
        pass
    return seen


def suite(rank, num_ranks, case_names=None, aggressive=False):
    os.environ["EP_RT_AGGRESSIVE_PTX"] = "1" if aggressive else "0"
    cases = selfcheck.standard_cases(num_ranks)
    if case_names is not None:
        cases = [c for c in cases if c.name in case_names]
    need = Config(24).get_nvl_buffer_size_hint(7168 * 2, num_ranks, 4096)
    buf = Buffer(dist.group.WORLD, need, explicitly_destroy=True)
    seed = selfcheck.shared_seed(buf.group)
    out = []
    for i, case in enumerate(cases):
        chk = selfcheck.run_case(buf, case, seed + i)
        out.append((case.name, chk.checks, chk.failures))
    buf.destroy()
    return {"seed": seed, "cases": out, "variant": "aggressive" if aggressive else "safe"}


def create_destroy(rank, num_ranks, cycles=20):
    def free_bytes():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return _driver.mem_get_info()[0]

    buf = Buffer(dist.group.WORLD, 256 * MB, explicitly_destroy=True)
    buf.destroy()
    before = free_bytes()
    for _ in range(cycles):
        buf = Buffer(dist.group.WORLD, 256 * MB, explicitly_destroy=True)
        x = torch.randn(64, 256, device=buf.device).to(torch.bfloat16)
        idx = torch.randint(0, 16, (64, 2), device=buf.device)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 16)
        buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                     topk_idx=idx, topk_weights=torch.rand(64, 2, device=buf.device))
        buf.destroy()
        del buf
    after = free_bytes()
    return before - after


def timeout(rank, num_ranks):
    """Rank 0 dispatches alone; it must raise an error naming rank 1 and the phase, not hang."""
    buf = Buffer(dist.group.WORLD, 16 * MB, timeout_s=3.0)
    x = torch.randn(32, 128, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, 8, (32, 2), device=buf.device)
    w = torch.rand(32, 2, device=buf.device)
    messages = []
    if rank == 0:
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 8)
        t0 = time.monotonic()
        try:
            buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                         topk_idx=idx, topk_weights=w)
            raise AssertionError("dispatch without peers returned")
        except CommTimeoutError as e:
            messages.append((str(e), time.monotonic() - t0))
        try:  # the Buffer stays failed
            buf.get_dispatch_layout(idx, 8)
            raise AssertionError("a failed Buffer accepted a call")
        except CommTimeoutError as e:
            messages.append((str(e), 0.0))
    dist.barrier()
    # Same for num_worst_tokens, where the host does not wait: the error surfaces at the next call.
    buf2 = Buffer(dist.group.WORLD, 16 * MB, timeout_s=3.0)
    if rank == 0:
        per_rank, _, per_expert, in_rank, _ = buf2.get_dispatch_layout(idx, 8)
        buf2.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                      topk_idx=idx, topk_weights=w, num_worst_tokens=64)
        torch.cuda.synchronize()
        try:
            buf2.get_dispatch_layout(idx, 8)
            raise AssertionError("the failed num_worst_tokens dispatch was not reported")
        except CommTimeoutError as e:
            messages.append((str(e), 0.0))
    dist.barrier()
    return messages


def too_small(rank, num_ranks):
    """A dispatch that does not fit raises on every rank, and the Buffer stays usable."""
    buf = Buffer(dist.group.WORLD, 1 * MB, explicitly_destroy=True)
    x = torch.randn(512, 2048, device=buf.device).to(torch.bfloat16)
    idx = torch.randint(0, 8, (512, 4), device=buf.device)
    w = torch.rand(512, 4, device=buf.device)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 8)
    message = None
    try:
        buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                     topk_idx=idx, topk_weights=w)
    except BufferTooSmallError as e:
        message = str(e)
    small = x[:8].contiguous()
    sidx = idx[:8].contiguous()
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(sidx, 8)
    recv, *_ = buf.dispatch(small, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=sidx, topk_weights=w[:8].contiguous())
    torch.cuda.synchronize()
    buf.destroy()
    return message, recv.size(0)
