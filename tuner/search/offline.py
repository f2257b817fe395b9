"""Offline search studies over a landscape: how many trials each sampler needs.

For every (problem, M) a landscape covers, each sampler runs the real search
(StudyRunner, in-memory storage, no early stop) and we note the first trial whose
time is within 1 % and 3 % of the landscape's best.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import optuna
import pandas as pd

from tuner.measure.landscape import Landscape
from tuner.measure.measurers import ReplayMeasurer
from tuner.plan.gpus import GpuSpec
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace
from tuner.search.runner import SearchSettings, StudyRunner

# (label, Optuna sampler, seed the study with the engines' defaults?)
VARIANTS = [("gp+seeds (default)", "gp", True), ("gp", "gp", False), ("tpe", "tpe", False),
            ("random", "random", False), ("tpe+seeds (shipped)", "tpe", True)]


class _LoggingReplay(ReplayMeasurer):
    def __init__(self, landscape: Landscape):
        super().__init__(landscape)
        self.log: list[float | None] = []

    def measure(self, problem, M, configs):
        out = super().measure(problem, M, configs)
        self.log.extend(m.time_us for m in out)
        return out


@dataclass
class Run:
    variant: str
    problem: str
    M: int
    seed: int
    to_3pct: int | None
    to_1pct: int | None


def _first_within(log: list, best: float, tol: float) -> int | None:
    for i, v in enumerate(log, start=1):
        if v is not None and v <= best * (1 + tol):
            return i
    return None


def search_efficiency(landscape: Landscape, space: SearchSpace, gpu: GpuSpec, budget: int = 64,
                      seeds: int = 3, variants=VARIANTS) -> list[Run]:
    kernel = landscape.kernel
    runs = []
    for key, params in landscape.problems.items():
        problem = Problem(kernel.name, params)
        for M in landscape.batch_sizes(params):
            best = landscape.best(params, M)
            if best is None:
                continue
            for label, sampler, seeded in variants:
                for seed in range(seeds):
                    measurer = _LoggingReplay(landscape)
                    settings = SearchSettings(budget=budget, patience=10 ** 9, sampler=sampler, seed=seed)
                    runner = StudyRunner(kernel, space, gpu, measurer, optuna.storages.InMemoryStorage(), settings)
                    init = [("default", kernel.default_config(params, M))] + \
                        [("default", c) for c in kernel.extra_seeds(params, M)] if seeded else []
                    runner.tune(problem, M, init)
                    log = measurer.log[:budget]           # the search's trials, not the re-timing
                    runs.append(Run(label, key, M, seed, _first_within(log, best[1], 0.03),
                                    _first_within(log, best[1], 0.01)))
    return runs


def summary_table(runs: list[Run], budget: int) -> pd.DataFrame:
    rows = []
    for label in dict.fromkeys(r.variant for r in runs):
        rs = [r for r in runs if r.variant == label]
        row = {"sampler": label, "studies": len(rs)}
        for col, attr in (("3%", "to_3pct"), ("1%", "to_1pct")):
            hits = [getattr(r, attr) for r in rs if getattr(r, attr) is not None]
            row[f"median trials to {col}"] = statistics.median(hits) if hits else None
            row[f"reached {col} within {budget}"] = f"{len(hits)}/{len(rs)}"
        rows.append(row)
    return pd.DataFrame(rows)


# -- the search benchmark over real landscapes (scripts/search_benchmark.py) --------------------
CHECKPOINTS = (16, 32, 48, 100)


@dataclass
class Trace:
    """One search run over one (problem, M) of a landscape: the times it measured, in order
    (None: a failed config), and the landscape's best and size."""
    variant: str
    landscape: str
    seed: int
    times: list
    best: float
    grid: int

    def best_at(self, n: int) -> float | None:
        seen = [t for t in self.times[:n] if t is not None]
        return min(seen) if seen else None

    def ratio_at(self, n: int) -> float:
        b = self.best_at(n)
        return b / self.best if b is not None else float("inf")

    def trials_to(self, tol: float) -> int | None:
        return _first_within(self.times, self.best, tol)


