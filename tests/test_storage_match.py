"""A storage whose studies do not match the space is refused in one line, and a refused --synthetic run
is its one line (issue 51, item 12). Before: a SQLite storage damaged in a trial's parameter (a page
that still parses) ended the run in Optuna's internal "CategoricalDistribution does not support dynamic
value space"; and every refusal found after a --synthetic run's banner (a --warm-start with no configs,
a journal that is not one, a manifest that is not ours, ...) printed two lines, the banner first."""

import json
import sqlite3

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search.storage import open_storage

KERNEL = get_kernel("fp8_gemm")


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [16])
    return path


def args(landscape, storage, out, trials=6):
    return ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--only", "N=7168,K=2048", "--batch-sizes", "16", "--trials", str(trials), "--storage", storage,
            "--out", str(out)]


def damage_sqlite_param(db):
    """One trial's parameter drawn, as stored, from other values than the study's (a damaged page)."""
    con = sqlite3.connect(db)
    param_id, dist = con.execute("SELECT param_id, distribution_json FROM trial_params LIMIT 1").fetchone()
    d = json.loads(dist)
    d["attributes"]["choices"] = [*d["attributes"]["choices"], 4096]
    con.execute("UPDATE trial_params SET distribution_json = ? WHERE param_id = ?", (json.dumps(d), param_id))
    con.commit()
    con.close()


def damage_choices(url):
    """The study's recorded values of each key edited away from what its trials were drawn from."""
    storage = open_storage(url)
    name = next(n for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n)
    study = optuna.load_study(study_name=name, storage=storage)
    choices = study.user_attrs["choices"]
    storage.set_study_user_attr(study._study_id, "choices", {k: v[:1] for k, v in choices.items()})


@pytest.mark.parametrize("kind", ["sqlite param", "sqlite choices", "journal choices"])
def test_a_storage_that_does_not_match_the_space_is_one_line(landscape, tmp_path, capsys, kind):
    url = f"sqlite:///{tmp_path / 's.db'}" if kind.startswith("sqlite") else f"journal:///{tmp_path / 's.journal'}"
    assert main(args(landscape, url, tmp_path / "a")) == 0
    if kind == "sqlite param":
        damage_sqlite_param(tmp_path / "s.db")
    else:
        damage_choices(url)
    capsys.readouterr()
    rc = main(args(landscape, url, tmp_path / "a", trials=10))      # the study goes on to a larger budget
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("tuner: error")]
    assert len(lines) == 1 and "does not match its search space" in lines[0], err
    assert "internal error" not in err and "dynamic value space" not in err


def test_refusals_of_a_synthetic_run_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    folder = tmp_path / "tables"
    folder.mkdir()
    journal = tmp_path / "res"
    journal.mkdir()
    (journal / "manifest.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "synthetic-fp8_gemm.jsonl.gz").write_text("a file of the user's")
    base = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--synthetic", "--only", "N=7168,K=2048",
            "--batch-sizes", "1", "--trials", "2"]
    cases = {"no configs": ["--warm-start", str(bad), "--out", str(tmp_path / "o1")],
             "an empty folder": ["--warm-start", str(folder), "--out", str(tmp_path / "o2")],
             "not found": ["--warm-start", str(tmp_path / "none"), "--out", str(tmp_path / "o3")],
             "not a manifest": ["--warm-start", str(journal), "--out", str(tmp_path / "o4")],
             "the landscape's place taken": ["--out", str(out)]}
    for case, extra in cases.items():
        for dry in ([], ["--dry-run"]):
            rc = main([*base, *extra, *dry])
            said = capsys.readouterr()
            assert rc == 2, (case, said)
            assert said.out == "" and len(said.err.splitlines()) == 1, (case, dry, said)
    assert (out / "synthetic-fp8_gemm.jsonl.gz").read_text() == "a file of the user's"


def test_a_routing_file_torch_refuses_is_our_line_not_torchs(tmp_path, capsys):
    """A .pt that torch.load(weights_only=True) refuses (it holds numpy objects): before, torch's own text
    reached stderr, terminal escapes and its advice to load the file unsafely included."""
    import numpy as np
    import torch
    path = tmp_path / "ids.pt"
    torch.save(np.zeros((16, 8), dtype=np.int32), path)
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--tp", "8", "--routing",
               str(path), "--dry-run"])
    said = capsys.readouterr()
    assert rc == 2 and said.out == ""
    assert len(said.err.splitlines()) == 1 and "not expert ids" in said.err
    assert all(c.isprintable() for c in said.err.rstrip("\n")) and "Weights only" not in said.err
