"""The between-process spread of a GPU run: every config timed both in its tuning (the studies
journal: each trial's first timing) and in its bench (a separate process, minutes later), as
bench/noise/<gpu>.json, which the tuner reads (tuner/measure/noise.py).

    python scripts/measure_noise.py bench/results/H200-2026-11-27 [--out bench/noise/H200.json] [--check]

Pairs: (engine, problem, M, config) found in both; a config timed by several bench rows (the same
table entry under two names) counts once. --check: write nothing, exit 1 if the file differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tuning_times(journal: Path) -> dict[tuple, float]:
    """(engine, problem, M, config) -> the first time the tuning process took of it."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tuner.search.optuna_private import study_id
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    out: dict[tuple, float] = {}
    for study in storage.get_all_studies():
        name = study.study_name                      # kernel@engine:problem:M=m
        if name.startswith("tuner-plan") or "@" not in name or ":M=" not in name:
            continue
        engine, rest = name.split("@", 1)[1].split(":", 1)
        problem, m = rest.rsplit(":M=", 1)
        for t in storage.get_all_trials(study_id(study)):
            if t.state.name == "COMPLETE" and t.values and t.values[0]:
                key = (engine, problem, int(m), json.dumps(t.user_attrs.get("config") or t.params, sort_keys=True))
                out.setdefault(key, float(t.values[0]))
    return out


def pairs_of(run: Path) -> list[dict]:
    tuned = tuning_times(run / "tuned" / "moe" / "studies.journal")
    pairs: dict[tuple, dict] = {}
    for bench in sorted((run / "bench").glob("*/bench-*.json")):
        as_measured = bench.with_name(bench.name.replace(".json", ".as-measured.json"))
        if not bench.name.endswith(".as-measured.json") and as_measured.is_file():
            continue                                  # a recomputed copy: its as-measured twin is read
        for r in json.loads(bench.read_text())["rows"]:
            if not r.get("time_us") or not r.get("config"):
                continue
            key = (r["kernel_source"].split()[0], r["problem"], r["M"], json.dumps(r["config"], sort_keys=True))
            if key in tuned and key not in pairs:
                pairs[key] = {"engine": key[0], "problem": key[1], "M": key[2], "config": r["config"],
                              "tuning_us": tuned[key], "bench_us": r["time_us"],
                              "change": r["time_us"] / tuned[key] - 1, "bench_rows": [r["contender"]]}
            elif key in pairs:
                pairs[key]["bench_rows"].append(r["contender"])
    return list(pairs.values())


def main(argv: list[str] | None = None) -> int:
    from tuner.measure.noise import FORMAT, spread_of
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="default bench/noise/<gpu>.json")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    env = json.loads((args.run / "environment.json").read_text())
    pairs = pairs_of(args.run)
    stats = spread_of([(p["tuning_us"], p["bench_us"]) for p in pairs])
    from tuner.plan.gpus import GPUS
    gpu = next(g.key for g in GPUS.values() if g.cuda_name == env["device"])
    out = args.out or ROOT / "bench" / "noise" / f"{gpu}.json"
    data = {"format": FORMAT, "device": env["device"], "between_process": stats,
            "made_by": f"scripts/measure_noise.py {args.run.resolve().relative_to(ROOT)}",
            "what": "each config timed in the tuning process (its studies journal's first timing) and in the "
                    "bench process (bench/*/bench-*.json as measured), same GPU, minutes apart",
            "versions": {k: env.get(k) for k in ("driver", "torch", "triton", "cuda")}, "pairs": pairs}
    text = json.dumps(data, indent=2) + "\n"
    if args.check:
        return 0 if out.is_file() and out.read_text() == text else 1
    from tuner.paths import atomic_write_text
    atomic_write_text(out, text)
    print(f"{len(pairs)} configs timed in two processes: spread (p90) {stats['spread']:.2%}, median "
          f"{stats['median']:.2%}, max {stats['max']:.2%}; {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