def _plain_trace(points: dict, keys: tuple, values: dict, budget: int, seed: int, sampler: str = "tpe") -> list:
    """An Optuna sampler as it comes (TPESampler() or GPSampler()), parameters categorical,
    driven directly: a config outside the landscape is a FAIL, a repeat gets its known
    value, and only distinct configs count as trials."""
    make = optuna.samplers.GPSampler if sampler == "gp" else optuna.samplers.TPESampler
    study = optuna.create_study(sampler=make(seed=seed))
    trace: list = []
    seen: dict = {}
    for _ in range(budget * 50):
        if len(trace) >= budget:
            break
        trial = study.ask()
        cfg = tuple(trial.suggest_categorical(k, values[k]) for k in keys)
        if cfg not in points:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        if cfg not in seen:
            seen[cfg] = points[cfg].time_us
            trace.append(seen[cfg])
        if seen[cfg] is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, seen[cfg])
    return trace


def _random_trace(points: dict, budget: int, seed: int) -> list:
    """Random search over the pruned space (the landscape's points), without repeats."""
    import random
    cfgs = sorted(points)
    return [points[c].time_us for c in random.Random(seed).sample(cfgs, min(budget, len(cfgs)))]


def _ours_trace(landscape: Landscape, space: SearchSpace, gpu: GpuSpec, params: dict, M: int,
                settings: SearchSettings, seeded: bool) -> list:
    """The project's search (StudyRunner, the CLI's code path) over the landscape, with an
    in-memory storage; the default config seeds it as a tuning run would."""
    kernel = landscape.kernel
    measurer = _LoggingReplay(landscape)
    runner = StudyRunner(kernel, space, gpu, measurer, optuna.storages.InMemoryStorage(), settings)
    seeds = [("default", kernel.default_config(params, M))] if seeded else []
    result = runner.tune(Problem(kernel.name, params), M, seeds)
    return measurer.log[:result.trials]          # the search's trials, not the finalists' re-timing


def benchmark_traces(landscape: Landscape, space: SearchSpace, gpu: GpuSpec, variant: str, seeds: range,
                     budget: int, settings_for=None) -> list[Trace]:
    """Traces of one variant over every (problem, M) of a landscape. variant: 'random',
    'plain-tpe', or 'ours:<label>' with settings_for(budget, seed) -> (SearchSettings, seeded)."""
    kernel = landscape.kernel
    out = []
    for key, params in landscape.problems.items():
        for M in landscape.batch_sizes(params):
            pts = landscape.lookup(params, M) or {}
            best = landscape.best(params, M)
            if best is None:
                continue
            values = {k: sorted({c[i] for c in pts}) for i, k in enumerate(kernel.config_keys)}
            for seed in seeds:
                if variant == "random":
                    times = _random_trace(pts, budget, seed)
                elif variant in ("plain-tpe", "plain-gp"):
                    times = _plain_trace(pts, kernel.config_keys, values, budget, seed, variant.split("-")[1])
                else:
                    settings, seeded = settings_for(budget, seed)
                    times = _ours_trace(landscape, space, gpu, params, M, settings, seeded)
                out.append(Trace(variant, landscape.path, seed, times, best[1], len(pts)))
    return out


def _ci95(xs: list[float]) -> float:
    finite = [x for x in xs if x != float("inf")]
    if len(finite) < 2:
        return float("nan")
    return 1.96 * statistics.stdev(finite) / len(finite) ** 0.5


