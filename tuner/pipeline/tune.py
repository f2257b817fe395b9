"""A tuning request from start to files: `tune(request)` plans every kernel's run
(tuner/pipeline/planning.py), prints the plan on a dry run, else runs each
(tuner/pipeline/run.py: measure, search, collect, emit) and says its closing table. The
command line (tuner/commands/kernel_commands.py), `tuner.api` and nightly jobs call this."""

from __future__ import annotations

import copy
import os
import time
from typing import Callable

from tuner.errors import TunerError
from tuner.pipeline.request import TuneRequest


def tune(request: TuneRequest, say: Callable[[str], None] = print, left: dict | None = None) -> list:
    """Plan and run one tuning run per kernel that times some of the tables (each
    engine's own, or ours); `say` gets the plan (dry run) or each kernel's results table.
    Returns [(run plan, {problem key: [StudyResult]})] (nothing on a dry run). With --minutes,
    `left` (when given) gets {"studies": the plan's studies a later window has to finish}."""
    if not request.trust_engine_source:
        return _tune(request, say, left)
    # for this run and the processes it starts (measuring children, compile workers)
    from tuner.plan.kernel_sources import TRUST_ENV
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1"
    try:
        return _tune(request, say, left)
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def _tune(request: TuneRequest, say: Callable[[str], None], left: dict | None = None) -> list:
    from tuner.pipeline.plan_text import plan_text  # light: a plan loads no Optuna, torch, Triton
    from tuner.pipeline.planning import plan_runs
    from tuner.search.stored_state import new_run
    new_run()                            # a stored state discarded is said once per run
    req = copy.copy(request)             # the defaults it left open are filled in the pipeline's copy
    window = None
    if req.minutes is not None and not req.dry_run:
        from tuner.search.window import Window
        # the command's start-up and planning count too
        window = Window(req.minutes, began=req.started, measure_timeout=req.measure_timeout)
    started = req.started if req.started is not None else time.monotonic()
    plans = plan_runs(req, say)
    for opts in plans:
        opts.started = started          # a run's "done in" is the command's time, its planning included
    if req.dry_run:
        if req.replay and not req.synthetic:
            # planned and priced as the run will tune: what the landscape times (a SYNTHETIC one times all)
            from tuner.pipeline.replay_coverage import narrow_to_landscape
            for opts in plans:
                narrow_to_landscape(opts, lambda line: say(f"note: {line}"))
        say("\n\n".join(plan_text(opts) for opts in plans))
        from tuner.pipeline.price import plan_price, total_line
        total = total_line([plan_price(opts) for opts in plans], plans[0].gpu.cuda_name) if plans else None
        if total:
            say(total)
        if req.minutes is not None:
            for line in window_order_lines(plans, req.minutes):
                say(line)
        return []
    from tuner.pipeline.run import run_tuning
    done: list = []
    for opts in plans:
        if window is not None and window.closed:
            continue                    # no time left for this kernel's studies: said below
        try:
            results = run_tuning(opts, window)
        except TunerError:
            from tuner.pipeline.planning import undo_planning
            from tuner.pipeline.stored_plans import storage_exists
            if not done and not storage_exists(opts):       # refused before anything was measured
                undo_planning(opts)
            raise
        for line in closing_lines(opts, results):
            say(line)
        done.append((opts, results))
    if window is not None:
        lines, studies_left = window_lines(plans, window, req)
        for line in lines:
            say(line)
        if left is not None:
            left["studies"] = studies_left
            left["stalled"] = window.stalled()
            left["progressed"] = window.progressed
            left["needs_s"] = round(window.needs_seconds(), 1)      # a window that makes progress, at least
    return done


def window_order_lines(plans: list, minutes: float) -> list[str]:
    """A dry run's --minutes: the order a window takes the studies in (what its storage holds read,
    nothing written), and what is left by the measured cost per trial where known."""
    from tuner.pipeline.stored_plans import open_run_storage, storage_exists
    from tuner.pipeline.windows import left_lines, study_order, study_states, window_length, wrap
    lines = [f"a window of {window_length(minutes)} takes the studies by value per GPU second (docs/tuning.md):"]
    for opts in plans:
        states = study_states(opts, open_run_storage(opts) if storage_exists(opts) else None)
        # one study per (problem, M), however many engines' tables it writes
        order = list(dict.fromkeys(f"{p.key} M={m}" for p, m in study_order(opts, states)
                                   if not states[(p.key, m)].finished))
        lines += left_lines(opts, states, minutes)[:1]
        if order:
            lines.append(wrap("  first: " + "; ".join(order[:6]) + ("; ..." if len(order) > 6 else "")))
    return lines


