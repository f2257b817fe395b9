"""Timing and checking configs on a device: a CUDA GPU, or the CPU device that stands in
for one in CI (tuner/measure/device.py holds the few lines that differ).

Per batch of configs: compile workers (separate processes) build every config in
parallel into Triton's on-disk cache while this process times them one by one:
a warm-up launch, then the device's timing of several input sets in rotation (CUDA graphs
replayed and timed with events on a GPU), the L2 cache flushed before each, the median
kept and the spread recorded. The measurement policy (tuner/measure/policy.py: CUDA graphs or
eager launches, L2 flushed or warm) says how, and goes with every result. This runs inside the isolated measuring child
(tuner/measure/isolation.py), never in the process that holds the search.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context

from tuner.measure.device import make_device, prepare_process
from tuner.measure.environment import software_versions
from tuner.measure.failures import exception_kind
from tuner.measure.measurers import Measurement, NumericsCheck, valid
from tuner.measure.numerics import check_config
from tuner.measure.policy import DEFAULT as DEFAULT_POLICY
from tuner.measure.policy import MeasurementPolicy
from tuner.measure.timing import summarize
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec
from tuner.plan.problems import Problem


def _compile_in_worker(kernel_ref: dict, params: dict, M: int, config: Config) -> str | None:
    """Runs in a compile worker: build one config into Triton's cache. Returns the
    error text, or None. The timing process compiles anything this could not."""
    try:
        from tuner.plan.kernel_registry import get_kernel
        get_kernel(**kernel_ref).compile_only(params, M, config)
        return None
    except Exception as e:  # noqa: BLE001 - any failure is data about this config
        return _short_error(e)


# NVML clocks-event reasons that mean the clocks were pulled down under us (power cap,
# thermal slowdowns, power brake); idle and application-clock settings do not count.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


# What a refused call inside a CUDA-graph capture raises: the capture is invalidated and ended,
# nothing sticky is left (the next capture in the same process works), unlike a kernel fault.
CAPTURE_REFUSALS = ("when stream is capturing", "during capture", "during cuda graph capture")


def poisons_context(error: str | None) -> bool:
    """Errors after which CUDA refuses every further call in this process."""
    text = (error or "").lower()
    if any(s in text for s in CAPTURE_REFUSALS):
        return False
    return any(s in text for s in ("illegal memory access", "illegal instruction", "misaligned address",
                                   "unspecified launch failure", "device-side assert", "cuda error"))


_poisons_context = poisons_context            # the name older callers used


def make_gpu_measurer(kernel: dict, gpu: str, compile_workers: int = 8, device: str = "cuda",
                      compile_timeout_s: float = 60.0, policy: dict | None = None) -> "DeviceMeasurer":
    """Factory run inside the isolated measuring worker (tuner.measure.isolation); `kernel` is a
    KernelSpec.ref (our kernel, or an engine's and where its code is)."""
    prepare_process(device)                   # before the kernels are imported
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    return DeviceMeasurer(get_kernel(**kernel), get_gpu(gpu), compile_workers=compile_workers, device=device,
                          compile_timeout_s=compile_timeout_s, policy=MeasurementPolicy.from_dict(policy))


def _short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


class DeviceMeasurer:
    """Times and checks configs of one kernel on one device (tuner/measure/device.py)."""

    def __init__(self, kernel: KernelSpec, gpu: GpuSpec, compile_workers: int = 8, device: str = "cuda",
                 input_sets: int | None = None, reps: int | None = None, compile_timeout_s: float = 60.0,
                 max_retakes: int = 1, cooldown_s: float = 1.0, policy: MeasurementPolicy = DEFAULT_POLICY):
        import torch
        self.torch = torch
        self.device = make_device(device, gpu)
        self.label = self.device.label
        self.poisoned = False
        self.on_step = None             # told what is under way (the isolation layer passes it to the progress line)
        self.compile_timeout_s = compile_timeout_s
        self._compile_workers = compile_workers
        self.max_retakes, self.cooldown_s = max_retakes, cooldown_s
        self.throttled_retakes = self.throttled_kept = 0
        # compile jobs handed to the workers: built into Triton's cache, failed (error text
        # kept), or lost (a worker crashed or the wait ran out)
        # ahead: jobs handed out before their config was asked for (compile_ahead), ahead_used: a
        # batch's configs found among them, ahead_dropped: those cancelled before a worker took them;
        # wait_s: seconds the timing waited for compile workers
        self.compiles: dict = {"built": 0, "failed": 0, "lost": 0, "reused": 0, "ahead": 0, "ahead_used": 0,
                               "ahead_dropped": 0, "wait_s": 0.0, "errors": []}
        self._submitted: dict = {}     # compile key (kernel.compile_per_m) -> its job, as handed to the workers
        self._ahead_keys: set = set()  # ... of those, the ones handed out ahead and not asked for yet
        self._ahead: list[tuple[Problem, int, Config]] = []    # to hand out after the next batch's own jobs
        self.kernel = kernel
        self.gpu = gpu
        self.input_sets = input_sets or self.device.input_sets
        self.reps = reps or self.device.reps
        props = self.device.properties()
        self.policy = policy
        # zeroed before each timed run (an L2 left warm: nothing flushed)
        self.flush = self.device.flush_buffer(props["l2_bytes"]) if policy.flush_l2 else None
        self._inputs_key: tuple[str, int] | None = None
        self._inputs: list[dict] = []
        self._warmed: set[tuple] = set()     # configs timed on the resident input sets (CpuDevice.time_runs)
        self._pool: ProcessPoolExecutor | None = None
        if compile_workers > 0 and kernel.compile_only is not None:
            self._pool = self._new_pool()
        self._env = {"device": self.device.name, "device_kind": self.device.kind, "timing": self.device.timing,
                     "kernel": kernel.source_label,
                     "code_version": kernel.code_version, **software_versions(), **self.device.nvml_snapshot(),
                     **props, "compile_workers": compile_workers if self._pool is not None else 0,
                     "policy": policy.as_dict()}

    def _new_pool(self) -> ProcessPoolExecutor:
        from tuner.measure.device import init_compile_worker
        return ProcessPoolExecutor(self._compile_workers, mp_context=get_context("spawn"),
                                   initializer=init_compile_worker, initargs=(self.device.kind, os.getpid()))

    def environment(self) -> dict:
        return {**self._env, "clocks_now": self.device.nvml_snapshot(), **self.counters(),
                "compiles": self.compile_stats()}

    def counters(self) -> dict:
        """What the retake rule and the clock warm-up did so far (the isolated child sends
        them with every result, so the parent's environment is never the one at start)."""
        return {"throttled_retakes": self.throttled_retakes, "throttled_kept": self.throttled_kept,
                "clock_warmups": self.device.clock_warmups}

    def compile_stats(self) -> dict:
        return {**self.compiles, "wait_s": round(self.compiles["wait_s"], 3), "errors": list(self.compiles["errors"])}

    def candidates(self, problem: Problem, M: int):
        return None

    def _input_sets(self, problem: Problem, M: int) -> list[dict]:
        key = (problem.key, M)
        if key != self._inputs_key:      # keep one (problem, M) resident at a time
            self._inputs, self._inputs_key = [], None
            self._warmed = set()
            self.device.empty_cache()
            self._inputs = [self.kernel.make_inputs(problem.params, M, self.device.tensor_device, seed)
                            for seed in range(self.input_sets)]
            self._inputs_key = key
        return self._inputs

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        return list(self.measure_iter(problem, M, configs))

    def _compile_key(self, problem: Problem, M: int, config: Config) -> tuple:
        m = M if self.kernel.compile_per_m else None
        return (problem.key, m, tuple(sorted(config.items())))

    def _submit(self, problem: Problem, M: int, configs: list[Config], ahead: bool = False) -> list:
        """One future per config; None where the same build was handed out before (a build
        handed out ahead and not asked for yet: its future, to wait for). `ahead`: jobs for
        configs not asked for yet, handed out after those that are."""
        if self._pool is None:
            return []
        futures: list = []
        try:
            for c in configs:
                key = self._compile_key(problem, M, c)
                if key in self._submitted:
                    if ahead:
                        continue
                    if key in self._ahead_keys:
                        self._ahead_keys.discard(key)
                        self.compiles["ahead_used"] += 1
                        futures.append(self._submitted[key])
                    else:
                        self.compiles["reused"] += 1
                        futures.append(None)
                    continue
                future = self._pool.submit(_compile_in_worker, self.kernel.ref, problem.params, M, c)
                self._submitted[key] = future
                futures.append(future)
                if ahead:
                    self._ahead_keys.add(key)
                    self.compiles["ahead"] += 1
        except BrokenProcessPool:
            self._restart_pool()
            return []
        return futures

    def _drop_stale_ahead(self, keep: set) -> None:
        """Jobs handed out ahead that no worker started yet, but those of `keep` (the batch at
        hand): cancelled, so that the batch's own jobs never queue behind them."""
        for key in list(self._ahead_keys - keep):
            if self._submitted[key].cancel():
                del self._submitted[key]
                self._ahead_keys.discard(key)
                self.compiles["ahead_dropped"] = self.compiles.get("ahead_dropped", 0) + 1

    def compile_ahead(self, jobs: list[tuple[Problem, int, Config]]) -> None:
        """Configs the search is likely to ask for next: their compile jobs are handed to the
        workers right after the next batch's own, so that they build while it is timed (a GPU
        host's workers outnumber a batch's configs). A job never asked for costs a worker's time."""
        self._ahead = list(jobs)

    def _await_compile(self, future) -> bool:
        """Wait for one compile job (at most the compile timeout); False when the pool broke."""
        try:
            error = future.result(timeout=self.compile_timeout_s)
        except BrokenProcessPool:            # a compile crashed its worker: new pool, no head start
            self.compiles["lost"] += 1
            self._restart_pool()
            return False
        except (FutureTimeout, Exception):   # a hung or failed compile only loses the head start
            self.compiles["lost"] += 1
            return True
        if error is None:
            self.compiles["built"] += 1
        else:
            self.compiles["failed"] += 1
            if len(self.compiles["errors"]) < 5:
                self.compiles["errors"].append(error)
        return True

    def measure_iter(self, problem: Problem, M: int, configs: list[Config]):
        """Yield each config's measurement as soon as it is taken (the isolation layer
        forwards them one by one, so a crash loses only the config it happened on)."""
        self._drop_stale_ahead({self._compile_key(problem, M, c) for c in configs})
        futures = self._submit(problem, M, configs)
        # only as many as the batch leaves workers idle (a GPU host's 16 for batches of 8): where
        # none idles (the CPU device's 2 for batches of 2) they would only delay the next batch's own
        ahead, self._ahead = self._ahead, []
        idle = max(0, self._compile_workers - sum(f is not None and not f.done() for f in futures))
        for job_problem, job_m, job_config in ahead:
            if idle <= 0:
                break
            idle -= len(self._submit(job_problem, job_m, [job_config], ahead=True))   # [] when handed out before
        n = len(configs)
        where = " in Triton's interpreter" if self.device.kind == "cpu" else ""
        for i, cfg in enumerate(configs):
            if futures and futures[i] is not None:
                if not futures[i].done():
                    self._step(f"compiling config {i + 1} of {n}")
                waited = time.monotonic()
                ok = self._await_compile(futures[i])
                self.compiles["wait_s"] += time.monotonic() - waited
                if not ok:
                    futures = []
            self._step(f"timing config {i + 1} of {n}{where}")
            m = self._time(problem, M, cfg)
            if m.error and poisons_context(m.error):
                self.poisoned = True
            yield m
            if self.poisoned:
                return

    def _step(self, text: str) -> None:
        if self.on_step is not None:
            self.on_step(text)

    def precompile(self, jobs: list[tuple[Problem, int, Config]]) -> dict:
        """Build many (problem, M, config) at once in the compile workers (validation of many
        cases, each with its own problem); returns the compile counts."""
        futures = [f for p, M, c in jobs for f in self._submit(p, M, [c]) if f is not None]
        waited = time.monotonic()
        for f in futures:
            if not self._await_compile(f):
                break
        self.compiles["wait_s"] += time.monotonic() - waited
        return self.compile_stats()

    def _restart_pool(self) -> None:
        self._submitted.clear()              # what the broken pool had queued may never have been built
        self._ahead_keys.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def _time(self, problem: Problem, M: int, cfg: Config) -> Measurement:
        """Time one config; a run during which NVML saw the clocks throttled is taken again,
        at most `max_retakes` times (one by default: a GPU that throttles on and on would
        otherwise cost every config several timings and cool-downs of a time-boxed call)."""
        for attempt in range(self.max_retakes + 1):
            before = self._throttle_reasons()
            m = self._time_once(problem, M, cfg)
            seen = before | self._throttle_reasons()
            if m.error or not (seen & THROTTLE_MASK):
                return m
            if attempt < self.max_retakes:
                self.throttled_retakes += 1
                time.sleep(self.cooldown_s)
        self.throttled_kept += 1      # the GPU would not stop throttling: keep the last, counted
        return m

    def _throttle_reasons(self) -> int:
        return self.device.throttle_reasons()

    def _time_once(self, problem: Problem, M: int, cfg: Config) -> Measurement:
        try:
            sets = self._input_sets(problem, M)      # out of memory here is this config's failure too
            runs = [functools.partial(self.kernel.run, inp, cfg) for inp in sets]
            warm_key = tuple(sorted(cfg.items()))
            times = self.device.time_runs(runs, self.flush, self.reps, graph=self.policy.graph,
                                          warmed=warm_key in self._warmed)
        except Exception as e:  # noqa: BLE001 - compile errors, out of resources, launch failures
            return Measurement(None, None, _short_error(e), exception_kind(e))
        self._warmed.add(warm_key)
        t = summarize(times)
        return valid(Measurement(t.median_us, t.spread, None))

    def check_numerics(self, problem: Problem, M: int, config: Config, seed: int | None = None) -> NumericsCheck:
        """Run on fresh random inputs into a NaN-poisoned output and compare with the
        reference by relative error; a NaN left anywhere fails (tuner/measure/numerics.py)."""
        seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
        try:
            agreement, _ = check_config(self.kernel, problem.params, M, config, self.device.tensor_device, seed)
        except Exception as e:  # noqa: BLE001 - a config that cannot run fails its check
            error = _short_error(e)
            if poisons_context(error):
                self.poisoned = True
            return NumericsCheck("failed", None, error)
        if agreement.unwritten:
            return NumericsCheck("failed", None, agreement.detail)
        return NumericsCheck("passed" if agreement.passed else "failed", agreement.rel_error, agreement.detail)

    def run_here(self, function: str, *args):
        """Run `module:function`(this measurer, *args) in the measuring process: work that
        needs the device beside the kernel's configs (bench's references outside Triton)."""
        module, attr = function.split(":")
        return getattr(importlib.import_module(module), attr)(self, *args)

    def close(self) -> None:
        """The compile workers ended at once: a build in progress or queued ahead is of no more
        use, and waiting for idle workers' interpreters to wind down (torch and Triton loaded)
        took 6.4 s of a run's close on the CPU device (2 workers, 2 loaded cores); Triton writes
        its cache atomically, so a killed build leaves no half-written kernel."""
        if self._pool is not None:
            workers = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in workers:
                proc.kill()
            for proc in workers:
                proc.join(5)
            self._pool = None


GpuMeasurer = DeviceMeasurer                  # the name it had when only a GPU could run it
