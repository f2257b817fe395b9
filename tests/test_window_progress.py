"""Every --minutes window makes progress or says how long it needs to be (issue 50, items 3 and 6;
issue 51, item 4), on a replayed SYNTHETIC landscape under a clock the test drives: each config
measured costs CONFIG_S "seconds", the measuring worker's start STARTUP_S, so where a window
closes never depends on how fast or idle the machine is.
- a window whose start-up and next batch cannot fit says so, with the --minutes that would, exits 1,
  and that length makes progress (before: 0 studies done, window after window, exit 0);
- a trial that spanned a wall-clock step (NTP, a suspended VM) blocks no window: durations come from the
  monotonic clock, and stored ones are bounded;
- what is left is priced all in: the search's own time (the sampler, the close) is in the estimate."""

import json

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search.storage import counts, open_storage

KERNEL = get_kernel("fp8_gemm")
PROBLEMS = [{"N": 7168, "K": 2048, "block_shape": [128, 128]}, {"N": 3072, "K": 1536, "block_shape": [128, 128]}]
MS = [1, 16]


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), PROBLEMS, MS)
    return path


def args(landscape, out, minutes, trials=6):
    return ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--out", str(out), "--trials", str(trials), "--batch-sizes", *map(str, MS), "--minutes", str(minutes)]


def measured(out) -> int:
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    return sum(counts(t) for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n
               for t in optuna.load_study(study_name=n, storage=storage).get_trials(deepcopy=False))


def window(landscape, out, minutes, clock, capsys, trials=6):
    clock.t = 0.0
    rc = main(args(landscape, out, minutes, trials))
    said = capsys.readouterr()
    return rc, said.out, said.err


def test_a_window_too_short_says_how_long_it_needs_and_that_length_progresses(landscape, tmp_path, clock, capsys):
    out = tmp_path / "out"
    clock.startup_s, clock.config_s = 10.0, 8.0      # a slow start-up, a slow config: 18 s for anything at all
    rc, said, err = window(landscape, out, 0.3, clock, capsys)
    assert rc == 0 and measured(out) == 1, (said, err)            # nothing known yet: its first batch ran (and ended at 18 s)
    before = measured(out)
    rc, said, err = window(landscape, out, 0.3, clock, capsys)
    said = said.replace("\n    ", " ")           # the lines wrapped at 120 columns, joined
    # 10 s of start-up and an 8 s batch do not fit 18 s: said, with the length that would, and exit 1
    assert rc == 1 and measured(out) == before
    assert "too short to make progress" in said and "start-up took 10 s" in said
    assert "a batch of 1 config takes about 8 s" in said
    lines = [ln for ln in err.splitlines() if "too short" in ln]
    assert len(lines) == 1 and lines[0].startswith("tuner: ") and "give --minutes" in lines[0]
    need = float(lines[0].rsplit("--minutes ", 1)[1].split()[0])
    assert 0.3 < need <= 1.0
    command = said.split("continue with")[1].split(":\n", 1)[1].replace("\\", " ").split()
    assert command[command.index("--minutes") + 1] == f"{need:g}"      # the command that continues, long enough
    rc, said, _ = window(landscape, out, need, clock, capsys)
    assert rc == 0 and measured(out) > before


def test_a_close_that_cannot_fit_is_said_too(landscape, tmp_path, clock, capsys):
    """A study whose trials are all measured but whose close (finalists timed again) never fits: before,
    every window ended at once with the same studies left."""
    out = tmp_path / "out"
    clock.config_s = 1.0
    # one study's budget (6) and its close: 5 finalists-and-default re-timed and the row's race besides
    rc, _, _ = window(landscape, out, 6.5 / 60, clock, capsys)
    assert measured(out) == 6
    rc, said, err = window(landscape, out, 2 / 60, clock, capsys)
    assert rc == 1 and "a study's close" in said and "give --minutes" in err
    assert measured(out) == 6


