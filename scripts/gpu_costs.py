#!/usr/bin/env python3
"""What a GPU run's tuning cost, measured: start-up, seconds per trial and per study's close.

    python scripts/gpu_costs.py bench/results/H200-2026-11-27 [--out FILE]

Reads a committed GPU run (the proof's folder: steps.json, and the tuned studies' journal
tuned/*/studies.journal, every trial's start and end as the GPU run stored them) and writes
costs.json beside them (tuner-costs/1): per kernel source (the engine whose kernel was tuned),
the step's seconds, its start-up (the step's seconds less its studies' span), and per study its
batch size, measured trials, the seconds from its first trial's start to its last trial's end
(trials, compiled ahead in batches) and the seconds to the next study's first trial (the
finalists timed again, the numerics check, the paired gain, the tables written). The plan's
price (tuner/plan/price.py) reads it; nothing here is estimated.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAME = re.compile(r"(\w+)(?:@(\w+))?:(.*):M=(\d+)$")


def studies(journal: Path) -> list[dict]:
    """Every study of a journal with trials: its kernel source, problem key, M, measured trials
    and its first start and last end (datetimes), in order of its first trial."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tuner.search.storage import counts
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    out = []
    for summary in optuna.get_all_study_summaries(storage):
        m = NAME.fullmatch(summary.study_name)
        if not m:
            continue
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
        timed = [t for t in trials if t.datetime_start is not None]
        if not timed:
            continue
        out.append({"source": m.group(2) or "ours", "problem": m.group(3), "M": int(m.group(4)),
                    "trials": sum(1 for t in trials if t.user_attrs.get("config") and counts(t)),
                    "first": min(t.datetime_start for t in timed),
                    "last": max(t.datetime_complete or t.datetime_start for t in timed)})
    return sorted(out, key=lambda s: s["first"])


def costs(run: Path) -> dict:
    steps = {s["name"]: s for s in json.loads((run / "steps.json").read_text())["steps"]}
    found = [s for j in sorted(run.glob("tuned/*/studies.journal")) for s in studies(j)]
    out: dict = {"format": "tuner-costs/1", "run": run.name, "gpu": json.loads((run / "steps.json").read_text())["gpu"],
                 "sources": {}}
    for source in dict.fromkeys(s["source"] for s in found):
        mine = [s for s in found if s["source"] == source]
        step = steps.get(f"tune-{source}")
        rows = []
        for i, s in enumerate(mine):
            nxt = mine[i + 1]["first"] if i + 1 < len(mine) else None
            rows.append({"problem": s["problem"], "M": s["M"], "trials": s["trials"],
                         "trial_s": round((s["last"] - s["first"]).total_seconds(), 2),
                         "close_s": round((nxt - s["last"]).total_seconds(), 2) if nxt else None})
        closes = sorted(r["close_s"] for r in rows if r["close_s"] is not None)
        close = closes[len(closes) // 2] if closes else 0.0
        span = (mine[-1]["last"] - mine[0]["first"]).total_seconds() + close   # the last study's close: the median
        out["sources"][source] = {
            "step": f"tune-{source}", "step_s": round(step["seconds"], 2) if step else None,
            "startup_s": round(step["seconds"] - span, 2) if step else None, "close_s": close, "studies": rows}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a committed GPU run's folder (bench/results/<GPU>-<date>)")
    ap.add_argument("--out", help="where to write (default: RUN/costs.json)")
    args = ap.parse_args()
    run = Path(args.run)
    data = costs(run)
    Path(args.out or run / "costs.json").write_text(json.dumps(data, indent=1) + "\n")
    for source, c in data["sources"].items():
        trials = sum(r["trials"] for r in c["studies"])
        print(f"{source}: step {c['step_s']} s, start-up {c['startup_s']} s, {len(c['studies'])} studies, "
              f"{trials} trials in {sum(r['trial_s'] for r in c['studies']):.1f} s, close {c['close_s']} s a study")
    return 0


if __name__ == "__main__":
    sys.exit(main())
