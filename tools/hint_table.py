"""The README's table of buffer sizes against DeepEP V1's (issue 22 item 2): what a DeepEP client's get_buffer asks
for (the larger of the dispatch and combine config's two-argument hint) from DeepEP's formulas (ep_rt/deepep_hints.py)
and from ep_rt's hints, for nodes of 8 GPUs; ep_rt's one-pass sizes (the hints' third argument, 4096 tokens per rank);
and how many rounds a 4096-token call of the reference routing takes in a buffer of the two-argument size
(ep_rt.cli.round_model: expected counts plus four standard deviations, a model, not a measurement).

    python tools/hint_table.py        # print the table (tests/tools/test_hint_table.py: the README holds it)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RANKS = (8, 16, 64, 160)
HIDDENS = (4096, 7168)
TOKENS = 4096


def table() -> str:
    from ep_rt import Buffer, deepep_hints
    from ep_rt.cli import round_model

    lines = [
        "| ranks | hidden | NVL: DeepEP V1 | NVL: ep_rt | RDMA: DeepEP V1 | RDMA: ep_rt | one pass, any routing "
        "(NVL + RDMA) | 4096 tokens, top-8 of 256 (model) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    gib = lambda n: f"{n / 2**30:.2f} GiB" if n else "0"  # noqa: E731
    for R in RANKS:
        for H in HIDDENS:
            nvl, rdma = deepep_hints.client_sizes(2 * H, R)
            configs = (
                Buffer.get_dispatch_config(R, num_ranks_per_node=8),
                Buffer.get_combine_config(R, num_ranks_per_node=8),
            )
            ours_nvl = max(c.get_nvl_buffer_size_hint(2 * H, R, num_ranks_per_node=8) for c in configs)
            ours_rdma = max(c.get_rdma_buffer_size_hint(2 * H, R, num_ranks_per_node=8) for c in configs)
            c = configs[0]
            whole = c.get_nvl_buffer_size_hint(2 * H, R, TOKENS, 8) + c.get_rdma_buffer_size_hint(2 * H, R, TOKENS, 8)
            n = round_model.rounds(ours_nvl, ours_rdma, R, min(R, 8), H, TOKENS)
            rounds = "one pass" if n == 1 else f"{n} rounds"
            lines.append(
                f"| {R} | {H} | {gib(nvl)} | {gib(ours_nvl)} | {gib(rdma)} | {gib(ours_rdma)} | {gib(whole)} "
                f"| {rounds} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
