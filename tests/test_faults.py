"""Fault isolation around the measurer: a measuring worker that cannot start is one clear
error; a measurement taken while NVML saw the clocks throttled is taken again. (Crashing,
hanging and context-poisoning configs run through the real measuring stack on the CPU device:
tests/test_cpu_device.py.)"""

import pytest

from tuner.errors import TunerError
from tuner.measure.isolation import IsolatedMeasurer
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem

KERNEL = get_kernel("fp8_gemm")
P = Problem("fp8_gemm", {"N": 7168, "K": 2048, "block_shape": [128, 128]})


def test_a_worker_that_cannot_start_is_one_clear_error(tmp_path):
    with pytest.raises(TunerError, match="FileNotFoundError"):
        IsolatedMeasurer(KERNEL, "faulty:FaultyMeasurer", {"log_path": str(tmp_path / "no" / "such" / "dir")})


class _FakeNvml:
    """NVML clock-event reasons from a script: one value per query."""
    def __init__(self, reasons):
        self.reasons = list(reasons)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons.pop(0) if self.reasons else 0


class _ScriptedDevice:
    """A device whose NVML reports the scripted clock-event reasons (no CUDA here)."""
    def __init__(self, reasons):
        self.nvml = _FakeNvml(reasons)

    def throttle_reasons(self):
        return self.nvml.nvmlDeviceGetCurrentClocksEventReasons(None)


def _bare_gpu_measurer(reasons, times):
    from tuner.measure.device_measurer import DeviceMeasurer
    from tuner.measure.measurers import Measurement
    m = DeviceMeasurer.__new__(DeviceMeasurer)    # only the retake logic is exercised
    m.device = _ScriptedDevice(reasons)
    m.max_retakes, m.cooldown_s = 2, 0.0
    m.throttled_retakes = m.throttled_kept = 0
    runs = iter(times)
    m._time_once = lambda problem, M, cfg: Measurement(next(runs), 0.01, None)
    return m


def test_a_measurement_taken_while_throttled_is_taken_again():
    SW_POWER_CAP, IDLE = 0x4, 0x1
    # before/after the 1st run: power-capped; 2nd run: clean (idle does not count)
    m = _bare_gpu_measurer([0, SW_POWER_CAP, IDLE, 0], [20.0, 10.0])
    assert m._time(P, 16, {}).time_us == 10.0
    assert (m.throttled_retakes, m.throttled_kept) == (1, 0)
    # throttled every time: kept after the retakes, and counted
    m = _bare_gpu_measurer([0x40] * 10, [30.0, 29.0, 28.0])
    assert m._time(P, 16, {}).time_us == 28.0
    assert (m.throttled_retakes, m.throttled_kept) == (2, 1)
