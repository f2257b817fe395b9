"""A RUNNING trial's owner is a process a reused pid cannot fake (issue 51, item 3;
tuner/search/owners.py): a window killed while tuner was pid 1 (a container's first process)
leaves trials that the next run fails and measures again, though `os.kill(1, 0)` succeeds;
trials named by an older tuner ("host:pid") asked before this boot, or before the process
that holds that pid now began, are taken as gone too."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from synthetic import write_synthetic_landscape

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search import owners
from tuner.search.storage import ACTIVE_TRIALS, WORKER_ID, counts, fail_stale, open_storage, worker_gone

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
HOST = socket.gethostname()
X = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}

linux = pytest.mark.skipif(owners.start_ticks("self") is None or not owners.boot_id(), reason="needs Linux's /proc")


def running(study, worker, asked=None):
    """A RUNNING trial owned by `worker`, asked at `asked` (default now)."""
    template = optuna.trial.FrozenTrial(
        number=0, state=TrialState.RUNNING, value=None, datetime_start=asked or datetime.datetime.now(),
        datetime_complete=None, params={}, distributions={}, user_attrs={"worker": worker, "config": X},
        system_attrs={}, intermediate_values={}, trial_id=0)
    tid = study._storage.create_new_trial(study._study_id, template_trial=template)
    return tid


@linux
def test_this_process_names_itself_with_its_boot_and_start():
    host, pid, boot, start = owners.parse(WORKER_ID)
    assert (host, pid, boot) == (HOST, os.getpid(), owners.boot_id())
    assert start == owners.start_ticks(os.getpid())
    assert owners.same_process(WORKER_ID)


@linux
def test_pid_1_alive_is_not_the_owner_it_names():
    """os.kill(1, 0) succeeds (pid 1 is alive, or another user's); the trial was named by another
    process that had pid 1 (a container's tuner): its start time does not match pid 1's."""
    real = owners.start_ticks(1)
    assert real is not None
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    tid = running(study, f"{HOST}:1/{owners.boot_id()}/{real + 12345}")
    assert worker_gone(study.trials[0].user_attrs["worker"], tid)
    requeued = []
    fail_stale(study, requeued.append)
    assert study.trials[0].state == TrialState.FAIL and study.trials[0].user_attrs["error"] == "interrupted"
    assert requeued == [X]
    # the same pid and start, in another boot (a reboot under the same host name): gone as well
    assert worker_gone(f"{HOST}:1/{'0' * 16}/{real}", tid)
    # ...and pid 1 as it is, this boot: alive
    assert not worker_gone(f"{HOST}:1/{owners.boot_id()}/{real}", tid)


@linux
def test_an_older_tuners_owner_asked_before_this_boot_is_gone():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    booted = datetime.datetime.fromtimestamp(owners.boot_time())
    tid = running(study, f"{HOST}:1", asked=booted - datetime.timedelta(hours=1))
    assert worker_gone(f"{HOST}:1", tid, study.trials[0].datetime_start)
    # asked after pid 1 began: pid 1 may be its owner (the claims' tests name a live worker so)
    assert not worker_gone(f"{HOST}:1", tid, datetime.datetime.now())


def test_owner_names_that_are_no_names_are_not_a_crash():
    for bad in ("", "x", f"{HOST}:", f"{HOST}:abc", f"{HOST}:1/", f"{HOST}:1/x/y", f"{HOST}:{'9' * 40}", 5, None):
        assert owners.parse(bad) is None or owners.parse(bad)[3] is None
        assert worker_gone(bad, 0) in (True, False)
    assert not ACTIVE_TRIALS


# A window run as pid 1: os.getpid() answers 1 (as in a container), and the process kills itself
# (by its real pid) the moment it has written its third claimed config, leaving that trial RUNNING.
AS_PID_1 = """
import os, signal, sys
real_pid = os.getpid()
os.getpid = lambda: 1
import optuna
real = optuna.trial.Trial.set_user_attr
claims = [0]
def write_then_die(self, key, value):
    real(self, key, value)
    if key == "config":
        claims[0] += 1
        if claims[0] == 3:
            os.kill(real_pid, signal.SIGKILL)
optuna.trial.Trial.set_user_attr = write_then_die
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@linux
def test_a_window_killed_as_pid_1_is_taken_over(tmp_path):
    land = tmp_path / "gemm.jsonl"
    problem = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [problem], [16])
    out = tmp_path / "out"
    argv = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land), "--batch-sizes",
            "16", "--trials", "4", "--patience", "4", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", AS_PID_1, *argv], env=env, cwd=tmp_path)
    assert killed.returncode == -9
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    name = next(n for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n)
    left = [t for t in optuna.load_study(study_name=name, storage=storage).trials if t.state == TrialState.RUNNING]
    assert [t.user_attrs["worker"].split("/")[0] for t in left] == [f"{HOST}:1"]
    # before: pid 1 is alive, so its trial held the last slot and the run waited for it forever
    done = subprocess.run([sys.executable, "-m", "tuner", *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    trials = optuna.load_study(study_name=name, storage=open_storage(f"journal:///{out / 'studies.journal'}")).trials
    assert sum(counts(t) for t in trials) == 4
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert [t.user_attrs["error"] for t in trials if t.number == left[0].number] == ["interrupted"]
