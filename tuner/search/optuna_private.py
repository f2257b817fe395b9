"""Every use of Optuna's private API, in one place (tests/test_optuna_private.py fails when an Optuna
release moves one of them; tests/test_structure.py fails when a module outside this one reaches
into Optuna's private names). Each says why the public API does not do."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in the storage (its number counts within the study only): the storage calls
    (heartbeats, reading one trial back, reopening another worker's trial) take this id, and
    Optuna exposes it on no public attribute."""
    return trial._trial_id


def study_id(study: Any) -> int:
    """A study's id in its storage (a Study's or a FrozenStudy's from get_all_studies), for reading
    its trials straight from the storage."""
    return study._study_id


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage a study was opened on: the only way to read one trial's present state back
    without loading the study."""
    return study._storage


def trial_of(study: optuna.Study, tid: int) -> optuna.Trial:
    """A Trial object for a trial of the storage: the public API hands out Trial objects only from
    ask(), and failing another worker's trial needs one built on its id."""
    return optuna.Trial(study, tid)


def journal_backend(storage: BaseStorage) -> Any:
    """The backend a JournalStorage writes through (None for other storages): syncing the journal
    file to the disk is the backend's, and JournalStorage keeps it there."""
    return getattr(storage, "_backend", None)


def journal_replay(prefix: str) -> Any:
    """Optuna's own replay of journal operations, one at a time (JournalStorage rebuilds its
    studies with it): an operation it cannot apply is none, whatever JSON it is."""
    from optuna.storages.journal._storage import JournalStorageReplayResult
    return JournalStorageReplayResult(prefix)
