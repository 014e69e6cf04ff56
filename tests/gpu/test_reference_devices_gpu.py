"""The low-latency reference gives the same bits on the CPU as on the GPU (what lets the 2x8 LL pools run it on the
CPU, tests/gpu/test_low_latency_nodes_gpu.py): dispatch in BF16 and FP8 (plain, round_scale, UE8M0 scales) and the
BF16 combine, every output field, on the inputs of the 16-rank cases and fresh seeds. LogFMT is left out: its
log2/exp2 may differ by an ulp between devices, and its cases keep the GPU reference."""

import random

import pytest
import torch

from ep_rt import reference_ll
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


def _bits(t):
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return t.view(torch.uint8 if t.element_size() == 1 else torch.int16)
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _same(what, cpu, gpu):
    if cpu is None or gpu is None:
        assert cpu is None and gpu is None, what
        return
    gpu = gpu.cpu()
    assert cpu.dtype == gpu.dtype and cpu.shape == gpu.shape, what
    differ = int((_bits(cpu) != _bits(gpu)).sum())
    assert differ == 0, f"{what}: {differ} elements differ between the CPU and the GPU reference"


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
