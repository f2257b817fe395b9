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
