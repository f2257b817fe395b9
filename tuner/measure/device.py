"""The one place where a CUDA GPU and the CPU device differ; everything above it is the same.

Whatever measures (tuner/measure/device_measurer.py's DeviceMeasurer inside tuner/measure/isolation.py's child,
`tuner bench`'s references, `tuner ceilings`, scripts/validate_kernels.py) runs the same
code on either device: the isolated measuring child, its compile-worker pool, recycling,
timeouts, hang kill and crash restart, the numerics check, tables and manifest. Only these
primitives differ:

                    CudaDevice ("cuda")                    CpuDevice ("cpu")
  tensors           on the GPU                             in memory
  kernels run       compiled                               in Triton's interpreter (TRITON_INTERPRET=1)
  timing            warm-up, one CUDA graph per callable,  one warm-up call per callable, then
                    replays timed with CUDA events         calls timed with the wall clock, each
                    (--timing eager: the launches timed,   under CUDA-graph capture's rules
                    no graph)                              (tuner/measure/capture_rules.py;
                                                           --timing eager: no rules, as no capture)
  clocks            after 1 s idle, 0.2 s of matmuls       the same idle rule, nothing to ramp
                    ramp the clocks before timing
  L2 flush          2 x L2 bytes on the GPU, zeroed        a plain buffer in memory, zeroed
                    before each replay, on the stream      likewise, before the clock starts
                    the timing events are recorded on      (--l2 warm: none)
                    (--l2 warm: none)
  properties        read off the device (L2, SMs)          the GPU's row of tuner/plan/gpus.py
  NVML              clocks, temperature, throttling        none
  compile workers   compile on the GPU                     compile for sm_90 with Triton's own
                                                           ptxas (no GPU needed), nothing launched

The CPU device exists so that CI runs the GPU's code path end to end; its times are the
interpreter's wall-clock times, say so everywhere they are shown (tuner/measure/provenance.py: CPU
DEVICE), are never shared with a GPU's studies or landscapes (the device name differs), and
`tuner install` refuses them without --force.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from tuner.errors import TunerError
from tuner.plan.gpus import GpuSpec

DEVICES = ("cuda", "cpu")
# Set in the CPU device's compile workers: kernels are compiled for this target although no
# GPU is present (kernels/engines/base.py takes its launch decisions for it).
COMPILE_TARGET_ENV = "TUNER_COMPILE_TARGET"
SM90 = "cuda:90"


def device_name(kind: str, gpu: GpuSpec) -> str:
    """The device as environments, studies, landscapes and manifests name it."""
    if kind == "cpu":
        return f"CPU device (stand-in for {gpu.cuda_name})"
    return gpu.cuda_name


def is_cpu_device_name(name: str | None) -> bool:
    return str(name or "").startswith("CPU device")


def check_kind(kind: str) -> str:
    if kind not in DEVICES:
        raise TunerError(f"--device {kind!r} is not one of {', '.join(DEVICES)}")
    return kind


def require(kind: str, gpu: GpuSpec, what: str, without: str = "") -> None:
    """Before anything is measured: a CUDA run needs the GPU `gpu` present (one line
    otherwise); a CPU-device run needs Triton's interpreter, switched on here."""
    check_kind(kind)
    if kind == "cuda":
        require_gpu(gpu.cuda_name, what, without)
    else:
        prepare_process("cpu")


def prepare_process(kind: str) -> None:
    """Before kernels are imported in a process that runs them: the CPU device runs them in
    Triton's interpreter, which Triton decides when a kernel is defined."""
    if kind == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


def make_device(kind: str, gpu: GpuSpec) -> "CudaDevice | CpuDevice":
    check_kind(kind)
    return CudaDevice(gpu) if kind == "cuda" else CpuDevice(gpu)


IDLE_S = 1.0          # idle this long, a GPU has let its clocks fall
RAMP_S = 0.2          # this long of back-to-back work brings them up again


