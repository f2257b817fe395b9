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

from tuner.gpus import GpuSpec
from tuner.landscape import Landscape
from tuner.measure import ReplayMeasurer
from tuner.problems import Problem
from tuner.search import SearchSettings, StudyRunner
from tuner.space import SearchSpace

# (label, Optuna sampler, seed the study with the engines' defaults?)
VARIANTS = [("tpe", "tpe", False), ("cmaes", "cmaes", False), ("random", "random", False),
            ("tpe+seeds (shipped)", "tpe", True)]


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
