"""Grid helpers live once, in kernels_src/include/ep_rt/grid.cuh (issue 26 item 2; internode.cu uses it). intranode.cu
keeps its own channel_range, and it and low_latency.cu their kWarpSize, until their next functional change (an edit that changes its preprocessed source renames the cu12
build's internal symbols, and the cu12 intranode cubins' hardware marks would go with them): the copy must stay the
same function, or senders and receivers of different families would slice channels differently."""

import re

from tests.repo import REPO

SRC = REPO / "kernels_src"


def _body(text: str, name: str) -> str:
    m = re.search(r"__device__ __forceinline__ void " + name + r"\(([^)]*)\) \{(.*?)\n\}", text, re.S)
    assert m, f"{name} not found"
    return " ".join((m.group(1) + m.group(2)).split())


def test_channel_range_is_defined_in_grid_cuh_and_intranodes_copy_is_the_same():
    grid = (SRC / "include" / "ep_rt" / "grid.cuh").read_text()
    defined_in = sorted(
        p.name for p in SRC.rglob("*.cu*") if "void channel_range(" in p.read_text() and p.name != "grid.cuh"
    )
    assert defined_in == ["intranode.cu"], defined_in
    assert _body((SRC / "intranode.cu").read_text(), "channel_range") == _body(grid, "channel_range")


def test_the_warp_size_has_one_name_and_one_value():
    defined = {}
    for p in SRC.rglob("*.cu*"):
        text = p.read_text()
        assert not re.search(r"constexpr int kWarp\b", text), p.name
        defined.update({p.name: v for v in re.findall(r"constexpr int kWarpSize = (\d+);", text)})
    assert defined == {"grid.cuh": "32", "intranode.cu": "32", "low_latency.cu": "32"}, defined
