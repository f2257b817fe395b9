"""The search judged on a REAL landscape that every CI run has: kernel_tuner's complete cache
of a 2D convolution (4096^2 image, 15x15 filter) brute-forced on an RTX 2080 Ti, 6768
configs, 6 parameters, published inside the source distribution of autotuning_methodology
1.1.0 on PyPI (MIT). Data of another project is not committed here: `.ci/run` downloads the
sdist into a cache folder and exports TUNER_REAL_SDISTS; `scripts/search_benchmark.py`
converts it (origin in the header). Without TUNER_REAL_SDISTS these tests skip, saying why."""

import importlib.util
import os
import statistics
import sys
from pathlib import Path

import pytest

from tuner.measure.landscape import read_header, read_landscape
from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space
from tuner.search.offline import benchmark_traces
from tuner.search.runner import default_settings

REPO = Path(__file__).resolve().parents[1]
NAME = "convolution-rtx2080ti"
SDISTS = os.environ.get("TUNER_REAL_SDISTS")
pytestmark = [pytest.mark.ci_variables, pytest.mark.skipif(
    not SDISTS, reason="TUNER_REAL_SDISTS is not set (.ci/run downloads autotuning_methodology==1.1.0's sdist, "
    "which holds the landscape, into a cache folder and sets it)")]
BUDGET, SEEDS = 48, range(8)       # the GEMM default budget; 8 seeds: about 15-30 s on 2 shared cores


def _bench():
    if "search_benchmark" in sys.modules:
        return sys.modules["search_benchmark"]
    spec = importlib.util.spec_from_file_location("search_benchmark", REPO / "scripts" / "search_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    bench = _bench()
    # the sdist must be there (downloading is .ci/run's job, not a test's); its sha256 is checked
    return bench.convert_one(NAME, None, tmp_path_factory.mktemp("real"), sdists=Path(SDISTS))


def test_the_published_cache_becomes_a_landscape_that_says_where_it_came_from(path):
    header = read_header(path)
    assert header["measured_on_gpu"] and "synthetic" not in header
    assert header["device"] == "NVIDIA GeForce RTX 2080 Ti"
    origin = header["origin"]
    assert origin["repository"] == "https://pypi.org/project/autotuning-methodology/1.1.0/"
    assert origin["path"].endswith("integration/mockfiles/mock_gpu.json") and len(origin["commit"]) == 64
    assert origin["license"].startswith("MIT") and origin["fixed"] == {"filter_height": 15, "filter_width": 15}
    assert header["config_keys"] == ["block_size_x", "block_size_y", "read_only", "tile_size_x", "tile_size_y",
                                     "use_padding"]
    kernel = landscape_kernel(header)
    land = read_landscape(path, kernel)
    params = next(iter(land.problems.values()))
    points = land.lookup(params, 4096)                  # M: the image's first dimension
    assert len(land.points) == 1 and len(points) == 6768
    # one entry of the published file, ms there, us here
    assert points[(2, 32, 0, 1, 1, 1)].time_us == round(2.8577247858047485 * 1000, 4)
    times = sorted(p.time_us for p in points.values() if p.time_us is not None)
    assert len(times) == 5256 and times[-1] / times[0] > 10     # the configs it timed: a landscape, not a plateau
    assert all(p.error and p.kind for p in points.values() if p.time_us is None)   # the rest failed, with why
    assert kernel.default_config(params, 4096) == header["default_config"]


def _mean_ratio(land, variant, settings_for=None):
    """Over the seeds: the run's ratio to the landscape's best averaged over trials 8 to 48
    (how close, and how soon), and the ratio at 48."""
    landscape, space, gpu = land
    traces = benchmark_traces(landscape, space, gpu, variant, SEEDS, BUDGET, settings_for)
    assert len(traces) == len(SEEDS) and all(0 < len(t.times) <= BUDGET for t in traces)
    return (statistics.fmean(statistics.fmean(t.ratio_at(n) for n in range(8, BUDGET + 1)) for t in traces),
            statistics.fmean(t.ratio_at(BUDGET) for t in traces), traces)


def test_the_default_search_beats_random_and_plain_tpe_on_a_real_convolution_landscape(path):
    header = read_header(path)
    kernel = landscape_kernel(header)
    land = (read_landscape(path, kernel), landscape_space(kernel, header), landscape_gpu(header))
    ours, ours_at_48, traces = _mean_ratio(land, "ours:default",
                                           lambda budget, seed: (default_settings(budget, seed=seed), True))
    assert len({tuple(t.times) for t in traces}) > 1                    # the seeds give other runs
    random, random_at_48, _ = _mean_ratio(land, "random")
    plain, _, _ = _mean_ratio(land, "plain-tpe")
    # measured (8 seeds): ours 1.18, random 1.36, plain TPE 1.40 over trials 8-48 (before issue 32's
    # changes to the model: ours 1.20)
    assert ours < random and ours < plain, (ours, random, plain)
    # at 48 itself, ours beats random by far (1.08 against 1.22 over these seeds); its lead
    # over plain TPE there is small next to the spread of 8 seeds (40 seeds: ours 1.085,
    # plain TPE 1.111, random 1.268; bench/results/search/convolution-rtx2080ti.md), so
    # ours against plain TPE at 48 alone is not asserted here
    assert ours_at_48 < random_at_48, (ours_at_48, random_at_48)