class _ClockWarmup:
    """A GPU lowers its clocks within about a second of idle and takes tens of milliseconds of
    load to raise them: longer than the whole timed region of a small-M run (40 replays of a
    few microseconds). So timing that starts after an idle spell (the first config of a run,
    one after a compile wait, a study after the numerics check) is preceded by RAMP_S of work
    on the device (`_ramp`); the idle rule is the same on either device."""
    clock_warmups = 0
    _last_timed: float | None = None

    def warm_clocks(self) -> bool:
        """Ramp the clocks when the device has been idle; True when it did."""
        if self._last_timed is not None and time.monotonic() - self._last_timed < IDLE_S:
            return False
        self._ramp(RAMP_S)
        self.clock_warmups += 1
        return True

    def warm_up(self, seconds: float) -> None:
        """Ramp the clocks for `seconds` whatever the idle rule says (before a ceiling: the
        first H200 run's copy ceiling was timed at a 345 MHz SM clock)."""
        self._ramp(seconds)
        self.clock_warmups += 1
        self._timed()

    def _timed(self) -> None:
        self._last_timed = time.monotonic()

    def _ramp(self, seconds: float) -> None:
        raise NotImplementedError


class CudaDevice(_ClockWarmup):
    kind = "cuda"
    tensor_device = "cuda"
    label = "gpu"                     # how a measurer on it is labelled (manifests, studies)
    timing = "each run captured in a CUDA graph, its replays timed with CUDA events"   # said in manifests
    input_sets, reps = 4, 40          # per config: input sets rotated, timed replays
    ceiling_sizes = {"size": 8192, "copy_bytes": [256 << 20, 1 << 30, 2 << 30], "reps": 20}
    compares_with_datasheet = True    # its ceilings are checked against the GPU's datasheet

    def __init__(self, gpu: GpuSpec):
        import torch

        from tuner.measure.environment import nvml_index
        require("cuda", gpu, "measuring")
        self.torch, self.gpu = torch, gpu
        self.name = torch.cuda.get_device_name()
        self._nvml_index = nvml_index(torch.cuda.current_device())
        self._nvml = self._nvml_handle = None
        self._ramp_operands: tuple[Any, Any] | None = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml, self._nvml_handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(self._nvml_index)
        except Exception:  # noqa: BLE001 - timing still works, unwatched
            self._nvml = None

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def properties(self) -> dict:
        p = self.torch.cuda.get_device_properties(0)
        l2 = getattr(p, "L2_cache_size", None) or self.gpu.l2_bytes   # the real L2, read off the device
        return {"sm_count": p.multi_processor_count, "l2_bytes": l2, "memory_bytes": p.total_memory,
                "capability": f"{p.major}.{p.minor}", "properties_from": "the device"}

    def flush_buffer(self, l2_bytes: int):
        """Writing twice the L2's size evicts whatever the last run left in it."""
        return self.torch.empty(2 * l2_bytes, dtype=self.torch.int8, device="cuda")

    def _ramp(self, seconds: float) -> None:
        """Back-to-back bf16 matmuls (4096^3, ~0.2 ms each) until `seconds` have passed."""
        torch = self.torch
        if self._ramp_operands is None:
            a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            self._ramp_operands = (a, torch.empty_like(a))
        a, c = self._ramp_operands
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(8):
                torch.matmul(a, a, out=c)
            torch.cuda.synchronize()

    def capture(self, run: Callable[[], object]):
        """`run` captured in a CUDA graph. When the capture fails, the error raised is the
        first one (with the global capture mode, a refused call invalidates the capture and
        ending it raises "operation failed due to a previous error during capture", which
        would hide what was refused)."""
        g = self.torch.cuda.CUDAGraph()
        try:
            with self.torch.cuda.graph(g):
                run()
        except Exception as e:  # noqa: BLE001 - re-raised: the first error of the capture
            raise first_capture_error(e) from None
        return g

    def time_runs(self, runs: Sequence[Callable[[], object]], flush, reps: int, graph: bool = True,
                  warmed: bool = False) -> list[float]:
        """Per-replay times (us) of `runs` (one callable per input set): the clocks ramped after
        idle, each run once (warm-up: binary loaded, data touched, caches filled), each
        captured as a CUDA graph, the graphs replayed once, then replayed in rotation, each
        replay timed with CUDA events. `flush` (None: nothing flushed, --l2 warm, or work far
        larger than L2) is zeroed before each timed replay on the current stream, the stream the
        start event is recorded on and the graph replayed on: the event is taken once the
        flush has finished, so the flush is never in the timed region and the replay never
        overlaps it. graph=False (--timing eager): the runs launched as they are, launch
        overhead included, as an engine runs prefill. `warmed` changes nothing here: each
        timing warms its runs up again, whatever ran on the GPU since."""
        torch = self.torch
        self.warm_clocks()
        for run in runs:
            run()
        torch.cuda.synchronize()
        runners: list = list(runs)
        if graph:
            graphs = [self.capture(run) for run in runs]
            runners = [g.replay for g in graphs]
            for replay in runners:
                replay()
            torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            if flush is not None:
                flush.zero_()                 # queued on `stream` ahead of the start event
            starts[r].record(stream)
            runners[r % len(runners)]()       # launched on the current stream: `stream`
            ends[r].record(stream)
        torch.cuda.synchronize()
        self._timed()
        return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]

    def nvml_snapshot(self) -> dict:
        from tuner.measure.environment import nvml_snapshot
        return nvml_snapshot(self._nvml_index)

    def clocks(self) -> dict:
        """The SM and memory clocks now (MHz), {} without NVML: cheap enough to poll."""
        if self._nvml is None:
            return {}
        try:
            nv, h = self._nvml, self._nvml_handle
            return {"sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                    "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)}
        except Exception:  # noqa: BLE001 - a reading missed, not a failure
            return {}

    def throttle_reasons(self) -> int:
        if self._nvml is None:
            return 0
        try:
            return int(self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._nvml_handle))
        except Exception:  # noqa: BLE001
            return 0

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()


