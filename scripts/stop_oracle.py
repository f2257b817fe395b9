#!/usr/bin/env python3
"""What the synthetic headline's studies would cost a search that knew the landscape's structure (issue 48).

    python scripts/stop_oracle.py [--out bench/results/search/stop-oracle.md]

The SYNTHETIC landscape (tuner/measure/synthetic.py) times a config as a smooth function of its
tile, stages and warps times a per-config factor uniform in [1, 1.04) (a hash of the config).
Two searchers that know the smooth part of every config, measured in its order (best first):
  - one that also knows the optimum and stops at the first config within 1.02x of it: the
    fewest configs any search could measure;
  - one that knows the factor's bounds but not the optimum, and stops when no unmeasured
    config can beat the best measured by 2% with a chance of 2% or more (the stopping rule's
    question, asked with the landscape's own structure instead of a model fitted to trials).
Against what the stopping rule measured (bench/results/search/stopping.json). Nothing is tuned:
the landscape is made as the headline's run makes it (by planning it), from the function the run
replays.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic"]
WITHIN, CHANCE, SPREAD = 1.02, 0.02, 0.04


def landscape(out: Path) -> Path:
    """The headline's SYNTHETIC landscape, made by planning its run (nothing tuned)."""
    from tuner.pipeline.planning import plan_runs
    from tuner.pipeline.request import TuneRequest
    req = TuneRequest(command="moe", model="deepseek-v3", gpu="H200", dtype="fp8_w8a8", synthetic=True, out=str(out),
                      quiet=True)
    plan_runs(req, say=lambda _: None)
    return out / "synthetic-fused_moe.jsonl.gz"


def studies(path: Path) -> dict:
    """{(problem, M): [(smooth time, time)]} of the landscape's timed points."""
    from tuner.measure.synthetic import _fake_moe_time_us
    out: dict = {}
    with gzip.open(path, "rt") as f:
        f.readline()
        for line in f:
            r = json.loads(line)
            if r.get("time_us") is not None:
                smooth = _fake_moe_time_us(r["problem"], r["M"], r["config"], 0)     # the factor at its low end
                out.setdefault((json.dumps(r["problem"], sort_keys=True), r["M"]), []).append((smooth, r["time_us"]))
    return out


def oracles(points: list[tuple[float, float]]) -> tuple[int, int, bool]:
    """(configs the optimum-knowing searcher measures, configs the structure-knowing one measures, whether
    the latter's best is within WITHIN of the optimum)."""
    ranked = sorted(points, key=lambda p: p[0])          # ties: the landscape's order (stable)
    best = min(t for _, t in ranked)
    first = next(i + 1 for i, (_, t) in enumerate(ranked) if t <= best * WITHIN)
    found = float("inf")
    for i, (_, t) in enumerate(ranked):
        found = min(found, t)
        none = 1.0
        for smooth, _ in ranked[i + 1:]:
            if smooth > found * (1 - WITHIN + 1):        # this config and all after it cannot beat by 2%
                break
            none *= 1 - min(1.0, max(0.0, (found * (2 - WITHIN) / smooth - 1) / SPREAD))
        if 1 - none < CHANCE:
            return first, i + 1, found <= best * WITHIN
    return first, len(ranked), True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "search" / "stop-oracle.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        all_points = studies(landscape(Path(tmp) / "run"))
    rows = [oracles(p) for p in all_points.values()]
    ours = json.loads((REPO / "bench" / "results" / "search" / "stopping.json").read_text())["headline"]
    lines = ["# What the synthetic headline's studies cost a search that knew the structure (scripts/stop_oracle.py)", "",
             f"`tuner {' '.join(HEADLINE)}`: {len(rows)} studies over a SYNTHETIC landscape.", "",
             "| searcher | configs measured | best within 1.02x of the optimum |", "| --- | --- | --- |",
             f"| knows the smooth part and the optimum: stops at the first config within 1.02x | {sum(r[0] for r in rows)} "
             f"| {len(rows)} of {len(rows)} |",
             f"| knows the smooth part and the factor's bounds: stops when no config is {CHANCE:.0%} likely to beat "
             f"the best by 2% | {sum(r[1] for r in rows)} | {sum(r[2] for r in rows)} of {len(rows)} |",
             f"| the stopping rule (bench/results/search/stopping.json): a model fitted to the trials | {ours['trials']} "
             f"| {ours['found_within']} of {len(ours['studies'])} (rows: {ours['rows_within']}) |", "",
             "What separates them is knowing the structure: which configs differ only by the per-config factor. The "
             "rule's model learns it from the trials and the neighbouring batch sizes, and keeps a 2-20% chance on "
             "unmeasured siblings of the incumbent (same tile, another BLOCK_SIZE_K or GROUP_SIZE_M) for tens of "
             "trials."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
