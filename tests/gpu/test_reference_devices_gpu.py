"""The references give the same bits on the CPU as on the GPU (what lets the 2x8 pools run them on the CPU,
NodesPool.reference_device): the low-latency dispatch in BF16 and FP8 (plain, round_scale, UE8M0 scales) and the BF16
combine; the high-throughput layout, dispatch (every handle field) and combine, intranode on 8 ranks and internode
on 2 x 8; every output field, on fresh seeds. LogFMT is left out: its log2/exp2 may differ by an ulp between
devices, and its cases keep the GPU reference."""

import random

import pytest
import torch

from ep_rt import reference_ll
from ep_rt.testing import selfcheck_ht, selfcheck_internode
from ep_rt.testing.checker import Checker
from ep_rt.testing.selfcheck_ht import Case
from ep_rt.testing.selfcheck_ll import LLCase, expert_outputs, ll_inputs, to_packed

from .conftest import gpus

pytestmark = gpus(1)

R = 16
CASES = [
    LLCase("bf16", use_fp8=False),
    LLCase("fp8"),
    LLCase("fp8 round_scale", round_scale=True),
    LLCase("fp8 ue8m0", round_scale=True, use_ue8m0=True, hidden=2048),
    LLCase("graph shape", num_tokens=64, max_tokens=64, hidden=2048, num_experts=16),
]


def _same(what, cpu, gpu):
    """The GPU reference's value bit for bit the CPU one's (Checker.equal: dtype, shape, then every bit), through
    tuples and lists of them; plain values (counts) equal."""
    if isinstance(cpu, (tuple, list)):
        assert isinstance(gpu, (tuple, list)) and len(cpu) == len(gpu), what
        for k, (c, g) in enumerate(zip(cpu, gpu)):
            _same(f"{what}[{k}]", c, g)
        return
    if cpu is not None and not isinstance(cpu, torch.Tensor):
        assert cpu == gpu, f"{what}: {cpu} on the CPU, {gpu} on the GPU"
        return
    chk = Checker(what)
    chk.equal(what, gpu, cpu)
    assert not chk.failures, f"the CPU and the GPU reference differ: {chk.failures}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_ll_reference_is_bit_identical_on_cpu_and_gpu(case):
    seed = random.SystemRandom().randrange(1 << 30)  # fresh inputs every run (printed on failure)
    dev = torch.device("cuda", torch.cuda.current_device())
    T, H, E = case.max_tokens, case.hidden, case.num_experts
    L = E // R
    cpu_in = ll_inputs(case, seed, R, "cpu")
    gpu_in = [[t.to(dev) for t in ts] for ts in cpu_in]
    kw = dict(use_fp8=case.use_fp8, round_scale=case.round_scale, use_ue8m0=case.use_ue8m0)
    on_cpu = reference_ll.low_latency_dispatch(cpu_in[0], cpu_in[1], T, E, **kw)
    on_gpu = reference_ll.low_latency_dispatch(gpu_in[0], gpu_in[1], T, E, **kw)
    for r in range(R):
        for field in on_cpu[r]:
            _same(f"seed {seed} rank {r} {field}", on_cpu[r][field], on_gpu[r][field])
    ys = [expert_outputs(seed, r, L, R, T, H, "cpu") for r in range(R)]
    packed = [
        to_packed(ys[r], on_cpu[r]["packed_recv_src_info"], on_cpu[r]["packed_recv_layout_range"], T) for r in range(R)
    ]
    for me in (0, R - 1):
        c = reference_ll.low_latency_combine(packed, cpu_in[1], cpu_in[2], on_cpu, ranks=(me,))[me]["combined_x"]
        g = reference_ll.low_latency_combine([p.to(dev) for p in packed], gpu_in[1], gpu_in[2], on_gpu, ranks=(me,))[
            me
        ]["combined_x"]
        _same(f"seed {seed} rank {me} combined_x", c, g)


HT_CASES = [
    Case("bf16 uniform", num_tokens=512, hidden=2048, num_experts=64),
    Case("fp8 row scales", dtype="fp8", num_tokens=256, hidden=2048, num_experts=64),
    Case("fp8 ue8m0, holes", dtype="fp8_ue8m0", num_tokens=256, hidden=2048, num_experts=64, routing="holes"),
    Case(
        "bias pair, num_worst_tokens", num_tokens=256, hidden=1024, num_experts=64, bias="pair", num_worst_tokens=True
    ),
]


@pytest.mark.parametrize("layout", ["8 ranks", "2x8"])
@pytest.mark.parametrize("case", HT_CASES, ids=lambda c: c.name)
def test_the_ht_reference_is_bit_identical_on_cpu_and_gpu(case, layout):
    seed = random.SystemRandom().randrange(1 << 30)
    dev = torch.device("cuda", torch.cuda.current_device())
    R, mode = (8, selfcheck_ht.INTRANODE) if layout == "8 ranks" else (16, selfcheck_internode.mode(8))
    cpu_in = mode.inputs(case, seed, R, "cpu")
    gpu_in = [[selfcheck_ht.on_device(t, dev) for t in ts] for ts in cpu_in]
    for r in (0, R - 1):
        _same(
            f"seed {seed} layout of rank {r}",
            mode.layout(cpu_in[1][r], case.num_experts, R),
            mode.layout(gpu_in[1][r], case.num_experts, R),
        )
    worst = case.num_tokens * R if case.num_worst_tokens else 0
    refs = [
        mode.dispatch(*ins, case.num_experts, case.num_sms, case.expert_alignment, worst) for ins in (cpu_in, gpu_in)
    ]
    for r in range(R):
        for field in refs[0][r]:
            _same(f"seed {seed} rank {r} {field}", refs[0][r][field], refs[1][r][field])
    combined = []
    for ins, ref, where in zip((cpu_in, gpu_in), refs, ("cpu", dev)):
        comb_xs, comb_ws, biases = selfcheck_ht.combine_inputs(case, seed, ins[0], ref, where)
        combined.append(mode.combine(comb_xs, ref, comb_ws, biases))
    for r in range(R):
        for field in combined[0][r]:
            _same(f"seed {seed} rank {r} combine {field}", combined[0][r][field], combined[1][r][field])
