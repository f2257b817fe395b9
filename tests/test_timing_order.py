"""The order of the timing steps, on both devices (tuner/measure/device.py).

No GPU here: CudaDevice.time_runs runs against a recording stand-in for torch.cuda, which
proves the order of the calls it makes (clocks ramped after idle, every run warmed up before
any capture, the L2 flush queued on the stream the start event is recorded on and the graph
replayed on, a failed capture's first error raised), not that CUDA does what they ask. The CPU
device's own timing, its clock rule and the throttle rule run for real."""

import time
from types import SimpleNamespace

import pytest

from tuner.measure.device import IDLE_S, CpuDevice, CudaDevice
from tuner.plan.gpus import get_gpu

STREAM = "stream-0"


class _Recording:
    """torch with a recording torch.cuda: every call appends to `log`."""

    def __init__(self, log: list, fail_capture: bool = False):
        self.log = log
        outer = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.name = f"event{len([x for x in log if x[0] == 'event'])}"
                log.append(("event",))

            def record(self, stream=None):
                log.append(("record", self.name, stream))

            def elapsed_time(self, other):
                return 0.005

        class Graph:
            count = 0

            def __init__(self):
                self.name = f"g{Graph.count}"
                Graph.count += 1

            def replay(self):
                log.append(("replay", self.name))

        class capture:                       # torch.cuda.graph
            def __init__(self, g):
                self.g = g

            def __enter__(self):
                log.append(("capture", self.g.name))

            def __exit__(self, kind, value, tb):
                log.append(("end capture", self.g.name))
                if kind is not None and outer.fail_capture:
                    # as the global capture mode does: ending an invalidated capture raises again
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                return False

        self.fail_capture = fail_capture
        self.bfloat16 = "bf16"
        self.cuda = SimpleNamespace(
            synchronize=lambda: log.append(("sync",)), current_stream=lambda: STREAM, Event=Event,
            CUDAGraph=Graph, graph=capture)

    def randn(self, *shape, **kw):
        return "A"

    def empty_like(self, a):
        return "C"

    def matmul(self, a, b, out=None):
        self.log.append(("matmul",))


def cuda_device(log, **kw) -> CudaDevice:
    d = CudaDevice.__new__(CudaDevice)
    d.torch, d._ramp_operands = _Recording(log, **kw), None
    return d


def test_cuda_timing_warms_up_captures_then_times_each_replay_after_its_flush():
    log: list = []
    d = cuda_device(log)
    flush = SimpleNamespace(zero_=lambda: log.append(("flush",)))
    runs = [lambda i=i: log.append(("run", i)) for i in range(2)]
    times = d.time_runs(runs, flush, reps=3)
    assert times == [5.0] * 3 and d.clock_warmups == 1
    ramp = [x for x in log[: log.index(("run", 0))]]
    assert ramp and {x[0] for x in ramp} <= {"matmul", "sync"}       # clocks ramped first (idle at start)
    body = [x for x in log[len(ramp):] if x[0] != "event"]
    g0, g1 = (x[1] for x in body if x[0] == "capture")
    assert body == [
        ("run", 0), ("run", 1), ("sync",),                                       # warm-up, all runs, before capture
        ("capture", g0), ("run", 0), ("end capture", g0), ("capture", g1), ("run", 1), ("end capture", g1),
        ("replay", g0), ("replay", g1), ("sync",),
        # each timed replay: the flush queued first, then the start event on the same stream
        ("flush",), ("record", "event0", STREAM), ("replay", g0), ("record", "event3", STREAM),
        ("flush",), ("record", "event1", STREAM), ("replay", g1), ("record", "event4", STREAM),
        ("flush",), ("record", "event2", STREAM), ("replay", g0), ("record", "event5", STREAM),
        ("sync",)]
    log.clear()
    d.time_runs(runs, flush, reps=1)                    # right after: the clocks are up, no ramp
    assert d.clock_warmups == 1 and log[0] == ("run", 0)


def test_a_failed_capture_raises_its_first_error_not_the_invalidation_after_it():
    log: list = []
    d = cuda_device(log, fail_capture=True)

    def syncs():
        if ("capture", "g") in [(x[0], x[1][:1]) for x in log if x[0] == "capture"]:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        d.time_runs([syncs], None, reps=2)


def test_the_cpu_device_ramps_after_idle_and_times_each_run_under_the_rules():
    d = CpuDevice(get_gpu("H200"))
    calls = []
    runs = [lambda i=i: calls.append(i) for i in range(2)]
    assert len(d.time_runs(runs, None, reps=1)) == 2           # at least one timed call per run
    assert calls == [0, 1, 0, 1] and d.clock_warmups == 1       # warm-ups, then the timed calls
    d.time_runs(runs[:1], None, reps=2)
    assert d.clock_warmups == 1                                  # not idle in between
    d._last_timed = time.monotonic() - IDLE_S - 0.1
    d.time_runs(runs[:1], None, reps=2)
    assert d.clock_warmups == 2


def test_a_gpu_that_throttles_on_and_on_costs_one_retake_per_config():
    from tuner.measure.device_measurer import DeviceMeasurer
    from tuner.measure.measurers import Measurement
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.problems import Problem
    m = DeviceMeasurer(get_kernel("fp8_gemm"), get_gpu("H200"), compile_workers=0, device="cpu")
    m.cooldown_s = 0.0
    m.device.throttle_reasons = lambda: 0x4                  # a power cap flagged at every look
    taken = []
    m._time_once = lambda problem, M, cfg: taken.append(cfg) or Measurement(10.0 + len(taken), 0.01)
    got = m._time(Problem("fp8_gemm", {"N": 256, "K": 256, "block_shape": [128, 128]}), 1, {})
    assert len(taken) == 2 and got.time_us == 12.0            # the first take and one retake, no more
    assert (m.throttled_retakes, m.throttled_kept) == (1, 1)
    assert {"throttled_retakes": 1, "throttled_kept": 1}.items() <= m.environment().items()
