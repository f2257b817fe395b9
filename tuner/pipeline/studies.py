"""The studies of a run: one per (problem, M) of the plan, each seeded (the engine's default,
--baseline's entry, warm starts, the batch sizes done) and run by the study runner
(tuner/search/runner.py) against one measurer; tied tables chosen together
(tuner/search/tied_choice.py). Several processes may run them at once on one storage (workers):
they share the studies, and a result is read back from the storage."""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Callable

from optuna.storages import BaseStorage

from tuner.errors import TunerError
from tuner.measure.measurers import Measurer
from tuner.pipeline.baselines import load_baseline_table
from tuner.pipeline.incumbents import engine_tables
from tuner.pipeline.run_plan import RunPlan, run_storage
from tuner.plan.engines import lookup_nearest
from tuner.plan.problems import Problem
from tuner.progress import Progress
from tuner.search.runner import StudyResult, StudyRunner, study_name
from tuner.search.storage import sync_storage
from tuner.search.storage_urls import shown
from tuner.search.tied_choice import choose_tied, table_default
from tuner.search.tied_race import incumbent_pairs, race_tied
from tuner.search.warm_start import incumbent, study_seeds
from tuner.search.window import Window, WindowClosed


def tune_all(opts: RunPlan, storage: BaseStorage, measurer: Measurer, progress: Progress,
             after_study: Callable[[], object] | None = None, window: Window | None = None) -> None:
    """Run every study of the plan against one measurer. Several processes may do this at
    once on one storage (workers): they share the studies. With a window (--minutes), the
    studies go by value (tuner/pipeline/windows.py) until its time is up."""
    runner = StudyRunner(opts.kernel, opts.space, opts.gpu, measurer, storage, opts.settings,
                         on_trial=lambda **kw: progress.trial(kw["done"], kw["budget"], kw["best"]),
                         prefix=opts.prefix, policy=opts.policy, window=window)
    # A run started again shows the studies it finished before as stored, and says so.
    stored = {(p.key, M): r for p in opts.problems for M in opts.ms_for(p)
              if (r := stored_result(storage, opts, p, M)) is not None}
    # a study that stopped at a budget this run raises continues (tuner/search/runner.py tune)
    continued = {(p.key, M) for p in opts.problems for M in opts.ms_for(p) if (p.key, M) in stored
                 and stored[p.key, M].get("stopped") == "budget"
                 and stored[p.key, M].get("trials", 0) < opts.settings.budget_for(p, M)}
    grown = len(continued)
    shown_only = set(stored) - continued        # shown as stored: nothing of theirs changes in this run
    if stored:
        total = sum(len(opts.ms_for(p)) for p in opts.problems)
        kept = len(stored) - grown
        progress.note(f"resuming from {shown(run_storage(opts))}: {len(stored)} of {total} studies finished before"
                      + (f"; {kept} shown as stored, not run again" if kept else "")
                      + (f"; {grown} continued to the larger budget" if grown else ""))
    installed = incumbent_tables(opts)
    # One order with or without a window (tuner/pipeline/windows.py): the studies seed each other (the batch
    # sizes done, the shapes tuned), so windows that continue each other leave what one run without
    # --minutes leaves only where both take the studies in the same order.
    from tuner.pipeline.windows import stored_close_seconds, study_order, study_states
    states = study_states(opts, storage)
    order = study_order(opts, states, getattr(measurer, "landscape", None))
    if window is not None:
        window.stored_close_s = stored_close_seconds(states)
    _upcoming(runner, opts, installed, [(p, M) for p, M in order if (p.key, M) not in stored])
    try:
        for problem, M in order:
            if window is not None and window.closed:
                break
            again = (problem.key, M) in shown_only
            if window is not None and not again:
                # the start-up ends where this window's first study to measure begins: showing the studies
                # stored before is start-up too, and grows with the run (a fixed --minutes stopped progressing
                # once it filled the window: found by a new-user pass)
                window.ready()
            # the batch sizes done: those whose study is finished, in this run (window) or an earlier one
            ms_done = [m for m in sorted(opts.ms_for(problem))
                       if m != M and stored_result(storage, opts, problem, m) is not None]
            # a study shown as stored changes no table: the tables are written after the studies that do
            # (and at the end), not again after each stored one (every table rewritten per stored study)
            _study(opts, storage, measurer, runner, progress, installed, problem, M, ms_done,
                   None if again else after_study)
    except WindowClosed:
        if window is None:
            raise
        window.closed = True
    finally:
        if window is not None:
            sync_storage(storage)       # what the window measured is on the disk


def _upcoming(runner: StudyRunner, opts: RunPlan, installed: dict, order: list[tuple[Problem, int]]) -> None:
    """What the run's studies will surely time, in their order, for the compile workers to build
    ahead (tuner/search/ahead.py): each one's seeds known before it starts (its defaults, the
    cost model's first, the row the engine reads today)."""
    if runner.ahead is None:
        return
    runner.ahead.upcoming = [(p, M, c) for p, M in order for c in runner.sure_configs(
        p, M, [("default", c) for c in opts.kernel.extra_seeds(p.params, M)]
        + [("installed", row[1]) for row in incumbents(opts, installed, p, M)])]