def window_lines(plans: list, window, req: TuneRequest) -> tuple[list[str], int]:
    """What a --minutes window leaves: per kernel, the studies finished and left, and the command
    that continues (the same command again, with the same --out or --storage)."""
    from tuner.pipeline.stored_plans import open_run_storage, storage_exists
    from tuner.pipeline.windows import continue_command, left_lines, study_states, window_length, wrap
    spent = window.clock() - window.started
    startup = f" (its start-up {window.ready_s:.0f} s)" if window.ready_s is not None else ""
    lines = [f"window of {window_length(window.minutes)}: {spent:.0f} s used{startup}"
             + ("; it closed before the work was done" if window.closed else "")]
    left = 0
    for opts in plans:
        states = study_states(opts, open_run_storage(opts) if storage_exists(opts) else None)
        lines += left_lines(opts, states, window.minutes)
        left += sum(not s.finished for s in states.values())
    stalled = window.stalled()
    if stalled:
        lines.append(wrap(stalled[0].upper() + stalled[1:]))
    if left:
        out = str(plans[0].out_dir) if plans and not req.storage else None
        argv = req.argv
        if stalled and argv is not None:          # the same command, with a window long enough
            argv = with_minutes(argv, stalled.rsplit("--minutes ", 1)[1].split()[0])
        lines.append("continue with (the studies finished are not run again, nor any trial measured):")
        from tuner.textwidth import command_lines

        # to be pasted: wrapped with ` \` marks only
        lines += command_lines("  " + continue_command(argv, out))
    return lines, left


def with_minutes(argv: list[str], minutes: str) -> list[str]:
    """`argv` with its --minutes (in either spelling) set to `minutes`."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--minutes" and i + 1 < len(argv):
            out += [a, minutes]
            skip = True
        elif a.startswith("--minutes="):
            out.append(f"--minutes={minutes}")
        else:
            out.append(a)
    return out


def closing_lines(opts, results: dict) -> list[str]:
    """What a finished run says: where its times came from, its table of results (each row
    naming its file), the studies that timed nothing, the kernel's hints for the engines, and
    where an engine would read the tables (for times from a GPU or a recorded landscape only)."""
    kernel, lines = opts.kernel, []
    if results:
        from tuner.emit.run_table import run_source, run_table_lines, unwritten_files, written_files
        lines.append(run_source(opts.out_dir))
        # a --synthetic run's times are a cost model's, as are a replayed SYNTHETIC landscape's: no kernel, ours or an
        # engine's, ran
        from tuner.search.identity import SYNTHETIC
        whose = "SYNTHETIC: no kernel ran" if opts.request.synthetic or opts.times == SYNTHETIC else kernel.source_label
        lines.append(f"{kernel.description} [{whose}]")
        lines.append("config = " + " ".join(kernel.config_keys))       # its own line: within 120 columns
        lines += run_table_lines(results, kernel.config_keys, written_files(opts), opts.out_dir, opts.settings.row_gain,
                                 unwritten_files(opts))
        from tuner.search.outcomes import untimed, why_untimed
        lines += [f"no config timed at M={r.M} of {r.problem.key}: {why_untimed(r)}" for r in untimed(results)]
    if kernel.engine_hints:
        by_key = {p.key: p for p in opts.problems}
        lines += kernel.engine_hints([(by_key[k], rs) for k, rs in results.items()])
    if results and (opts.times == "GPU" or str(opts.times).startswith("landscape")):
        # (tables chosen on SYNTHETIC or CPU-device times are not pointed at for an engine to read)
        from tuner.emit.install_target import config_folder_lines
        for engine in sorted({e for p in opts.problems for e in p.engines if e in opts.engines}):
            lines += config_folder_lines(engine, kernel.table_kind, opts.out_dir / engine / kernel.table_kind)
    return lines
