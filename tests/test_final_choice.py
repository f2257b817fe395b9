"""The choice of a study's config (tuner/search/runner.py, StudyRunner._finish, and conclusion.conclude): the
finalists and the default are timed again together and the default competes like any
finalist, so a table never holds a config slower than the default measured in that same
re-time. Over a SYNTHETIC landscape; the re-time differs from the search's times as noise
makes it differ on a device (here by a fixed factor per config, so the outcome is known)."""

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.measure.landscape import read_landscape
from tuner.measure.measurers import Measurement, NumericsCheck, ReplayMeasurer
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_tuple
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import SearchSettings, StudyRunner

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
PROBLEM = Problem("fp8_gemm", P)
M = 16


class NoisyRetime(ReplayMeasurer):
    """The landscape's times while the search measures; from the re-time on (the first call
    that times the default again, or after `searching` calls), every config but the default
    `slower` times slower. Numerics fail for the configs in `failing`."""

    def __init__(self, landscape, default, slower=1.5):
        super().__init__(landscape)
        self.default, self.slower = config_tuple(KERNEL, default), slower
        self.retimed = False
        self.failing: set[tuple] = set()
        self.checked: list[tuple] = []

    def measure(self, problem, M, configs):
        out = super().measure(problem, M, configs)
        self.retimed |= len(configs) > 1          # the search asks one at a time; the re-time many
        if not self.retimed:
            return out
        return [Measurement(m.time_us * (1 if config_tuple(KERNEL, c) == self.default else self.slower), m.spread)
                if m.time_us else m for c, m in zip(configs, out)]

    def check_numerics(self, problem, M, config):
        t = config_tuple(KERNEL, config)
        self.checked.append(t)
        if t in self.failing:
            return NumericsCheck("failed", "relative error 0.5 over 0.02 (test)")
        return NumericsCheck("passed", "test")


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), GPU, [P], [M])
    return read_landscape(path, KERNEL)


def canonical_default():
    """The default as a study holds it (folded like every config: SearchSpace.canonical)."""
    return load_space(KERNEL).canonical(P, M, GPU, KERNEL.default_config(P, M))


def tune(measurer, storage=None, budget=12):
    runner = StudyRunner(KERNEL, load_space(KERNEL), GPU, measurer, storage or optuna.storages.InMemoryStorage(),
                         SearchSettings(budget=budget, patience=1000, seed=1))
    return runner, runner.tune(PROBLEM, M, [("default", KERNEL.default_config(P, M))])


def test_the_default_wins_where_the_finalists_retime_slower_than_it(landscape):
    default = canonical_default()
    fair = ReplayMeasurer(landscape)
    _, searched = tune(fair)
    assert searched.speedup and searched.speedup > 1.2      # the search beats the default by more than the noise
    noisy = NoisyRetime(landscape, default, slower=searched.speedup * 1.1)
    _, result = tune(noisy)
    assert config_tuple(KERNEL, result.config) == config_tuple(KERNEL, default)
    assert result.time_us == result.default_time_us and result.speedup == 1.0
    assert result.numerics["status"] == "passed"            # checked like any finalist


def test_a_finalist_that_stays_faster_than_the_default_in_the_retime_wins(landscape):
    default = canonical_default()
    _, searched = tune(ReplayMeasurer(landscape))
    noisy = NoisyRetime(landscape, default, slower=searched.speedup * 0.9)
    _, result = tune(noisy)
    assert result.config == searched.config and result.speedup > 1.0


def test_a_default_that_fails_numerics_never_wins(landscape):
    default = canonical_default()
    _, searched = tune(ReplayMeasurer(landscape))
    noisy = NoisyRetime(landscape, default, slower=searched.speedup * 1.1)
    noisy.failing.add(config_tuple(KERNEL, default))
    _, result = tune(noisy)
    assert result.config is not None and config_tuple(KERNEL, result.config) != config_tuple(KERNEL, default)
    assert [r["config"] for r in result.rejected] == [default]
    assert result.speedup < 1.0                               # reported as it was measured, not hidden


def test_concluding_tied_tables_lets_the_default_win_only_with_the_shared_keys(landscape):
    default = canonical_default()
    storage = optuna.storages.InMemoryStorage()
    runner, searched = tune(ReplayMeasurer(landscape), storage)
    measured = sorted((t, c) for c, t in runner.measured(PROBLEM, M).items() if t is not None)
    from tuner.plan.kernel_api import config_dict
    from tuner.search.conclusion import conclude
    # a key standing for the one SGLang's up and down tables share (BLOCK_SIZE_M). Not
    # BLOCK_SIZE_K: since rule block_k_is_group the space holds only the group's 128
    key = "num_warps"
    i = KERNEL.config_keys.index(key)
    shared = (key,)
    same = [config_dict(KERNEL, c) for _, c in measured if c[i] == default[key]
            and c != config_tuple(KERNEL, default)][:2]
    other = [config_dict(KERNEL, c) for _, c in measured if c[i] != default[key]][:2]
    assert same and other
    runner.measurer = NoisyRetime(landscape, default, slower=10.0)
    kept = conclude(runner, PROBLEM, M, same, default, shared=shared)
    assert kept.config == default and kept.speedup == 1.0
    # a default with another shared key would break the tie between the two tables: not a candidate
    runner.measurer = NoisyRetime(landscape, default, slower=10.0)
    tied = conclude(runner, PROBLEM, M, other, default, shared=shared)
    assert tied.config == other[0] and tied.speedup < 1.0
