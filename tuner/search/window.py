"""A time-boxed window of tuning (--minutes): when it closes, and stopping on time.

The studies check the window before each batch they measure (`fits`: is there time for one
more, at the longest batch this window or the study's recent stored batches took?) and before
a study's close (its finalists timed again, checked, its tables written), and close cleanly
when there is not: the trials measured so far stay in the storage, and the next window with
the same storage continues the study. A batch that runs past the end anyway (a compile that
hangs, a machine under load) is cut at the deadline by an alarm: only while measuring
(`measuring()`), the one place where the process waits on something else, so a storage write
is never cut in the middle; the cut batch's trials are failed as interrupted (keeping how long
they ran, `CUT_ATTR`: the next window knows such a batch takes longer than that), and the next
window measures them again (tuner/search/storage.py fail_stale). No estimate depends on an
idle machine: every time is one this window or an earlier one measured, on the monotonic clock
(`now`: a wall-clock step, NTP or a suspended VM, changes no duration), each stored one bounded
by what a batch can take (`plausible`), so an edited or damaged storage cannot block a window.

A window that cannot make progress says so: where its start-up and the next step (a batch, or
a study's close) do not fit in its minutes and nothing was measured or closed, `stalled()` says
how long a window needs to be (tuner/pipeline/tune.py prints it, and the command exits 1),
instead of ending window after window with nothing done.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from typing import Callable, Iterable, Iterator

TOOK_ATTR = "took_s"        # a measured trial: the monotonic seconds of its batch, from its round's start to the tell
BATCH_ATTR = "batch"        # ...and how many configs that batch measured
CUT_ATTR = "cut_s"          # a trial of a batch the window's alarm cut: how long the batch had run
CLOSE_ATTR = "close_s"      # a study (user attribute): the seconds its close took (finalists, choice, tables)
CLOSE_CUT_ATTR = "close_cut_s"   # a study (user attribute): how long a close the window's alarm cut had run
SPENT_ATTR = "spent_s"      # a study (user attribute): the seconds spent on it, every window, all in
STARTING = "the measuring worker's start"
RECENT = 8                  # the stored batches a study's next batch is judged by (the latest, not the first cold ones)


def now() -> float:
    """The window's clock, monotonic (tests give it another)."""
    return time.monotonic()


def plausible(seconds: object, most: float) -> float | None:
    """A stored duration as a number of seconds within [0, most] (None: not a number at all)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return None
    return min(max(float(seconds), 0.0), most)


def suggested_minutes(needs_s: float) -> float:
    """A window's length to suggest for one that needs `needs_s` (start-up and next step), in tenths of a
    minute, with room: 1.25x and 10 s, as a loaded machine's start-up and batches vary from one window to
    the next."""
    return math.ceil((needs_s * 1.25 + 10) / 6) / 10


class WindowClosed(Exception):
    """The window's time is up: stop measuring, keep what is stored."""


