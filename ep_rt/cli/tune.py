"""python -m ep_rt tune: find the SM count for your shapes and rank count, and write it where Buffer finds it.

What is swept, and why only that: of a Config's five fields only num_sms changes what ep_rt's intranode kernels
do (num_sms channels, one block each). The chunk sizes (num_max_nvl_chunked_*, num_max_rdma_chunked_*) size
DeepEP's ring buffers; ep_rt writes every token straight to its final row, so they are validated as DeepEP does
and otherwise unused, and sweeping them would measure nothing. A combine runs on the channels of the dispatch that
made its handle, so one SM count serves both: the one with the least dispatch + combine kernel time (the slowest
rank's) is chosen, and both the dispatch and the combine entries get it.

The sweep runs the HT benchmark (python -m ep_rt bench's, DeepEP's bandwidth formulas) at every SM count, prints
the table, writes (or updates) a JSON config file, and draws bandwidth against SMs as a PNG when matplotlib is
installed. Use the file with EP_RT_CONFIG_FILE=PATH: Buffer.get_dispatch_config / get_combine_config then return
its Configs for that rank count.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

from .. import __version__, config_file, config_tables
from ..config import Config
from ..errors import ConfigFileError
from ..transport import nvl_layout
from . import plot


def parse_sms(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sms takes comma-separated ints, got {text!r}") from None
    if not values or values[0] < 1 or values[-1] > nvl_layout.MAX_CHANNELS:
        raise argparse.ArgumentTypeError(f"--sms values must be in 1..{nvl_layout.MAX_CHANNELS}, got {text!r}")
    return values


def default_sms(device_sms: int) -> list[int]:
    """Every fourth SM count up to the GPU's SMs (at most 64: more channels than that never helped on 8 GPUs)."""
    return list(range(4, min(device_sms, 64) + 1, 4))


def check_shape(args, num_ranks: int) -> None:
    if args.tokens < 1 or args.hidden < 1 or args.topk < 1 or args.experts < 1:
        raise SystemExit("tune: --tokens, --hidden, --topk and --experts must be positive")
    if args.experts % num_ranks:
        raise SystemExit(f"tune: --experts ({args.experts}) must be divisible by the rank count ({num_ranks})")
    if args.topk > min(nvl_layout.MAX_TOPK, args.experts):
        raise SystemExit(f"tune: --topk must be at most {min(nvl_layout.MAX_TOPK, args.experts)}")
    if args.hidden % (128 if args.dtype == "fp8" else 8):
        raise SystemExit(f"tune: --hidden must be a multiple of {128 if args.dtype == 'fp8' else 8} for {args.dtype}")


# ---- results -------------------------------------------------------------------------------------------


def merge_ranks(per_rank: list[list[dict]]) -> list[dict]:
    """One row per SM count: the slowest rank's kernel times (what every rank waits for), bandwidth from them."""
    rows = []
    for same in zip(*per_rank):
        row = dict(same[0])
        for key in ("dispatch_us", "combine_us", "dispatch_call_us", "combine_call_us"):
            row[key] = max(r[key] for r in same)
        for key, time_key in (("dispatch_gbps", "dispatch_us"), ("combine_gbps", "combine_us")):
            slowest = max(same, key=lambda r: r[time_key])
            row[key] = slowest[key]
        row["total_us"] = row["dispatch_us"] + row["combine_us"]
        rows.append(row)
    return rows


def best(rows: list[dict]) -> dict:
    return min(rows, key=lambda r: (r["total_us"], r["num_sms"]))


def format_table(rows: list[dict], chosen: dict) -> str:
    lines = [f"{'SMs':>5} {'dispatch us':>12} {'GB/s':>7} {'combine us':>11} {'GB/s':>7} {'total us':>9}"]
    for r in rows:
        mark = " *" if r is chosen else "  "
        lines.append(
            f"{r['num_sms']:>5} {r['dispatch_us']:>12.1f} {r['dispatch_gbps']:>7.1f} {r['combine_us']:>11.1f} "
            f"{r['combine_gbps']:>7.1f} {r['total_us']:>9.1f}{mark}"
        )
    lines.append(f"* chosen: num_sms={chosen['num_sms']} (least dispatch + combine time of the slowest rank)")
    return "\n".join(lines)


