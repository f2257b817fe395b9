"""--record, --baseline seeding and the numerics gate, with a FAKE GPU measurer whose
timings come from the synthetic cost model (tests/synthetic.py)."""

import json

import optuna
import pytest
from synthetic import block_fp8_model, fake_time_us

from tuner.cli import main
from tuner.measure.landscape import read_landscape
from tuner.measure.measurers import Measurement, NumericsCheck
from tuner.pipeline.run_plan import default_storage
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.search.runner import study_name
from tuner.search.storage import open_storage

KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


class FakeGpu:
    """Stands in for the isolated GPU measurer: synthetic times, scripted numerics."""
    label = "gpu"
    instances = []

    def __init__(self, kernel, factory, kwargs, **kw):
        assert factory == "tuner.measure.device_measurer:make_gpu_measurer" and kwargs["gpu"] == "H200"
        self.kernel, self.calls, self.failing = kernel, [], set()
        FakeGpu.instances.append(self)

    def environment(self):
        return {"device": "NVIDIA H200", "triton": "3.6.0", "torch": "fake", "cuda": "fake", "driver": "fake"}

    def candidates(self, problem, M):
        return None

    def measure(self, problem, M, configs):
        self.calls.extend(configs)
        return [Measurement(t, 0.01, None) if (t := fake_time_us(problem.params, M, c)) else
                Measurement(None, None, "synthetic failure") for c in configs]

    def check_numerics(self, problem, M, config):
        if tuple(config.values()) in self.failing:
            return NumericsCheck("failed", 0.5, "scripted failure")
        return NumericsCheck("passed", 0.003, "fake")

    def close(self):
        self.closed = True


@pytest.fixture
def fake_gpu(monkeypatch):
    import tuner.measure.device
    import tuner.measure.isolation
    FakeGpu.instances.clear()
    monkeypatch.setattr(tuner.measure.isolation, "IsolatedMeasurer", FakeGpu)
    monkeypatch.setattr(tuner.measure.device, "require_gpu", lambda name, *why: None)
    return FakeGpu


def gemm(out, *extra):
    # Our kernel: these tests are of recording, resuming and checking, not of whose kernel runs.
    return main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--out", str(out),
                 "--quiet", "--trials", "16", "--kernel-source", "ours", *extra])


def test_record_writes_the_full_grid_and_replays_it(fake_gpu, tmp_path):
    model = block_fp8_model(tmp_path / "small.yaml", 2048, 16, 2048)   # three GEMM shapes keep this quick
    land_path = tmp_path / "rec.jsonl.gz"
    args = ["--model", str(model), "--tp", "1", "--batch-sizes", "1", "16"]
    # one compile worker: the GPU run then asks one config at a time, as a replay does
    assert gemm(tmp_path / "a", "--record", str(land_path), "--compile-workers", "1", *args) == 0
    land = read_landscape(land_path, KERNEL)
    assert land.header["device"] == "NVIDIA H200" and land.header["kernel"] == "fp8_gemm"
    # every problem of the plan, both Ms, the pruned grid (32 configs at M=1: BLOCK_SIZE_K 64 is
    # pruned by block_k_is_group) plus the default seeds
    assert len(land.problems) == 3
    square = {"N": 2048, "K": 2048, "block_shape": [128, 128]}
    assert len(land.lookup(square, 1)) >= 32 + 1
    # the engines' default (GROUP_SIZE_M folded: one M tile) is outside the pruned grid at
    # M=1 (BLOCK_SIZE_M 64 > 16) but is a seed, so it is timed and recorded too
    assert (64, 128, 128, 1, 4, 2) in land.lookup(square, 1)
    recorded_tables = json.loads((tmp_path / "a" / "manifest.json").read_text())
    # replaying the recording picks the same configs as the recording run did
    assert gemm(tmp_path / "b", "--replay", str(land_path), *args) == 0
    replayed = json.loads((tmp_path / "b" / "manifest.json").read_text())
    a = {json.dumps(t["problem"]): t["entries"] for t in recorded_tables["tables"]}
    b = {json.dumps(t["problem"]): t["entries"] for t in replayed["tables"]}
    assert a.keys() == b.keys()
    for k in a:
        for m in ("1", "16"):
            assert a[k][m]["config"] == b[k][m]["config"]
            assert a[k][m]["default_time_us"] == pytest.approx(b[k][m]["default_time_us"], abs=1e-3)
            assert a[k][m]["numerics"]["status"] == "passed"
            assert b[k][m]["numerics"]["status"] == "not checked"