def _study(opts: RunPlan, storage: BaseStorage, measurer: Measurer, runner: StudyRunner, progress: Progress,
           installed: dict, problem: Problem, M: int, done: list[int],
           after_study: Callable[[], object] | None) -> bool:
    """One study, seeded; False where a tied table has nothing to tie to at M. Its time, all in
    (seeds, search, close, tables written), is added to the study's SPENT_ATTR, and its close's
    (finalists timed again, choice, tables) kept as CLOSE_ATTR: what is left is priced from them."""
    from tuner.search.window import now
    began = now()
    closed = False
    try:
        closed = _run_study(opts, storage, measurer, runner, progress, installed, problem, M, done, after_study)
        return closed
    finally:
        try:
            _spent(storage, opts, problem, M, now() - began,
                   now() - runner.searched_at if closed and runner.searched_at is not None else None, runner.window)
        except Exception:  # noqa: BLE001 - a time not kept (a full disk, say) must not hide the study's own error
            if closed:
                raise


def _spent(storage: BaseStorage, opts: RunPlan, problem: Problem, M: int, seconds: float,
           close_s: float | None, window) -> None:
    """Add `seconds` to the study's time spent (every window's), and keep its close's time."""
    from tuner.search.window import CLOSE_ATTR, SPENT_ATTR, plausible
    try:
        study_id = storage.get_study_id_from_name(study_name(problem, M, opts.prefix, opts.kernel.source))
    except KeyError:
        return                  # never opened (a tied table with nothing to tie to, a window closed before)
    attrs = storage.get_study_user_attrs(study_id)
    before = plausible(attrs.get(SPENT_ATTR), float("inf")) or 0.0
    storage.set_study_user_attr(study_id, SPENT_ATTR, round(before + seconds, 3))
    if close_s is not None:
        storage.set_study_user_attr(study_id, CLOSE_ATTR, round(close_s, 3))
        if window is not None:
            window.close_done(close_s)


def _run_study(opts: RunPlan, storage: BaseStorage, measurer: Measurer, runner: StudyRunner, progress: Progress,
               installed: dict, problem: Problem, M: int, done: list[int],
               after_study: Callable[[], object] | None) -> bool:
    baseline = load_baseline_table(opts.baseline, opts.kernel, opts.gpu, problem) if opts.baseline else None
    tied_config = None
    if problem.tied_to:
        tied = wait_for_result(storage, opts, by_key(opts)[problem.tied_to], M)
        if not tied or not tied.get("config"):
            return False            # nothing to tie to at this M: left out of both tables
        tied_config = tied["config"]
    progress.start_study(f"{label(problem)} M={M}")
    default = table_default(opts.kernel, problem, M, tied_config)
    seeds = [("default", default)]
    seeds += [("default", c) for c in opts.kernel.extra_seeds(problem.params, M)]
    if baseline:
        seeds.append(("baseline", lookup_nearest(baseline, M)))
    # warm seeds: known configs (--warm-start, shipped tables) and the batch sizes done, closest first
    measured_done = {m: runner.measured(problem, m) for m in done}
    seeds += study_seeds(opts.warm, opts.kernel, problem.params, M, opts.gpu,
                         opts.settings.budget_for(problem, M), measured_done,
                         shapes=tuned_shapes(opts, storage, runner, problem))
    # a tied table searches its shared keys freely too: both tables choose them together below;
    # what the batch sizes done measured is evidence for when the study may stop
    try:
        r = runner.tune(problem, M, seeds, None, default, incumbents(opts, installed, problem, M), measured_done)
    except WindowClosed:
        progress.end_study("cut: the window closed; the trials measured are kept for the next")
        raise
    if problem.tied_to and not r.tied:
        up = by_key(opts)[problem.tied_to]
        tied_r = choose_tied(runner, measurer, problem, up, M, opts.settings.top_k,
                             lambda q: stored_result(storage, opts, q, M))
        if tied_r is not None:
            # the pair chosen together is raced against the pair the engine runs today
            up_d = stored_result(storage, opts, up, M) or {}
            up_r = StudyRunner.result_from_dict(up, M, up_d) if up_d.get("default_config") else None
            if up_r is not None:
                down_rows = incumbents(opts, installed, problem, M)
                pairs = incumbent_pairs(opts.kernel, up, problem, M, [
                    *incumbents(opts, installed, up, M), ("default", opts.kernel.default_config(up.params, M))],
                    down_rows[0] if down_rows else None)
                _, tied_r = race_tied(runner, up, problem, M, up_r, tied_r, pairs, opts.settings.row_gain)
            r = tied_r
    progress.end_study(summary(r, time_unit(opts), getattr(opts.settings.row_gain, "noise", None)))
    sync_storage(storage)       # a finished study is on the disk (a journal syncs at most each second)
    if after_study:
        after_study()           # the tables as far as they go: a stopped run keeps them
    return True


