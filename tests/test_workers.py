"""Several worker processes on one storage (the journal file, the default of a local run,
and SQLite here; PostgreSQL too when TUNER_TEST_POSTGRES_URL names a server, as .ci/run
arranges), replaying a SYNTHETIC landscape slowed down so that they overlap. One worker is
killed mid-run."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from synthetic import block_fp8_model, slowed_cli, write_synthetic_landscape

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.space import load_space
from tuner.search.runner import study_name
from tuner.search.storage import open_storage

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
MS = [1, 16]
BUDGET = 12
# The PostgreSQL case is always collected; without a server it is skipped, and says why.
STORAGES = ["journal", "sqlite", pytest.param("postgresql", marks=[pytest.mark.ci_variables, pytest.mark.skipif(
    not os.environ.get("TUNER_TEST_POSTGRES_URL"),
    reason="TUNER_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL server on loopback and sets it)")])]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("workers")
    model = block_fp8_model(d / "small.yaml", 2048, 16, 2048)
    problems = gemm_problems(load_model(str(model)), 1)
    land = d / "land.jsonl.gz"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [p.params for p in problems], MS)
    return model, land, problems


def _run(args, env):
    return subprocess.Popen([sys.executable, "-c", slowed_cli(0.15), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _trials(url, prefix, problem, M):
    return optuna.load_study(study_name=study_name(problem, M, prefix), storage=open_storage(url)).trials


@pytest.mark.parametrize("backend", STORAGES)
def test_workers_share_studies_and_survive_a_kill(setup, tmp_path, backend):
    model, land, problems = setup
    url = {"journal": f"journal:///{tmp_path / 'shared.journal'}", "sqlite": f"sqlite:///{tmp_path / 'shared.db'}",
           "postgresql": os.environ.get("TUNER_TEST_POSTGRES_URL", "")}[backend]
    prefix = f"test-{uuid.uuid4().hex[:8]}/"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "out"
    lead = _run(["gemm", "--model", str(model), "--gpu", "H200", "--tp", "1", "--replay", str(land),
                 "--storage", url, "--study-prefix", prefix, "--out", str(out), "--trials", str(BUDGET),
                 "--patience", "100", "--batch-sizes", *map(str, MS), "--quiet"], env)
    deadline = time.time() + 300         # generous: a slow machine only waits longer
    while time.time() < deadline:                       # workers join once the plan is stored
        try:
            if f"{prefix}tuner-plan:fp8_gemm" in optuna.get_all_study_names(open_storage(url)):
                break
        except Exception:
            pass
        time.sleep(0.3)
    worker = ["worker", "--storage", url, "--study-prefix", prefix, "--replay", str(land), "--quiet"]
    victim, helper = _run(worker, env), _run(worker, env)
    victim_id = f"{socket.gethostname()}:{victim.pid}"
    while time.time() < deadline:                       # let the victim measure a little, then kill it
        done = [t for p in problems for m in MS for t in _safe_trials(url, prefix, p, m)
                if str(t.user_attrs.get("worker")).split("/")[0] == victim_id and t.state == optuna.trial.TrialState.COMPLETE]
        if len(done) >= 2:
            break
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for proc in (lead, helper):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    workers = set()
    for p in problems:
        for m in MS:
            trials = _trials(url, prefix, p, m)
            measured = [t for t in trials if "config" in t.user_attrs and t.user_attrs.get("error") != "interrupted"
                        and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]
            configs = [tuple(t.user_attrs["config"].values()) for t in measured]
            assert len(configs) == BUDGET, (p.key, m)          # no trial lost, none beyond the budget
            assert len(set(configs)) == BUDGET, (p.key, m)     # none run twice
            # every trial a worker named (all but one asked in the instant of the kill) finished
            assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and t.user_attrs]
            workers |= {t.user_attrs["worker"].split("/")[0] for t in measured}     # host:pid (owners.py)
    assert victim_id in workers and len(workers) >= 2              # the work really was shared
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["tables"]) == len(problems)
    # tuner collect writes the same tables from the storage alone
    again = subprocess.run([sys.executable, "-m", "tuner", "collect", "--storage", url, "--study-prefix", prefix,
                            "--out", str(tmp_path / "collected")], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    for t in manifest["tables"]:
        for f in t["files"].values():
            assert (tmp_path / "collected" / f).read_text() == (out / f).read_text()


def _safe_trials(url, prefix, p, m):
    try:
        return _trials(url, prefix, p, m)
    except KeyError:
        return []


def test_worker_without_a_plan_is_one_clear_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tuner", "worker", "--storage", f"sqlite:///{tmp_path / 'x.db'}",
            "--study-prefix", "nothing/"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True)      # no storage there: none is made
    assert r.returncode == 2 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists()
    (tmp_path / "x.db").touch()                                              # a storage, but no plan in it
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "no tuning plan" in r.stderr and len(r.stderr.strip().splitlines()) == 1
