"""Per-rank body of the Megatron-Core client test (module level, so spawned ranks import it; megatron is imported
inside, after the deep_ep alias is installed). Megatron's own fused_dispatch / fused_combine run forward and backward
on ep_rt; the ranks return what they got as plain lists (tensors shared between processes would need the sender
alive when the parent reads them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

N, H, K, E = 96, 256, 4, 16  # tokens per rank, hidden, top-k, experts


def make_inputs(seed: int, rank: int):
    """Rank `rank`'s x (bf16), token_indices (int64, some -1 as Megatron's capacity dropping makes), token_probs (f32)
    and the loss weights g, the same in every process."""
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(N, H, generator=gen).to(torch.bfloat16)
    probs, idx = torch.topk(torch.rand(N, E, generator=gen), K, dim=1)
    idx = torch.where(torch.rand(N, K, generator=gen) < 0.15, torch.full_like(idx, -1), idx)
    idx[:3] = -1  # tokens routed nowhere
    g = torch.randn(N, H, generator=gen)
    return x, idx, probs.contiguous(), g


def expert(recv_x, recv_idx, recv_probs):
    """A stand-in expert: each received row scaled by 1 + this rank's share of its routing weight."""
    share = (recv_probs * (recv_idx >= 0)).sum(dim=1, keepdim=True)
    return (recv_x.float() * (1.0 + share)).to(torch.bfloat16)


def _plain(t):
    return {
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "values": (t.float() if t.is_floating_point() else t).cpu().tolist(),
    }


def megatron_rank(rank, num_ranks, seed, async_modes):
    import ep_rt

    ep_rt.install_deep_ep_alias()
    from megatron.core.transformer.moe import fused_a2a

    assert fused_a2a.HAVE_DEEP_EP and fused_a2a.Buffer is ep_rt.Buffer, "megatron did not pick up ep_rt"
    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    out = {}
    for async_finish in async_modes:
        x0, idx0, probs0, g0 = make_inputs(seed, rank)
        x = x0.to(dev).requires_grad_()
        probs = probs0.to(dev).requires_grad_()
        recv_x, recv_idx, recv_probs, tokens_per_expert, handle = fused_a2a.fused_dispatch(
            x, idx0.to(dev), probs, E, group, async_finish=async_finish, allocate_on_comm_stream=async_finish
        )
        combined, _ = fused_a2a.fused_combine(
            expert(recv_x, recv_idx, recv_probs),
            group,
            handle,
            async_finish=async_finish,
            allocate_on_comm_stream=async_finish,
        )
        (combined.float() * g0.to(dev)).sum().backward()
        torch.cuda.synchronize()
        out[async_finish] = {
            name: _plain(t)
            for name, t in (
                ("recv_x", recv_x),
                ("recv_idx", recv_idx),
                ("recv_probs", recv_probs),
                ("tokens_per_expert", tokens_per_expert),
                ("combined", combined),
                ("grad_x", x.grad),
                ("grad_probs", probs.grad),
            )
        }
    dist.barrier()  # every rank's kernels are done before any rank frees its buffer
    fused_a2a._buffer = None  # Megatron's cached Buffer: released here, while the process group still exists
    return out
