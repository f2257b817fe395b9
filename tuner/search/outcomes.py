"""What a tuning run timed: the studies that timed nothing, and why, in one line.

A study that timed nothing (every config failed, or none survived pruning) leaves its batch
size out of the tables. `tuner gemm|moe|mla` then says so in one line with the first
failure's text and exits 1 (tuner/commands/kernel_commands.py); the proof reads the same from
the manifest (tuner/jobs/proof_outcomes.py).
"""

from __future__ import annotations

from typing import Iterable


def untimed(results: dict[str, list]) -> list:
    """The StudyResults (tuner/search/runner.py) of `results` that timed nothing."""
    return [r for rs in results.values() for r in rs if r.timed_nothing]


def why_untimed(r) -> str:
    """Why one study timed nothing: the first failure's text, or that nothing was left to time."""
    if r.first_failure:
        return f"first failure: {r.first_failure}"
    return str(r.numerics.get("detail") or "nothing was timed")


def untimed_line(done: Iterable[tuple]) -> str | None:
    """One line over a run's kernels ([(run options, {problem key: [StudyResult]})]) naming the
    studies that timed nothing and the first one's reason; None when every study timed a config."""
    missing, total = [], 0
    for opts, results in done:
        total += sum(len(rs) for rs in results.values())
        missing += [(opts.kernel.source_label, r) for r in untimed(results)]
    if not missing:
        return None
    source, first = missing[0]
    where = f"M={first.M} of {first.problem.key} [{source}]"
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return (f"no config was timed for {len(missing)} of {total} studies ({where}{more}), so their batch sizes "
            f"are not in the tables; {why_untimed(first)}")
