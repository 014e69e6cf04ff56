"""run_ll_case and run_ll_graph with the reference on another device than the Buffer's (reference_device: the 2x8
LL pools run it on the CPU), on the CPU against a stand-in Buffer whose "kernels" are the reference itself over
the inputs the case made for every rank: the inputs and the reference are made on reference_device, the Buffer gets
its own rank's inputs, and a wrong row of the stand-in's dispatch or combine is still caught."""

import pytest
import torch

from ep_rt import reference_ll
from ep_rt.testing import selfcheck_ll
from ep_rt.testing.selfcheck_ll import LLCase, to_packed


class _World:
    """What the case made for every rank (ll_inputs, the expert outputs), recorded as it made them."""

    def __init__(self):
        self.inputs = None
        self.outputs = {}  # rank -> its expert outputs of the latest round
        self.devices = set()


class _StandInLL:
    """A Buffer whose low-latency calls are ep_rt.reference_ll over the world's inputs (rank `rank` of R)."""

    def __init__(self, world, R, rank, wrong=None):
        self.world, self.group_size, self.rank, self.wrong = world, R, rank, wrong
        self.device = torch.device("cpu")

    def low_latency_dispatch(self, x, idx, T, E, use_fp8=True, round_scale=False, use_ue8m0=False, **modes):
        xs, idxs, _ = self.world.inputs
        assert torch.equal(x, xs[self.rank]) and torch.equal(idx, idxs[self.rank])
        self.want = reference_ll.low_latency_dispatch(
            xs, idxs, T, E, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0
        )
        mine = {k: v.clone() if v is not None else None for k, v in self.want[self.rank].items()}
        if self.wrong == "dispatch":
            mine["packed_recv_x"][0, 0] = mine["packed_recv_x"][0, 1]
        recv = (mine["packed_recv_x"], mine["packed_recv_x_scales"]) if use_fp8 else mine["packed_recv_x"]
        handle = (mine["packed_recv_src_info"], mine["packed_recv_layout_range"], T, x.size(1), E)
        self.T = T
        return recv, mine["packed_recv_count"], handle, None, None

    def low_latency_combine(self, x, idx, w, handle, out=None, **modes):
        _, idxs, ws = self.world.inputs
        R, me, want = self.group_size, self.rank, self.want
        if len(self.world.outputs) < R:  # (run_ll_graph's warm-up calls: nothing made yet, nothing checked)
            return torch.zeros(idx.size(0), x.size(-1), dtype=torch.bfloat16), None, None
        packed = [
            x
            if r == me
            else to_packed(
                self.world.outputs[r], want[r]["packed_recv_src_info"], want[r]["packed_recv_layout_range"], self.T
            )
            for r in range(R)
        ]
        combined = reference_ll.low_latency_combine(packed, idxs, ws, want, ranks=(me,))[me]["combined_x"]
        if self.wrong == "combine":
            combined[1, 2] += 1.0
        if out is not None:
            out.copy_(combined)
            combined = out
        return combined, None, None

    def get_next_low_latency_combine_buffer(self, handle):
        return torch.empty(0)

    def raise_if_failed(self):
        pass


@pytest.fixture
def world(monkeypatch):
    w = _World()
    real_inputs, real_outputs = selfcheck_ll.ll_inputs, selfcheck_ll.expert_outputs

    def inputs(case, seed, num_ranks, device):
        w.devices.add(str(device))
        w.inputs = real_inputs(case, seed, num_ranks, device)
        return w.inputs

    def outputs(seed, rank, L, R, T, H, device):
        w.devices.add(str(device))
        w.outputs[rank] = real_outputs(seed, rank, L, R, T, H, device)
        return w.outputs[rank]

    monkeypatch.setattr(selfcheck_ll, "ll_inputs", inputs)
    monkeypatch.setattr(selfcheck_ll, "expert_outputs", outputs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return w


CASES = [
    LLCase("bf16", max_tokens=16, num_tokens=12, hidden=256, num_experts=8, use_fp8=False),
    LLCase("fp8, out", max_tokens=16, num_tokens=12, hidden=256, num_experts=8, out=True, rounds=2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("rank", [0, 2])
def test_a_case_with_the_reference_on_the_cpu_passes_and_is_made_there(world, case, rank):
    chk = selfcheck_ll.run_ll_case(_StandInLL(world, 4, rank), case, seed=5, reference_device="cpu")
    assert chk.failures == [] and chk.checks >= 4
    assert world.devices == {"cpu"}


@pytest.mark.parametrize("wrong", ["dispatch", "combine"])
def test_a_wrong_row_is_caught_with_the_reference_on_the_cpu(world, wrong):
    chk = selfcheck_ll.run_ll_case(_StandInLL(world, 4, 1, wrong), CASES[0], seed=6, reference_device="cpu")
    assert any(("x[0]" if wrong == "dispatch" else "combined_x") in f for f in chk.failures), chk.failures


def test_the_graph_case_takes_the_reference_device(world, monkeypatch):
    """run_ll_graph makes its inputs and reference there too (the replays themselves need CUDA: only the setup up
    to the capture runs here)."""

    class _NoGraph(Exception):
        pass

    def no_graph():
        raise _NoGraph

    monkeypatch.setattr(torch.cuda, "CUDAGraph", no_graph)
    buf = _StandInLL(world, 16, 3)
    with pytest.raises(_NoGraph):
        selfcheck_ll.run_ll_graph(buf, seed=7, reference_device="cpu")
    assert world.devices == {"cpu"} and len(world.inputs[0]) == 16
