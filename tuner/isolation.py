"""Measuring in a child process, so that no config can take the run down with it.

The parent keeps the search; a child process builds the real measurer (the GPU one) and
times configs one by one, sending each result back as soon as it has it. When the child
dies (a segfault, an illegal memory access that poisons its CUDA context, an abort), hangs
past the timeout, or has served its quota of configs (Triton's in-process caches only
grow), the parent records the config it was on as failed with the reason, starts a fresh
child and goes on with the rest.
"""

from __future__ import annotations

import importlib
import signal
import traceback
from multiprocessing import get_context
from typing import Any

from tuner.errors import TunerError
from tuner.failures import CRASH, RUNTIME, TIMEOUT
from tuner.kernel_api import Config, KernelSpec
from tuner.measure import Measurement, NumericsCheck, valid
from tuner.problems import Problem


def _child_main(conn, factory: str, kwargs: dict) -> None:
    """The child: build the measurer, then serve requests until told to stop."""
    try:
        module, attr = factory.split(":")
        inner = getattr(importlib.import_module(module), attr)(**kwargs)
        conn.send(("ready", inner.environment()))
    except TunerError as e:
        conn.send(("fatal", str(e)))
        return
    except Exception as e:  # noqa: BLE001
        conn.send(("fatal", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method == "close":
            break
        try:
            if method == "measure":
                problem, M, configs = args
                each = getattr(inner, "measure_iter", None)
                results = each(problem, M, configs) if each else (
                    inner.measure(problem, M, [c])[0] for c in configs)
                for result in results:
                    conn.send(("item", result))
                    if getattr(inner, "poisoned", False):
                        # the CUDA context is unusable after that error: let the parent start anew
                        conn.send(("restart", f"CUDA context lost after {result.error}"))
                        return
                conn.send(("done", None))
            else:
                conn.send(("ok", getattr(inner, method)(*args)))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
    try:
        inner.close()
    except Exception:  # noqa: BLE001
        pass


def _death_reason(exitcode) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


class IsolatedMeasurer:
    """A Measurer whose work happens in a replaceable child process."""

    def __init__(self, kernel: KernelSpec, factory: str, kwargs: dict, timeout_s: float = 300.0,
                 recycle_after: int = 256, start_timeout_s: float = 900.0, label: str = "gpu"):
        self.kernel = kernel
        self.factory, self.kwargs = factory, kwargs
        self.timeout_s, self.recycle_after, self.start_timeout_s = timeout_s, recycle_after, start_timeout_s
        self.label = label
        self.starts = 0
        self.failures: list[str] = []          # what took children down, for the manifest
        self.proc: Any = None             # the child (a spawn Process) and our end of its pipe
        self.conn: Any = None
        self._env: dict = {}
        self._start()

    # -- the child's life ------------------------------------------------------------
    def _start(self) -> None:
        ctx = get_context("spawn")
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child_end, self.factory, self.kwargs), daemon=True)
        self.proc.start()
        child_end.close()
        self.starts += 1
        self.served = 0
        if not self.conn.poll(self.start_timeout_s):
            self._kill()
            raise TunerError(f"the measuring worker did not start within {self.start_timeout_s:.0f}s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise TunerError(f"the measuring worker failed to start ({_death_reason(self.proc.exitcode)})") from None
        if status == "fatal":
            self._kill()
            raise TunerError(payload)
        self._env = payload

    def _kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()

    def _restart(self, why: str | None) -> None:
        if why:
            self.failures.append(why)
        self._kill()
        self._start()

    def _receive(self, timeout: float):
        """(status, payload), or ("lost", reason) when the child died or hung."""
        if not self.conn.poll(timeout):
            return "lost", f"hang: no result within {timeout:.0f}s"
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            return "lost", _death_reason(self.proc.exitcode)

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
        return env

    def candidates(self, problem: Problem, M: int):
        return None

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        results: list[Measurement] = []
        todo = list(configs)
        while todo:
            if self.served >= self.recycle_after:
                self._restart(None)          # memory stays flat: a fresh child now and then
            if not self._send(("measure", (problem, M, todo))):
                self._restart(_death_reason(self.proc.exitcode))
                continue
            while True:                     # until "done" (or a restart), so the pipe stays in step
                status, payload = self._receive(self.timeout_s)
                if status == "item":
                    results.append(valid(payload))
                    todo.pop(0)
                    self.served += 1
                elif status == "done":
                    break
                elif status == "restart":   # the child gave up its CUDA context after an error
                    self._restart(payload)
                    break
                elif status == "error":     # the batch as a whole raised: blame the config at hand
                    results.append(Measurement(None, None, payload.splitlines()[0], RUNTIME))
                    todo.pop(0)
                    break
                elif not todo:              # lost after the last result: nothing to blame
                    self._restart(payload)
                    break
                else:                       # "lost": the config at hand crashed or hung the child
                    results.append(Measurement(None, None, payload, TIMEOUT if payload.startswith("hang") else CRASH))
                    todo.pop(0)
                    self._restart(f"{payload} ({problem.key} M={M} {configs[len(results) - 1]})")
                    break
        return results

    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck:
        if not self._send(("check_numerics", (problem, M, config))):
            self._restart(_death_reason(self.proc.exitcode))
            return NumericsCheck("failed", None, "measuring worker was gone")
        status, payload = self._receive(self.timeout_s)
        if status == "ok":
            return payload
        reason = payload if status == "lost" else payload.splitlines()[0]
        if status == "lost":
            self._restart(reason)
        return NumericsCheck("failed", None, reason)

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self._send(("close", None))
            self.proc.join(10)
        self._kill()


def isolated_gpu_measurer(kernel: KernelSpec, gpu_key: str, compile_workers: int = 8,
                          timeout_s: float = 300.0, recycle_after: int = 256) -> "IsolatedMeasurer":
    """The GPU measurer (tuner.measure_gpu) in a replaceable child process."""
    return IsolatedMeasurer(kernel, "tuner.measure_gpu:make_gpu_measurer",
                            {"kernel": kernel.ref, "gpu": gpu_key, "compile_workers": compile_workers},
                            timeout_s=timeout_s, recycle_after=recycle_after)
