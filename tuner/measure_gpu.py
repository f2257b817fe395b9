"""Timing and checking configs on a real GPU.

Per batch of configs: compile workers (separate processes) build every config in
parallel into Triton's on-disk cache while this process times them one by one:
a warm-up launch, one CUDA graph per input set, then graph replays with the L2
cache flushed before each, several input sets rotated, the median kept and the
spread recorded.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context

from tuner.environment import nvml_index, nvml_snapshot, software_versions
from tuner.failures import exception_kind
from tuner.gpu_timing import graph_times, l2_flush_buffer, summarize
from tuner.gpus import GpuSpec
from tuner.kernel_api import Config, KernelSpec
from tuner.measure import Measurement, NumericsCheck, require_gpu, valid
from tuner.numerics import check_config
from tuner.problems import Problem


def _compile_in_worker(kernel_ref: dict, params: dict, M: int, config: Config) -> str | None:
    """Runs in a compile worker: build one config into Triton's cache. Returns the
    error text, or None. The timing process compiles anything this could not."""
    try:
        from kernels import get_kernel
        get_kernel(**kernel_ref).compile_only(params, M, config)
        return None
    except Exception as e:  # noqa: BLE001 - any failure is data about this config
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


# NVML clocks-event reasons that mean the clocks were pulled down under us (power cap,
# thermal slowdowns, power brake); idle and application-clock settings do not count.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def _poisons_context(error: str) -> bool:
    """Errors after which CUDA refuses every further call in this process."""
    text = error.lower()
    return any(s in text for s in ("illegal memory access", "illegal instruction", "misaligned address",
                                   "unspecified launch failure", "device-side assert", "cuda error"))


def make_gpu_measurer(kernel: dict, gpu: str, compile_workers: int = 8) -> "GpuMeasurer":
    """Factory run inside the isolated measuring worker (tuner.isolation); `kernel` is a
    KernelSpec.ref (our kernel, or an engine's and where its code is)."""
    from kernels import get_kernel
    from tuner.gpus import get_gpu
    return GpuMeasurer(get_kernel(**kernel), get_gpu(gpu), compile_workers=compile_workers)


def _short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


class GpuMeasurer:
    label = "gpu"

    def __init__(self, kernel: KernelSpec, gpu: GpuSpec, compile_workers: int = 8,
                 input_sets: int = 4, reps: int = 40, compile_timeout_s: float = 600.0,
                 max_retakes: int = 3, cooldown_s: float = 2.0):
        require_gpu(gpu.cuda_name, "measuring", "")
        import torch
        self.torch = torch
        self.poisoned = False
        self.compile_timeout_s = compile_timeout_s
        self._compile_workers = compile_workers
        self.max_retakes, self.cooldown_s = max_retakes, cooldown_s
        self.throttled_retakes = self.throttled_kept = 0
        self._nvml = self._nvml_handle = None
        self._nvml_index = nvml_index(torch.cuda.current_device())
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml, self._nvml_handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(self._nvml_index)
        except Exception:  # noqa: BLE001 - timing still works, unwatched
            self._nvml = None
        self.kernel = kernel
        self.gpu = gpu
        self.input_sets = input_sets
        self.reps = reps
        props = torch.cuda.get_device_properties(0)
        l2 = getattr(props, "L2_cache_size", gpu.l2_bytes) or gpu.l2_bytes
        self._flush = l2_flush_buffer(torch, l2)
        self._inputs_key: tuple[str, int] | None = None
        self._inputs: list[dict] = []
        self._pool = None
        if compile_workers > 0 and kernel.compile_only is not None:
            self._pool = ProcessPoolExecutor(compile_workers, mp_context=get_context("spawn"))
        self._env = {"device": torch.cuda.get_device_name(), "kernel": kernel.source_label,
                     "code_version": kernel.code_version, **software_versions(), **nvml_snapshot(self._nvml_index),
                     "sm_count": props.multi_processor_count, "l2_bytes": l2}

    def environment(self) -> dict:
        return {**self._env, "clocks_now": nvml_snapshot(self._nvml_index),
                "throttled_retakes": self.throttled_retakes, "throttled_kept": self.throttled_kept}

    def candidates(self, problem: Problem, M: int):
        return None

    def _input_sets(self, problem: Problem, M: int) -> list[dict]:
        key = (problem.key, M)
        if key != self._inputs_key:      # keep one (problem, M) resident at a time
            self._inputs = []
            self.torch.cuda.empty_cache()
            self._inputs = [self.kernel.make_inputs(problem.params, M, "cuda", seed)
                            for seed in range(self.input_sets)]
            self._inputs_key = key
        return self._inputs

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        return list(self.measure_iter(problem, M, configs))

    def measure_iter(self, problem: Problem, M: int, configs: list[Config]):
        """Yield each config's measurement as soon as it is taken (the isolation layer
        forwards them one by one, so a crash loses only the config it happened on)."""
        futures = []
        if self._pool is not None:
            try:
                futures = [self._pool.submit(_compile_in_worker, self.kernel.ref, problem.params, M, c)
                           for c in configs]
            except BrokenProcessPool:
                self._restart_pool()
        for i, cfg in enumerate(configs):
            if futures:
                try:
                    futures[i].result(timeout=self.compile_timeout_s)
                except BrokenProcessPool:       # a compile crashed its worker: new pool, no head start
                    futures = []
                    self._restart_pool()
                except Exception:               # a hung or failed compile only loses the head start
                    pass
            m = self._time(problem, M, cfg)
            if m.error and _poisons_context(m.error):
                self.poisoned = True
            yield m
            if self.poisoned:
                return

    def _restart_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = ProcessPoolExecutor(self._compile_workers, mp_context=get_context("spawn"))

    def _time(self, problem: Problem, M: int, cfg: Config) -> Measurement:
        """Time one config; a run during which NVML saw the clocks throttled is taken again."""
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
        if self._nvml is None:
            return 0
        try:
            return int(self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._nvml_handle))
        except Exception:  # noqa: BLE001
            return 0

    def _time_once(self, problem: Problem, M: int, cfg: Config) -> Measurement:
        sets = self._input_sets(problem, M)
        try:
            runs = [functools.partial(self.kernel.run, inp, cfg) for inp in sets]
            times = graph_times(self.torch, runs, self._flush, self.reps)
        except Exception as e:  # noqa: BLE001 - compile errors, out of resources, launch failures
            return Measurement(None, None, _short_error(e), exception_kind(e))
        t = summarize(times)
        return valid(Measurement(t.median_us, t.spread, None))

    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck:
        """Run on fresh random inputs into a NaN-poisoned output and compare with the
        reference by relative error; a NaN left anywhere fails (tuner/numerics.py)."""
        seed = int.from_bytes(os.urandom(4), "little")
        try:
            agreement, _ = check_config(self.kernel, problem.params, M, config, "cuda", seed)
        except Exception as e:  # noqa: BLE001 - a config that cannot run fails its check
            return NumericsCheck("failed", None, _short_error(e))
        if agreement.unwritten:
            return NumericsCheck("failed", None, agreement.detail)
        return NumericsCheck("passed" if agreement.passed else "failed", agreement.rel_error, agreement.detail)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
