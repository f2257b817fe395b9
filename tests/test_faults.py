"""Fault isolation: crashing, hanging and failing configs become failed trials with their
reason while the search goes on (FAKE misbehaving measurer: tests/faulty.py)."""

import optuna
import pytest
from faulty import fault

from kernels import get_kernel
from tuner.errors import TunerError
from tuner.gpus import get_gpu
from tuner.isolation import IsolatedMeasurer
from tuner.problems import Problem
from tuner.search import SearchSettings, StudyRunner, study_name
from tuner.space import load_space

KERNEL = get_kernel("fp8_gemm")
P = Problem("fp8_gemm", {"N": 7168, "K": 2048, "block_shape": [128, 128]})


@pytest.fixture
def small_space(tmp_path):
    f = tmp_path / "space.yaml"
    f.write_text("kernel: fp8_gemm\nparams:\n  BLOCK_SIZE_M: [16]\n  BLOCK_SIZE_N: [32, 64, 128]\n"
                 "  BLOCK_SIZE_K: [64, 128]\n  GROUP_SIZE_M: [1]\n  num_warps: [4, 8]\n  num_stages: [3, 4, 5]\n"
                 "constraints: {block_k_divides_group: {}}\n")
    return load_space(KERNEL, f)


def test_every_fault_is_a_failed_trial_and_the_run_completes(small_space, tmp_path):
    log = tmp_path / "pids"
    measurer = IsolatedMeasurer(KERNEL, "faulty:FaultyMeasurer", {"log_path": str(log)},
                                timeout_s=3, recycle_after=5, label="faulty")
    storage = optuna.storages.InMemoryStorage()
    runner = StudyRunner(KERNEL, small_space, get_gpu("H200"), measurer, storage,
                         SearchSettings(budget=36, patience=1000, batch=6, seed=1))
    try:
        result = runner.tune(P, 16, [])
    finally:
        measurer.close()
    assert result.trials == 36           # every config of the space, faulty ones included
    assert result.config is not None and fault(result.config) is None
    study = optuna.load_study(study_name=study_name(P, 16), storage=storage)
    errors = {}
    for t in study.trials:
        if "config" in t.user_attrs and t.state == optuna.trial.TrialState.FAIL:
            errors[fault(t.user_attrs["config"])] = t.user_attrs["error"]
    assert "SIGSEGV" in errors["segfault"]
    assert errors["hang"].startswith("hang: no result within 3s")
    assert errors["compile"].startswith("CompilationError")
    assert errors["resources"].startswith("OutOfResources")
    assert "illegal memory access" in errors["illegal"]
    good = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "config" in t.user_attrs]
    assert len(good) == 36 - 5 and all(fault(t.user_attrs["config"]) is None for t in good)
    # a fresh child after the crash, the hang, the poisoned context, and after 5 configs served
    pids = log.read_text().split()
    assert len(set(pids)) == len(pids) >= 36 // 5
    env = measurer.environment()
    assert env["worker_starts"] == len(pids)
    assert any("SIGSEGV" in f for f in env["worker_failures"])


def test_a_worker_that_cannot_start_is_one_clear_error(tmp_path):
    with pytest.raises(TunerError, match="FileNotFoundError"):
        IsolatedMeasurer(KERNEL, "faulty:FaultyMeasurer", {"log_path": str(tmp_path / "no" / "such" / "dir")})


class _FakeNvml:
    """NVML clock-event reasons from a script: one value per query."""
    def __init__(self, reasons):
        self.reasons = list(reasons)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons.pop(0) if self.reasons else 0


def _bare_gpu_measurer(reasons, times):
    from tuner.measure import Measurement
    from tuner.measure_gpu import GpuMeasurer
    m = GpuMeasurer.__new__(GpuMeasurer)          # no CUDA here: only the retake logic is exercised
    m._nvml, m._nvml_handle = _FakeNvml(reasons), None
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
