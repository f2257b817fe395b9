"""`tuner ceilings` at working clocks: on the CPU device with a fake device whose copy is slow
until its clocks are warm, the warm-up comes first; a copy still slow is measured again, marked
SUSPECT and never used silently (`load` takes the datasheet's figure and says so)."""

import functools
import json

import pytest

from tuner.cli import main
from tuner.measure import ceilings
from tuner.measure.ceiling_checks import RETRY_WARMUP_S, SUSPECT_BELOW, WARMUP_S
from tuner.measure.device import CpuDevice
from tuner.plan.gpus import get_gpu

GPU = get_gpu("H200")


class SlowUntilWarm(CpuDevice):
    """A CPU device compared with the H200's datasheet whose copies run at 50% of it until
    `warm_after` seconds of warm-up, then at 90%; its matmuls at 80% of the FP8 datasheet rate."""
    compares_with_datasheet = True
    warm_after = WARMUP_S

    def __init__(self, gpu):
        super().__init__(gpu)
        self.ramped, self.copies_timed, self.log = 0.0, 0, []

    def _ramp(self, seconds):
        self.ramped += seconds
        self.log.append(("ramp", seconds))

    def time_runs(self, runs, flush, reps, graph=True):
        self.warm_clocks()
        if isinstance(runs[0], functools.partial):         # a copy: (dst, src) or (src, out=dst)
            nbytes = 2 * runs[0].args[0].nbytes
            rate = (0.9 if self.ramped >= self.warm_after else 0.5) * self.gpu.hbm_tb_s
            self.copies_timed += 1
            self.log.append(("copy", rate))
            return [nbytes / (rate * 1e6)] * reps
        size = 256
        return [2.0 * size ** 3 / (0.8 * self.gpu.fp8_tflops * 1e6)] * reps


class NeverWarm(SlowUntilWarm):
    warm_after = float("inf")


def run_ceilings(monkeypatch, tmp_path, device_class, capsys):
    made = []

    def make(kind, gpu):
        made.append(device_class(gpu))
        return made[-1]
    monkeypatch.setattr("tuner.measure.device.make_device", make)
    out = tmp_path / "c.json"
    assert main(["ceilings", "--gpu", "H200", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text()), made[0], capsys.readouterr().out, out


def test_ceilings_warm_the_clocks_before_the_copy(monkeypatch, tmp_path, capsys):
    data, dev, printed, _ = run_ceilings(monkeypatch, tmp_path, SlowUntilWarm, capsys)
    assert dev.log[0] == ("ramp", WARMUP_S)                  # warmed before anything was timed
    assert all(rate == pytest.approx(0.9 * GPU.hbm_tb_s) for kind, rate in dev.log if kind == "copy")
    assert data["copy_tb_s"] == pytest.approx(0.9 * GPU.hbm_tb_s)
    assert data["suspect"] == {} and "SUSPECT" not in printed
    copy = data["figures"]["copy"]
    assert copy["tries"] == 1 and copy["datasheet"] == GPU.hbm_tb_s
    # the best of every size x method, each kept
    assert len(copy["trials"]) == 2 * 3 and {t["bytes"] for t in copy["trials"]} == {4 << 20, 16 << 20}
    assert ceilings.load(GPU, tmp_path / "c.json", dev.name).copy_tb_s == pytest.approx(0.9 * GPU.hbm_tb_s)


def test_a_copy_that_stays_slow_is_measured_again_and_flagged(monkeypatch, tmp_path, capsys):
    data, dev, printed, path = run_ceilings(monkeypatch, tmp_path, NeverWarm, capsys)
    assert ("ramp", RETRY_WARMUP_S) in dev.log and dev.copies_timed == 2 * 2 * 3     # measured twice
    assert data["figures"]["copy"]["tries"] == 2
    assert data["copy_tb_s"] == pytest.approx(0.5 * GPU.hbm_tb_s) and 0.5 < SUSPECT_BELOW
    assert "copy_tb_s" in data["suspect"] and "fp8_tflops" not in data["suspect"]
    assert "SUSPECT copy_tb_s" in printed
    c = ceilings.load(GPU, path, dev.name)                   # never used silently
    assert c.copy_tb_s == GPU.hbm_tb_s and "suspect" in c.source


def test_an_unchecked_low_ceiling_file_is_not_used(tmp_path):
    """The first H200 run's ceilings.json (2.72 TB/s, written before the check) is caught on load."""
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"format": ceilings.FORMAT, "device": "NVIDIA H200", "device_kind": "cuda",
                             "measured": "2026-11-27T22:24:17+00:00", "copy_tb_s": 2.717, "fp8_tflops": 1439.3,
                             "bf16_tflops": 782.6}))
    c = ceilings.load(GPU, f)
    assert c.copy_tb_s == GPU.hbm_tb_s and c.fp8_tflops == 1439.3
    assert "the measured 2.72 is suspect" in c.source
