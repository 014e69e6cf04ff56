"""`python -m ep_rt [COMMAND]`: the command line. Each command is a module of this package with main(argv);
this only picks one. Without a command (or with only options), `check` runs, as `python -m ep_rt` always did."""

from __future__ import annotations

import importlib

COMMANDS = {
    "check": "every operation against ep_rt.reference on fresh inputs, then the benchmarks (the default)",
    "doctor": "what is wrong here: GPU, driver, cubins, NVLink, NVSHMEM, transports, settings, a smoke round",
    "bench": "the HT and LL benchmarks alone (DeepEP's formulas), text or --json, optional --plot",
    "tune": "sweep SM counts for your shapes, write a config file for EP_RT_CONFIG_FILE",
    "alias": "the startup hook that gives unchanged DeepEP code (import deep_ep) ep_rt",
    "model": "predicted internode HT times on a real cluster, next to DeepEP's published numbers",
}


def usage() -> str:
    lines = ["usage: python -m ep_rt [COMMAND] [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<8} {what}" for name, what in COMMANDS.items()]
    lines += [
        "  help     this list; `help COMMAND`: that command's options",
        "",
        "`python -m ep_rt COMMAND --help` for a command's options.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["help"]:  # `help` and `help COMMAND`, as `--help` and `COMMAND --help`
        if len(argv) == 1:
            argv = ["--help"]
        elif argv[1] in COMMANDS and len(argv) == 2:
            argv = [argv[1], "--help"]
        else:
            print(f"python -m ep_rt help: no command {' '.join(argv[1:])!r}\n\n{usage()}", file=sys.stderr)
            return 2
    if argv and argv[0] in ("-h", "--help") and len(argv) == 1:
        print(usage())
        return 0
    name = argv.pop(0) if argv and argv[0] in COMMANDS else "check"
    return importlib.import_module(f".{name}", __name__).main(argv)