def first_capture_error(e: BaseException) -> BaseException:
    """The error a failed capture began with: past "operation failed due to a previous error
    during capture" (raised when the invalidated capture ends) to the one it followed."""
    seen: BaseException = e
    while "due to a previous error during capture" in str(seen) and seen.__context__ is not None:
        seen = seen.__context__
    return seen


class CpuDevice(_ClockWarmup):
    kind = "cpu"
    tensor_device = "cpu"
    label = "cpu-device"
    timing = "wall clock, each timed call held to CUDA-graph capture's rules (tuner/measure/capture_rules.py)"
    # The interpreter is slow: one input set (warmed up, then timed under the rules) and two
    # timed calls take every code path the GPU's four sets and forty replays do, per set included.
    input_sets, reps = 1, 2
    ceiling_sizes = {"size": 256, "copy_bytes": [4 << 20, 16 << 20], "reps": 3}
    compares_with_datasheet = False   # a CPU's copy is no GPU's: nothing to compare

    def __init__(self, gpu: GpuSpec):
        import torch
        prepare_process("cpu")
        self.torch, self.gpu = torch, gpu
        self.name = device_name("cpu", gpu)

    def synchronize(self) -> None:
        pass

    def properties(self) -> dict:
        return {"sm_count": self.gpu.sm_count, "l2_bytes": self.gpu.l2_bytes, "memory_bytes": None,
                "capability": "9.0", "properties_from": "tuner/plan/gpus.py (no GPU: the CPU device)"}

    def flush_buffer(self, l2_bytes: int):
        return self.torch.empty(2 * l2_bytes, dtype=self.torch.int8)

    def _ramp(self, seconds: float) -> None:
        """A CPU has no clocks to ramp for us: the idle rule runs, the ramp costs nothing."""

    def time_runs(self, runs: Sequence[Callable[[], object]], flush, reps: int, graph: bool = True,
                  warmed: bool = False) -> list[float]:
        """Per-call wall-clock times (us) of `runs`, as the GPU times them: each run once
        outside the rules (the warm-up, as on the GPU before its capture: caches filled,
        kernels compiled), then calls in rotation, at least one per run, each under CUDA-graph
        capture's rules (tuner/measure/capture_rules.py: what the GPU's capture of that run
        would refuse raises here, with the GPU's words), `flush` zeroed before each, outside
        the timed region (None: --l2 warm). graph=False (--timing eager): no capture on the
        GPU, so no capture rules here either. `warmed`: these very runs (config and input
        sets) were timed in this process before, so what a warm-up does (the interpreter's
        rewrite cached, lazy state built outside the rules) is done: no warm-up, whose
        interpreted launch is a third of a timing's CPU time."""
        import contextlib

        from tuner.measure.capture_rules import capture_rules
        rules = capture_rules if graph else contextlib.nullcontext
        self.warm_clocks()
        for run in runs if not warmed else ():
            run()
        times = []
        for r in range(max(reps, len(runs))):
            if flush is not None:
                flush.zero_()
            with rules():
                t0 = time.perf_counter()
                runs[r % len(runs)]()
                times.append((time.perf_counter() - t0) * 1e6)
        self._timed()
        return times

    def nvml_snapshot(self) -> dict:
        return {}

    def clocks(self) -> dict:
        return {}

    def throttle_reasons(self) -> int:
        return 0

    def empty_cache(self) -> None:
        pass


