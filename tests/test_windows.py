"""Tuning in time-boxed windows (--minutes, issue 38 item 2), on a replayed SYNTHETIC landscape:
windows that continue each other leave what one longer run leaves (the same studies, the same
measured configs, the same table files), a table not tuned through holds the incumbent where it
is not tuned, and a window killed with SIGKILL loses only its trial in flight. The windows' clock
here counts measured configs (one second each), so where a window closes never depends on how
fast or idle the machine is."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from synthetic import slowed_cli, write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import table_entry
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search.storage import counts, open_storage

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
PROBLEMS = [{"N": 7168, "K": 2048, "block_shape": [128, 128]}, {"N": 3072, "K": 1536, "block_shape": [128, 128]}]
MS = [1, 16, 128]
TRIALS = 10


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), PROBLEMS, MS)
    return path


def count_configs(monkeypatch) -> list[float]:
    """The windows' clock: one second per config measured (searched or timed again)."""
    import tuner.search.window as window
    from tuner.measure import measurers
    clock = [0.0]
    real = measurers.ReplayMeasurer.measure

    def measure(self, problem, M, configs):
        clock[0] += len(configs)
        return real(self, problem, M, configs)

    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", measure)
    monkeypatch.setattr(window, "now", lambda: clock[0])
    return clock


@pytest.fixture
def counted_clock(monkeypatch):
    return count_configs(monkeypatch)


