"""The stopping rule of a study (tuner/search/stopping.py), on plain numbers: no Optuna, no kernel."""

import pytest

from tuner.search.stopping import BUDGET, CONFIDENCE, CONVERGED, EXHAUSTED, MIN_TRIALS, StoppingRule, trials_since_gain


@pytest.mark.parametrize("outcomes,since", [
    ([], 0),
    ([10.0], 0),                               # the first time is a gain
    ([10.0, 11.0, 12.0], 2),
    ([10.0, 9.0, 9.99, 8.0], 0),               # 9.0 and 8.0 are gains; 9.99 is not
    ([10.0, 9.0, 9.99], 1),
    ([10.0, 9.96], 1),                         # 0.4 % faster: less than the 0.5 % that counts
    ([10.0, 9.96, 9.92], 2),                   # 0.4 % below the moved best: still no gain
    ([None, None], 2),                         # failures are never a gain
    ([None, 10.0, None], 1),
])
def test_trials_since_gain(outcomes, since):
    assert trials_since_gain(outcomes, 0.005) == since


def test_a_small_gain_moves_the_best_without_resetting_the_count():
    # 10 -> 9.96 (0.4 %, no gain, best now 9.96) -> 9.90 (0.6 % below 9.96: a gain, though
    # only 1 % below 10): measured against the moved best, not the first one
    assert trials_since_gain([10.0, 9.96, 9.90], 0.005) == 0
    assert trials_since_gain([10.0, 9.96, 9.90], 0.02) == 2


def test_the_budget_comes_first():
    rule = StoppingRule(budget=8, patience=2)
    assert rule.reason(8, 8, [1.0] * 8) == BUDGET                  # spent and exhausted: budget
    assert rule.reason(9, 100, [1.0] * 9) == BUDGET                # another worker's overshoot


def test_exhausted_when_every_candidate_is_measured_or_the_sampler_is_stuck():
    rule = StoppingRule(budget=48, patience=100, idle_limit=3)
    assert rule.reason(5, 5, [3.0, 2.0, 1.0, 0.5, 0.2]) == EXHAUSTED
    assert rule.reason(5, 6, [3.0, 2.0, 1.0, 0.5, 0.2]) is None
    assert rule.reason(5, 6, [3.0, 2.0, 1.0, 0.5, 0.2], idle_rounds=3) is None
    assert rule.reason(5, 6, [3.0, 2.0, 1.0, 0.5, 0.2], idle_rounds=4) == EXHAUSTED


def test_with_patience_converged_after_patience_without_a_gain_once_the_seeds_are_measured():
    rule = StoppingRule(budget=48, patience=3, seeds=4)
    flat = [5.0, 6.0, 6.0, 6.0]                                    # 3 trials without a gain
    assert trials_since_gain(flat, 0.005) == 3
    # 4 measured < seeds + patience = 7: the seeds might still hold the winner
    assert rule.reason(4, 100, flat) is None
    assert rule.reason(7, 100, [5.0] + [6.0] * 6) == CONVERGED
    # a gain resets the count
    assert rule.reason(7, 100, [5.0] * 4 + [4.0, 6.0, 6.0]) is None


def test_a_small_budget_converges_at_the_budget_not_after_the_seeds():
    rule = StoppingRule(budget=4, patience=2, seeds=5)
    assert rule.reason(3, 100, [5.0, 6.0, 6.0]) is None
    assert rule.reason(4, 100, [5.0, 6.0, 6.0, 6.0]) == BUDGET


def test_failures_count_towards_convergence():
    rule = StoppingRule(budget=48, patience=3)
    assert rule.reason(4, 100, [5.0, None, None, None]) == CONVERGED
    assert rule.reason(4, 100, [None, None, None, 5.0]) is None   # the first time is a gain


class Asked:
    """The model's chance, counting how often the rule asked it."""
    def __init__(self, chance):
        self.chance, self.calls = chance, 0

    def __call__(self):
        self.calls += 1
        return self.chance


def test_the_evidence_stops_a_study_long_before_three_quarters_of_its_budget():
    # issue 48: no wait for a share of the budget; the model's chance of a table-changing gain decides
    rule = StoppingRule(budget=48, seeds=6)
    unlikely, likely = Asked(1 - CONFIDENCE - 0.001), Asked(0.3)
    assert rule.reason(8, 1000, [5.0] * 8, chance=unlikely) == CONVERGED
    assert rule.reason(8, 1000, [5.0] * 8, chance=likely) is None
    assert rule.reason(47, 1000, [5.0] * 47, chance=likely) is None            # the budget is a cap, no more
    assert rule.reason(48, 1000, [5.0] * 48, chance=likely) == BUDGET


def test_the_evidence_is_asked_only_once_the_seeds_and_a_few_trials_are_measured():
    rule = StoppingRule(budget=48, seeds=6)
    sure = Asked(0.0)
    assert rule.reason(5, 1000, [5.0] * 5, chance=sure) is None and sure.calls == 0    # a seed is not measured yet
    assert rule.reason(6, 1000, [5.0] * 6, chance=sure) == CONVERGED and sure.calls == 1
    early = StoppingRule(budget=48, seeds=1)
    assert early.reason(MIN_TRIALS - 1, 1000, [5.0] * 3, chance=sure) is None       # too few to judge by
    assert early.reason(MIN_TRIALS, 1000, [5.0] * 4, chance=sure) == CONVERGED
    # the budget, an exhausted space and a stuck sampler are said without asking the model
    never = Asked(0.0)
    assert rule.reason(48, 1000, [5.0] * 48, chance=never) == BUDGET
    assert rule.reason(9, 9, [5.0] * 9, chance=never) == EXHAUSTED and never.calls == 0


def test_without_evidence_or_patience_only_the_budget_and_the_space_stop_a_study():
    rule = StoppingRule(budget=48, seeds=2)
    plateau = [5.0] + [6.0] * 40
    assert rule.reason(41, 1000, plateau) is None                  # no plateau rule unless --patience gave one
    assert rule.reason(48, 1000, plateau + [6.0] * 7) == BUDGET
