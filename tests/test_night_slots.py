"""`tuner nightly --minutes`: a night's slot shared so that every job advances, a retune that spans
two windows after an environment change, and the slot said by a dry run and taken by the script
(issue 50, items 3 and 8; issue 51, item 7). Replayed SYNTHETIC landscapes, under the clock the test
drives (tests/window_clock.py: one "second" per config measured)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from synthetic import block_fp8_model, scaled_landscape, write_synthetic_landscape
from test_nightly import script_turn

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.space import load_space
from tuner.search.storage import counts, open_storage

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
MS = [1, 16]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    model = block_fp8_model(d / "tiny.yaml", 1024, 8)
    problems = [p.params for p in gemm_problems(load_model(str(model)), 1)]
    base = d / "base.jsonl"
    write_synthetic_landscape(base, KERNEL, load_space(KERNEL), get_gpu("H200"), problems, MS)
    faster = scaled_landscape(base, d / "faster.jsonl", KERNEL, 0.8, triton="3.7.0")      # another Triton
    return d, model, base, faster


def night_config(d: Path, model: Path, lands: dict[str, Path], trials: int = 8) -> Path:
    job = {"kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": trials, "batch_sizes": MS}
    cfg = {"runs_dir": str(d / "runs"), "jobs": [{**job, "name": n, "replay": str(p)} for n, p in lands.items()]}
    path = d / f"night-{len(list(d.glob('night-*')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def measured(run: Path) -> int:
    """Configs measured in a job's run folder (0 where it has none)."""
    if not (run / "studies.journal").is_file():
        return 0
    storage = open_storage(f"journal:///{run / 'studies.journal'}")
    return sum(counts(t) for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n
               for t in optuna.load_study(study_name=n, storage=storage).get_trials(deepcopy=False))


def night(cfg: Path, name: str, minutes: float, clock, capsys) -> tuple[int, str]:
    clock.t = 0.0
    rc = main(["nightly", str(cfg), "--night", name, "--minutes", str(minutes)])
    return rc, capsys.readouterr().out


def run_of(d: Path, job: str) -> Path:
    return Path(json.loads((d / "runs" / "state.json").read_text())[job]["run"])


def test_the_slot_is_shared_so_that_every_job_advances(world, tmp_path, clock, capsys):
    """Two jobs, a slot that holds a fraction of their work: before, the first job took nine tenths of
    every night's slot and the second advanced by a tenth at most, however many nights."""
    _, model, base, _ = world
    cfg = night_config(tmp_path, model, {"a": base, "b": base}, trials=12)
    got: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(1, 4):
        rc, said = night(cfg, f"n{i}", 1, clock, capsys)
        assert rc == 0, said
        for job in got:
            got[job].append(measured(run_of(tmp_path, job)))
    for job, counts_by_night in got.items():
        # every night each job measured more, and about as much as the other
        assert all(b > a for a, b in zip([0, *counts_by_night], counts_by_night)), got
    assert min(got["a"][0], got["b"][0]) >= max(got["a"][0], got["b"][0]) / 2, got


def test_a_job_the_slot_cannot_hold_waits_and_says_how_long_a_slot_would(world, tmp_path, clock, capsys):
    """Start-ups longer than the whole slot: each job's window says it made no progress and what it needs;
    a job whose need the slot cannot hold waits (the first in turn tries all the same: its need may have
    been a one-time start-up's), and a slot of the length said makes progress."""
    _, model, base, _ = world
    cfg = night_config(tmp_path, model, {"a": base, "b": base})
    clock.startup_s = 20.0                  # a start-up longer than the whole slot
    rc, said = night(cfg, "n1", 0.25, clock, capsys)
    assert "a: its share of the slot" in said and "made no progress: it needs about 20 s" in said
    state = json.loads((tmp_path / "runs" / "state.json").read_text())
    assert state["a"]["unfinished"] and state["a"]["needs_s"] == 20
    rc, said = night(cfg, "n2", 0.25, clock, capsys)         # b first (it had no time), then a
    summary = {r["job"]: r for r in json.loads((tmp_path / "runs" / "n2" / "summary.json").read_text())}
    assert summary["a"]["status"] == "waiting" and "min would hold it" in summary["a"]["why"], summary
    need = float(summary["a"]["why"].split("a slot of ")[1].split(" min")[0])
    assert "the slot of 0.25 min is shorter than the retunes left need together" in said
    assert measured(run_of(tmp_path, "a")) == 0
    rc, said = night(cfg, "n3", need, clock, capsys)
    assert measured(run_of(tmp_path, "a")) > 0, said


