"""tools/ll_packed_model.py, the CPU model of docs/LL_PACKED_DESIGN.md's packed LL layout (the LL cubins' packed
variants; tests/ops/test_ll_packed_layout.py holds ll_layout and the kernel source to it): on random routings (-1 entries, duplicates of an expert in a token) every message gets its own slot inside
its block, the receiver's view of each (expert, source) cell is a contiguous run in the source's token order, the
block size is tight, and the design's size table is what the model computes."""

import random
import re

import pytest

from tests.repo import REPO, load_tool


def _tool():
    return load_tool("ll_packed_model.py", "ll_packed_model")


def _routing(rng, T, K, E, duplicates):
    rows = []
    for _ in range(T):
        if duplicates:
            row = [rng.randrange(-1, E) for _ in range(K)]
        else:
            row = rng.sample(range(E), K)
            row = [e if rng.random() > 0.1 else -1 for e in row]
        rows.append(row)
    return rows


@pytest.mark.parametrize("R,E,T,K", [(2, 8, 16, 4), (4, 16, 32, 8), (8, 8, 8, 8), (4, 64, 24, 16), (3, 6, 10, 2)])
@pytest.mark.parametrize("duplicates", [False, True])
def test_every_message_gets_its_own_slot_and_each_cell_is_a_contiguous_run(R, E, T, K, duplicates):
    tool = _tool()
    rng = random.Random(R * 1000 + E * 10 + T + K + duplicates)
    L = E // R
    for _ in range(20):
        topk = _routing(rng, T, K, E, duplicates)
        try:
            pos = tool.dispatch_positions(topk, E, R, T)
        except ValueError:
            assert duplicates  # a cell past T needs an expert twice in one token
            continue
        valid = [(t, k) for t in range(T) for k in range(K) if topk[t][k] >= 0]
        assert sorted(pos) == valid
        per_rank = {}
        for (t, k), (r, p) in pos.items():
            assert r == topk[t][k] // L
            assert 0 <= p < tool.block_slots(T, R, E) == T * min(16, L), (p, T, K, L)
            per_rank.setdefault(r, []).append(p)
        for r, ps in per_rank.items():
            assert len(ps) == len(set(ps)), f"two messages share a slot at rank {r}"
        # The receiver's cells, rebuilt from the counts alone: local expert l's messages fill
        # [sum of the counts of l' < l, + its count), in the source's token-major order.
        for r in range(R):
            counts = [sum(1 for t, k in valid if topk[t][k] == r * L + l) for l in range(L)]
            for l in range(L):
                mine = [(t, k) for t, k in valid if topk[t][k] == r * L + l]  # token-major already
                want = list(range(sum(counts[:l]), sum(counts[:l]) + counts[l]))
                assert [pos[tk][1] for tk in mine] == want
        slots = tool.combine_slots(topk, E)
        assert sorted(slots) == valid and len(set(slots.values())) == len(valid)
        assert all(0 <= s < T * min(16, E) for s in slots.values())
        assert all(s // min(16, E) == t for (t, _), s in slots.items())  # a token's rows stay in its own slots


def test_the_dispatch_block_is_tight_and_a_cell_past_t_raises():
    tool = _tool()
    R, E, T, K = 2, 8, 4, 4  # L = 4 = K
    full = [[0, 1, 2, 3]] * T  # every token to all four experts of rank 0: the block's T x min(16, L) slots, all used
    pos = tool.dispatch_positions(full, E, R, T)
    assert sorted(p for _, p in pos.values()) == list(range(T * K))
    twice = [[5, 5, 6]] * T  # expert 5 gets 2T messages from this source
    with pytest.raises(ValueError, match="more than 4 messages"):
        tool.dispatch_positions(twice, E, R, T)


def _doc_table(header: str) -> list[tuple]:
    """The numeric rows of LL_PACKED_DESIGN.md's table under `header` (its first line)."""
    lines = (REPO / "docs" / "LL_PACKED_DESIGN.md").read_text(encoding="utf-8").splitlines()
    rows = []
    for line in lines[lines.index(header) + 2 :]:
        m = re.fullmatch(r"\| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", line)
        if not m:
            break
        rows.append(tuple(int(v) for v in m.groups()[:3]) + tuple(float(v) for v in m.groups()[3:]))
    return rows


def test_the_design_documents_tables_are_what_the_model_computes():
    tool = _tool()
    per_buffer = _doc_table("| ranks | experts | hidden | today (DeepEP's) | packed | ratio |")
    assert len(per_buffer) == len(tool.TABLE) and per_buffer == tool.table()
    whole = _doc_table("| ranks | experts | hidden | DeepEP's hint | ep_rt today | ep_rt packed |")
    assert len(whole) == len(tool.TABLE) and whole == tool.whole_table()


def test_packed_every_row_allocates_no_more_than_deepeps_hint_and_today_every_row_more():
    for R, E, H, hint, today, packed in _tool().whole_table():
        assert today > hint >= packed, (R, E, H)
