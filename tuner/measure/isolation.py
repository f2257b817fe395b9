"""Measuring in a child process, so that no config can take the run down with it.

The parent keeps the search; a child process builds the real measurer (tuner/measure/device_measurer.py,
on a GPU or the CPU device) and times configs one by one, sending each result back as soon
as it has it. When the child dies (a segfault, an illegal memory access that poisons its CUDA
context, an abort), hangs past the timeout, or has served its quota of configs (Triton's
in-process caches only grow), the parent records the config it was on as failed with the
reason, starts a fresh child and goes on with the rest.

The child is an ordinary (not daemonic) process, so it can start its compile-worker pool; it
leads a process group of its own that its compile workers join, and the parent always ends
it by killing that whole group (tuner/measure/process_tree.py), so a restart leaves no compile worker
behind. The child and its workers also die when their parent does, kill -9 included.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import multiprocessing.util  # noqa: F401 - imported before our atexit hook, so that ours runs first
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from multiprocessing import get_context
from typing import Any, Callable

from tuner.errors import TunerError
from tuner.measure.failures import CRASH, RUNTIME, TIMEOUT
from tuner.measure.measurers import Measurement, NumericsCheck, valid
from tuner.measure.process_tree import become_group_leader, die_with_parent, kill_group, watch_parent
from tuner.plan.kernel_api import Config, KernelSpec
from tuner.plan.problems import Problem

# A child we kill (a hang, a crash, a run stopped) leaves the semaphores of its compile
# workers' queues to Python's resource tracker, which unlinks them at the end of the run and
# warns that it does ("leaked semaphore objects"): nothing is leaked, so that warning is not
# printed. The tracker takes its warning filters from this process's -W options when it
# starts (the first child starts it), so the filter goes there before any child does.
QUIET_TRACKER = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"
if QUIET_TRACKER not in sys.warnoptions:
    sys.warnoptions.append(QUIET_TRACKER)

DEFAULT_TIMEOUT_S = 120.0          # one config, compile included: a fifth of a 10-minute device command
COMPILE_SHARE = 0.5                # a compile worker's build is waited for at most this share of it
WAIT_TICK_S = 1.0                  # while the child works, whoever waits (the progress line) hears of it this often


def _child_main(conn, factory: str, kwargs: dict, pdeathsig: bool, parent: int | None = None) -> None:
    """The child: build the measurer, then serve requests until told to stop. A parent gone
    (killed, interrupted: the pipe breaks) ends it quietly, never with a traceback."""
    become_group_leader()
    # Interrupted from outside (SIGINT, as SIGTERM already does): a quiet death the parent
    # reads as its run being stopped, not a config's crash. (This process started with SIGINT
    # ignored, while it was still in its parent's process group: see IsolatedMeasurer._start.)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if pdeathsig:
        die_with_parent()
    watch_parent(kill_group=True, parent=parent)
    try:
        _serve(conn, factory, kwargs)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass                               # the parent is gone: nothing to tell anyone


def _serve(conn, factory: str, kwargs: dict) -> None:
    try:
        module, attr = factory.split(":")
        inner = getattr(importlib.import_module(module), attr)(**kwargs)
        conn.send(("ready", inner.environment()))
    except (BrokenPipeError, ConnectionResetError, EOFError):
        raise
    except TunerError as e:
        conn.send(("fatal", str(e)))
        return
    except Exception as e:  # noqa: BLE001
        conn.send(("fatal", f"{type(e).__name__}: {e}"))
        return
    compile_stats, counters = getattr(inner, "compile_stats", None), getattr(inner, "counters", None)
    if hasattr(inner, "on_step"):          # what it is doing (compiling, timing config k of n), as it starts it
        inner.on_step = lambda text: conn.send(("status", text))

    def stats() -> dict | None:
        """Sent with every result: the compile counts and the measurer's counters so far."""
        out = dict(compile_stats()) if compile_stats else {}
        if counters:
            out["counters"] = counters()
        return out or None

    try:
        _requests(conn, inner, stats)
    finally:
        try:
            inner.close()
        except Exception:  # noqa: BLE001
            pass


def _requests(conn, inner, stats) -> None:
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method == "close":
            break
        try:
            if method == "measure":
                problem, M, configs, *ahead = args
                if ahead and hasattr(inner, "compile_ahead"):
                    inner.compile_ahead(ahead[0])
                each = getattr(inner, "measure_iter", None)
                results = each(problem, M, configs) if each else (
                    inner.measure(problem, M, [c])[0] for c in configs)
                for result in results:
                    conn.send(("item", result))
                    if getattr(inner, "poisoned", False):
                        # the CUDA context is unusable after that error: let the parent start anew
                        conn.send(("restart", (f"CUDA context lost after {result.error}", stats())))
                        return
                conn.send(("done", stats()))
            else:
                result = getattr(inner, method)(*args)
                lost = f"CUDA context lost after {method}" if getattr(inner, "poisoned", False) else None
                conn.send(("ok", (result, lost, stats())))
                if lost:
                    return
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