@pytest.fixture(scope="module")
def whole_run(landscape, tmp_path_factory) -> tuple[Path, float]:
    """One run of the whole plan on the counted clock, and the first window's minutes sized from it:
    the first study whole (its trials and its close) and half the second's trials, so that the window
    ends inside the second study. What a study's close times depends on where the run is: it races the
    tuned row against the row the engine reads today (tuner/search/choice.py), and with the engines'
    wheels at hand ($TUNER_ENGINE_WHEELS) vLLM's shipped table for N=3072,K=1536 is that incumbent,
    4 pairs more (8 configs) than without: a fixed 30 s window closed at the end of the first study's
    close, before the second measured anything (failed in CI, where the wheels are set)."""
    whole = tmp_path_factory.mktemp("whole") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "120")
        count_configs(mp)
        assert main(args(landscape, whole, 10.5)) == 0
    storage = open_storage(f"journal:///{whole / 'studies.journal'}")
    spent = []
    for name in optuna.get_all_study_names(storage):
        if "tuner-plan" not in name:
            study = optuna.load_study(study_name=name, storage=storage)
            began = min(t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start)
            spent.append((began, study.user_attrs["spent_s"]))
    first_study_s = sorted(spent)[0][1]
    return whole, round((first_study_s + TRIALS // 2) / 60, 2)     # as a user types it: '0.45 min'


def args(landscape, out, minutes):
    return ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--out", str(out), "--trials", str(TRIALS), "--batch-sizes", *map(str, MS), "--minutes", str(minutes)]


def studies(out: Path) -> dict[str, list[str]]:
    """{study: its measured configs, sorted}."""
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    got = {}
    for name in optuna.get_all_study_names(storage):
        if "tuner-plan" in name:
            continue
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        got[name] = sorted(json.dumps(t.user_attrs["config"], sort_keys=True) for t in trials if counts(t))
    return got


def finished(out: Path) -> set[str]:
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    return {n for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n
            and optuna.load_study(study_name=n, storage=storage).user_attrs.get("result")}


def tables(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in out.rglob("*.json") if p.name != "manifest.json"}


def engines_row(entry: dict, M: int) -> dict:
    """The row at M of the table every engine of a manifest entry reads today for its shape, as our table
    writes it (the nearest key: the engines' lookup)."""
    from tuner.pipeline.incumbents import engine_tables
    from tuner.plan.engines import lookup_nearest
    from tuner.plan.problems import Problem
    engines = list(entry["files"])
    found = engine_tables(KERNEL, Problem("fp8_gemm", entry["problem"], tuple(entry["layers"]), tuple(engines)),
                          get_gpu("H200"), engines)
    assert len(found) == len(engines)
    (row,) = {json.dumps(lookup_nearest(t.rows, M), sort_keys=True) for t in found}
    return table_entry(KERNEL, json.loads(row))


def test_two_windows_leave_what_one_run_of_both_leaves(landscape, whole_run, tmp_path, counted_clock, capsys,
                                                      monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole: tuner/textwidth.py)
    split = tmp_path / "split"
    whole, minutes = whole_run
    # 6 studies of 10 trials: window 1 ends inside the second study, window 2 finishes
    assert main(args(landscape, split, minutes)) == 0
    said = capsys.readouterr().out
    first = studies(split)
    assert 0 < len(finished(split)) < len(first) <= 6
    assert any(0 < len(c) < TRIALS for n, c in first.items() if n not in finished(split)), first   # a study cut
    assert "it closed before the work was done" in said and "continue with" in said
    block = said[said.index(f"window of {minutes:g} min"):].splitlines()       # what the window says of itself
    assert all(len(line) <= 120 for line in block), block
    # the command it says continues: the same one (its --out named)
    command = said.split("continue with")[1].split(":\n", 1)[1].replace("\\\n", " ").split()
    assert command[:2] == ["tuner", "gemm"] and command[command.index("--out") + 1] == str(split)
    # the rows not tuned yet hold the incumbent: the row the engines read today where they read a table
    # for the shape (their wheels at hand: $TUNER_ENGINE_WHEELS), else the default
    manifest = json.loads((split / "manifest.json").read_text())
    for entry in manifest["tables"]:
        partial = entry.get("partial")
        tuned = [int(m) for m in entry["entries"]]
        if partial is None:
            assert sorted(tuned) == MS
            continue
        assert partial["planned"] == MS and set(partial["incumbent"]) == {str(m) for m in MS} - set(map(str, tuned))
        for rel in entry["files"].values():
            rows = json.loads((split / rel).read_text())
            assert sorted(map(int, rows)) == MS
            for m, held in partial["incumbent"].items():
                assert rows[m] == engines_row(entry, int(m)) if held == "installed" else \
                    rows[m] == table_entry(KERNEL, KERNEL.default_config(entry["problem"], int(m)))
    counted_clock[0] = 0.0
    assert main(args(landscape, split, 10)) == 0
    assert "every table of the plan is written" in capsys.readouterr().out
    got, want = studies(split), studies(whole)
    assert len(want) == 6 and got == want                  # the same configs measured, none twice
    assert all(len(c) == len(set(c)) == TRIALS for c in got.values())
    for n, configs in first.items():                       # nothing window 1 measured was lost
        assert set(configs) <= set(got[n])
    assert tables(split) == tables(whole) and len(tables(whole)) == 4
    assert not any("partial" in e for e in json.loads((split / "manifest.json").read_text())["tables"])


def test_a_window_takes_the_study_it_cut_first(landscape, whole_run, tmp_path, counted_clock, capsys):
    out = tmp_path / "out"
    assert main(args(landscape, out, whole_run[1])) == 0   # the second study cut
    cut = [n for n, c in studies(out).items() if n not in finished(out)]
    assert len(cut) == 1
    counted_clock[0] = 0.0
    capsys.readouterr()
    assert main(args(landscape, out, 10)) == 0
    first_study = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("["))
    assert cut[0].split(":", 1)[1].replace(":M=", " M=") in first_study


def test_a_dry_run_says_the_order_a_window_takes(landscape, whole_run, tmp_path, counted_clock, capsys):
    out = tmp_path / "out"
    assert main(args(landscape, out, whole_run[1])) == 0   # the second study cut
    before = studies(out)
    cut = next(n for n, c in before.items() if n not in finished(out))
    capsys.readouterr()
    assert main([*args(landscape, out, 10), "--dry-run"]) == 0
    said = capsys.readouterr().out
    first = said.split("  first: ", 1)[1].replace("\n    ", " ").split("; ")
    assert first[0] == cut.split(":", 1)[1].replace(":M=", " M=")       # the study it cut goes first
    assert "studies finished; left" in said and "(1 begun)" in said
    assert studies(out) == before                                       # a dry run measured nothing


def test_bad_minutes_are_one_line(landscape, tmp_path, capsys):
    for bad in ("0", "-1", "nan", "1441", "soon"):
        assert main(args(landscape, tmp_path / "out", bad)) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--minutes" in err and "must" in err
    assert not (tmp_path / "out").exists()


def test_a_window_killed_loses_only_its_trial_in_flight(landscape, tmp_path):
    out = tmp_path / "out"
    argv = [*args(landscape, out, 30), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", slowed_cli(0.05), *argv], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 300        # generous: a slow machine only waits longer
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        try:
            if sum(map(len, studies(out).values())) >= 15:
                break
        except Exception:                    # noqa: BLE001 - the storage is not there yet
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = studies(out)
    assert sum(map(len, before.values())) >= 15
    done = subprocess.run([sys.executable, "-m", "tuner", *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = studies(out)
    assert len(after) == 6 and all(len(c) == len(set(c)) == TRIALS for c in after.values())
    for name, configs in before.items():
        assert set(configs) <= set(after[name])            # every trial measured before the kill is kept


def night_config(d: Path, runs: str, land: Path) -> Path:
    from synthetic import block_fp8_model
    model = block_fp8_model(d / "tiny.yaml", 1024, 8)
    job = {"kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": 6, "batch_sizes": [1, 16],
           "replay": str(land)}
    path = d / f"{runs}.yaml"
    import yaml
    path.write_text(yaml.safe_dump({"runs_dir": str(d / runs), "jobs": [{**job, "name": "a"}, {**job, "name": "b"}]}))
    return path


@pytest.fixture(scope="module")
def night_landscape(tmp_path_factory):
    from synthetic import block_fp8_model

    from tuner.plan.models import gemm_problems, load_model
    d = tmp_path_factory.mktemp("nights")
    problems = [p.params for p in gemm_problems(load_model(str(block_fp8_model(d / "tiny.yaml", 1024, 8))), 1)]
    path = d / "land.jsonl"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), problems, [1, 16])
    return path


def test_nightly_windows_add_up_over_nights(night_landscape, tmp_path, counted_clock, capsys):
    split, whole = night_config(tmp_path, "split", night_landscape), night_config(tmp_path, "whole", night_landscape)
    assert main(["nightly", str(split), "--night", "n1", "--minutes", "0.5"]) == 0
    said = capsys.readouterr().out
    state = json.loads((tmp_path / "split" / "state.json").read_text())
    assert state["a"]["unfinished"] and "studies left for the next window" in said
    summary = json.loads((tmp_path / "split" / "n1" / "summary.json").read_text())
    assert summary[0]["status"] == "partial" and summary[1]["status"] in ("partial", "waiting")
    first = studies(tmp_path / "split" / "n1" / "a")
    counted_clock[0] = 0.0
    assert main(["nightly", str(split), "--night", "n2", "--minutes", "20"]) == 0
    assert "continuing the retune begun in" in capsys.readouterr().out
    state = json.loads((tmp_path / "split" / "state.json").read_text())
    assert state["a"]["run"].endswith("n1/a") and not any(s.get("unfinished") for s in state.values())
    counted_clock[0] = 0.0
    assert main(["nightly", str(whole), "--night", "n1", "--minutes", "20.5"]) == 0
    for job in ("a", "b"):
        run = Path(state[job]["run"])
        got, want = studies(run), studies(tmp_path / "whole" / "n1" / job)
        assert got == want and all(len(c) == len(set(c)) for c in got.values())
        assert tables(run) == tables(tmp_path / "whole" / "n1" / job)
    for name, configs in first.items():
        assert set(configs) <= set(studies(tmp_path / "split" / "n1" / "a")[name])


def first_window_minutes(whole: Path, printed: str) -> float:
    """A first window sized from what one run of the work took on this machine, now: its start-up
    (the measuring worker's start in it), the first study whole and half the second. Its first
    batch (a cold compile, the longest) is measured well before it closes, and the second study's
    next batch, judged by that longest one, does not fit: it closes with progress made, before
    the work is done, on an idle machine as on a loaded one (a fixed 3 s window closed, on a
    loaded 2-core machine, while the measuring worker still started: nothing measured, exit 1)."""
    import re
    ready = float(re.search(r"window of [\d.]+ min: \d+ s used \(its start-up (\d+) s\)", printed).group(1))
    storage = open_storage(f"journal:///{whole / 'studies.journal'}")
    spent = []
    for name in optuna.get_all_study_names(storage):
        if "tuner-plan" not in name:
            study = optuna.load_study(study_name=name, storage=storage)
            began = min(t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start)
            spent.append((began, study.user_attrs["spent_s"]))
    (_, s1), (_, s2) = sorted(spent)
    return (ready + s1 + s2 / 2) / 60


@pytest.mark.triton
@pytest.mark.triton_incidental     # the windows' clock and what they leave, not the kernel they time
def test_windows_on_the_cpu_device_end_on_time_and_add_up(tmp_path):
    """The GPU's code path (measuring child, compile worker) on the CPU device, on the real clock: a
    window too short for the work ends within its minutes plus 20 s (the start-up before the
    command's first line, measured here, allowed for), cutting a batch in flight if it must and
    leaving no process; the next window finishes, and the two leave the studies, trial counts and
    table files one run of both lengths leaves (CPU-device times are noise: which configs win may
    differ, so the rows are compared by batch size). The first window's length comes from that
    run's times (first_window_minutes); where the load changed between the runs so that it made no
    progress, or finished, it is tried again on a fresh folder, longer or shorter: every window
    tried is held to its minutes and leaves no process."""
    from test_cpu_device import GEMM_ARGS, left_in
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import tuner.cli"], env=env, check=True, timeout=300)
    startup = time.monotonic() - t0          # what runs before the window's clock starts

    def window(out: Path, minutes: float, rc: int = 0) -> tuple[int, str, str]:
        argv = [sys.executable, "-m", "tuner", "gemm", *GEMM_ARGS, "--batch-sizes", "1", "16", "--trials", "2",
                "--patience", "2", "--compile-workers", "1", "--out", str(out), "--minutes", f"{minutes:.3f}"]
        t = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        out_text, err = proc.communicate(timeout=900)
        took = time.monotonic() - t
        assert proc.returncode in (0, 1), err
        assert took <= minutes * 60 + 20 + startup, (took, startup, err)
        assert not left_in(sid=proc.pid), "processes of the window outlived it"
        return proc.returncode, out_text, err

    whole = tmp_path / "whole"
    rc, printed, err = window(whole, 10.05)
    assert rc == 0 and "every table of the plan is written" in printed, err
    minutes = first_window_minutes(whole, printed)
    for attempt in range(4):
        split = tmp_path / f"split{attempt}"
        rc, first, err = window(split, minutes)
        if rc == 1:                 # nothing measured: said in one line, with a window that would do
            assert "too short to make progress" in err and "give --minutes" in err, err
            minutes *= 1.5
        elif "every table of the plan is written" in first:
            minutes *= 0.7
        else:
            break
    assert rc == 0 and "it closed before the work was done" in first and "continue with" in first, (minutes, err)
    rc, second, err = window(split, 10)
    assert rc == 0 and "every table of the plan is written" in second, err
    got, want = studies(split), studies(whole)
    assert sorted(got) == sorted(want) and len(want) == 2
    assert all(len(c) == len(set(c)) == 2 for c in [*got.values(), *want.values()])
    assert sorted(tables(split)) == sorted(tables(whole))
    for rel in tables(whole):
        assert sorted(json.loads(tables(split)[rel])) == sorted(json.loads(tables(whole)[rel])) == ["1", "16"]


def test_windows_add_up_to_a_run_without_minutes(landscape, tmp_path, clock, capsys):
    """A run without --minutes takes the studies in the order windows do (by value: here a traffic
    profile weighs M=128 most, so it goes first), so windows that continue each other leave what it
    leaves: the same configs measured in every study, the same table files. Before, it went problem by
    problem and M up, seeding each study from other batch sizes done than the windows had, and the
    tables differed (19 of 54 rows of the headline's synthetic run)."""
    traffic = tmp_path / "traffic.csv"
    traffic.write_text("M,weight\n1,1\n16,3\n128,12\n")
    split, whole = tmp_path / "split", tmp_path / "whole"

    def run(out, minutes=None):
        argv = [*args(landscape, out, minutes or 1)[:-2], "--traffic", str(traffic)]
        argv = [a for a in argv if a not in ("--trials", str(TRIALS))] + ["--trials", "8"]
        clock.t = 0.0
        assert main(argv + (["--minutes", str(minutes)] if minutes else [])) == 0
        return capsys.readouterr().out

    run(split, 0.6)
    assert 0 < len(finished(split)) < 6
    assert "every table of the plan is written" in run(split, 30)
    run(whole)
    assert studies(split) == studies(whole) and len(studies(whole)) == 6
    assert tables(split) == tables(whole) and tables(whole)