class Window:
    def __init__(self, minutes: float, clock: Callable[[], float] | None = None, began: float | None = None,
                 measure_timeout: float = 120.0):
        self.minutes = float(minutes)
        self.clock: Callable[[], float] = clock or (lambda: now())
        self.started = self.clock() if began is None else began     # began: when the command did
        self.deadline = self.started + self.minutes * 60.0
        self.closed = False              # set once a study stopped for want of time
        self.longest_s = 0.0             # the longest batch measured in this window
        self.finish_s = 0.0              # the longest close of a study in this window
        self.stored_close_s = 0.0        # the longest close an earlier window stored (tuner/pipeline/studies.py)
        self.measure_timeout = float(measure_timeout)
        self.ready_s: float | None = None     # the start-up: seconds from the command's start to its first study
        self.measured = 0                # configs measured in this window
        self.concluded = 0               # studies closed in this window
        self.needed: tuple[str, float] | None = None   # the step that did not fit: (what it takes, seconds)
        self.cut: tuple[str, float] | None = None      # the step the alarm cut: (what, seconds it had run)
        self._measuring = False
        self._from_cut = False

    def left(self) -> float:
        """Seconds until the window closes (never below 0)."""
        return max(0.0, self.deadline - self.clock())

    def ready(self) -> None:
        """The run is ready for its first study: what came before is the window's start-up."""
        if self.ready_s is None:
            self.ready_s = self.clock() - self.started

    def fits(self, seconds: float, what: str = "the next step") -> bool:
        """Whether work expected to take `seconds` ends before the deadline; False from the
        first time it did not, so that no later, smaller piece starts in the gap."""
        if not self.closed and self.clock() + seconds >= self.deadline:
            self.closed = True
            self.needed = (what, seconds)
        return not self.closed

    def most_s(self, configs: int) -> float:
        """The longest a batch of `configs` can plausibly take: each config within the measure
        timeout, compiles included, and a minute for the rest."""
        return (max(1, configs) + 1) * self.measure_timeout + 60.0

    def batch_seconds(self, trials: Iterable, configs: int = 1) -> float:
        """What the next batch (of `configs`) is expected to take: the longest batch measured in
        this window, or of the study's RECENT latest stored batches (an earlier window's too),
        at least as long as a batch the alarm cut ran; every stored time bounded (`plausible`)."""
        from tuner.search.storage import counts
        most = self.most_s(configs)
        took: list[tuple[int, float, int]] = []
        cut = []
        for t in trials:
            attrs = t.user_attrs
            if counts(t):
                s = plausible(attrs.get(TOOK_ATTR), most)
                n = attrs.get(BATCH_ATTR, 1)
                if s is not None:
                    took.append((t.number, s, n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1))
            elif attrs.get("error") == "interrupted":
                s = plausible(attrs.get(CUT_ATTR), most)
                if s is not None:
                    cut.append(s)
        recent = sorted(took)[-RECENT:]
        longest = max([self.longest_s, *(s for _, s, _ in recent)])
        self._from_cut = max(cut, default=0.0) > longest       # a lower bound: such a batch ran longer
        return max([longest, *cut])

    def close_seconds(self, trials: Iterable, configs: int = 8, cut_s: object = None) -> float:
        """What a study's close is expected to take: the longest close of this window or stored by
        an earlier one, else two batches (its `configs` are timed again, compiling nothing: a batch's
        time per config, compiles included, would price it several times over, and a window shorter
        than an estimate never measures a close to learn better), and never less than an earlier
        window's cut close of this study ran (`cut_s`): an estimate too short costs one cut close."""
        known = max(self.finish_s, min(self.stored_close_s, self.most_s(configs)))
        if known <= 0:
            known = 2 * self.batch_seconds(trials)
        cut = plausible(cut_s, self.most_s(configs)) or 0.0
        self._from_cut = cut > known
        return max(known, cut)

    def before_batch(self, trials, configs: int = 1) -> None:
        seconds = self.batch_seconds(trials, configs)
        what = f"a batch of {configs} config{'s' * (configs != 1)}"
        said = (f"{what} ran more than {seconds:.0f} s before a window cut it" if self._from_cut
                else f"{what} takes about {seconds:.0f} s (measured)" if seconds > 0
                else "nothing was measured yet")
        if not self.fits(seconds, said):
            raise WindowClosed()

    def before_close(self, trials, configs: int = 8, cut_s: object = None) -> None:
        """A study's close (its finalists timed again, checked, its tables written)."""
        seconds = self.close_seconds(trials, configs, cut_s)
        what = "a study's close (finalists timed again, checked)"
        said = (f"{what} ran more than {seconds:.0f} s before a window cut it" if self._from_cut
                else f"{what} takes about {seconds:.0f} s")
        if not self.fits(seconds, said):
            raise WindowClosed()

    def batch_done(self, seconds: float, configs: int) -> None:
        """A batch measured, taking `seconds` from its round's start."""
        self.longest_s = max(self.longest_s, seconds)
        self.measured += configs

    def close_done(self, seconds: float) -> None:
        self.finish_s = max(self.finish_s, seconds)
        self.concluded += 1

    @property
    def progressed(self) -> bool:
        return bool(self.measured or self.concluded)

    def _next_step(self) -> tuple[float, float, str]:
        """(start-up, the next step's seconds, what is known of it) as this window saw them."""
        startup = self.ready_s if self.ready_s is not None else self.clock() - self.started
        if self.needed is not None:
            known, step = self.needed
        elif self.cut is not None and self.cut[0] == STARTING:
            # its start-up was not over, nor any batch begun: both are longer than the window saw, so
            # the start-up and a first batch are counted as long again (a 0 s next step advised a
            # window that closed on the worker's start again)
            known = "the measuring worker was still starting when it closed (counted as long again with a first batch)"
            step = max(self.longest_s, self.cut[1], startup)
        elif self.cut is not None:
            known, step = f"{self.cut[0]} ran {self.cut[1]:.0f} s before the window cut it", self.cut[1]
        else:
            known, step = "nothing was measured yet", self.longest_s
        return startup, step, known

    def needs_seconds(self) -> float:
        """How long a window of this run needs to be to make progress, as this one measured it: its
        start-up and the next step."""
        startup, step, _ = self._next_step()
        return startup + step

    def stalled(self) -> str | None:
        """Where this window measured nothing and closed no study for want of time: why, and how
        long a window needs to be (None: it made progress, or it was not short of time)."""
        if self.progressed or not self.closed:
            return None
        startup, _, known = self._next_step()
        minutes = suggested_minutes(self.needs_seconds())
        return (f"the window of {self.minutes:g} min ({self.minutes * 60:.0f} s) is too short to make progress: its "
                f"start-up took {startup:.0f} s and {known}; give --minutes {minutes:g} or more")

    @contextlib.contextmanager
    def measuring(self, closing: bool = False, starting: bool = False) -> Iterator[None]:
        """Measuring a batch (closing: a study's finalists; starting: waiting for the measuring
        worker to start): the deadline's alarm may cut it (raising WindowClosed here), and what
        it cut is kept (`cut`) for the line of a window too short."""
        if self.left() <= 0:
            self.closed = True
            raise WindowClosed()
        t0 = self.clock()
        self._measuring = True
        try:
            yield
        except WindowClosed:
            what = "a study's close" if closing else STARTING if starting else "a batch"
            self.cut = (what, self.clock() - t0)
            raise
        finally:
            self._measuring = False

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
