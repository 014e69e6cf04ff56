"""How to install ep_rt beside each torch release: the one table that README "Installing" shows, that
tests/cli/test_install_table.py checks against the recorded torch pins (tests/package/test_requirements.py), and that
doctor and the error hints quote. ep-rt is on no package index: every command installs the wheel file (built in a
checkout with `pip wheel --no-deps -w . .`) or the checkout itself. Standard library only (the runtime's hints use it
too).

The rule behind every row: take the extra of your torch's CUDA major. cu12 brings cuda-bindings 12.9.x (torch 2.9's
CUDA 12 wheels pin no cuda-bindings, so a plain install picks 13.x, which refuses drivers below r580 at first use) and
nvidia-nvshmem-cu12; cu13 brings cuda-bindings 13.x and nvidia-nvshmem-cu13. Never the other flavour's extra: the two
NVSHMEM distributions install the same files, so one would overwrite the other (and torch's copy).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

VERSION = "0.1.0"  # ep_rt.__version__ and pyproject.toml's version (a CPU test keeps the three equal)
WHEEL = f"./ep_rt-{VERSION}-py3-none-any.whl"
TORCH_INDEX = "https://download.pytorch.org/whl/"


def ep_rt_target(extra: str, checkout: bool = False) -> str:
    """What pip installs: the wheel file with an extra, or the checkout (the current folder) with it."""
    return f'".[{extra}]"' if checkout else f'"{WHEEL}[{extra}]"'


def extra_hint(flavour: str) -> str:
    """The install hint for one flavour's extra, as error messages give it."""
    return f"pip install {ep_rt_target(flavour)} (from a checkout: pip install {ep_rt_target(flavour, True)})"


class Row(NamedTuple):
    series: str  # torch minor release, "2.9"
    cuda: int  # CUDA major of the build: 12 or 13
    build: Optional[str]  # the build to take ("cu128"), or None where no build of this CUDA major was seen
    default: bool  # the build is PyPI's default for that release (no index URL needed)
    recorded: bool  # its NVSHMEM (and cuda-bindings) pins are recorded in tests/package/test_requirements.py

    @property
    def extra(self) -> str:
        return f"cu{self.cuda}"

    def command(self, checkout: bool = False) -> str:
        """The exact command: torch first (from its index when not PyPI's default), then ep_rt with the extra."""
        ep_rt = f"pip install {ep_rt_target(self.extra, checkout)}"
        if self.build is None:  # no such build seen: the rule only, beside the torch you have
            return ep_rt
        torch = f'"torch=={self.series}.*"'
        if self.default:
            return f"pip install {torch} {ep_rt_target(self.extra, checkout)}"
        return f"pip install {torch} --index-url {TORCH_INDEX}{self.build} && {ep_rt}"

    def note(self) -> str:
        if self.build is None:
            return f"no CUDA {self.cuda} build of torch {self.series} seen: the cu{self.cuda} rule, unverified"
        where = "PyPI default" if self.default else "PyTorch index"
        return f"{self.build} ({where}); " + (
            "pins recorded" if self.recorded else "pins not recorded: same rule, unverified"
        )


# One row per torch release and CUDA major. The build is PyPI's default where that is of this CUDA major, else a
# build of the PyTorch index (HARDWARE_REACH.md §1.1 lists the variants seen).
ROWS = [
    Row("2.9", 12, "cu128", True, True),
    Row("2.9", 13, "cu130", False, True),
    Row("2.10", 12, "cu128", True, True),
    Row("2.10", 13, "cu130", False, False),
    Row("2.11", 12, "cu128", False, True),
    Row("2.11", 13, "cu130", True, True),
    Row("2.12", 12, "cu126", False, True),
    Row("2.12", 13, "cu130", True, True),
    Row("2.13", 12, "cu126", False, False),
    Row("2.13", 13, "cu130", True, True),
    Row("2.14", 12, None, False, False),
    Row("2.14", 13, "cu130", True, True),
    Row("2.15", 12, None, False, False),
    Row("2.15", 13, "CUDA 13.2", True, True),
]


def row_for(torch_version: str, cuda_version: Optional[str]) -> Optional[Row]:
    """The row of an installed torch ("2.10.0+cu128", "12.8"), or None (a CPU build, a release outside the table)."""
    if not cuda_version:
        return None
    series = ".".join(torch_version.split("+")[0].split(".")[:2])
    cuda = int(cuda_version.split(".")[0])
    return next((r for r in ROWS if r.series == series and r.cuda == cuda), None)


def command_for(torch_version: str, cuda_version: Optional[str]) -> str:
    """What to run for an installed torch ("2.10.0+cu128", "12.8"): its row's command (the README's), or, for a
    release outside the table, the rule for its CUDA major."""
    if not cuda_version:
        return "install a CUDA build of torch first (README 'Installing' has the command for each release)"
    row = row_for(torch_version, cuda_version)
    return row.command() if row else extra_hint(f"cu{cuda_version.split('.')[0]}")


def markdown_table() -> str:
    lines = ["| torch | CUDA | install (from the folder holding the wheel) | torch build, pins |", "|---|---|---|---|"]
    for r in ROWS:
        lines.append(f"| {r.series} | {r.cuda} | `{r.command()}` | {r.note()} |")
    return "\n".join(lines)
