"""When a study stops: the budget is spent, the space is exhausted, or the evidence says it converged.

Plain numbers in, a reason out: no Optuna here, so the rule is tested on its own
(tests/test_stopping.py) and the search (tuner/search/runner.py) only asks it each round.

Converged (issue 48): once the seeds are measured, the study stops when the chance that any
config it has not measured beats its best by more than the gain that would change the table
(--min-gain, or the device's measured noise where higher) falls below 1 - CONFIDENCE. That
chance is the search's own model's (tuner/search/evidence.py: the study's trials, the
neighbouring batch sizes' and the cost model's ranking), asked only when the cheap checks
have passed. The budget stays as a cap. Before, a study could not stop before 3/4 of a budget
sized by its space: on the synthetic headline that was 2,339 measured configs where 700 find
the same tables, and the H200 GEMM landscape spent 19-24 trials on an optimum found by trial 9.
An explicit --patience replaces it with the plateau stop: that many measured trials without a
gain of min_gain (tools that time a whole space give one the budget never reaches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

BUDGET, EXHAUSTED, CONVERGED = "budget", "exhausted", "converged"
CONFIDENCE = 0.98       # stop when no unmeasured config has a 2 % chance of changing the table
MIN_TRIALS = 4          # measured configs before the evidence is asked at all


def trials_since_gain(outcomes: Sequence[float | None], min_gain: float) -> int:
    """Measured trials since the last one that beat the best so far by more than
    `min_gain` (a fraction); `outcomes` are times in trial order, None for a failure.
    A failure is never a gain; a small gain moves the best without resetting the count."""
    best, since = None, 0
    for v in outcomes:
        if v is not None and (best is None or v < best * (1 - min_gain)):
            since = 0
        else:
            since += 1
        if v is not None and (best is None or v < best):
            best = v
    return since


@dataclass(frozen=True)
class StoppingRule:
    budget: int                 # distinct configs to measure at most
    patience: int = 0           # measured trials without a gain before converging (0: no such stop)
    min_gain: float = 0.005     # what counts as a gain for `patience` (0.5 %)
    seeds: int = 0              # configs queued up front: measured before converging
    confidence: float = CONFIDENCE
    min_trials: int = MIN_TRIALS
    # the share of the budget measured before `patience` may stop a study (the plateau rule of a study
    # with no evidence but its own trials, plateau_rule; 0 for an explicit --patience)
    fair_share: float = 0.0
    # Rounds in a row in which the sampler proposed nothing new to measure (every
    # proposal done, pending or pruned) before the study counts as exhausted.
    idle_limit: int = 50

    def reason(self, measured: int, candidates: int, outcomes: Sequence[float | None],
               idle_rounds: int = 0, chance: Callable[[], float] | None = None) -> str | None:
        """Why to stop now, or None to go on. measured: distinct configs measured;
        candidates: how many configs the study may measure at all; outcomes: every
        measured trial's time in trial order (None: failed); idle_rounds: rounds in a row
        without a new config to measure; chance: the model's probability that an unmeasured
        config beats the best by the table's gain (asked last; None: no evidence stop)."""
        if measured >= self.budget:
            return BUDGET
        if measured >= candidates:
            return EXHAUSTED
        if idle_rounds > self.idle_limit:
            return EXHAUSTED
        settled = measured >= max(self.seeds, self.min_trials)
        if (self.patience and measured >= min(self.budget, max(self.seeds + self.patience,
                                                               self.fair_share * self.budget))
                and trials_since_gain(outcomes, self.min_gain) >= self.patience):
            return CONVERGED
        if chance is not None and settled and chance() < 1 - self.confidence:
            return CONVERGED
        return None


def plateau_rule(budget: int, min_gain: float, seeds: int) -> StoppingRule:
    """The stop of a study whose only evidence is its own trials (no batch size done, no cost model: a
    landscape of another project, a first batch size of a kernel without a work model): half its budget
    without a gain, once 3/4 of it is measured, as before issue 48. There the model, fitted to a few of
    its own points, was confident too soon: on the held-out landscapes (bench/search_split.yaml) it
    stopped pnpoly-rtx3060laptop at 1.18x of the best where the plateau rule reached 1.00x, and the
    checking set's geometric mean at 100 trials went from 1.014x to 1.082x."""
    return StoppingRule(budget, max(8, budget // 2), min_gain, seeds=seeds, fair_share=0.75)
