#!/usr/bin/env python3
"""How well does the Hopper cost model (tuner/plan/cost_model.py) order the H200's configs, and
does seeding a study with its best guesses (tuner/search/prior.py) find the best sooner?

    python scripts/cost_model_check.py [--seeds 10] [--out bench/results/cost-model.md]

Reads the first H200 run (2026-11-27): the recorded landscape of vLLM's FP8 GEMM
(landscapes/NVIDIA_H200/), the tuned MoE studies (bench/results/H200-2026-11-27/tuned/moe/
studies.journal: every trial's config and time) and the benches (bench-gemm, bench/moe: the
default and shipped configs). Prints, per problem and batch size, the Spearman rank correlation
of the model's estimates with the measured times; then, replaying the landscape and each study
(only the configs it measured exist), the measured trials our default search needs to come
within 2 % of the best, with and without the prior's seeds. Every time is the H200's; the
estimates use no GPU time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "results" / "H200-2026-11-27"
LANDSCAPE = REPO / "landscapes" / "NVIDIA_H200" / "fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"
JOURNALS = (RUN / "tuned" / "moe" / "studies.journal", RUN / "extra" / "mla-partial" / "studies.journal")
BENCHES = (RUN / "extra" / "bench-gemm" / "bench-NVIDIA_H200-2026-11-27.json",
           RUN / "bench" / "moe" / "bench-NVIDIA_H200-2026-11-27.json")
WITHIN = 0.02
MLA_NOTE = ("MLA decode has no work description, so no prior: a trial one (two launches: programs per request, "
            "head block and split streaming the latent cache, then the merge) ordered the 5 H200 MLA studies "
            "(extra/mla-partial/, context 1024, M = 1-16) with Spearman -0.20 to 0.13, no better than chance.")


def spearman(a, b) -> float:
    """Spearman's rank correlation (ties share their mean rank); nan for fewer than 3 points."""
    if len(a) < 3:
        return float("nan")

    def rank(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        sums = np.zeros(len(counts))
        np.add.at(sums, inv, r)
        return (sums / counts)[inv]
    ra, rb = rank(a), rank(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def parse_key(key: str) -> dict:
    """A problem key ('E=256,N=256,...,block_shape=[128,128],part=op') back into params."""
    params = {}
    for part in re.findall(r"([A-Za-z_]+)=(\[[^\]]*\]|[^,]*)", key):
        name, value = part
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def kernel_of(name: str, source: str):
    from tuner.plan.kernel_registry import get_kernel
    return get_kernel(name) if source == "ours" else get_kernel(name, source, load_code=False)


def landscape_sets():
    """(label, kernel, params, M, {config tuple: time}) per (problem, M) of the landscape."""
    from tuner.plan.kernel_api import config_from_entry, config_tuple
    lines = [json.loads(x) for x in gzip.open(LANDSCAPE, "rt")]
    kernel = kernel_of(lines[0]["kernel"], lines[0].get("kernel_source", "ours"))
    sets: dict = {}
    for rec in lines[1:]:
        if rec.get("time_us") is None:
            continue
        k = (json.dumps(rec["problem"], sort_keys=True), rec["M"])
        sets.setdefault(k, (rec["problem"], {}))[1][config_tuple(kernel, config_from_entry(kernel, rec["config"]))] = \
            rec["time_us"]
    return [(f"landscape vllm fp8_gemm N={p['N']},K={p['K']}", kernel, p, m, pts) for (_, m), (p, pts) in sets.items()]


def study_sets():
    """(label, kernel, params, M, {config tuple: time}) per tuned study of the journal."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = []
    for journal in JOURNALS:
        out += _journal_sets(JournalStorage(JournalFileBackend(str(journal))))
    return out


def _journal_sets(storage):
    import optuna

    from tuner.plan.kernel_api import config_from_entry, config_tuple
    out = []
    for summary in optuna.get_all_study_summaries(storage):
        m = re.fullmatch(r"(\w+)(?:@(\w+))?:(.*):M=(\d+)", summary.study_name)
        if not m:
            continue
        name, source, key, M = m.group(1), m.group(2) or "ours", m.group(3), int(m.group(4))
        kernel = kernel_of(name, source)
        params = parse_key(key)
        pts = {}
        for tr in optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False):
            cfg = tr.user_attrs.get("config")
            if cfg and tr.value is not None:
                pts[config_tuple(kernel, config_from_entry(kernel, cfg))] = float(tr.value)
        label = f"study {source} {name} " + (f"part={params['part']}" if "part" in params else
                                              f"context={params.get('context')}")
        out.append((label, kernel, params, M, pts))
    return out


def bench_sets():
    """(label, kernel, params, None, {(M, config tuple): time}) per bench shape: the Triton rows."""
    from tuner.plan.kernel_api import config_from_entry, config_tuple
    out = []
    for path in BENCHES:
        data = json.loads(path.read_text())
        groups: dict = {}
        for row in data["rows"]:
            if not row.get("config") or row.get("time_us") is None:
                continue
            source = row["kernel_source"].split()[0]
            kernel = kernel_of(data["kernel"], source)
            key = (source, row["problem"])
            groups.setdefault(key, (kernel, {}))[1][(row["M"], config_tuple(kernel, config_from_entry(
                kernel, row["config"])))] = row["time_us"]
        for (source, problem), (kernel, pts) in groups.items():
            out.append((f"bench {source} {data['kernel']} {problem}", kernel, parse_key(problem), None, pts))
    return out


def correlation_rows(gpu) -> list[dict]:
    from tuner.plan.cost_model import estimate_us
    from tuner.plan.kernel_api import config_dict
    rows = []
    for label, kernel, params, M, pts in landscape_sets() + study_sets() + bench_sets():
        if kernel.work is None:
            continue                    # MLA decode: no work description (see the note at the end)
        keys = sorted(pts)
        if M is None:
            est = [estimate_us(kernel.work(params, m, config_dict(kernel, t)), gpu) for m, t in keys]
        else:
            est = [estimate_us(kernel.work(params, M, config_dict(kernel, t)), gpu) for t in keys]
        times = [pts[k] for k in keys]
        best = min(times)
        top = sorted(range(len(keys)), key=lambda i: est[i])[:6]
        rows.append({"set": label, "M": "all" if M is None else M, "configs": len(keys),
                     "spearman": spearman(est, times),
                     "best of model's top 6 / best": min(times[i] for i in top) / best})
    return rows


def trials_to_best(kernel, params, M, pts, gpu, prior: int, seed: int) -> int | None:
    """Measured trials (seeds included) our default search needs to come within WITHIN of the
    best of `pts`, replaying them (only they exist)."""
    import optuna

    from tuner.measure.landscape import Landscape, Point
    from tuner.measure.measurers import ReplayMeasurer
    from tuner.plan.kernel_api import config_dict
    from tuner.plan.problems import Problem
    from tuner.plan.space import SearchSpace
    from tuner.search.runner import StudyRunner
    from tuner.search.settings import SearchSettings

    land = Landscape({"device": gpu.cuda_name}, kernel)
    for t, v in pts.items():
        land.add(params, M, config_dict(kernel, t), Point(v))
    values = {k: sorted({t[i] for t in pts}) for i, k in enumerate(kernel.config_keys)}
    space = SearchSpace(kernel, values, {}, source="replayed points")
    log: list = []

    class Logging(ReplayMeasurer):
        def measure(self, problem, M, configs):
            got = super().measure(problem, M, configs)
            log.extend(m.time_us for m in got)
            return got

    settings = SearchSettings(budget=len(pts), patience=10 ** 9, sampler="gp", seed=seed, prior=prior)
    runner = StudyRunner(kernel, space, gpu, Logging(land), optuna.storages.InMemoryStorage(), settings)
    seeds = [("default", kernel.default_config(params, M))] + [("default", c) for c in kernel.extra_seeds(params, M)]
    result = runner.tune(Problem(kernel.name, params), M, seeds)
    best = min(pts.values())
    for i, v in enumerate(log[:result.trials], start=1):
        if v is not None and v <= best * (1 + WITHIN):
            return i
    return None


def trials_rows(gpu, seeds: int, prior: int) -> list[dict]:
    rows = []
    for label, kernel, params, M, pts in landscape_sets() + study_sets():
        if kernel.work is None:
            continue
        row = {"set": label, "M": M, "configs": len(pts)}
        for name, n in (("without", 0), (f"with {prior}", prior)):
            got = [trials_to_best(kernel, params, M, pts, gpu, n, s) for s in range(seeds)]
            hits = [g if g is not None else len(pts) + 1 for g in got]
            row[f"{name}: median"] = statistics.median(hits)
            row[f"{name}: worst"] = max(hits)
        rows.append(row)
    return rows


def summary(trials, prior: int) -> str:
    """How many replays reach 2 % within 12 measured trials (the issue's target), median and worst seed."""
    n = len(trials)
    parts = []
    for name, label in (("without", "without the prior"), (f"with {prior}", f"with {prior} prior seeds")):
        med = int((trials[f"{name}: median"] <= 12).sum())
        worst = int((trials[f"{name}: worst"] <= 12).sum())
        parts.append(f"{label}: {med}/{n} replays within 12 trials at the median seed, {worst}/{n} at the "
                     f"worst (mean of the medians {trials[f'{name}: median'].mean():.1f})")
    return "Within 2 % in at most 12 measured trials: " + "; ".join(parts) + "."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="search seeds per replayed study")
    ap.add_argument("--prior", type=int, default=None, help="prior seeds (default: the search's default)")
    ap.add_argument("--out", default=None, help="also write the tables to this Markdown file")
    args = ap.parse_args()
    import pandas as pd

    from tuner.jobs.report import markdown_table
    from tuner.plan.gpus import get_gpu
    from tuner.search.settings import SearchSettings
    gpu = get_gpu("H200")
    prior = SearchSettings().prior if args.prior is None else args.prior
    corr = pd.DataFrame(correlation_rows(gpu)).round(3)
    trials = pd.DataFrame(trials_rows(gpu, args.seeds, prior))
    text = ("Times: NVIDIA H200, 2026-11-27 (bench/results/H200-2026-11-27/, landscapes/NVIDIA_H200/); "
            "estimates: tuner/plan/cost_model.py, no GPU time.\n\n## Rank correlation (Spearman) of the estimate "
            "with the measured time\n\n" + markdown_table(corr) +
            f"\n\n## Measured trials to within {WITHIN:.0%} of the best, replayed (our default search, gp, "
            f"{args.seeds} seeds; the engines' defaults seeded first; a miss counts as configs + 1)\n\n"
            + markdown_table(trials) + "\n\n" + summary(trials, prior) + "\n\n" + MLA_NOTE + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text("Made by `python scripts/cost_model_check.py --out " + args.out + "`.\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
