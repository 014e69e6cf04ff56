"""CPU tests of the high-throughput GPU checks' wiring (selfcheck_ht.run_case with the intranode and internode
modes): a stand-in Buffer that answers every call with the reference's result passes every check, and one that
corrupts a single output or handle field is caught by name. The stand-in sees all ranks' inputs by wrapping the
harness's input functions (a rank of the real collective computes only its own part)."""

import pytest
import torch

from ep_rt.testing import selfcheck_ht, selfcheck_internode
from ep_rt.testing.selfcheck_ht import INTRANODE, Case


class ReferenceBuffer:
    """Answers layout, dispatch, cached dispatch and combine for rank `rank` from `mode`'s reference."""

    def __init__(self, mode, num_ranks, rank, corrupt=None):
        self.mode, self.group_size, self.rank, self.device = mode, num_ranks, rank, torch.device("cpu")
        self.corrupt = corrupt  # (what, index): "recv_x" or a handle field name
        self.world = self.combine_world = self.ref = None

    def capture(self):
        return None

    def raise_if_failed(self):
        pass

    def get_dispatch_layout(self, topk_idx, num_experts, **_):
        return (*self.mode.layout(topk_idx, num_experts, self.group_size), None)

    def dispatch(self, x, handle=None, num_worst_tokens=0, config=None, expert_alignment=1, topk_idx=None, **kw):
        xs, idxs, ws = self.world
        if handle is None:
            self.ref = self.mode.dispatch(
                xs,
                idxs,
                ws,
                kw["num_tokens_per_expert"].numel(),
                config.num_sms,
                expert_alignment,
                num_worst_tokens,
                with_topk=topk_idx is not None,
            )
        mine = self.ref[self.rank]
        recv_x = mine["recv_x"].clone()
        if self.corrupt == "recv_x" and recv_x.numel():
            recv_x.view(-1).view(torch.int16)[0] ^= 1
        out_x = (recv_x, mine["recv_x_scales"]) if mine["recv_x_scales"] is not None else recv_x
        if handle is not None:
            return out_x, None, None, None, None, None
        fields = [mine[k].clone() for k in self.mode.handle_fields]
        if self.corrupt in self.mode.handle_fields:
            fields[self.mode.handle_fields.index(self.corrupt)].view(-1)[0] += 1
        idx = mine["recv_topk_idx"]
        return (
            out_x,
            None if idx is None else selfcheck_ht.as_topk_idx_t(idx),
            mine["recv_topk_weights"],
            mine["num_recv_tokens_per_expert_list"],
            tuple(fields),
            None,
        )

    def combine(self, x, handle, topk_weights=None, bias=None, **_):
        if self.combine_world is None:  # (run_graph_case's warm-up and capture: not checked)
            n = self.world[0][self.rank].size(0)
            return torch.zeros(n, x.size(1), dtype=torch.bfloat16), topk_weights, None
        comb_xs, comb_ws, biases = self.combine_world
        out = self.mode.combine(comb_xs, self.ref, comb_ws if topk_weights is not None else None, biases)
        return out[self.rank]["combined_x"], out[self.rank]["combined_topk_weights"], None


