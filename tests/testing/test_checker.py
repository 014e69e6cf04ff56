"""ep_rt.testing.checker: the comparer behind every GPU check is strict (dtype, whole shape, then bits of the
defined rows), and the case filter refuses names it does not know."""

import pytest
import torch

from ep_rt.testing import selfcheck_ht, selfcheck_internode, selfcheck_ll
from ep_rt.testing.checker import Checker, select


def _failures(got, want, rows=None):
    chk = Checker("case")
    chk.equal("x", got, want, rows=rows)
    assert chk.checks == 1
    return chk.failures


def test_equal_tensors_pass():
    t = torch.arange(12, dtype=torch.float32).view(4, 3)
    assert _failures(t.clone(), t) == []
    assert _failures(t.clone(), t, rows=2) == []
    assert _failures(None, None) == []


def test_same_bits_in_another_dtype_fail():
    bf16 = torch.tensor([1.0, -2.5, 3.0], dtype=torch.bfloat16)
    assert "dtype" in _failures(bf16.view(torch.float16), bf16)[0]
    f32 = torch.tensor([1.0, 2.0], dtype=torch.float32)
    assert "dtype" in _failures(f32.view(torch.int32), f32)[0]
    assert "dtype" in _failures(torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int32))[0]


def test_rows_beyond_the_defined_ones_must_still_have_the_expected_shape():
    want = torch.zeros(4, 3, dtype=torch.int32)
    padded_differently = want.clone()
    padded_differently[3] = 7  # past the defined rows: undefined by the API, so not compared
    assert _failures(padded_differently, want, rows=3) == []
    assert "shape" in _failures(torch.zeros(5, 3, dtype=torch.int32), want, rows=3)[0]  # an extra row
    assert "shape" in _failures(torch.zeros(2, 3, dtype=torch.int32), want, rows=3)[0]  # a row short
    assert "defined rows" in _failures(want.clone(), want, rows=5)[0]
    wrong = want.clone()
    wrong[1, 2] = 1
    assert "1 elements differ, first at [1, 2]" in _failures(wrong, want, rows=3)[0]


def test_none_against_a_tensor_and_a_list_against_a_list():
    assert "got None" in _failures(None, torch.zeros(1))[0]
    assert "got a tensor" in _failures(torch.zeros(1), None)[0]
    assert _failures([1, 2], [1, 2]) == [] and _failures([1, 3], [1, 2])
    assert "want a tensor" in _failures([0.0], torch.zeros(1))[0]


def test_bits_compare_nan_and_signed_zero_exactly():
    want = torch.tensor([float("nan"), 0.0])
    assert _failures(want.clone(), want) == []
    assert _failures(torch.tensor([float("nan"), -0.0]), want)


class _C:
    def __init__(self, name):
        self.name = name


def test_select_keeps_the_case_order_and_refuses_unknown_names():
    cases = [_C("a"), _C("b"), _C("c")]
    assert [c.name for c in select(cases, ["c", "a"])] == ["a", "c"]
    assert [c.name for c in select(cases, None)] == ["a", "b", "c"]
    assert [c.name for c in select(cases, ["b", "graph"], also=("graph",))] == ["b"]
    with pytest.raises(ValueError, match=r"unknown case names \['d'\]; known: \['a', 'b', 'c'\]"):
        select(cases, ["a", "d"])
    with pytest.raises(ValueError, match="unknown case names"):
        select(cases, "ab")  # one name, not its letters


def test_every_fixed_case_filter_names_existing_cases():
    """The case lists that GPU runs filter by name (the main command's --quick, the GPU tests' subsets) name cases
    that exist: a renamed case fails here on the CPU instead of raising in a GPU run."""
    from ep_rt.testing import main_check
    from tests.gpu import test_internode_cases_gpu, test_intranode_gpu, test_low_latency_nodes_gpu, workers

    for R in (2, 4, 8):
        ht, ll = selfcheck_ht.standard_cases(R), selfcheck_ll.ll_cases(R)
        select(ht, main_check.QUICK_HT)
        select(ht, workers.TOPK_BITS_HT_CASES, also=(workers.GRAPH_CASE,))
        select(ht, test_intranode_gpu.SHARED_GPU_CASES, also=(workers.GRAPH_CASE,))
        select(ll, main_check.QUICK_LL)
        select(ll, workers.TOPK_BITS_LL_CASES)
    internode = {
        "QUICK_INTERNODE": (main_check.QUICK_INTERNODE, ((4, 2), (8, 4), (16, 8))),
        "LL compat": (workers.INTERNODE_LL_COMPAT_CASES, ((4, 2),)),
        "sixteen": (workers.INTERNODE_SIXTEEN_CASES, ((16, 8),)),
    }
    for name, pool in test_internode_cases_gpu.POOLS.items():  # each pool's cases, on its own layout
        cases = tuple(c for c in pool.cases if c != workers.GRAPH_CASE)
        internode[name] = (cases, ((pool.num_ranks, pool.ranks_per_node),))
    for what, (names, layouts) in internode.items():
        for R, G in layouts:
            assert select(selfcheck_internode.internode_cases(R, G), names), what
    ll_extra = (workers.LL_GRAPH_CASE, workers.LL_AFTER_CLEAN_CASE)
    for name, pool in test_low_latency_nodes_gpu.POOLS.items():
        assert len(select(selfcheck_ll.ll_cases(pool.num_ranks), pool.cases, also=ll_extra)) >= 3, name
