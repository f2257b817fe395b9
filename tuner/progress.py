"""A progress line on stderr while tuning: a bar on a terminal (within its width, redrawn in
place), a line per study otherwise (wrapped to 120 columns or the terminal's width)."""

from __future__ import annotations

import sys
import time

from tuner.textwidth import cut, fit_text, terminal_known, width

# Into a log (no terminal), a wait on the measuring child is said once it has lasted this long,
# then again this often: a GPU's compile and timing take less, a CPU device's interpreter more.
LOG_WAIT_AFTER_S = 5.0
LOG_WAIT_EVERY_S = 30.0
# The CPU device: once one config's timing has taken this long in the interpreter, the run says
# what that rate means for its studies (a served model's shapes take it minutes a config).
SLOW_CONFIG_S = 60.0


class Progress:
    def __init__(self, total_studies: int, stream=None, enabled: bool = True, unit: str = "us"):
        self.total = max(total_studies, 1)
        self.unit = unit                      # how a time is shown ("us (CPU device)" off a GPU)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.study = 0
        self.label = ""
        self.t0 = time.monotonic()
        self._last = ""
        self._logged: tuple[str, float] = ("", 0.0)     # the wait last said into a log, at its seconds
        self.interpreted = False      # the CPU device: a slow config is said with what it means (once)
        self._slow_said = False

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

    def waiting(self, what: str, seconds: float) -> None:
        """What the measuring child is doing while the search waits (starting, compiling, timing
        config k of n) and for how long: redrawn on a terminal; into a log once the wait has
        lasted LOG_WAIT_AFTER_S, then every LOG_WAIT_EVERY_S."""
        if not self.enabled or not what:
            return
        if self.interpreted and what.startswith("timing") and seconds >= SLOW_CONFIG_S and not self._slow_said:
            self._slow_said = True      # a lower bound: each study times one config at least
            self.note(f"tuner: {seconds:.0f}s in Triton's interpreter for one config: {self.total} studies take over "
                      f"{self.total * seconds / 3600:.1f} h; try --synthetic or a small --model")
        total = time.monotonic() - self.t0
        where = f"[{self.study}/{self.total}] " if self.study else ""
        text = f"{where}{what}: {seconds:.0f}s ({total:.0f}s in all)"
        if self.tty:
            line = cut(f"{text}  {self.label}", width(self.stream) - 1)
            self.stream.write("\r" + line.ljust(len(self._last)))
            self.stream.flush()
            self._last = line
            return
        said, at = self._logged
        if seconds >= LOG_WAIT_AFTER_S and (what != said or seconds - at >= LOG_WAIT_EVERY_S):
            self._logged = (what, seconds)
            # one line, whatever the study's label, cut to the terminal's width or 120 columns; not
            # "[k/n] ...", which is a finished study's line
            study = f"; study {self.study}/{self.total} {self.label}" if self.study else ""
            self.note(cut(f"tuner: {what}: {seconds:.0f}s ({total:.0f}s in all){study}", min(width(self.stream), 120)))

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
