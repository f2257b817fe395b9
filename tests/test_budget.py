"""Budgets sized by the space (tuner/search/budget.py, issue 43): without --trials each batch size's
studies get at most so many trials from their pruned space (a cap: they stop earlier on evidence,
issue 48), and the plan says what it chose."""

import re

import pytest

from tuner.cli import main
from tuner.plan.problems import Problem
from tuner.search.budget import CEILING, FLOOR, sized_budget, sized_settings
from tuner.search.settings import default_settings

ARGS = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel-source", "ours",
        "--only", "N=7168,K=2048", "--batch-sizes", "1", "4096", "--dry-run"]


def test_the_budget_grows_with_the_pruned_space_within_its_bounds():
    # the H200's vLLM GEMM at small M (64 configs) no longer gets 48; CLBlast's 17,956 get the most
    assert sized_budget(64) == FLOOR < 48
    assert sized_budget(841) == 58 and sized_budget(4362) == 132 and sized_budget(17956) == CEILING
    assert sized_budget(10) == 10 and sized_budget(0) == 0                 # a small space: all of it
    sizes = [sized_budget(n) for n in range(1, 20000, 97)]
    assert sizes == sorted(sizes)


def test_a_sized_budget_leaves_the_stop_to_the_evidence_unless_patience_is_given():
    p = Problem("fp8_gemm", {"N": 1, "K": 1})
    s = sized_settings(default_settings(48), {1: 64, 4096: 1583})
    assert (s.budget_for(p, 1), s.budget_for(p, 4096)) == (24, 80)
    assert (s.patience_for(p, 1), s.patience_for(p, 4096)) == (0, 0)        # 0: stop on evidence
    given = sized_settings(default_settings(48, patience=5), {1: 64, 4096: 1583})
    assert given.patience_for(p, 1) == 5


def test_the_plan_prints_the_budget_it_chose_and_why(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "budget sized by the space: 2*sqrt(pruned configs), 24..160 (--trials N fixes it)" in out
    assert "stop: when no config it has not measured is 2% likely to change the table" in out
    assert "the budget is a cap" in out
    # the budget of each M from the pruned space the plan itself reports
    sizes = re.search(r"configs after pruning, per M: 1:(\d+) 4096:(\d+)", out).groups()
    pruned = dict(zip((1, 4096), map(int, sizes)))
    budgets = {m: sized_budget(n) for m, n in pruned.items()}
    assert f"per M, pruned configs -> trials: 1:{pruned[1]}->{budgets[1]} 4096:{pruned[4096]}->{budgets[4096]}" in out
    assert budgets[1] < 48 < budgets[4096]                 # fewer trials where the space is small, more where large
    assert f"at most {budgets[1] + budgets[4096]} measured configs" in out
    assert all(len(line) <= 120 for line in out.splitlines() if line.startswith("  budget") or "->" in line)
    assert main([*ARGS, "--trials", "48"]) == 0
    out = capsys.readouterr().out
    assert "budget 48 trials per batch size" in out and "->" not in out and "at most 96 measured configs" in out


@pytest.mark.parametrize("ms", [list(range(1, 60))])
def test_the_budget_lines_wrap_within_120_columns(ms):
    from tuner.search.budget import budget_lines
    s = sized_settings(default_settings(48), {m: 64 * m for m in ms})
    lines = budget_lines(s, {m: 64 * m for m in ms})
    assert len(lines) > 1 and all(len(line) <= 120 for line in lines)
    assert sum(len(re.findall(r"\b\d+:\d+->\d+\b", line)) for line in lines) == len(ms)
