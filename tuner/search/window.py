"""A time-boxed window of tuning (--minutes): when it closes, and stopping on time.

The studies check the window before each batch they measure (`fits`: is there time for one
more, at the longest batch this window or the study's stored trials took?) and close cleanly
when there is not: the trials measured so far stay in the storage, and the next window with
the same storage continues the study. A batch that runs past the end anyway (a compile that
hangs, a machine under load) is cut at the deadline by an alarm: only while measuring
(`measuring()`), the one place where the process waits on something else, so a storage write
is never cut in the middle; the cut batch's trials are failed as interrupted, and the next
window measures them again (tuner/search/storage.py fail_stale). No estimate depends on an
idle machine: every time is one this window or an earlier one measured.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator


def now() -> float:
    """The window's clock (tests give it another)."""
    return time.monotonic()


class WindowClosed(Exception):
    """The window's time is up: stop measuring, keep what is stored."""


class Window:
    def __init__(self, minutes: float, clock: Callable[[], float] | None = None, began: float | None = None):
        self.minutes = float(minutes)
        self.clock: Callable[[], float] = clock or now
        self.started = self.clock() if began is None else began     # began: when the command did
        self.deadline = self.started + self.minutes * 60.0
        self.closed = False              # set once a study stopped for want of time
        self.longest_s = 0.0             # the longest batch measured in this window
        self.finish_s = 0.0              # the longest close of a study (finalists timed again, checked)
        self._measuring = False

    def left(self) -> float:
        """Seconds until the window closes (never below 0)."""
        return max(0.0, self.deadline - self.clock())

    def fits(self, seconds: float) -> bool:
        """Whether work expected to take `seconds` ends before the deadline; False from the
        first time it did not, so that no later, smaller piece starts in the gap."""
        if not self.closed and self.clock() + seconds >= self.deadline:
            self.closed = True
        return not self.closed

    def batch_seconds(self, trials) -> float:
        """What the next batch is expected to take: the longest batch measured in this window, or
        the longest of the study's measured trials (Optuna FrozenTrials) from ask to tell (an
        earlier window's too)."""
        from tuner.search.storage import counts
        took = [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                if counts(t) and t.datetime_start and t.datetime_complete]
        return max([self.longest_s, *took])

    def before_batch(self, trials) -> None:
        if not self.fits(self.batch_seconds(trials)):
            raise WindowClosed()

    def before_close(self, trials) -> None:
        """A study's close (its finalists timed again, checked): as long as the longest close so
        far, and at least two batches."""
        if not self.fits(max(self.finish_s, 2 * self.batch_seconds(trials))):
            raise WindowClosed()

    @contextlib.contextmanager
    def measuring(self, closing: bool = False, starting: bool = False) -> Iterator[None]:
        """Measuring a batch (closing: a study's finalists; starting: waiting for the measuring
        worker to start): the deadline's alarm may cut it (raising WindowClosed here). The
        time of a batch and of a close is kept, the longest of each."""
        if self.left() <= 0:
            self.closed = True
            raise WindowClosed()
        t0 = self.clock()
        self._measuring = True
        try:
            yield
        finally:
            self._measuring = False
            took = self.clock() - t0
            if closing:
                self.finish_s = max(self.finish_s, took)
            elif not starting:
                self.longest_s = max(self.longest_s, took)

    @contextlib.contextmanager
    def alarm(self) -> Iterator[None]:
        """The deadline as an alarm (the main thread only: elsewhere the checks alone stop)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def ring(signum, frame):
            self.closed = True
            if self._measuring:
                self._measuring = False
                raise WindowClosed()

        before = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, self.left()))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)


def measuring_in(window: Window | None, closing: bool = False, starting: bool = False):
    """Measuring in a window (which its deadline may cut), or without one."""
    return window.measuring(closing, starting) if window is not None else contextlib.nullcontext()
