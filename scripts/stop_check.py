#!/usr/bin/env python3
"""How many trials the search spends, and how close it lands, under its stopping rule (issue 48).

    python scripts/stop_check.py [--out bench/results/search/stopping]

Runs, replayed, what the README's main job and the H200's recorded landscape ask of the search
and writes OUT.json (every study) and OUT.md (the summary):
  - the synthetic headline, `tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8
    --synthetic` (54 studies over a SYNTHETIC landscape): per study its cap (the budget sized
    by its space), the configs it measured, the best it found and the row its table holds, each
    over the landscape's best at that (problem, M);
  - the recorded H200 landscape (vLLM's FP8 GEMM N=7168,K=2048, M = 1 and 16,
    landscapes/NVIDIA_H200/): the trials per study and whether the row is the landscape's best.
The plan's price (tuner/pipeline/price.py) reads the share of the caps the synthetic headline
spent. Times are a SYNTHETIC cost model's and an H200's, replayed: nothing runs a kernel here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic"]
H200 = REPO / "landscapes" / "NVIDIA_H200" / "fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"
RECORDED = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
            "--batch-sizes", "1", "16", "--replay", str(H200)]
WITHIN = 1.02


def run(args: list[str], out: Path) -> None:
    got = subprocess.run([sys.executable, "-m", "tuner", *args, "--out", str(out), "--quiet"], cwd=REPO,
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"stop_check: tuner {' '.join(args)} failed: {got.stderr.strip()[-500:]}")


def best_times(landscape: Path, kernel) -> dict:
    """{(problem key, M): {config tuple: time}} of a landscape's timed points."""
    from tuner.plan.kernel_api import config_from_entry, config_tuple
    from tuner.plan.problems import Problem
    points: dict = {}
    with gzip.open(landscape, "rt") as f:
        f.readline()
        for line in f:
            r = json.loads(line)
            if r.get("time_us") is not None:
                key = (Problem(kernel.name, r["problem"]).key, r["M"])
                points.setdefault(key, {})[config_tuple(kernel, config_from_entry(kernel, r["config"]))] = r["time_us"]
    return points


def studies(out: Path, landscape: Path, kernel_of) -> list[dict]:
    """Per study of a finished run: cap, measured configs, stop reason, best found and row over the best."""
    from tuner.plan.kernel_api import config_from_entry, config_tuple
    from tuner.plan.problems import Problem
    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for table in manifest["tables"]:
        kernel = kernel_of(table)
        points = best_times(landscape, kernel)
        key = Problem(kernel.name, table["problem"]).key
        for m, e in table["entries"].items():
            pts = points[(key, int(m))]
            best = min(pts.values())
            row = pts.get(config_tuple(kernel, config_from_entry(kernel, e["config"])))
            search = e.get("search") or {}
            rows.append({"problem": key, "part": table["problem"].get("part"), "M": int(m),
                         "cap": search.get("budget"), "trials": e.get("trials"), "stopped": e.get("stopped"),
                         "row_ratio": round(row / best, 4) if row else None, "config": e["config"]})
    return rows


def journal_trials(out: Path):
    """(problem key, M, its measured trials in order) of every study in a run's journal."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = JournalStorage(JournalFileBackend(str(out / "studies.journal")))
    for s in optuna.get_all_study_summaries(storage):
        if ":M=" not in s.study_name:
            continue
        key, m = s.study_name.split(":", 1)[1].rsplit(":M=", 1)
        yield key, int(m), [t for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials(
            deepcopy=False) if t.user_attrs.get("config") and t.value is not None]


def found_ratios(out: Path, landscape: Path, kernel) -> dict:
    """{(problem key, M): best measured time over the landscape's best} from the run's journal."""
    points = best_times(landscape, kernel)
    ratios = {}
    for key, m, trials in journal_trials(out):
        if trials and (key, m) in points:
            ratios[(key, m)] = round(min(t.value for t in trials) / min(points[(key, m)].values()), 4)
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "search" / "stopping"),
                    help="OUT.json and OUT.md are written")
    args = ap.parse_args()
    from tuner.plan.kernel_registry import get_kernel
    with tempfile.TemporaryDirectory() as tmp:
        syn, rec = Path(tmp) / "synthetic", Path(tmp) / "recorded"
        run(HEADLINE, syn)
        landscape = syn / "synthetic-fused_moe.jsonl.gz"
        ours = get_kernel("fused_moe")
        headline = studies(syn, landscape, lambda t: ours)
        found = found_ratios(syn, landscape, ours)
        for r in headline:
            r["found_ratio"] = found.get((r["problem"], r["M"]))
        run(RECORDED, rec)
        gemm = get_kernel("fp8_gemm", "vllm", load_code=False)
        # one study per M, written to both engines' tables: each once
        recorded = list({r["M"]: r for r in studies(rec, H200, lambda t: gemm) if r["trials"] is not None}.values())
    trials, caps = sum(r["trials"] for r in headline), sum(r["cap"] for r in headline)
    data = {"format": "tuner-stopping/1", "headline": {"command": "tuner " + " ".join(HEADLINE), "studies": headline,
                                                        "trials": trials, "caps": caps,
                                                        "share": round(trials / caps, 4),
                                                        "rows_within": sum(1 for r in headline if r["row_ratio"]
                                                                           and r["row_ratio"] <= WITHIN),
                                                        "found_within": sum(1 for r in headline if r["found_ratio"]
                                                                            and r["found_ratio"] <= WITHIN)},
            "recorded": {"command": "tuner " + " ".join(RECORDED).replace(str(REPO) + "/", ""), "studies": recorded}}
    Path(args.out + ".json").write_text(json.dumps(data, indent=1) + "\n")
    h = data["headline"]
    lines = ["# The stopping rule, replayed (scripts/stop_check.py)", "",
             "Made by `python scripts/stop_check.py`: SYNTHETIC and recorded H200 times, replayed.", "",
             f"- `{h['command']}`: {len(headline)} studies measured {h['trials']} configs, {h['share']:.0%} of the "
             f"{h['caps']} their caps allow; the row each table holds is within {WITHIN:.2f}x of the study's "
             f"optimum in {h['rows_within']} of {len(headline)}, the best config found in {h['found_within']}.",
             f"- `{data['recorded']['command']}`: " + "; ".join(
                 f"M={r['M']} stopped after {r['trials']} trials ({r['stopped']}), its row "
                 + ("the landscape's best" if r["row_ratio"] == 1.0 else f"{r['row_ratio']:.3f}x the best")
                 for r in recorded) + ".", "",
             "| part | M | cap | trials | stopped | best found / optimum | row / optimum |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['part']} | {r['M']} | {r['cap']} | {r['trials']} | {r['stopped']} | {r['found_ratio']} | "
              f"{r['row_ratio']} |" for r in sorted(headline, key=lambda r: (r["part"], r["M"]))]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
