"""How concurrent workers claim trials of one study (tuner/search/storage.py claim),
with the other worker's steps played by hand in between, in the orders that used to lose a
trial or measure one twice. The 'other worker' is named after PID 1, a live process."""

import functools
import socket

import optuna
import pytest

from tuner.measure.measurers import Measurement
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_tuple
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search import storage as study_storage
from tuner.search.runner import SearchSettings, StudyRunner
from tuner.search.storage import WORKER_ID, claim

KERNEL = get_kernel("fp8_gemm")
KEY = functools.partial(config_tuple, KERNEL)
OTHER = f"{socket.gethostname()}:1"
X = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
Y = {**X, "num_stages": 4}


@pytest.fixture
def setup():
    runner = StudyRunner(KERNEL, load_space(KERNEL), get_gpu("H200"), None, optuna.storages.InMemoryStorage(),
                         SearchSettings(budget=1))
    return runner, optuna.create_study(storage=runner.storage)


def ask(study, worker, config=None):
    trial = study.ask()
    if worker:
        trial.set_user_attr("worker", worker)
    if config:
        trial.set_user_attr("config", config)
    return trial


def state(study, trial):
    return study.trials[trial.number].state


def test_a_slot_is_held_by_an_earlier_trial_still_being_set_up(setup):
    runner, study = setup
    theirs = ask(study, OTHER)                  # asked first; its config not written yet
    mine = ask(study, WORKER_ID, X)
    kept, waiting = claim(study, [(mine, X)], budget=1, key=KEY)
    assert kept == [] and waiting               # the earlier trial may take the only slot
    assert study.trials[mine.number].user_attrs["pruned"] == "over budget"
    theirs.set_user_attr("config", Y)           # ...and it does: one trial, not two
    assert [t for t, _ in claim(study, [(theirs, Y)], budget=1, key=KEY)[0]] == [theirs]


def test_an_unnamed_trial_stops_holding_a_slot_after_a_grace(setup, monkeypatch):
    runner, study = setup
    ask(study, None)                            # a process killed right after asking
    mine = ask(study, WORKER_ID, X)
    monkeypatch.setattr(study_storage, "UNNAMED_GRACE_S", -1.0)
    kept, waiting = claim(study, [(mine, X)], budget=1, key=KEY)
    assert [t for t, _ in kept] == [mine] and not waiting


def test_a_config_claimed_first_by_a_later_trial_is_not_measured_twice(setup):
    runner, study = setup
    theirs = ask(study, OTHER)                  # lower number, config written late
    mine = ask(study, WORKER_ID, X)
    assert [t for t, _ in claim(study, [(mine, X)], budget=2, key=KEY)[0]] == [mine]
    theirs.set_user_attr("config", X)           # the same config, written after mine
    kept, waiting = claim(study, [(theirs, X)], budget=2, key=KEY)
    assert kept == [] and not waiting
    assert state(study, theirs) == optuna.trial.TrialState.PRUNED
    assert study.trials[theirs.number].user_attrs["pruned"] == "repeat"
    assert state(study, mine) == optuna.trial.TrialState.RUNNING


def test_a_dead_workers_unfinished_setup_holds_no_slot(setup):
    runner, study = setup
    gone = ask(study, f"{socket.gethostname()}:{2 ** 22 + 12345}")    # no such process
    mine = ask(study, WORKER_ID, X)
    assert [t for t, _ in claim(study, [(mine, X)], budget=1, key=KEY)[0]] == [mine]
    assert state(study, gone) == optuna.trial.TrialState.RUNNING          # left to fail_stale


def test_a_trial_another_worker_finished_first_is_left_as_it_is(setup):
    """SQLite lets two workers pop one queued trial, and two workers may fail the same dead
    worker's trial at once: the second write must neither raise nor overwrite the first."""
    runner, study = setup
    trial = ask(study, WORKER_ID, X)
    study.tell(trial, 12.5)                                   # the other worker's result
    runner._tell(study, trial, Measurement(99.0, 0.01, None))  # ours arrives second
    runner._tell(study, trial, Measurement(None, None, "boom"))
    assert not study_storage.close_trial(study, trial, optuna.trial.TrialState.FAIL, error="interrupted")
    done = study.trials[trial.number]
    assert done.state == optuna.trial.TrialState.COMPLETE and done.value == 12.5
    assert "error" not in done.user_attrs and "spread" not in done.user_attrs
    fresh = ask(study, WORKER_ID, Y)
    assert study_storage.close_trial(study, fresh, optuna.trial.TrialState.FAIL, error="interrupted")
    assert study.trials[fresh.number].user_attrs["error"] == "interrupted"


def test_a_claim_on_a_trial_finished_meanwhile_is_dropped(setup):
    runner, study = setup
    mine = ask(study, WORKER_ID, X)
    study.tell(mine, 3.0)                       # the other popper measured it first
    kept, _ = claim(study, [(mine, X)], budget=5, key=KEY)
    assert kept == []


def test_opening_a_fresh_database_that_another_process_is_creating(tmp_path, monkeypatch):
    """Workers started together on a new database race to create its tables; the loser
    sees 'table ... already exists' and must simply open what the winner made."""
    real = optuna.storages.RDBStorage
    calls = []

    @functools.wraps(real)                     # keeps RDBStorage's signature for open_storage
    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) table studies already exists")
        if len(calls) == 2:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num")
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    monkeypatch.setattr(study_storage.time, "sleep", lambda s: None)
    storage = study_storage.open_storage(f"sqlite:///{tmp_path / 'fresh.db'}")
    assert len(calls) == 3 and isinstance(storage, real)
    calls.clear()

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("(sqlite3.OperationalError) unable to open database file")

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(RuntimeError, match="unable to open"):
        study_storage.open_storage(f"sqlite:///{tmp_path / 'fresh.db'}")
    assert len(calls) == 1                     # other errors are not retried
