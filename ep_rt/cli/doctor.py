"""python -m ep_rt doctor: what to run when something is wrong. One line per item (ok / warning / error / skip) with
a hint; exit code 0 when nothing is an error.

It looks at: the packages; the NVIDIA driver and the CUDA version it supports; the GPUs; which cubin archs and
variants ship and which this GPU loads (checksums verified); the NVLink matrix (NVML, by PCI bus id); NVSHMEM's
host and device versions; which remote transports NVSHMEM could initialise here (IBGDA, IBRC, UCX, libfabric: the
plugins it ships and their system libraries, InfiniBand devices); GDRCopy; the driver options IBGDA needs and
GPUDirect RDMA (nvidia_peermem or dma-buf); the EP_RT_ and NVSHMEM_ settings in effect; the network settings an
internode Buffer would run with (transport, queue pairs, service level, NIC per GPU); and a smoke round on 2 ranks
(they may share a GPU): one intranode dispatch + combine and one low-latency dispatch + combine against
ep_rt.reference. Without a GPU or driver it still runs: the GPU items say so, and the exit code is 1.
"""

from __future__ import annotations

import argparse

from .. import __version__, env
from . import doctor_checks as checks
from .doctor_probe import System

MARK = {checks.OK: "ok", checks.WARNING: "WARNING", checks.ERROR: "ERROR", checks.SKIP: "skip"}


def run_checks(s, smoke: bool, num_ranks: int, run_ranks=None) -> list:
    """Every item, in order. `run_ranks(fn, num_ranks, num_gpus)` runs the smoke round (ep_rt.testing.spawn's)."""
    items = checks.check_packages(s)
    gpu_items, gpus = checks.check_gpus(s)
    cubin_items, manifest = checks.check_cubins(s, gpus, env.aggressive_ptx())
    items += checks.check_driver(s, manifest) + gpu_items + cubin_items + checks.check_nvlink(s, gpus)
    items += checks.check_nvshmem(s, manifest, _nvshmem_package_missing(s)) + checks.check_transports(s, gpus)
    items += checks.check_gdrcopy(s, gpus) + checks.check_ibgda_driver(s) + checks.check_gpudirect_rdma(s)
    items += checks.check_rdma_ordering(s, gpus) + checks.check_host_words(s, gpus)
    items += checks.check_settings(s) + checks.check_network(s, gpus)
    rounds = (("ht", "smoke: intranode dispatch + combine"), ("ll", "smoke: low-latency dispatch + combine"))
    if not smoke:
        return items + [checks.Item(n, checks.SKIP, "--no-smoke") for _, n in rounds]
    from ..testing import smoke as smoke_mod

    num_gpus = min(len(gpus), num_ranks)
    bodies = {"ht": smoke_mod.smoke_ht, "ll": smoke_mod.smoke_ll}
    for kind, name in rounds:
        # An error blocks only the rounds it makes pointless (NVSHMEM trouble leaves the intranode round to run).
        blocked = [i.name for i in items if i.status == checks.ERROR and kind in i.blocks]
        if blocked:
            items.append(checks.Item(name, checks.SKIP, f"not run: fix the errors above first ({', '.join(blocked)})"))
            continue
        item = checks.smoke_item(name, lambda fn=bodies[kind]: run_ranks(fn, num_ranks, num_gpus))
        item.detail = f"{num_ranks} ranks on {num_gpus} GPU{'s' if num_gpus > 1 else ''}: {item.detail}"
        items.append(item)
    return items


def _nvshmem_package_missing(s) -> bool:
    """No NVSHMEM distribution of torch's flavour (any, for a CPU torch): the packages item says so already."""
    flavour = checks.torch_flavour(s.torch_info())
    wanted = (
        [checks.NVSHMEM_PACKAGES[flavour]]
        if flavour in checks.NVSHMEM_PACKAGES
        else list(checks.NVSHMEM_PACKAGES.values())
    )
    return all(s.package_version(p) is None for p in wanted)


WIDTH = 120  # no line of the report is longer


def format_items(items, width: int = WIDTH) -> str:
    """One item per line (mark, name, detail, -> hint), wrapped under the detail column to `width` characters."""
    import textwrap

    name_width = max(len(i.name) for i in items)
    indent = " " * (9 + name_width + 2)
    lines = []

    def wrap(first: str, text: str, more: str) -> list:
        return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=more, break_on_hyphens=False) or [
            first.rstrip()
        ]

    for i in items:
        first = f"{MARK[i.status]:<8} {i.name:<{name_width}}  "
        inline = first + i.detail + (f"  -> {i.hint}" if i.hint else "")
        if len(inline) <= width:
            lines.append(inline)
        else:
            lines += wrap(first, i.detail, indent)
            if i.hint:  # its own lines, a command unbroken where it fits (split after &&, as a shell reads it)
                for k, part in enumerate(i.hint.replace(" && ", " &&\n").split("\n")):
                    lines += wrap(" " * 9 + ("-> " if k == 0 else "   "), part, " " * 12)
        for x in i.extra:  # rows under the item (the NVLink matrix, one setting each): their own lines
            lines += wrap(indent, x, indent + "    ")
    counts = {s: sum(i.status == s for i in items) for s in MARK}
    lines.append(
        f"{counts[checks.OK]} ok, {counts[checks.WARNING]} warnings, {counts[checks.ERROR]} errors, "
        f"{counts[checks.SKIP]} skipped"
    )
    return "\n".join(lines)


def exit_code(items) -> int:
    return 1 if any(i.status == checks.ERROR for i in items) else 0


def _spawn(fn, num_ranks, num_gpus):
    from ..testing.spawn import run_ranks

    return run_ranks(fn, num_ranks, num_gpus=num_gpus, timeout_s=600)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_rt doctor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-smoke", action="store_true", help="skip the multi-rank smoke round")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the smoke round (default 2)")
    args = parser.parse_args(argv)
    print(f"ep_rt {__version__} doctor")
    items = run_checks(System(), not args.no_smoke, args.ranks, _spawn)
    print(format_items(items))
    return exit_code(items)
