"""The plain-torch expectation of the Megatron-Core GPU test (tests/gpu/test_megatron_gpu.py), checked on the CPU
against a second, independent derivation: ep_rt.reference's dispatch and combine (differentiable torch ops) with
torch autograd for the gradients. So the GPU test compares ep_rt with an expectation that is itself checked."""

import torch

from ep_rt import reference

from ..gpu import megatron_worker as mw
from ..gpu.test_megatron_gpu import R, expectation

SEED = 1234


def test_expectation_exercises_the_routing():
    want = expectation(SEED)
    for me in range(R):
        assert 0 < want[me]["recv_x"].size(0) < R * mw.N
        assert int(want[me]["tokens_per_expert"].sum()) == int((want[me]["recv_idx"] >= 0).sum())
        assert (want[me]["combined"][:3] == 0).all() and (want[me]["grad_x"][:3] == 0).all()  # routed nowhere
        assert want[me]["grad_probs"].abs().sum() > 0


def test_expectation_agrees_with_autograd_through_the_reference():
    inputs = [mw.make_inputs(SEED, r) for r in range(R)]
    xs = [x.clone().requires_grad_() for x, _, _, _ in inputs]
    ps = [p.clone().requires_grad_() for _, _, p, _ in inputs]
    dispatched = reference.intranode_dispatch(xs, [i for _, i, _, _ in inputs], ps, mw.E, num_channels=4)
    ys = [mw.expert(d["recv_x"], d["recv_topk_idx"], d["recv_topk_weights"]) for d in dispatched]
    combined = reference.intranode_combine(ys, dispatched)
    sum((c["combined_x"].float() * g).sum() for c, (_, _, _, g) in zip(combined, inputs)).backward()
    want = expectation(SEED)
    for r in range(R):
        assert torch.equal(dispatched[r]["recv_x"], want[r]["recv_x"])
        assert torch.equal(dispatched[r]["recv_topk_idx"], want[r]["recv_idx"])
        assert torch.equal(dispatched[r]["recv_topk_weights"], want[r]["recv_probs"])
        assert dispatched[r]["num_recv_tokens_per_expert_list"] == want[r]["tokens_per_expert"].tolist()
        assert torch.equal(combined[r]["combined_x"], want[r]["combined"])
        # autograd sums the two ranks' bf16 gradients in bf16, ep_rt's combine in f32: within bf16 rounding
        torch.testing.assert_close(xs[r].grad, want[r]["grad_x"])
        torch.testing.assert_close(ps[r].grad, want[r]["grad_probs"], rtol=1e-5, atol=1e-4)