def test_a_retune_after_an_environment_change_spans_two_windows(world, tmp_path, clock, capsys):
    """Night 1 tunes; Triton changes; night 2's slot cuts the retune, night 3 finishes it (its diff in
    night 2's folder) and reports it. Before: night 3 ended in an internal error (the diff 'is not in the
    subpath' of night 3), with no report, and night 3 run again said the job was unchanged."""
    _, model, base, faster = world
    first = night_config(tmp_path, model, {"a": base})
    clock.t = 0.0
    assert main(["nightly", str(first), "--night", "n1"]) == 0
    changed = night_config(tmp_path, model, {"a": faster})
    rc, said = night(changed, "n2", 0.2, clock, capsys)
    assert rc == 0 and "environment changed" in said
    state = json.loads((tmp_path / "runs" / "state.json").read_text())
    assert state["a"]["unfinished"] and state["a"]["run"].endswith("n2/a")
    rc, said = night(changed, "n3", 30, clock, capsys)
    assert rc == 0, said
    summary = json.loads((tmp_path / "runs" / "n3" / "summary.json").read_text())
    assert summary[0]["status"] == "improved" and summary[0]["diff"].endswith("n2/a/diff/diff.md")
    report = (tmp_path / "runs" / "n3" / "report.md").read_text()
    assert "([diff](../n2/a/diff/diff.md))" in report
    assert (tmp_path / "runs" / "n3" / "../n2/a/diff/diff.md").is_file()
    # the same night again: the retune it did, not "unchanged"
    rc, said = night(changed, "n3", 30, clock, capsys)
    summary = json.loads((tmp_path / "runs" / "n3" / "summary.json").read_text())
    assert summary[0]["status"] == "improved", summary


def test_a_dry_run_says_the_slot(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole: tuner/textwidth.py)
    _, model, base, _ = world
    cfg = night_config(tmp_path, model, {"a": base, "b": base})
    assert main(["nightly", str(cfg), "--dry-run", "--minutes", "0.3"]) == 0
    said = capsys.readouterr().out
    assert "the slot: 0.3 min (18 s), shared by the jobs in turn" in said
    assert "  1. a: 8 s of retuning if every job retunes" in said and "  2. b: 8 s" in said
    assert all(len(line) <= 120 for line in said[said.index("the slot:"):said.index("\njob ")].splitlines())
    assert not (tmp_path / "runs").exists()


def test_the_script_takes_the_slot(world, tmp_path):
    _, model, base, _ = world
    cfg = night_config(tmp_path, model, {"a": base})
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_NIGHT": "slot-test"}
    script = REPO / "scripts" / "nightly_retune.sh"
    with script_turn():             # the script's lock is the checkout's: test_nightly.py's start it too
        done = subprocess.run(["bash", str(script), "--python", sys.executable, "--minutes", "10", str(cfg)],
                              env=env, capture_output=True, text=True, timeout=600)
    log = REPO / "logs" / "nightly-slot-test.log"
    try:
        assert done.returncode == 0, done.stderr
        assert "--minutes 10" in log.read_text()
    finally:
        log.unlink(missing_ok=True)
    bad = subprocess.run(["bash", str(script), "--minutes", "soon", str(cfg)], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "--minutes" in bad.stderr