def _stopped_from_outside(exitcode) -> None:
    """A child ended by SIGINT or SIGTERM was stopped by someone (a Ctrl-C, a scheduler), not
    by a config (those crash, abort or hang, and we kill with SIGKILL): the run stops as
    interrupted, the config at hand left unmeasured (a rerun measures it), never recorded as
    a crash."""
    from tuner.errors import Terminated
    if exitcode == -signal.SIGINT:
        raise KeyboardInterrupt("the measuring worker was interrupted (SIGINT)")
    if exitcode == -signal.SIGTERM:
        raise Terminated("the measuring worker was terminated (SIGTERM)")


@contextlib.contextmanager
def _quiet_start():
    """Around starting a child (fork, exec, handing it what it runs: milliseconds). The child
    starts in our process group and leaves it only when it runs our code: a Ctrl-C meanwhile,
    while Python starts in it (seconds), would print its KeyboardInterrupt traceback. So it
    starts with SIGINT ignored, the one disposition exec keeps (the spawn resets a signal
    mask), and takes SIGINT again when it is on its own; a Ctrl-C landing here in those
    milliseconds is lost. A SIGTERM here waits until the child has all it needs (a start cut
    short leaves it a half-read pipe and a traceback), then stops us as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    deferred: list[int] = []
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    sigterm = signal.signal(signal.SIGTERM, lambda signum, frame: deferred.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, sigterm)
        if deferred:
            if callable(sigterm):
                sigterm(signal.SIGTERM, None)
            elif sigterm != signal.SIG_IGN:
                os.kill(os.getpid(), signal.SIGTERM)


def _death_reason(exitcode) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


def _add_counts(a: dict, b: dict | None) -> dict:
    """Compile counts (and the measurers' counters) of two children added up."""
    if not b:
        return a
    out: dict = {k: a.get(k, 0) + b.get(k, 0) for k in ("built", "failed", "lost", "reused", "ahead", "ahead_used",
                                                                  "ahead_dropped")}
    out["wait_s"] = round(a.get("wait_s", 0.0) + b.get("wait_s", 0.0), 3)
    out["errors"] = (list(a.get("errors", [])) + list(b.get("errors", [])))[:5]
    if a.get("counters") or b.get("counters"):
        ca, cb = a.get("counters") or {}, b.get("counters") or {}
        out["counters"] = {k: ca.get(k, 0) + cb.get(k, 0) for k in {*ca, *cb}}
    return out


# Children alive in this process, ended at exit before multiprocessing joins them (a child
# that is not daemonic would otherwise be waited for forever).
_LIVE: "weakref.WeakSet[IsolatedMeasurer]" = weakref.WeakSet()


@atexit.register
def _end_children() -> None:
    for m in list(_LIVE):
        m._kill()


class IsolatedMeasurer:
    """A Measurer whose work happens in a replaceable child process."""

    def __init__(self, kernel: KernelSpec, factory: str, kwargs: dict, timeout_s: float = DEFAULT_TIMEOUT_S,
                 recycle_after: int = 256, start_timeout_s: float = 900.0, label: str = "gpu",
                 on_wait: Callable[[str, float], None] | None = None):
        self.kernel = kernel
        self.factory, self.kwargs = factory, kwargs
        self.timeout_s, self.recycle_after, self.start_timeout_s = timeout_s, recycle_after, start_timeout_s
        self.label = label
        self.starts = 0
        self.failures: list[str] = []          # what took children down, for the manifest
        self.process_groups: list[int] = []    # every child's group (its pid), for whoever counts processes
        self.proc: Any = None             # the child (a spawn Process) and our end of its pipe
        self.conn: Any = None
        self._env: dict = {}
        self._compiles_before: dict = {}       # compile counts of children already replaced
        self._compiles_now: dict = {}
        self._ahead: list = []                 # configs to build ahead, sent with the next measurement
        self.busy = False                      # a request sent and not answered in full (a stop lands mid-request)
        # told every WAIT_TICK_S while we wait on the child: what it is doing, for how many seconds
        self.on_wait = on_wait
        self.step, self._step_since = "", time.monotonic()
        self._start()

    # -- the child's life ------------------------------------------------------------
    def _start(self) -> None:
        ctx = get_context("spawn")
        self.conn, child_end = ctx.Pipe()
        # PR_SET_PDEATHSIG follows the thread that starts the child: ask for it only from the
        # main thread, which lives as long as the run (the parent watch covers the rest)
        pdeathsig = threading.current_thread() is threading.main_thread()
        self.proc = ctx.Process(target=_child_main, args=(child_end, self.factory, self.kwargs, pdeathsig, os.getpid()),
                                daemon=False)
        with _quiet_start():
            self.proc.start()
            _LIVE.add(self)
        child_end.close()
        self.process_groups.append(self.proc.pid)
        self.starts += 1
        self.served = 0
        self.busy = False
        try:
            self._doing("starting the measuring worker")
            started = self._wait(self.start_timeout_s)
        except BaseException:                 # stopped while it starts (a --minutes window's end): no child left
            self._kill()
            raise
        if not started:
            self._kill()
            raise TunerError(f"the measuring worker did not start within {self.start_timeout_s:.0f}s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            reason = _death_reason(self.proc.exitcode)
            self._kill()
            _stopped_from_outside(self.proc.exitcode)
            raise TunerError(f"the measuring worker failed to start ({reason})") from None
        if status == "fatal":
            self._kill()
            raise TunerError(payload)
        self._env = payload

    def _kill(self) -> None:
        """End the child and everything in its process group (its compile workers)."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()
        _LIVE.discard(self)

    def _restart(self, why: str | None) -> None:
        """A fresh child: after a failure (`why`) the old one is killed with its group; when
        recycled it is closed first, so that its pool ends cleanly."""
        if why:
            self.failures.append(why)
        else:
            self.close()
        self._compiles_before = _add_counts(self._compiles_before, self._compiles_now)
        self._compiles_now = {}
        self._kill()
        self._start()

    def _doing(self, step: str) -> None:
        self.step, self._step_since = step, time.monotonic()
        if self.on_wait is not None:
            self.on_wait(step, 0.0)

    def _wait(self, timeout: float) -> bool:
        """conn.poll(timeout), telling on_wait what the child is doing every WAIT_TICK_S meanwhile."""
        if self.on_wait is None:
            return self.conn.poll(max(timeout, 0))
        deadline = time.monotonic() + timeout
        while not self.conn.poll(max(0.0, min(WAIT_TICK_S, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return False
            self.on_wait(self.step, time.monotonic() - self._step_since)
        return True

    def _receive(self, timeout: float):
        """(status, payload), or ("lost", reason) when the child died or hung. The child's word
        of what it is doing ("status") goes to on_wait; the timeout runs on regardless."""
        deadline = time.monotonic() + timeout
        while True:
            if not self._wait(deadline - time.monotonic()):
                return "lost", f"hang: no result within {timeout:.0f}s"
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(5)
                _stopped_from_outside(self.proc.exitcode)
                return "lost", _death_reason(self.proc.exitcode)
            if message[0] != "status":
                return message
            self._doing(message[1])

    def _send(self, message) -> bool:
        try:
            self.conn.send(message)
            return True
        except (BrokenPipeError, OSError):
            return False

    # -- the Measurer interface ----------------------------------------------------------
    def environment(self) -> dict:
        env = dict(self._env)
        env["worker_starts"] = self.starts
        if self.failures:
            env["worker_failures"] = list(self.failures)
        compiles = _add_counts(self._compiles_before, self._compiles_now)
        env.update(compiles.pop("counters", None) or {})      # retakes, clock warm-ups: live, not as at start
        if compiles.get("built") or compiles.get("failed") or compiles.get("lost"):
            env["compiles"] = compiles
        return env

    def candidates(self, problem: Problem, M: int):
        return None

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        results: list[Measurement] = []
        todo = list(configs)
        while todo:
            if self.served >= self.recycle_after:
                self._restart(None)          # memory stays flat: a fresh child now and then
            # no more than the child's quota: it is replaced after exactly recycle_after configs
            batch = todo[: max(1, self.recycle_after - self.served)]
            self.busy = True                # until "done": a stop meanwhile kills the child (close)
            ahead, self._ahead = self._ahead, []     # with the first batch sent: built while it is timed
            if not self._send(("measure", (problem, M, batch, *([ahead] if ahead else [])))):
                self.proc.join(5)
                _stopped_from_outside(self.proc.exitcode)
                self._restart(_death_reason(self.proc.exitcode))
                continue
            pending = len(batch)
            while True:                     # until "done" (or a restart), so the pipe stays in step
                status, payload = self._receive(self.timeout_s)
                if status == "item":
                    results.append(valid(payload))
                    todo.pop(0)
                    pending -= 1
                    self.served += 1
                elif status == "done":
                    self._compiles_now = payload or {}
                    self.busy = False
                    break
                elif status == "restart":   # the child gave up its CUDA context after an error
                    why, self._compiles_now = payload
                    self._restart(why)
                    break
                elif status == "error":     # the batch as a whole raised: blame the config at hand
                    self.busy = False
                    results.append(Measurement(None, None, payload.splitlines()[0], RUNTIME))
                    todo.pop(0)
                    break
                elif not pending:           # lost after the batch's last result: nothing to blame
                    self._restart(payload)
                    break
                else:                       # "lost": the config at hand crashed or hung the child
                    results.append(Measurement(None, None, payload, TIMEOUT if payload.startswith("hang") else CRASH))
                    todo.pop(0)
                    self._restart(f"{payload} ({problem.key} M={M} {configs[len(results) - 1]})")
                    break
        return results

    def call(self, method: str, *args, timeout_s: float | None = None):
        """(True, result) of the child measurer's `method`, or (False, why) when it raised,
        crashed or hung; a child that crashed, hung or lost its CUDA context is replaced."""
        if not self._send((method, args)):
            self.proc.join(5)
            _stopped_from_outside(self.proc.exitcode)
            self._restart(_death_reason(self.proc.exitcode))
            if not self._send((method, args)):
                return False, "measuring worker was gone"
        self.busy = True
        self._doing(method.replace("_", " "))
        status, payload = self._receive(timeout_s or self.timeout_s)
        self.busy = status not in ("ok", "error")
        if status == "ok":
            result, lost, self._compiles_now = payload
            if lost:
                self._restart(lost)
            return True, result
        if status == "lost":
            self._restart(f"{payload} ({method})")
            return False, payload
        return False, str(payload).splitlines()[0]

    def compile_ahead(self, jobs: list[tuple[Problem, int, Config]]) -> None:
        """Configs likely asked for next: sent with the next measurement, whose compile workers
        build them after its own configs (DeviceMeasurer.compile_ahead)."""
        self._ahead = list(jobs)

    def check_numerics(self, problem: Problem, M: int, config: Config, seed: int | None = None) -> NumericsCheck:
        ok, result = self.call("check_numerics", problem, M, config, seed)
        return result if ok else NumericsCheck("failed", None, result)

    def precompile(self, jobs: list[tuple[Problem, int, Config]]) -> dict:
        """Build many configs at once in the child's compile workers (validation)."""
        workers = max(1, int(self.kwargs.get("compile_workers") or 1))
        wait = float(self.kwargs.get("compile_timeout_s") or self.timeout_s)
        ok, result = self.call("precompile", jobs, timeout_s=self.timeout_s + wait * math.ceil(len(jobs) / workers))
        return result if ok else {"error": result}

    def run_here(self, function: str, *args):
        """`module:function`(the child's measurer, *args) in the child; raises RuntimeError
        with the reason when it raised, crashed or hung (the child is replaced)."""
        ok, result = self.call("run_here", function, *args)
        if not ok:
            raise RuntimeError(result)
        return result

    def close(self) -> None:
        """Ended cleanly (its compile pool closed) when idle; killed with its group at once when
        a request is still in flight (a Ctrl-C or SIGTERM mid-measurement: it would read
        "close" only after the config at hand, minutes later in Triton's interpreter)."""
        if self.proc is not None and self.proc.is_alive() and not self.busy:
            self._send(("close", None))
            self.proc.join(10)
        self._kill()


def isolated_gpu_measurer(kernel: KernelSpec, gpu_key: str, compile_workers: int = 8,
                          timeout_s: float = DEFAULT_TIMEOUT_S, recycle_after: int = 256,
                          device: str = "cuda", policy: dict | None = None,
                          on_wait: Callable[[str, float], None] | None = None) -> "IsolatedMeasurer":
    """The device measurer (tuner.measure.device_measurer) in a replaceable child process, on a CUDA GPU
    or the CPU device. Its compile workers are waited for at most half the timeout, so that a
    slow compile is never taken for a hung config."""
    from tuner.measure.device import CpuDevice, CudaDevice, check_kind
    label = (CpuDevice if check_kind(device) == "cpu" else CudaDevice).label
    return IsolatedMeasurer(kernel, "tuner.measure.device_measurer:make_gpu_measurer",
                            {"kernel": kernel.ref, "gpu": gpu_key, "compile_workers": compile_workers,
                             "device": device, "compile_timeout_s": COMPILE_SHARE * timeout_s,
                             **({"policy": policy} if policy else {})},
                            timeout_s=timeout_s, recycle_after=recycle_after, label=label, on_wait=on_wait)