def test_a_clock_step_during_a_trial_blocks_no_window(landscape, tmp_path, clock, capsys, monkeypatch):
    """The wall clock jumps an hour while one trial is measured (an NTP step, a suspended VM): that
    trial is stored as an hour long by Optuna's datetimes, and before, no window under an hour fit a
    batch again."""
    import datetime as dt

    from optuna.storages.journal import _storage
    out = tmp_path / "out"
    real = _storage.datetime
    step = [dt.timedelta(0)]

    class Stepped(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + step[0]

    monkeypatch.setattr(_storage, "datetime", Stepped)
    from tuner.measure import measurers
    counted = measurers.ReplayMeasurer.measure

    def stepping(self, problem, M, configs):
        step[0] += dt.timedelta(hours=1)        # while this batch is measured
        return counted(self, problem, M, configs)

    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", stepping)
    rc, _, _ = window(landscape, out, 4 / 60, clock, capsys)
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    name = next(n for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n)
    hour_long = [t for t in optuna.load_study(study_name=name, storage=storage).trials if counts(t)]
    assert hour_long and all((t.datetime_complete - t.datetime_start).total_seconds() >= 3600 for t in hour_long)
    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", counted)
    before = measured(out)
    rc, said, _ = window(landscape, out, 1, clock, capsys)
    assert rc == 0 and measured(out) > before and "too short" not in said


@pytest.mark.parametrize("stored", [1e12, float("nan"), "an hour", -5, True])
def test_a_stored_duration_is_bounded(landscape, tmp_path, clock, capsys, stored):
    """A trial's stored time edited (or damaged) to anything: a window still measures."""
    out = tmp_path / "out"
    window(landscape, out, 3 / 60, clock, capsys)
    journal = out / "studies.journal"
    lines = journal.read_text().splitlines()
    edited = 0
    for i, line in enumerate(lines):
        op = json.loads(line)
        if op.get("user_attr", {}).get("took_s") is not None:
            op["user_attr"]["took_s"] = stored
            lines[i] = json.dumps(op)
            edited += 1
    assert edited
    journal.write_text("\n".join(lines) + "\n")
    before = measured(out)
    rc, said, err = window(landscape, out, 10, clock, capsys)
    assert rc == 0 and measured(out) > before, err


def test_what_is_left_is_priced_all_in(landscape, tmp_path, clock, capsys):
    """The estimate after a window, against what finishing the work then took: the search's own time
    (here 0.5 s a proposal) and the studies' closes are in it. Before: 1.00 s a trial, the measuring
    alone, and no close, a third of what finishing took."""
    out = tmp_path / "out"
    clock.config_s, clock.sampler_s = 1.0, 0.5
    rc, said, _ = window(landscape, out, 0.75, clock, capsys, trials=12)
    line = next(ln for ln in said.replace("\n    ", " ").splitlines() if ln.startswith("fp8_gemm: "))
    assert "s a study besides" in line, line
    estimate = line.split("about ", 1)[1].split(" as measured")[0]
    seconds = float(estimate.split()[0]) * (60 if estimate.endswith("min") else 1)
    rc, said, _ = window(landscape, out, 30, clock, capsys, trials=12)
    assert rc == 0 and "every table of the plan is written" in said
    took = clock.t
    assert 0.75 <= seconds / took <= 1.33, (seconds, took, line)


def test_a_synthetic_window_does_not_make_its_landscape_again(tmp_path, capsys):
    """A --synthetic run's landscape is made once for its problems and batch sizes: the next window replays
    it (before, every window made its 44,928 points again, the whole of a short window's start-up), and a
    run for other batch sizes makes its own."""
    out = tmp_path / "out"
    base = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--synthetic", "--only", "N=7168,K=2048",
            "--trials", "2", "--out", str(out)]
    assert main([*base, "--batch-sizes", "1", "16"]) == 0
    land = out / "synthetic-fp8_gemm.jsonl.gz"
    made = land.stat().st_mtime_ns, land.read_bytes()
    capsys.readouterr()
    assert main([*base, "--batch-sizes", "1", "16", "--minutes", "5"]) == 0
    assert "made by an earlier run for the same problems and batch sizes" in capsys.readouterr().out
    assert (land.stat().st_mtime_ns, land.read_bytes()) == made
    assert main([*base, "--batch-sizes", "1", "32", "--out", str(tmp_path / "other")]) == 0
    assert "made " in capsys.readouterr().out