def tuned_shapes(opts: RunPlan, storage: BaseStorage, runner: StudyRunner, problem: Problem) -> list[tuple]:
    """[(params, {M: measured})] of the run's other problems that differ from `problem` only in
    the kernel's warm_across keys, over their finished studies (a warm start across shapes)."""
    across = set(opts.kernel.warm_across)
    if not across:
        return []
    out = []
    for other in opts.problems:
        keys = (set(other.params) | set(problem.params)) - across
        if other.key == problem.key or any(other.params.get(k) != problem.params.get(k) for k in keys):
            continue
        done = {m: runner.measured(other, m) for m in opts.ms_for(other)
                if stored_result(storage, opts, other, m) is not None}
        if done:
            out.append((other.params, done))
    return out


def incumbent_tables(opts: RunPlan) -> dict[str, list[tuple[dict, str]]]:
    """{problem key: [(rows, where)]} of the tables a tuned row must beat: --baseline's, else
    the one each engine of the problem reads today on this GPU (tuner/pipeline/incumbents.py),
    where every such engine reads one; a problem not in it has the default as incumbent."""
    from tuner.plan.engines import TABLE_FAMILIES
    out: dict[str, list[tuple[dict, str]]] = {}
    found: dict = {}
    for problem in opts.problems:
        baseline = load_baseline_table(opts.baseline, opts.kernel, opts.gpu, problem) if opts.baseline else None
        if baseline:
            out[problem.key] = [(baseline, f"--baseline {opts.baseline}")]
            continue
        if opts.kernel.emit_table is not None:
            continue                    # our own format: no engine reads it
        readers = [e for e in problem.engines if e in opts.engines and (e, opts.kernel.table_kind) in TABLE_FAMILIES]
        tables = engine_tables(opts.kernel, problem, opts.gpu, opts.engines, opts.request.engine_source, found)
        if tables and len(tables) == len(readers):
            out[problem.key] = [(t.rows, t.where) for t in tables]
    return out


def incumbents(opts: RunPlan, installed: dict, problem: Problem, M: int) -> list[tuple]:
    """[("installed", the row the engine reads at M: the nearest key, where)]; [] where it
    reads none, or where the engines sharing this problem's one row (a table written for
    both) read different rows at M: the default is the incumbent then, as before any table."""
    from tuner.plan.kernel_api import config_tuple
    rows = [(incumbent(opts.kernel, r, M), where) for r, where in installed.get(problem.key, [])]
    if not rows or not all(r for r, _ in rows):
        return []
    if len({config_tuple(opts.kernel, r[0][1]) for r, _ in rows}) > 1:
        return []
    return [(rows[0][0][0][0], rows[0][0][0][1], "; ".join(where for _, where in rows))]


def by_key(opts: RunPlan) -> dict[str, Problem]:
    return {p.key: p for p in opts.problems}


def stored_result(storage: BaseStorage, opts: RunPlan, problem: Problem, M: int) -> dict | None:
    """The stored result of a finished study (None before it finishes). Read from the storage
    directly, and copied once: each run reads every study's result after every study, and
    Optuna's Study.user_attrs deep-copies all of a study's attributes on each access."""
    from tuner.search.stored_state import checked_result
    name = study_name(problem, M, opts.prefix, opts.kernel.source)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    attrs = storage.get_study_user_attrs(study_id)
    if checked_result(name, attrs.get("result")) is None:      # none yet, or one that does not validate
        return None
    # the storage's own objects (a journal's in-memory state): copied before anyone changes them
    return copy.deepcopy({**attrs["result"], "environment": attrs.get("environment", {}),
                          "measured_by": attrs.get("measured_by"), "identity": attrs.get("identity")})


def wait_for_result(storage: BaseStorage, opts: RunPlan, problem: Problem, M: int, poll_s: float = 2.0) -> dict | None:
    """The finished result of a study another worker may still be running."""
    while True:
        r = stored_result(storage, opts, problem, M)
        if r is not None or M not in opts.ms_for(problem):
            return r
        time.sleep(poll_s)


def time_unit(opts: RunPlan) -> str:
    """How a time of this run is shown: microseconds, and where they were not taken on a GPU, so."""
    if opts.replay:
        from tuner.measure.landscape import read_header
        from tuner.measure.provenance import is_cpu_device
        try:
            header = read_header(opts.replay)
        except TunerError:
            return "us"
        return "us (SYNTHETIC)" if header.get("synthetic") else "us (CPU device)" if is_cpu_device(header) else "us"
    return "us (CPU device)" if opts.device == "cpu" else "us"


def label(problem: Problem) -> str:
    return problem.key + (f" [{', '.join(problem.engines)}]" if len(problem.engines) == 1 else "")


def summary(r: StudyResult, unit: str = "us", noise=None) -> str:
    if r.resumed:
        return "stored: " + summary(dataclasses.replace(r, resumed=False), unit, noise)
    if r.config is None:
        why = r.numerics.get('detail', r.stopped)
        return f"no config ({why}; first failure: {r.first_failure})" if r.timed_nothing and r.first_failure \
            else f"no config ({why})"
    from tuner.measure.noise import speedup
    sp = f", {speedup(r.speedup, noise)} default" if r.speedup else ""
    return f"{r.time_us:.2f} {unit}{sp} after {r.trials} trials ({r.stopped})"