def tuned_entries(num_ranks: int, num_sms: int) -> list[dict]:
    """Dispatch and combine entries with the chosen SM count; the chunk sizes of the built-in table's row for one
    node of num_ranks (unused by ep_rt, kept for DeepEP code that reads them), DeepEP's Config defaults where one
    node has none (more than 8 ranks)."""
    out = []
    for kind in config_file.KINDS:
        try:
            row = config_tables.lookup(kind, num_ranks, num_nodes=1)
            config = Config(num_sms, row.nvl_send, row.nvl_recv, row.rdma_send, row.rdma_recv)
        except ValueError:
            config = Config(num_sms)
        out.append(config_file.entry(kind, num_ranks, config))
    return out


def write_config(path: Path, num_ranks: int, num_sms: int, tuned: dict) -> None:
    """Write the chosen entries, keeping an existing file's entries for other rank counts (an invalid existing
    file is an error: it is not overwritten)."""
    entries, history = [], {}
    if path.exists():
        with open(path, encoding="utf-8") as f:
            try:
                old = json.load(f)
            except ValueError as e:
                raise ConfigFileError(f"{path} exists and is not valid JSON ({e}); not overwriting it") from None
        config_file.parse(old, str(path))
        entries = [e for e in old["configs"] if e["num_ranks"] != num_ranks]
        history = {k: v for k, v in old.get("tuned", {}).items() if k != str(num_ranks)}
    entries += tuned_entries(num_ranks, num_sms)
    config_file.write(
        path, sorted(entries, key=lambda e: (e["num_ranks"], e["kind"])), {**history, str(num_ranks): tuned}
    )


def draw(path: Path, rows: list[dict], num_ranks: int, shape: str) -> str:
    x = [r["num_sms"] for r in rows]
    return plot.lines(
        path,
        x,
        {"dispatch": [r["dispatch_gbps"] for r in rows], "combine": [r["combine_gbps"] for r in rows]},
        "SMs (channels)",
        "GB/s (DeepEP's formula)",
        f"ep_rt HT on {num_ranks} ranks: {shape}",
    )


# ---- command -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_rt tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank (default 4096)")
    parser.add_argument("--hidden", type=int, default=7168, help="hidden size (default 7168)")
    parser.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    parser.add_argument("--experts", type=int, default=256, help="experts in all (default 256)")
    parser.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16", help="what dispatch sends (default bf16)")
    parser.add_argument("--ranks", type=int, default=0, help="ranks (default: one per local GPU)")
    parser.add_argument(
        "--sms",
        type=parse_sms,
        default=None,
        help="SM counts to try, comma-separated (default: 4, 8, ... up to the GPU's SMs, at most 64)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per point (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per point (default 10)")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("ep_rt_config.json"),
        help="config file to write or update (default ep_rt_config.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: the output's name with .png)")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("tune: error: no CUDA GPU found; tuning measures the kernels, so it needs the GPUs it tunes for")
        return 1
    num_gpus = torch.cuda.device_count()
    num_ranks = args.ranks or num_gpus
    check_shape(args, num_ranks)
    if num_ranks > num_gpus:
        print(
            f"tune: warning: {num_ranks} ranks on {num_gpus} GPUs share GPUs; the times will not be those of "
            f"{num_ranks} GPUs"
        )
    sms = args.sms or default_sms(torch.cuda.get_device_properties(0).multi_processor_count)
    from ..testing import tune_ht
    from ..testing.spawn import run_ranks

    per_rank = run_ranks(
        tune_ht.sweep_rank,
        num_ranks,
        timeout_s=3600,
        args=(args.tokens, args.hidden, args.topk, args.experts, args.dtype, sms, args.warmup, args.iters),
    )
    rows = merge_ranks(per_rank)
    chosen = best(rows)
    shape = f"{args.tokens} x {args.hidden} {args.dtype}, top-{args.topk}, {args.experts} experts"
    print(f"ep_rt tune: {num_ranks} ranks on {num_gpus} x {torch.cuda.get_device_name(0)}, {shape}")
    print(format_table(rows, chosen))
    tuned = {
        "by": "python -m ep_rt tune",
        "ep_rt": __version__,
        "gpu": torch.cuda.get_device_name(0),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shape": {
            "tokens": args.tokens,
            "hidden": args.hidden,
            "topk": args.topk,
            "experts": args.experts,
            "dtype": args.dtype,
        },
        "num_sms": chosen["num_sms"],
        "sweep": rows,
    }
    write_config(args.output, num_ranks, chosen["num_sms"], tuned)
    print(f"wrote {args.output}: use it with EP_RT_CONFIG_FILE={os.path.abspath(args.output)}")
    if not args.no_plot:
        print(draw(args.plot or args.output.with_suffix(".png"), rows, num_ranks, shape))
    return 0