# -- compile workers -------------------------------------------------------------------------
def init_compile_worker(kind: str, parent: int | None = None) -> None:
    """Initializer of a compile-worker process (a ProcessPoolExecutor of the measuring child,
    whose pid is `parent`): it dies with its parent (killing its group, siblings included),
    and on the CPU device compiles for sm_90 without a GPU."""
    from tuner.measure.process_tree import watch_parent
    watch_parent(kill_group=True, parent=parent)
    if kind == "cpu":
        compile_for_sm90()


def compile_for_sm90() -> None:
    """Make this process compile Triton kernels for sm_90 (H100/H200) although it has no GPU:
    kernels compiled, not interpreted (before any kernel module is imported), and Triton's
    driver questions answered for that target. Nothing can be launched here."""
    import sys
    if any(name.startswith("kernels.") for name in sys.modules):
        raise RuntimeError("compile worker: kernels were imported before the compile target was set")
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ[COMPILE_TARGET_ENV] = SM90
    from triton.runtime.driver import driver
    driver.set_active(_Sm90Target())


def compiling_for_sm90() -> bool:
    """True in a CPU-device compile worker (kernels/engines take sm_90's launch decisions)."""
    return os.environ.get(COMPILE_TARGET_ENV) == SM90


class _Sm90Target:
    """What Triton asks its driver while compiling a launch, answered for sm_90 on a machine
    without a GPU: the target, a device index and a stream. Anything else (loading or
    launching a binary) is refused: a compile worker launches nothing."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    @staticmethod
    def is_active() -> bool:
        return False

    def __getattr__(self, name: str):
        raise RuntimeError(f"the CPU device's compile worker compiles only; it cannot {name}")


def require_gpu(expected_cuda_name: str, what: str = "timing on the GPU",
                without: str = "--replay FILE times from a recorded landscape") -> None:
    """Stop with one clear line when no (or another) GPU is present: what needed it, and
    what can be done without one."""
    import torch
    if not torch.cuda.is_available():
        raise TunerError(f"no CUDA GPU is visible ({what} needs one)" + (f"; {without}" if without else ""))
    name = torch.cuda.get_device_name()
    if name != expected_cuda_name:
        raise TunerError(f"--gpu asks for {expected_cuda_name!r} but this machine has {name!r}; "
                         "tables are specific to the GPU they were measured on")
