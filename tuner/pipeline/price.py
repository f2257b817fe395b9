"""A plan's price: the GPU time it is expected to take, from measured costs (issue 48).

Two records, both committed and both measured, make it:
  - what one GPU run's tuning cost on that GPU (bench/results/<GPU>-<date>/costs.json, written by
    scripts/gpu_costs.py from the run's own journal and steps): per kernel source (whose kernel
    was tuned) the command's start-up, and per study its batch size, measured trials, the
    seconds its trials took and the seconds its close took (the finalists timed again, the
    numerics check, the paired gain, the tables written);
  - what the stopping rule spends (bench/results/search/stopping.json, scripts/stop_check.py):
    the measured configs per study of the synthetic headline's 54 studies replayed under it.
A study of the plan is expected to measure that many configs (its mean), or its cap where the cap
(the budget sized by its space, or --trials) is smaller: a study stops on evidence, which does not
grow with its cap as a share of it would. Each trial costs the seconds per trial measured at the
nearest batch sizes (between two, by log M), then the study closes in the mean close; each
kernel's run adds its start-up. Light: JSON only, no Optuna, so the dry run prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.errors import TunerError
from tuner.paths import REPO_ROOT
from tuner.reading import read_json_file

RESULTS = REPO_ROOT / "bench" / "results"
STOPPING = RESULTS / "search" / "stopping.json"


@dataclass
class Price:
    seconds: float
    trials: int               # expected measured configs, over the plan's studies
    cap: int                  # what the budgets allow
    costs: str                # the measured costs' file, relative to the repository
    pooled: bool              # the plan's kernel source has no costs of its own there: all sources' pooled


def _rel(path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def measured_costs(gpu_key: str):
    """(the newest committed costs of GPU runs on `gpu_key`, its path) or None."""
    found = []
    for path in sorted(RESULTS.glob("*/costs.json")):
        try:
            data = read_json_file(path, "measured costs ")
        except TunerError:
            continue
        if isinstance(data, dict) and data.get("format") == "tuner-costs/1" and data.get("gpu") == gpu_key:
            found.append((path.parent.name, data, path))
    if not found:
        return None
    _, data, path = max(found, key=lambda f: f[0])
    return data, path


def stop_trials() -> float | None:
    """The mean measured configs of a study under the stopping rule (the synthetic headline's, replayed)."""
    try:
        data = read_json_file(STOPPING, "the stopping rule's replay ")
        trials = float(data["headline"]["trials"]) / len(data["headline"]["studies"])
    except (TunerError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return trials if trials >= 1 else None


def per_trial_s(studies: list[dict], M: int) -> float:
    """Seconds per measured trial at M: the measured batch sizes' (all their studies' trials over
    their seconds), between the two nearest by log M, the nearest beyond the ends."""
    by_m: dict[int, list[float]] = {}
    for s in studies:
        if s.get("trials"):
            got = by_m.setdefault(int(s["M"]), [0.0, 0.0])
            got[0] += float(s["trial_s"])
            got[1] += int(s["trials"])
    rates = sorted((m, t / n) for m, (t, n) in by_m.items() if n)
    if not rates:
        return 0.0
    x = math.log2(max(M, 1))
    if x <= math.log2(rates[0][0]):
        return rates[0][1]
    for (m0, r0), (m1, r1) in zip(rates, rates[1:]):
        x0, x1 = math.log2(m0), math.log2(m1)
        if x <= x1:
            return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
    return rates[-1][1]


def plan_price(opts) -> Price | None:
    """The expected GPU seconds of a plan (RunPlan) on its GPU, or None where nothing measured them."""
    found = measured_costs(opts.gpu.key)
    per_study = stop_trials()
    if found is None or per_study is None:
        return None
    data, path = found
    sources = data.get("sources") or {}
    mine = sources.get(opts.kernel.source)
    pooled = mine is None
    studies = [s for c in ([mine] if mine else sources.values()) for s in c.get("studies", [])]
    startups = [c["startup_s"] for c in ([mine] if mine else sources.values()) if c.get("startup_s") is not None]
    closes = [c["close_s"] for c in ([mine] if mine else sources.values()) if c.get("close_s") is not None]
    if not studies:
        return None
    seconds = sum(startups) / len(startups) if startups else 0.0
    close = sum(closes) / len(closes) if closes else 0.0
    trials = cap = 0
    # one study per (problem, M), however many engines' tables it writes (a GEMM's both engines')
    for p, m in {(p.key, m): (p, m) for p in opts.problems for m in opts.ms_for(p)}.values():
        budget = opts.settings.budget_for(p, m)
        expect = min(budget, max(1, round(per_study)))
        trials, cap = trials + expect, cap + budget
        seconds += expect * per_trial_s(studies, m) + close
    return Price(seconds, trials, cap, _rel(path), pooled)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def price_line(price: Price, opts) -> str:
    """The plan's lines: 'expected: about 5.5 min of GPU on NVIDIA H200, ...', and where it comes from."""
    whose = "every kernel's pooled, none of this kernel's" if price.pooled else f"{opts.kernel.source}'s"
    return (f"  expected: about {minutes(price.seconds)} of GPU on {opts.gpu.cuda_name}, {price.trials} measured configs "
            f"(at most {price.cap})\n"
            f"    from {price.costs} ({whose} start-up, seconds per trial and per study)\n"
            f"    and {_rel(STOPPING)} (the configs a study measured under the stopping rule, replayed)")


def total_line(prices: list[Price | None], gpu_name: str) -> str | None:
    """The whole run's line, where several plans (one per kernel) run one after another."""
    known = [p for p in prices if p is not None]
    if len(known) < 2 or len(known) != len(prices):
        return None
    return (f"expected for the {len(known)} plans: about {minutes(sum(p.seconds for p in known))} of GPU on "
            f"{gpu_name}, {sum(p.trials for p in known)} measured configs")
