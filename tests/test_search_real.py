"""The search judged on a REAL landscape: CLBlast's Xgemm brute-forced on an RTX 3090 by
kernel_tuner and published (AutoTuningAssociation/benchmark_hub, MIT; origin in the
landscape's header), its 6-parameter slice (841 configs) converted by
`scripts/search_benchmark.py convert`. Data of another project is not committed here: the
test reads it from ../shared/landscapes/real beside the checkout (or $TUNER_REAL_LANDSCAPES)
and skips, saying why, where it is absent."""

import os
import statistics
from pathlib import Path

import pytest

from tuner.measure.landscape import read_header, read_landscape
from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space
from tuner.search.offline import benchmark_traces
from tuner.search.runner import default_settings

NAME = "xgemm-rtx3090-6p.jsonl.gz"
DIRS = ([Path(os.environ["TUNER_REAL_LANDSCAPES"])] if os.environ.get("TUNER_REAL_LANDSCAPES") else []) + \
    [Path(__file__).resolve().parents[2] / "shared" / "landscapes" / "real"]
PATH = next((d / NAME for d in DIRS if (d / NAME).is_file()), None)
pytestmark = [pytest.mark.ci_variables, pytest.mark.skipif(
    PATH is None, reason=f"{NAME} is not in {' or '.join(map(str, DIRS))} (make it with `python "
    "scripts/search_benchmark.py convert`)")]
BUDGET, SEEDS = 32, range(8)


@pytest.fixture(scope="module")
def land():
    header = read_header(PATH)
    kernel = landscape_kernel(header)
    assert header["measured_on_gpu"] and "synthetic" not in header
    assert header["origin"]["repository"].endswith("benchmark_hub")
    return read_landscape(PATH, kernel), landscape_space(kernel, header), landscape_gpu(header)


def mean_ratio(land, variant, settings_for=None):
    """The mean, over the seeds, of the run's ratio to the landscape's best averaged over
    trials 8 to 32: how close the search is, and how soon (sturdier than one checkpoint)."""
    landscape, space, gpu = land
    traces = benchmark_traces(landscape, space, gpu, variant, SEEDS, BUDGET, settings_for)
    assert len(traces) == len(SEEDS)
    return statistics.fmean(statistics.fmean(t.ratio_at(n) for n in range(8, BUDGET + 1)) for t in traces), traces


def test_the_default_search_beats_random_and_plain_tpe_on_a_real_gemm_landscape(land):
    ours, traces = mean_ratio(land, "ours:default",
                              lambda budget, seed: (default_settings(budget, seed=seed), True))
    assert all(len(t.times) <= BUDGET and t.times for t in traces)
    assert len({tuple(t.times) for t in traces}) > 1                   # the seeds give other runs
    random, _ = mean_ratio(land, "random")
    plain, _ = mean_ratio(land, "plain-tpe")
    assert ours < random and ours < plain, (ours, random, plain)
    assert statistics.fmean(t.ratio_at(BUDGET) for t in traces) <= 1.05
