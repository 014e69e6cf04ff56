"""The layout kernel against ep_rt.reference, bit-exact, on fresh random and adversarial routing."""

import os

import pytest
import torch

from ep_rt import reference
from ep_rt.ops.layout import LayoutOp

pytestmark = pytest.mark.smoke

SEED = int.from_bytes(os.urandom(4), "little")


def routings(num_tokens, num_experts, num_topk, gen):
    scores = torch.rand(num_tokens, num_experts, generator=gen)
    uniform = torch.topk(scores, num_topk, dim=1).indices
    holes = torch.where(torch.rand(uniform.shape, generator=gen) < 0.3, torch.full_like(uniform, -1), uniform)
    all_minus_one = torch.full_like(uniform, -1)
    hot = torch.zeros_like(uniform)  # duplicates: every k picks expert 0
    rand_dupes = torch.randint(-1, num_experts, uniform.shape, generator=gen)
    return {
        "uniform": uniform,
        "holes": holes,
        "all -1": all_minus_one,
        "one hot expert": hot,
        "random with duplicates": rand_dupes,
    }


@pytest.mark.parametrize(
    "num_ranks,num_experts,num_topk,num_tokens",
    [
        (2, 256, 8, 4096),
        (4, 64, 4, 1000),
        (8, 288, 8, 128),
        (8, 8192, 32, 3000),
        (16, 256, 8, 777),
        (32, 64, 6, 513),
        (2, 2, 1, 1),
        (8, 64, 8, 0),
        (1, 16, 3, 100),
    ],
)
def test_layout_kernel_matches_reference(num_ranks, num_experts, num_topk, num_tokens):
    op = LayoutOp(torch.cuda.current_device(), torch.cuda.get_device_properties(0).multi_processor_count)
    gen = torch.Generator().manual_seed(SEED + num_ranks * 7919 + num_tokens)
    stream = torch.cuda.current_stream()
    for name, idx in routings(num_tokens, num_experts, num_topk, gen).items():
        idx = idx.cuda()
        per_rank, per_node, per_expert, in_rank, _ = op(idx, num_experts, num_ranks, stream, stream)
        want = reference.dispatch_layout(idx, num_experts, num_ranks)
        torch.cuda.synchronize()
        assert torch.equal(per_rank, want[0]), (name, SEED)
        if want[1] is None:
            assert per_node is None
        else:
            assert torch.equal(per_node, want[1]), (name, SEED)
        assert torch.equal(per_expert, want[2]), (name, SEED)
        assert torch.equal(in_rank, want[3]), (name, SEED)


def test_launch_with_attributes_matches_plain_launch():
    """cuLaunchKernelEx with the cooperative attribute (and a cluster of 1) gives the same layout."""
    from ep_rt.runtime import abi as params, modules as cubins
    from ep_rt.runtime.launch import Launcher

    dev = torch.cuda.current_device()
    op = LayoutOp(dev, 8)
    gen = torch.Generator().manual_seed(SEED)
    idx = torch.topk(torch.rand(2048, 64, generator=gen), 6, dim=1).indices.cuda()
    want = reference.dispatch_layout(idx, 64, 4)
    op.kernel = Launcher(
        cubins.load_family(dev, "layout"), "ep_rt_get_dispatch_layout", params.LayoutParams, cooperative=True
    )
    stream = torch.cuda.current_stream()
    per_rank, _, per_expert, in_rank, _ = op(idx, 64, 4, stream, stream)
    torch.cuda.synchronize()
    assert torch.equal(per_rank, want[0]) and torch.equal(per_expert, want[2]) and torch.equal(in_rank, want[3])