def test_a_close_the_alarm_cut_is_taken_as_at_least_that_long(landscape, tmp_path, clock, capsys, monkeypatch):
    """A study's close cut by the window's alarm (simulated here: it ran 20 s, then the alarm rang) is kept
    as a lower bound: the next window does not start it again where it cannot fit, and says so. Before,
    nothing was kept of a cut close, and every window of that length started it again, to be cut again."""
    from tuner.measure import measurers
    from tuner.search.window import WindowClosed
    out = tmp_path / "out"
    counted = measurers.ReplayMeasurer.measure
    rang = []

    def cut_close(self, problem, M, configs):
        if len(configs) > 1 and not rang:          # the close's first re-time (finalists and the default)
            rang.append(True)
            clock.t += 20
            raise WindowClosed()
        return counted(self, problem, M, configs)

    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", cut_close)
    rc, said, _ = window(landscape, out, 30, clock, capsys)
    assert rang and measured(out) == 6
    monkeypatch.setattr(measurers.ReplayMeasurer, "measure", counted)
    rc, said, err = window(landscape, out, 0.3, clock, capsys)
    said = said.replace("\n    ", " ")
    assert rc == 1 and "a study's close (finalists timed again, checked) ran more than 20 s before a window cut it" in said
    rc, said, err = window(landscape, out, 1, clock, capsys)
    assert rc == 0 and "too short" not in said


def test_a_window_that_closed_on_the_workers_start_asks_for_the_start_and_a_first_batch():
    """A window whose measuring worker was still starting when it closed measured nothing, and its start-up
    was longer than the window: the length it advises counts the start-up and a first batch as long again.
    Before, the next step counted 0 s: a 0.5 min window that closed on the start advised --minutes 0.8,
    which closed on the start again (found by a new-user pass)."""
    import re

    from tuner.search.window import Window, WindowClosed
    t = [0.0]
    w = Window(0.5, clock=lambda: t[0])
    with pytest.raises(WindowClosed):
        with w.measuring(starting=True):
            t[0] = 30.0                  # the deadline's alarm rings while the worker starts
            w.closed = True
            raise WindowClosed()
    said = w.stalled()
    assert said and "still starting" in said, said
    advised = float(re.search(r"give --minutes ([\d.]+)", said).group(1))
    assert advised * 60 >= 2 * 30 * 1.25, said       # the start-up twice over, with the usual room


def test_studies_shown_as_stored_write_no_tables_again(landscape, tmp_path, clock, capsys, monkeypatch):
    """A window that continues a run shows the studies stored before, and writes the tables after the studies that
    change them and at its end, not after each stored one: every table was rewritten once per stored study, a cost
    that grew with the run until a fixed --minutes made no progress (found by a new-user pass: 10 windows of
    0.05 min progressed, the 11th showed 23 of 35 stored studies and ran out)."""
    from tuner.pipeline import run
    out = tmp_path / "out"
    rc, _, err = window(landscape, out, 60, clock, capsys, trials=4)       # every study finished
    assert rc == 0, err
    calls = []
    real = run.collect
    monkeypatch.setattr(run, "collect", lambda *a, **k: calls.append(k.get("quiet")) or real(*a, **k))
    rc, said, err = window(landscape, out, 60, clock, capsys, trials=4)
    assert rc == 0 and "4 shown as stored" in err, said + err
    assert calls == [None], calls           # the run's own end only (not quiet): no table written again per stored study
