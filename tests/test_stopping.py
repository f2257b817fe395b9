"""The stopping rule of a study (tuner/search/stopping.py), on plain numbers: no Optuna, no kernel."""

import pytest

from tuner.search.stopping import BUDGET, CONVERGED, EXHAUSTED, StoppingRule, trials_since_gain


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


def test_converged_after_patience_without_a_gain_once_the_seeds_are_measured():
    rule = StoppingRule(budget=48, patience=3, seeds=4, fair_share=0.0)
    flat = [5.0, 6.0, 6.0, 6.0]                                    # 3 trials without a gain
    assert trials_since_gain(flat, 0.005) == 3
    # 4 measured < seeds + patience = 7: the seeds might still hold the winner
    assert rule.reason(4, 100, flat) is None
    assert rule.reason(7, 100, [5.0] + [6.0] * 6) == CONVERGED
    # a gain resets the count
    assert rule.reason(7, 100, [5.0] * 4 + [4.0, 6.0, 6.0]) is None


def test_a_small_budget_converges_at_the_budget_not_after_the_seeds():
    # min(budget, seeds + patience): with budget 4 the rule never asks for 7 measured
    rule = StoppingRule(budget=4, patience=2, seeds=5)
    assert rule.reason(3, 100, [5.0, 6.0, 6.0]) is None
    assert rule.reason(4, 100, [5.0, 6.0, 6.0, 6.0]) == BUDGET


def test_failures_count_towards_convergence():
    rule = StoppingRule(budget=48, patience=3, fair_share=0.0)
    assert rule.reason(4, 100, [5.0, None, None, None]) == CONVERGED
    assert rule.reason(4, 100, [None, None, None, 5.0]) is None   # the first time is a gain


def test_no_convergence_before_a_fair_share_of_the_budget():
    # A plateau of `patience` trials early on is no reason to stop: the search must have
    # measured three quarters of its budget (36 of 48) first.
    rule = StoppingRule(budget=48, patience=16, seeds=2)
    plateau = [5.0] + [6.0] * 34                                   # 35 measured, 34 without a gain
    assert rule.reason(35, 1000, plateau) is None
    assert rule.reason(36, 1000, plateau + [6.0]) == CONVERGED
    assert rule.reason(36, 1000, plateau[:20] + [4.0] + [6.0] * 15) is None   # a gain 15 trials ago
