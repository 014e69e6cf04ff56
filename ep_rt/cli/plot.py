"""PNG charts for tune and bench when matplotlib is installed; without it, a note instead of a chart (ep_rt does
not depend on matplotlib)."""

from __future__ import annotations

import importlib


def _pyplot():
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, no display
    return importlib.import_module("matplotlib.pyplot")


NO_MATPLOTLIB = "matplotlib is not installed: no plot drawn (pip install matplotlib to get one)"


def lines(path, x, series: dict, xlabel: str, ylabel: str, title: str) -> str:
    """One line per series over x; returns what happened, for the user."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"


def bars(path, labels: list, series: dict, ylabel: str, title: str) -> str:
    """Grouped bars: one group per label, one bar per series."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 4))
    width = 0.8 / max(len(series), 1)
    for i, (name, ys) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], ys, width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))], labels, rotation=20, ha="right")
    ax.set(ylabel=ylabel, title=title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"
