"""A plain-text progress bar on stderr (no dependency): `label [#####.....] 3/10 note`, redrawn in place."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, label: str, stream=None, width: int = 30):
        if total < 1:
            raise ValueError(f"a progress bar needs a positive total, got {total}")
        self.total, self.label, self.width = total, label, width
        self.stream = stream if stream is not None else sys.stderr

    def render(self, done: int, note: str = "") -> str:
        done = max(0, min(done, self.total))
        fill = self.width * done // self.total
        return f"{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total}" + (
            f" {note}" if note else ""
        )

    def update(self, done: int, note: str = "") -> None:
        self.stream.write("\r" + self.render(done, note) + ("\n" if done >= self.total else ""))
        self.stream.flush()
