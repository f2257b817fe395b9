"""The cost model as the search's prior: a study's first measurements are the candidates the
Hopper cost model (tuner/plan/cost_model.py) ranks fastest.

A study's candidates are a finite, known set, and a kernel that describes its work
(`KernelSpec.work`) gets an estimate for each at no GPU time. The best few by that estimate
are queued as seeds (label PRIOR), after the engines' defaults and any warm start, so the
sampler starts from where the model expects the fast configs and spends its own trials
around them. Nothing here knows which kernel it orders; a kernel without `work` gets no
prior seeds.

On the H200 data (scripts/cost_model_check.py, bench/results/cost-model.md) the estimate
orders vLLM's FP8 GEMM landscape with Spearman 0.93, and the seeds bring the study to within
2 % of the best in fewer measured trials; where a kernel's order is not predicted well, the
seeds cost their few trials and the sampler goes on as without them.
"""

from __future__ import annotations

import math
from typing import Iterable

from tuner.plan.cost_model import estimate_us
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec, Params, config_dict

PRIOR = "cost-model"           # the seed label of a prior seed
# Seeds taken from the model's order; the remaining budget is the sampler's.
DEFAULT_SEEDS = 6


def estimates(kernel: KernelSpec, gpu: GpuSpec, params: Params, M: int,
              candidates: Iterable[tuple]) -> dict[tuple, float]:
    """{candidate: estimated microseconds} for every candidate the model can estimate (none
    when the kernel does not describe its work)."""
    if kernel.work is None:
        return {}
    out = {}
    for t in candidates:
        try:
            est = estimate_us(kernel.work(params, M, config_dict(kernel, t)), gpu)
        except (KeyError, ValueError, ZeroDivisionError):
            continue                       # a config the model cannot describe is left to the sampler
        if math.isfinite(est):
            out[t] = est
    return out


def prior_seeds(kernel: KernelSpec, gpu: GpuSpec, params: Params, M: int, candidates: Iterable[tuple],
                count: int, taken: Iterable[tuple] = ()) -> list[tuple[str, Config]]:
    """The `count` candidates the model ranks fastest, besides those `taken` (already seeded),
    as labelled seeds; ties in the estimate go in the candidates' sorted order, so the same
    space gives the same seeds in any process."""
    if count <= 0:
        return []
    skip = set(taken)
    est = estimates(kernel, gpu, params, M, (t for t in candidates if t not in skip))
    ranked = sorted(est, key=lambda t: (est[t], t))
    return [(PRIOR, config_dict(kernel, t)) for t in ranked[:count]]


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2                   # ties share their mean rank
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation; None for fewer than 3 points or a constant side."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else None


AGREEMENT_POINTS = 5             # timed configs a batch size done needs before it judges the model


def agreement(kernel: KernelSpec, gpu: GpuSpec, params: Params, done: dict[int, dict[tuple, float | None]]) -> float | None:
    """How well the cost model ordered what this run measured for the problem: the mean over the
    batch sizes done (with AGREEMENT_POINTS timed configs or more) of the rank correlation of its
    estimates with the times; None where nothing was measured to judge it by."""
    rhos = []
    for m, measured in done.items():
        timed = {t: v for t, v in measured.items() if v is not None}
        est = estimates(kernel, gpu, params, m, timed)
        both = [t for t in timed if t in est]
        if len(both) >= AGREEMENT_POINTS:
            rho = spearman([est[t] for t in both], [timed[t] for t in both])
            if rho is not None:
                rhos.append(rho)
    return sum(rhos) / len(rhos) if rhos else None


def earned_seeds(count: int, rho: float | None) -> int:
    """Prior seeds in proportion to the model's agreement with what was measured (all `count` before
    anything was): on the H200's runs it ordered vLLM's GEMM with 0.93 and earns its six; where it
    orders a landscape no better than chance, its seeds are trials the sampler spends better."""
    return count if rho is None else int(round(count * min(1.0, max(0.0, rho))))
