"""A tuning request from start to files: `tune(request)` plans every kernel's run
(tuner/pipeline/planning.py), prints the plan on a dry run, else runs each
(tuner/pipeline/run.py: measure, search, collect, emit) and says its closing table. The
command line (tuner/commands/kernel_commands.py), `tuner.api` and nightly jobs call this."""

from __future__ import annotations

import copy
import os
from typing import Callable

from tuner.pipeline.request import TuneRequest


def tune(request: TuneRequest, say: Callable[[str], None] = print) -> list:
    """Plan and run one tuning run per kernel that times some of the tables (each
    engine's own, or ours); `say` gets the plan (dry run) or each kernel's results table.
    Returns [(run plan, {problem key: [StudyResult]})] (nothing on a dry run)."""
    if not request.trust_engine_source:
        return _tune(request, say)
    # for this run and the processes it starts (measuring children, compile workers)
    from tuner.plan.kernel_sources import TRUST_ENV
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1"
    try:
        return _tune(request, say)
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def _tune(request: TuneRequest, say: Callable[[str], None]) -> list:
    from tuner.pipeline.plan_text import plan_text  # light: a plan loads no Optuna, torch, Triton
    from tuner.pipeline.planning import plan_runs

    req = copy.copy(request)             # the defaults it left open are filled in the pipeline's copy
    plans = plan_runs(req, say)
    if req.dry_run:
        say("\n\n".join(plan_text(opts) for opts in plans))
        return []
    from tuner.pipeline.run import run_tuning
    done = []
    for opts in plans:
        results = run_tuning(opts)
        for line in closing_lines(opts, results):
            say(line)
        done.append((opts, results))
    return done


def closing_lines(opts, results: dict) -> list[str]:
    """What a finished run says: where its times came from, its table of results (each row
    naming its file), the studies that timed nothing, the kernel's hints for the engines, and
    where an engine would read the tables (for times from a GPU or a recorded landscape only)."""
    kernel, lines = opts.kernel, []
    if results:
        from tuner.emit.run_table import run_source, run_table_lines, written_files
        lines.append(run_source(opts.out_dir))
        # a --synthetic run's times are a cost model's: no kernel, ours or an engine's, ran
        whose = "SYNTHETIC: no kernel ran" if opts.request.synthetic else kernel.source_label
        lines.append(f"{kernel.description} [{whose}]")
        lines.append("config = " + " ".join(kernel.config_keys))       # its own line: within 120 columns
        lines += run_table_lines(results, kernel.config_keys, written_files(opts), opts.out_dir, opts.settings.row_gain)
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