@pytest.fixture
def cpu_harness(monkeypatch):
    """Hands the harness's all-rank combine inputs to the stand-in, and makes its CUDA syncs no-ops."""
    holder = {}

    def combine_inputs(*args, **kw):
        holder["buf"].combine_world = real_combine_inputs(*args, **kw)
        return holder["buf"].combine_world

    real_combine_inputs = selfcheck_ht.combine_inputs
    monkeypatch.setattr(selfcheck_ht, "combine_inputs", combine_inputs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def use(buf):
        holder["buf"] = buf
        return buf

    return use


def _run(cpu_harness, mode, R, case, corrupt=None, rank=1, reference_device=None):
    buf = cpu_harness(ReferenceBuffer(mode, R, rank, corrupt))
    real = mode.inputs
    buf.input_devices = set()

    def inputs(case, seed, num_ranks, device):  # the stand-in sees every rank's (routed) inputs
        buf.input_devices.add(str(device))
        buf.world = real(case, seed, num_ranks, device)
        return buf.world

    object.__setattr__(mode, "inputs", inputs)  # on this instance only (Mode is frozen)
    try:
        chk = selfcheck_ht.run_case(buf, case, 7, mode, reference_device)
        assert buf.input_devices == {"cpu"}  # (the stand-in's device and the named one: both the CPU here)
        return chk
    finally:
        object.__delattr__(mode, "inputs")


CASES = [
    Case("bf16", num_tokens=24, hidden=128, num_experts=16),
    Case("fp8", dtype="fp8", num_tokens=20, hidden=256, num_experts=16),
    Case("bias pair, no top-k", num_tokens=16, hidden=128, num_experts=16, num_topk=0, bias="pair"),
]


@pytest.mark.parametrize("where", [None, "cpu"])  # the Buffer's device, or the reference on a named one
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_intranode_wiring_passes_the_reference(cpu_harness, case, where):
    chk = _run(cpu_harness, selfcheck_ht.Mode(), 2, case, reference_device=where)
    assert chk.checks >= 20 and not chk.failures, chk.failures


@pytest.mark.parametrize(
    "case",
    CASES + [Case("span nodes", routing="span_nodes", num_tokens=16, hidden=128, num_experts=16)],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize("where", [None, "cpu"])
def test_internode_wiring_passes_the_reference(cpu_harness, case, where):
    chk = _run(cpu_harness, selfcheck_internode.mode(2), 4, case, reference_device=where)
    assert chk.checks >= 24 and not chk.failures, chk.failures


@pytest.mark.parametrize(
    "mode,R,field",
    [
        (INTRANODE, 2, "recv_src_idx"),
        (INTRANODE, 2, "send_pos"),
        (None, 4, "send_rdma_head"),
        (None, 4, "recv_src_meta"),
    ],
)
def test_a_corrupted_handle_field_is_named(cpu_harness, mode, R, field):
    mode = selfcheck_ht.Mode() if mode is INTRANODE else selfcheck_internode.mode(2)
    chk = _run(cpu_harness, mode, R, CASES[0], corrupt=field)
    assert any(field in f for f in chk.failures), chk.failures


def test_a_corrupted_recv_x_is_caught_in_dispatch_and_cached_dispatch(cpu_harness):
    chk = _run(cpu_harness, selfcheck_internode.mode(2), 4, CASES[0], corrupt="recv_x", reference_device="cpu")
    names = {f.split(":")[0] for f in chk.failures}
    assert {"dispatch.recv_x", "cached_dispatch.recv_x"} <= names, chk.failures


def test_the_graph_case_runs_its_replays_with_the_reference_on_the_cpu(cpu_harness, monkeypatch):
    """run_graph_case with reference_device: inputs and references made there, every replay's refill copied into
    the captured tensors, the eager round between replays too. No CUDA graph here (its replays change nothing), so
    the replays' checks find the outputs of the capture: the run must get through all of them and count them."""
    import contextlib

    class NoGraph:
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", NoGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    mode = selfcheck_internode.mode(2)
    buf = cpu_harness(ReferenceBuffer(mode, 4, 2))
    real, devices = mode.inputs, set()

    def inputs(case, seed, num_ranks, device):
        devices.add(str(device))
        buf.world = real(case, seed, num_ranks, device)
        return buf.world

    object.__setattr__(mode, "inputs", inputs)
    try:
        case = Case("cuda graph", num_tokens=16, hidden=128, num_experts=16, num_worst_tokens=True, bias="one")
        chk = selfcheck_ht.run_graph_case(
            buf, 3, 2, mode, case, Case("eager", num_tokens=12, hidden=128, num_experts=16), reference_device="cpu"
        )
    finally:
        object.__delattr__(mode, "inputs")
    assert devices == {"cpu"} and chk.checks >= 2 * 7 + 20, chk.checks
