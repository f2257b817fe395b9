"""A progress line on stderr while tuning: a bar on a terminal (within its width, redrawn in
place), a line per study otherwise (wrapped to 120 columns or the terminal's width)."""

from __future__ import annotations

import sys
import time

from tuner.textwidth import cut, fit_text, terminal_known, width


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

    def line(self, done: int, budget: int, best: float | None, columns: int) -> str:
        """The redrawn line, one column short of `columns` (a terminal wraps a line that fills its
        last column): counts, best time and elapsed first, then as much of the study's label as fits."""
        frac = (self.study - 1 + min(done / max(budget, 1), 1.0)) / self.total
        bar_width = 20 if columns >= 100 else 10
        bar = "#" * int(frac * bar_width) + "-" * (bar_width - int(frac * bar_width))
        best_s = f"{best:.2f} {self.unit}" if best is not None else "-"
        head = (f"[{bar}] {self.study}/{self.total} trial {done}/{budget} best {best_s} "
                f"{time.monotonic() - self.t0:.0f}s  ")
        return cut(head + self.label, columns - 1)

    def trial(self, done: int, budget: int, best: float | None) -> None:
        if not self.tty:
            return
        line = self.line(done, budget, best, width(self.stream))
        self.stream.write("\r" + line.ljust(len(self._last)))
        self.stream.flush()
        self._last = line

    def end_study(self, summary: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self._last = ""
        self.stream.write(self._fit(f"[{self.study}/{self.total}] {self.label}: {summary}") + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if self.enabled:
            if self.tty and self._last:
                self.stream.write("\n")
                self._last = ""
            self.stream.write(self._fit(text) + "\n")
            self.stream.flush()

    def _fit(self, text: str) -> str:
        """`text` wrapped to the terminal's width; whole where none is known (a log)."""
        return fit_text(text, width(self.stream)) if terminal_known(self.stream) else text