def test_a_recording_into_a_file_another_run_records_is_refused(fake_gpu, tmp_path, capsys):
    """Another process recording into FILE (alive) makes a second --record into it exit 2 with
    one line, its GPU measurer closed and the other's partial untouched; once that process is
    killed (-9), the next recording continues its timings."""
    import signal
    import subprocess
    import sys
    land_path = tmp_path / "rec.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from tuner.measure.landscape import LandscapeWriter, Point\n"
        "from tuner.plan.kernel_registry import get_kernel\n"
        "k = get_kernel('fp8_gemm')\n"
        "w = LandscapeWriter(sys.argv[1], k, {'format': 'tuner-landscape/1', 'kernel': 'fp8_gemm',"
        " 'device': 'NVIDIA H200', 'triton': '3.6.0'})\n"
        "p = {'N': 7168, 'K': 2048, 'block_shape': [128, 128]}\n"
        "w.write(p, 1, k.default_config(p, 1), Point(3.25, None, 0.01))\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"), str(land_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        partial = tmp_path / "rec.jsonl.partial"
        before = partial.read_text()
        capsys.readouterr()
        args = ["--only", "N=7168,K=2048", "--batch-sizes", "1", "--compile-workers", "1"]
        assert gemm(tmp_path / "a", "--record", str(land_path), *args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "being recorded by another run" in err, err
        assert fake_gpu.instances and all(getattr(g, "closed", False) for g in fake_gpu.instances)
        assert partial.read_text() == before and not land_path.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert gemm(tmp_path / "b", "--record", str(land_path), *args) == 0
    pts = read_landscape(land_path, KERNEL).lookup(P, 1)
    assert pts[tuple(KERNEL.default_config(P, 1).values())].time_us == 3.25     # the killed run's timing, kept

def test_config_failing_numerics_is_never_emitted(fake_gpu, tmp_path, monkeypatch):
    from tuner.search.runner import StudyRunner
    real_finish = StudyRunner._finish

    def fail_the_fastest(self, problem, M, measured, *rest, **kw):
        fastest = min((v, t) for t, v in measured.items() if v is not None)[1]
        self.measurer.failing.add(fastest)
        return real_finish(self, problem, M, measured, *rest, **kw)

    monkeypatch.setattr(StudyRunner, "_finish", fail_the_fastest)
    assert gemm(tmp_path / "o", "--batch-sizes", "16") == 0
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    for t in manifest["tables"]:
        e = t["entries"]["16"]
        assert e["rejected"] and e["rejected"][0]["numerics"]["status"] == "failed"
        bad = e["rejected"][0]["config"]
        assert e["config"] != bad
        table = json.loads((tmp_path / "o" / t["files"]["vllm"]).read_text())
        assert table["16"] == e["config"]


def test_baseline_table_seeds_every_study(fake_gpu, tmp_path, shared_dir):
    base = shared_dir / "baselines" / "vllm-0.33.0" / "fp8_gemm"
    shipped = json.loads((base / "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
                         .read_text())
    assert gemm(tmp_path / "o", "--batch-sizes", "64", "--baseline", str(base)) == 0
    study = optuna.load_study(study_name=study_name(Problem("fp8_gemm", P), 64),
                              storage=open_storage(default_storage(tmp_path / "o")))
    seeded = [t.user_attrs["config"] for t in study.trials if t.user_attrs.get("seed") == "baseline"]
    assert len(seeded) == 1
    want = shipped["64"]
    for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps", "num_stages"):
        assert seeded[0][k] == want[k]
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    entry = next(t for t in manifest["tables"] if t["problem"] == P)["entries"]["64"]
    baseline_time = next(t.value for t in study.trials if t.user_attrs.get("seed") == "baseline")
    assert entry["time_us"] <= baseline_time   # never slower than the shipped table
