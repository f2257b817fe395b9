"""What a replayed landscape covers of a plan: the problems and batch sizes a replay can tune.

A run replays only these (tuner/pipeline/run.py), and its dry run plans only these
(tuner/pipeline/tune.py): before, `--replay LAND --dry-run` listed and priced studies of
problems the landscape holds no timing of, which the run then skipped. Light: reading a
landscape loads no Optuna or torch (a dry run loads neither).
"""

from __future__ import annotations

from typing import Callable

from tuner.errors import TunerError
from tuner.measure.measurers import ReplayMeasurer
from tuner.pipeline.run_plan import RunPlan
from tuner.plan.kernel_api import config_tuple


def replay_coverage(opts: RunPlan, measurer: ReplayMeasurer, note: Callable[[str], None]):
    """(problems, {problem key: batch sizes}) of the plan that the replayed landscape times: a
    problem it holds no timing of is skipped, a batch size it lacks is left out (each said through
    `note`); refused in one line where it lacks a key the traffic profile serves, covers nothing, or
    holds no config of the space."""
    covered, plan_ms = [], {}
    serving = _traffic_shares(opts)
    said: set[str] = set()

    def once(line: str) -> None:        # a problem two engines' tables share is one problem to the landscape
        if line not in said:
            said.add(line)
            note(line)
    for p in opts.problems:
        ms = [m for m in opts.batch_sizes if measurer.covers(p, m)]
        missing = [m for m in opts.batch_sizes if m not in ms]
        lost = [m for m in missing if serving.get(m, 0.0) > 0]
        if lost and ms:
            # the profile's keys where the traffic is: tuning without them keys the table far away
            share = sum(serving[m] for m in lost)
            raise TunerError(f"landscape {opts.replay} lacks M={','.join(map(str, lost))} of {p.key}, the keys that "
                             f"serve {share:.1%} of the traffic profile's passes: record them (--record), or give "
                             f"--batch-sizes the landscape holds (M={','.join(map(str, ms))})")
        if not ms:
            once(f"skip {p.key}: the landscape has no timings for it")
            continue
        if missing:
            once(f"{p.key}: the landscape lacks M={','.join(map(str, missing))}; tuning M={','.join(map(str, ms))}")
        covered.append(p)
        plan_ms[p.key] = ms
    if not covered:
        raise TunerError(f"landscape {opts.replay} covers none of the planned problems and batch sizes")
    # Its points must be configs of the search space (or the seeds), or nothing can be chosen.
    usable = False
    for p in covered:
        for m in plan_ms[p.key]:
            points = measurer.candidates(p, m) or set()
            space = {config_tuple(opts.kernel, c) for c in opts.space.configs(p.params, m, opts.gpu)}
            seeds = {config_tuple(opts.kernel, opts.space.canonical(p.params, m, opts.gpu, c)) for c in
                     [opts.kernel.default_config(p.params, m), *opts.kernel.extra_seeds(p.params, m)]}
            if points & (space | seeds):
                usable = True
                break
        if usable:
            break
    if not usable:
        raise TunerError(f"landscape {opts.replay} holds no config of the search space "
                         f"({opts.space.source}) nor the default: recorded with another space or kernel?")
    return covered, plan_ms


def _traffic_shares(opts: RunPlan) -> dict[int, float]:
    """{key: its share of the traffic's passes} of the run's batch sizes ({} without --traffic)."""
    if opts.traffic is None:
        return {}
    from tuner.plan.traffic import key_coverage
    return {c.key: c.share for c in key_coverage(sorted(opts.batch_sizes), opts.traffic)}


def narrow_to_landscape(opts: RunPlan, note: Callable[[str], None]) -> None:
    """A dry run of a replay: the plan's problems and batch sizes narrowed to what its landscape
    times, as the run will narrow them."""
    if not opts.replay:
        return
    measurer = ReplayMeasurer.from_file(opts.replay, opts.kernel, opts.device_name)
    try:
        opts.problems, opts.plan_ms = replay_coverage(opts, measurer, note)
    finally:
        measurer.close()
