"""Optuna's private API, reached from one module (tuner/search/optuna_private.py, issue 53): each
use does what we rely on with the installed Optuna (so a release that moves or changes one fails
here, by name, not somewhere in a run), and no other module of tuner/ or scripts/ that imports
Optuna reaches into its private names."""

import ast
import json
from pathlib import Path

import optuna
import pytest

from tuner.search.optuna_private import journal_backend, journal_replay, study_id, study_storage, trial_id, trial_of
from tuner.search.storage import JournalFile, open_storage

REPO = Path(__file__).resolve().parents[1]
PRIVATE_MODULE = REPO / "tuner" / "search" / "optuna_private.py"
# private names of our own reached from a module that also imports Optuna (not Optuna's)
OWN_PRIVATE = {("scripts/sampler_cost.py", "sg._BLAS")}


@pytest.fixture
def journal_study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(f"journal:///{tmp_path / 'studies.journal'}")
    study = optuna.create_study(study_name="s", storage=storage)
    return storage, study


def test_trial_and_study_ids_are_the_storage_ones(journal_study):
    storage, study = journal_study
    study.ask()
    second = study.ask()
    assert study_id(study) == storage.get_study_id_from_name("s")
    assert storage.get_trial(trial_id(second)).number == second.number == 1
    frozen = study.get_trials(deepcopy=False)[1]
    assert trial_id(frozen) == trial_id(second)
    assert study_id(storage.get_all_studies()[0]) == study_id(study)      # a FrozenStudy's too
    assert study_storage(study) is storage


def test_a_trial_built_on_its_id_is_told_like_one_from_ask(journal_study):
    """Failing another worker's trial (tuner/search/storage.py fail_stale) builds a Trial on its id."""
    storage, study = journal_study
    asked = study.ask()
    other = trial_of(study, trial_id(asked))
    other.set_user_attr("error", "interrupted")
    study.tell(other, state=optuna.trial.TrialState.FAIL)
    back = storage.get_trial(trial_id(asked))
    assert back.state == optuna.trial.TrialState.FAIL and back.user_attrs == {"error": "interrupted"}


def test_the_journal_backend_is_the_file_we_opened(journal_study, tmp_path):
    storage, _ = journal_study
    assert isinstance(journal_backend(storage), JournalFile)
    assert journal_backend(optuna.storages.InMemoryStorage()) is None


def test_the_replay_applies_a_journal_one_operation_at_a_time(journal_study, tmp_path):
    """tuner/search/journal_repair.py counts a journal's whole operations with Optuna's own replay:
    a real journal's operations apply one by one, and one it cannot apply raises."""
    storage, study = journal_study
    trial = study.ask()
    study.tell(trial, 1.5)
    lines = (tmp_path / "studies.journal").read_text().splitlines()
    replay = journal_replay("check-")
    for line in lines:
        replay.apply_logs([json.loads(line)])
    assert [s.study_name for s in replay.get_all_studies()] == ["s"]
    with pytest.raises(Exception):  # noqa: B017 - whatever Optuna raises: journal_repair takes any
        journal_replay("check-").apply_logs([{"op_code": 4, "worker_id": "w"}])   # a trial of no study


def private_uses(path: Path) -> list[str]:
    """`x._name` (x neither self nor cls), getattr(x, "_name"), and imports of a private Optuna
    module or name, in a module that imports Optuna."""
    tree = ast.parse(path.read_text())
    imports_optuna = any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "optuna" for a in n.names)
                         or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "optuna"
                         for n in ast.walk(tree))
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "optuna":
            if any(part.startswith("_") for part in n.module.split(".")) or any(a.name.startswith("_") for a in n.names):
                found.append(f"{n.lineno}: from {n.module} import ...")
        if not imports_optuna:
            continue
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
            root = n.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
                found.append(ast.unparse(n))
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                and len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_")):
            found.append(ast.unparse(n))
    rel = str(path.relative_to(REPO))
    return [f"{rel}: {use}" for use in found if (rel, use) not in OWN_PRIVATE]


def test_no_other_module_reaches_into_optunas_private_names():
    files = sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "scripts").glob("*.py"), *(REPO / "kernels").rglob("*.py")])
    assert len(private_uses(PRIVATE_MODULE)) >= 4           # the check sees the uses where they are
    found = [use for path in files if path != PRIVATE_MODULE for use in private_uses(path)]
    assert not found, f"Optuna's private API outside tuner/search/optuna_private.py: {found}"
