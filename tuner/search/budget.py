"""A study's trial budget sized by its pruned space, when the command is not given --trials (issue 43).

One budget for every space wasted trials on small spaces and starved large ones: on the H200 landscape of
vLLM's FP8 GEMM (64 configs per M after pruning; bench/results/H200-2026-11-27/) the default search found
the optimum by trial 15-18 in every run while `tuner gemm` spent 48, and on CLBlast's 17,956-config Xgemm
spaces 48 trials reach 1.07-1.11x of the best where 100 reach 1.03-1.04x (bench/results/search/). The
budget grows with the square root of the pruned space (2 x sqrt(configs): 64 -> 24 with the floor,
841 -> 58, 4,362 -> 132), between FLOOR and CEILING and never above the space itself. It is a cap: a study
stops earlier when its evidence says it converged (tuner/search/stopping.py, issue 48). Plain numbers: the
plan reads it without loading Optuna.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Mapping

from tuner.search.settings import SearchSettings

PER_ROOT = 2.0          # trials per square root of the pruned configs
FLOOR = 24              # enough for the random start (8) and a model that has seen 16 more
CEILING = 160           # a study's cost stays bounded on the largest spaces
RULE = f"{PER_ROOT:g}*sqrt(pruned configs), {FLOOR}..{CEILING}"


def sized_budget(configs: int) -> int:
    """The trials of a study whose pruned space holds `configs` (all of them for a small one)."""
    if configs <= 0:
        return 0
    return min(configs, max(FLOOR, min(CEILING, round(PER_ROOT * math.sqrt(configs)))))


def pruned_sizes(space, problems, batch_sizes, gpu) -> dict[int, int]:
    """Per batch size M, the largest pruned space over the problems (a SearchSpace's configs)."""
    return {m: max((len(space.configs(p.params, m, gpu)) for p in problems), default=0) for m in batch_sizes}


def sized_settings(settings: SearchSettings, sizes: Mapping[int, int]) -> SearchSettings:
    """`settings` with a budget per batch size M from the largest pruned space at that M (`sizes`)."""
    budgets = {str(m): max(1, sized_budget(n)) for m, n in sorted(sizes.items())}
    typical = round(statistics.median(budgets.values())) if budgets else settings.budget
    return dataclasses.replace(settings, budget=typical, budgets=budgets, sized=RULE)


def budget_lines(settings: SearchSettings, sizes: Mapping[int, int], width: int = 120) -> list[str]:
    """What the plan says of a sized budget per batch size ('M:configs->trials'), wrapped to `width` columns."""
    if not settings.sized:
        return []
    lines = []
    line = "  per M, pruned configs -> trials:"
    for m, n in sorted(sizes.items()):
        item = f" {m}:{n}->{settings.budgets.get(str(m), settings.budget)}"
        if len(line) + len(item) > width:
            lines.append(line)
            line = "   "
        line += item
    return lines + [line]
