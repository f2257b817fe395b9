#!/usr/bin/env python3
"""What a patience stop would have spent on finished synthetic-headline runs (issue 48, analysis only).

    python scripts/stop_patience.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is the --out of `tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8 --synthetic
--out RUN_DIR --quiet [--seed N]`. Its studies' trials, in the order they were measured, are cut where
a patience rule would have stopped them: after P trials in a row that did not improve the best
measured time by more than G (a share of it). Printed per (P, G): the configs the cut trajectories
measure, over all runs, and the studies whose best measured config then lies over 1.02x of the
study's optimum (the landscape's, which the search never reads). The trajectories are the stopping
rule's own, so a cut can only end a study earlier than it ended; a rule that is stopped later would
have seen more. Nothing is measured here: SYNTHETIC times, replayed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WITHIN = 1.02


def trajectories(out: Path) -> dict[str, list[tuple[float, float]]]:
    """{study: [(measured time, time over the study's optimum)]} in trial order."""
    from stop_check import best_times, journal_trials

    from tuner.plan.kernel_api import config_from_entry, config_tuple
    from tuner.plan.kernel_registry import get_kernel
    kernel = get_kernel("fused_moe")
    points = best_times(out / "synthetic-fused_moe.jsonl.gz", kernel)
    found = {}
    for key, m, trials in journal_trials(out):
        times = points.get((key, m))
        if times:
            best = min(times.values())
            found[f"{key}:M={m}"] = [
                (t.value, times[config_tuple(kernel, config_from_entry(kernel, t.user_attrs["config"]))] / best)
                for t in trials]
    return found


def cut(trials: list[tuple[float, float]], patience: int, gain: float) -> tuple[int, float]:
    """(trials measured, the best measured config's ratio) when the rule stops the study."""
    best = trials[0]
    since = 0
    for i, (value, ratio) in enumerate(trials[1:], start=2):
        since = 0 if value < best[0] * (1 - gain) else since + 1
        if value < best[0]:
            best = (value, ratio)
        if since >= patience:
            return i, best[1]
    return len(trials), best[1]


def first_hit(trials: list[tuple[float, float]]) -> int:
    """The trial at which the best measured config first lies within 1.02x of the optimum (0: never)."""
    best = None
    for i, (value, ratio) in enumerate(trials, start=1):
        if best is None or value < best[0]:
            best = (value, ratio)
        if best[1] <= WITHIN:
            return i
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    runs = [trajectories(r) for r in args.runs]
    for r, t in zip(args.runs, runs):
        hits = [first_hit(v) for v in t.values()]
        print(f"{r}: {len(t)} studies, {sum(map(len, t.values()))} trials; the first config within {WITHIN}x "
              f"found at trial {sorted(hits)} (sum {sum(hits)}; never {hits.count(0)})")
    print("patience gain  configs per run  studies over 1.02x per run")
    for patience in (4, 6, 8, 10, 12):
        for gain in (0.0, 0.005, 0.01, 0.02):
            got = [[cut(v, patience, gain) for v in t.values()] for t in runs]
            print(f"{patience:8d} {gain:5.3f}  {' '.join(f'{sum(n for n, _ in g):5d}' for g in got)}  "
                  f"{' '.join(f'{sum(1 for _, x in g if x > WITHIN):3d}' for g in got)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