def benchmark_rows(traces: list[Trace], checkpoints=CHECKPOINTS) -> list[dict]:
    """One row per checkpoint: ratio to best (mean +- 95 % CI, median, worst), share of runs
    within 1 % and 5 %, and trials to reach 1 % and 5 % (median over the runs that did;
    how many did)."""
    rows = []
    for n in checkpoints:
        ratios = [t.ratio_at(n) for t in traces]
        finite = [r for r in ratios if r != float("inf")]
        row = {"trials": n, "runs": len(traces),
               "mean": statistics.fmean(finite) if finite else float("nan"), "ci95": _ci95(ratios),
               "median": statistics.median(ratios), "worst": max(ratios),
               "within 1%": sum(r <= 1.01 for r in ratios) / len(ratios),
               "within 5%": sum(r <= 1.05 for r in ratios) / len(ratios)}
        for tol, name in ((0.01, "1%"), (0.05, "5%")):
            hits = [h for t in traces if (h := t.trials_to(tol)) is not None and h <= n]
            row[f"median trials to {name}"] = statistics.median(hits) if hits else None
        rows.append(row)
    return rows


# -- warm starts across GPUs (scripts/search_benchmark.py warm) ------------------------------------
def _search(landscape: Landscape, space: SearchSpace, gpu: GpuSpec, params: dict, M: int,
            settings: SearchSettings, seeds: list) -> tuple[list, dict]:
    """Our search over one (problem, M) of a landscape: the times it measured in order, and
    every config it measured with its time."""
    kernel = landscape.kernel
    measurer = _LoggingReplay(landscape)
    runner = StudyRunner(kernel, space, gpu, measurer, optuna.storages.InMemoryStorage(), settings)
    problem = Problem(kernel.name, params)
    result = runner.tune(problem, M, seeds)
    return measurer.log[:result.trials], runner.measured(problem, M)


SOURCE_BUDGET = 48          # the source GPU's run: a results folder tuned with the default --trials


def warm_traces(target: Landscape, source: Landscape, space: SearchSpace, gpu: GpuSpec, seeds: range,
                budget: int, share: float | None, cache: dict | None = None) -> list[Trace]:
    """Per seed, a cold run of our default search on `target` (share None), or a warm one:
    seeded (tuner/search/warm_start.py, the CLI's ranking and cap) with the best configs a cold
    run of SOURCE_BUDGET trials (same seed) measured on `source`, the same kernel recorded on
    another GPU, as `--warm-start` seeds a study from that GPU's results folder. Both
    landscapes must hold the same (problem, M) grid; times are the target's. `cache` keeps
    the source runs between calls."""
    from tuner.search.runner import default_settings
    from tuner.search.warm_start import PER_SOURCE_M, Known, WarmPool, study_seeds
    kernel = target.kernel
    out = []
    for key, params in target.problems.items():
        for M in target.batch_sizes(params):
            best = target.best(params, M)
            src_params = source.problems.get(key)
            if best is None or src_params is None:
                continue
            default = [("default", kernel.default_config(params, M))]
            for seed in seeds:
                settings = default_settings(budget, seed=seed)
                seeded = default
                if share is not None:
                    cache = {} if cache is None else cache
                    if (key, M, seed) not in cache:
                        cache[(key, M, seed)] = _search(source, space, gpu, src_params, M,
                                                        default_settings(SOURCE_BUDGET, seed=seed), default)[1]
                    measured = cache[(key, M, seed)]
                    timed = sorted((v, t) for t, v in measured.items() if v is not None)[:PER_SOURCE_M]
                    pool = WarmPool([Known(dict(zip(kernel.config_keys, t)), kernel.name, params, M,
                                           source.header.get("device", ""), "source", i, v)
                                     for i, (v, t) in enumerate(timed)])
                    seeded = default + study_seeds(pool, kernel, params, M, gpu, budget, {}, share)
                times, _ = _search(target, space, gpu, params, M, settings, seeded)
                pts = target.lookup(params, M) or {}
                out.append(Trace("warm" if share is not None else "cold", target.path, seed, times, best[1], len(pts)))
    return out
