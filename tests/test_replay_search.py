"""Search, resume and emission over a SYNTHETIC landscape (tests/synthetic.py), on a CPU."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from synthetic import cli_killed_at_claim, slowed_cli, write_synthetic_landscape

from tuner.cli import main
from tuner.measure.landscape import read_landscape
from tuner.pipeline.run_plan import default_storage
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import study_name
from tuner.search.storage import open_storage

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
PROBLEMS = [{"N": 7168, "K": 2048, "block_shape": [128, 128]}, {"N": 3072, "K": 1536, "block_shape": [128, 128]}]
MS = [1, 16, 128]


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), PROBLEMS, MS)
    return path


def tune(landscape, out, *extra, trials=40):
    argv = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--out", str(out), "--trials", str(trials), "--batch-sizes", *map(str, MS), *extra]
    return main(argv)


def measured_trials(storage_url, params, M):
    study = optuna.load_study(study_name=study_name(Problem("fp8_gemm", params), M), storage=open_storage(storage_url))
    return [t for t in study.trials if "config" in t.user_attrs and t.user_attrs.get("error") != "interrupted"
            and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]


def test_replay_emits_both_engines_tables_near_the_best(landscape, tmp_path, capsys):
    out = tmp_path / "out"
    assert tune(landscape, out) == 0
    captured = capsys.readouterr()
    assert "skip N=4096,K=512" in captured.err          # says which problems it skips
    assert "speedup" in captured.out                      # closing table
    land = read_landscape(landscape, KERNEL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["measured_by"].startswith("replay:")
    assert len(manifest["tables"]) == 2
    for entry in manifest["tables"]:
        params = entry["problem"]
        assert set(entry["files"]) == {"vllm", "sglang"}
        assert entry["environment"]["synthetic"] is True
        vllm = json.loads((out / entry["files"]["vllm"]).read_text())
        sglang = json.loads((out / entry["files"]["sglang"]).read_text())
        assert vllm == sglang
        assert list(vllm) == [str(m) for m in MS]
        for M in MS:
            cfg = vllm[str(M)]
            assert list(cfg) == list(KERNEL.config_keys)
            best_cfg, best_t = land.best(params, M)
            e = entry["entries"][str(M)]
            assert e["config"] == cfg
            assert e["time_us"] <= best_t * 1.03, (params, M)
            assert e["time_us"] <= e["default_time_us"]          # never slower than the default
            assert e["numerics"]["status"] == "not checked"
            assert e["trials"] <= 40


def test_replay_refuses_another_device(landscape, tmp_path, capsys):
    argv = ["gemm", "--model", "deepseek-v3", "--gpu", "H100", "--tp", "8", "--per-rank", "--replay", str(landscape),
            "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "recorded on 'NVIDIA H200'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_resume_counts_stored_trials_against_the_budget(landscape, tmp_path, monkeypatch):
    from tuner.measure import measurers as measure
    out = tmp_path / "out"
    calls = []
    real = measure.ReplayMeasurer.measure

    def counting(self, problem, M, configs):
        calls.extend((problem.key, M, tuple(c.values())) for c in configs)
        if len(calls) > 70:
            raise KeyboardInterrupt   # stop part-way, as Ctrl-C would
        return real(self, problem, M, configs)

    monkeypatch.setattr(measure.ReplayMeasurer, "measure", counting)
    assert tune(landscape, out, "--patience", "100", trials=24) == 130
    first = len(calls)
    monkeypatch.setattr(measure.ReplayMeasurer, "measure", real)
    assert tune(landscape, out, "--patience", "100", trials=24) == 0
    url = default_storage(out)
    assert url == f"journal:///{(out / 'studies.journal').resolve()}"        # the default storage
    for params in PROBLEMS:
        for M in MS:
            trials = measured_trials(url, params, M)
            configs = [tuple(t.user_attrs["config"].values()) for t in trials]
            assert len(configs) == len(set(configs))            # nothing measured twice
            assert len(trials) == min(24, len(load_space(KERNEL).configs(params, M, get_gpu("H200"))) + 2)
    assert first > 0


def test_a_finished_run_started_again_says_it_resumed(landscape, tmp_path, capsys):
    out = tmp_path / "out"
    assert tune(landscape, out, trials=8) == 0
    first = capsys.readouterr().err
    assert "resuming" not in first and "stored:" not in first
    assert tune(landscape, out, trials=8) == 0
    again = capsys.readouterr().err
    studies = len(PROBLEMS) * len(MS)
    assert f"resuming from journal:///{(out / 'studies.journal').resolve()}: {studies} of {studies} studies" in again
    lines = [ln for ln in again.splitlines() if ln.startswith("[")]
    assert len(lines) == studies and all("M=" in ln and ": stored: " in ln for ln in lines)


def test_kill_9_then_resume(landscape, tmp_path):
    out = tmp_path / "out"
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--out", str(out), "--trials", "20", "--patience", "100", "--batch-sizes", *map(str, MS), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", slowed_cli(0.02), *args], env=env, cwd=tmp_path)
    url = default_storage(out)
    deadline = time.time() + 300         # generous: a slow machine only waits longer
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            if len(measured_trials(url, PROBLEMS[0], 16)) >= 5:
                break
        except Exception:
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # Whatever is on disk now is whole: every table that exists parses.
    for f in out.rglob("*.json"):
        json.loads(f.read_text())
    assert not list(out.rglob("*.tmp"))
    done = subprocess.run([sys.executable, "-m", "tuner", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for params in PROBLEMS:
        for M in MS:
            trials = measured_trials(url, params, M)
            assert len(trials) == 20
            assert len({tuple(t.user_attrs["config"].values()) for t in trials}) == 20
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["tables"]) == 2


def test_kill_at_a_claim_then_resume(landscape, tmp_path):
    """A process killed the instant it claimed a config leaves no claim that blocks the
    resumed run: every RUNNING trial names its (dead) worker."""
    out = tmp_path / "out"
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--out", str(out), "--trials", "12", "--patience", "100", "--batch-sizes", "1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", cli_killed_at_claim(5), *args], env=env, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    url = default_storage(out)
    storage = open_storage(url)
    running = [t for s in optuna.get_all_study_names(storage) for t in optuna.load_study(study_name=s, storage=storage).trials
               if t.state == optuna.trial.TrialState.RUNNING]
    assert any("config" in t.user_attrs for t in running)          # the interrupted claim is there
    assert all("worker" in t.user_attrs for t in running)
    done = subprocess.run([sys.executable, "-m", "tuner", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for params in PROBLEMS:
        trials = measured_trials(url, params, 1)
        assert len({tuple(t.user_attrs["config"].values()) for t in trials}) == len(trials) == 12
    storage = open_storage(url)
    left = [t for s in optuna.get_all_study_names(storage) for t in optuna.load_study(study_name=s, storage=storage).trials
            if t.state == optuna.trial.TrialState.RUNNING]
    assert not left                   # the dead process's trials were failed and requeued


def test_an_unnamed_claim_from_an_older_run_is_cleared(landscape, monkeypatch):
    """A RUNNING trial that names a config but no worker (a process killed between the two
    writes, in the order older versions used) is failed once it is old, not waited on."""
    from tuner.measure.measurers import ReplayMeasurer
    from tuner.search import runner as search
    from tuner.search import storage as study_storage
    from tuner.search.runner import SearchSettings, StudyRunner

    gpu, space = get_gpu("H200"), load_space(KERNEL)
    measurer = ReplayMeasurer.from_file(str(landscape), KERNEL, gpu.cuda_name)
    storage = optuna.storages.InMemoryStorage()
    problem = Problem("fp8_gemm", PROBLEMS[0])
    runner = StudyRunner(KERNEL, space, gpu, measurer, storage,
                         SearchSettings(budget=4, patience=1000, batch=2, seed=1))
    runner.poll_s = 0.0
    runner.tune(problem, 1, [])
    study = optuna.load_study(study_name=study_name(problem, 1), storage=storage)
    measured = {tuple(t.user_attrs["config"].values()) for t in study.trials if "config" in t.user_attrs}
    cfg = next(c for c in space.configs(problem.params, 1, gpu) if tuple(c.values()) not in measured)
    orphan = study.ask()
    orphan.set_user_attr("config", cfg)

    sleeps = []

    def sleep(seconds):               # a broken recovery would wait forever: give up loudly
        sleeps.append(seconds)
        if len(sleeps) > 200:
            raise AssertionError("the run waited on the orphaned trial")

    monkeypatch.setattr(search.time, "sleep", sleep)
    monkeypatch.setattr(study_storage, "ORPHAN_AFTER_S", -1)
    runner.settings = SearchSettings(budget=8, patience=1000, batch=2, seed=1)
    result = runner.tune(problem, 1, [])
    assert result.trials == 8
    left = study.trials[orphan.number]
    assert left.state == optuna.trial.TrialState.FAIL and left.user_attrs["error"] == "interrupted"
