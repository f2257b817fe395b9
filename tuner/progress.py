"""A progress line on stderr while tuning: a bar on a terminal, a line per study otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_studies: int, stream=None, enabled: bool = True, unit: str = "us"):
        self.total = max(total_studies, 1)
        self.unit = unit                      # how a time is shown ("us (CPU device)" off a GPU)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.study = 0
        self.t0 = time.monotonic()
        self._last = ""

    def start_study(self, label: str) -> None:
        self.study += 1
        self.label = label

    def trial(self, done: int, budget: int, best: float | None) -> None:
        if not self.tty:
            return
        frac = (self.study - 1 + min(done / max(budget, 1), 1.0)) / self.total
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        best_s = f"{best:.2f} {self.unit}" if best is not None else "-"
        line = (f"\r[{bar}] {self.study}/{self.total} {self.label}  trial {done}/{budget}  best {best_s}"
                f"  {time.monotonic() - self.t0:.0f}s")
        self.stream.write(line.ljust(len(self._last)))
        self.stream.flush()
        self._last = line

    def end_study(self, summary: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self._last = ""
        self.stream.write(f"[{self.study}/{self.total}] {self.label}: {summary}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if self.enabled:
            if self.tty and self._last:
                self.stream.write("\n")
                self._last = ""
            self.stream.write(text + "\n")
            self.stream.flush()
