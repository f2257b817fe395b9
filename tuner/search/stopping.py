"""When a study stops: the budget is spent, the space is exhausted, or the search converged.

Plain numbers in, a reason out: no Optuna here, so the rule is tested on its own
(tests/test_stopping.py) and the search (tuner/search/runner.py) only asks it each round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

BUDGET, EXHAUSTED, CONVERGED = "budget", "exhausted", "converged"


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
    budget: int                 # distinct configs to measure
    patience: int               # measured trials without a gain before converging
    min_gain: float = 0.005     # what counts as a gain (0.5 %)
    seeds: int = 0              # configs queued up front: measured before converging
    # The share of the budget measured before the search may converge: on recorded GPU
    # landscapes (scripts/search_benchmark.py) a model-based search still finds better
    # configs late, and stopping at the first plateau cost it more than the trials saved.
    fair_share: float = 0.75
    # Rounds in a row in which the sampler proposed nothing new to measure (every
    # proposal done, pending or pruned) before the study counts as exhausted.
    idle_limit: int = 50

    def reason(self, measured: int, candidates: int, outcomes: Sequence[float | None],
               idle_rounds: int = 0) -> str | None:
        """Why to stop now, or None to go on. measured: distinct configs measured;
        candidates: how many configs the study may measure at all; outcomes: every
        measured trial's time in trial order (None: failed); idle_rounds: rounds in a row
        without a new config to measure."""
        if measured >= self.budget:
            return BUDGET
        if measured >= candidates:
            return EXHAUSTED
        if (trials_since_gain(outcomes, self.min_gain) >= self.patience
                and measured >= min(self.budget, max(self.seeds + self.patience, self.fair_share * self.budget))):
            return CONVERGED
        if idle_rounds > self.idle_limit:
            return EXHAUSTED
        return None
