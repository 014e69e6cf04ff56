"""tools/sass_regions.py: cuts each kernel of an Nsight Compute SASS source page (CSV) at its block barriers and exits,
sums samples and executed instructions per region, keeps two launches of one kernel apart; and the filed page of the
thirty-first session's profile still reads (the numbers docs/LL_PACKED_DESIGN.md quotes)."""

import gzip

from tests.repo import REPO, load_tool

HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"'


def _page(kernels):
    lines = []
    for name, rows in kernels:
        lines.append(f'"Kernel Name","{name}",')
        lines.append(HEADER)
        lines += [f'"0x{i:x}","{src}","{s}","{x}"' for i, (src, s, x) in enumerate(rows)]
    return "\n".join(lines) + "\n"


def test_regions_cut_at_barriers_and_exit():
    tool = load_tool("sass_regions.py", "sass_regions")
    rows = [
        ("IMAD R1, R2, R3", 5, 100),
        ("BAR.SYNC.DEFER_BLOCKING 0x0", 1, 10),
        ("LDG.E R4, [R2]", "1,200", "2,000"),
        ("@!P0 EXIT", 3, 10),
        ("BRA 0x10", 0, 0),
    ]
    ((name, launch, parsed),) = tool.read_kernels(_page([("k", rows)]))
    assert (name, launch, len(parsed)) == ("k", 0, 5)
    assert [r[:4] for r in tool.regions(parsed)] == [(0, 1, 6.0, 110.0), (2, 3, 1203.0, 2010.0), (4, 4, 0.0, 0.0)]


def test_launches_kept_apart_and_selected():
    tool = load_tool("sass_regions.py", "sass_regions")
    page = _page([("send", [("NOP", 7, 70)]), ("recv", [("NOP", 9, 90)]), ("send", [("NOP", 11, 110)])])
    kernels = tool.read_kernels(page)
    assert [(n, i) for n, i, _ in kernels] == [("send", 0), ("recv", 0), ("send", 1)]
    assert "send (launch 1): 11 samples, 110 warp instructions" in tool.report(page, launch=1)
    assert "recv" not in tool.report(page, launch=1)


def test_filed_profile_reads():
    tool = load_tool("sass_regions.py", "sass_regions")
    folder = REPO / "docs/gpu_runs/2026-12-07_b95848c/20261207T190909Z"
    totals = {}
    for variant in ("default", "packed"):
        text = gzip.decompress((folder / f"ll_sass_{variant}.csv.gz").read_bytes()).decode()
        for name, launch, rows in tool.read_kernels(text):
            if launch == 0:
                parts = tool.regions(rows)
                totals[variant, name] = (sum(p[2] for p in parts), sum(p[3] for p in parts))
    assert totals == {
        ("default", "ep_rt_ll_dispatch_send"): (1082.0, 1912815.0),
        ("default", "ep_rt_ll_dispatch_recv"): (1706.0, 2856168.0),
        ("packed", "ep_rt_ll_dispatch_send"): (1248.0, 2379545.0),
        ("packed", "ep_rt_ll_dispatch_recv"): (1793.0, 3053847.0),
    }
