"""Compile ahead (tuner/search/ahead.py): while a batch is timed, the compile workers build the
study's seeds not measured yet, then the next studies' sure configs, then the candidates the cost
model ranks fastest among those nobody measured or holds; a study's own leave the list when it
begins. And the study runner hands them to a measurer that can build ahead."""

import pytest

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_dict, config_tuple
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.space import load_space
from tuner.search.ahead import CompileAhead
from tuner.search.prior import estimates

GPU = get_gpu("H200")


def _gemm():
    kernel = get_kernel("fp8_gemm")
    problem = next(p for p in gemm_problems(load_model("deepseek-v3"), 8) if p.key.startswith("N=7168,K=2048,"))
    allowed = {config_tuple(kernel, c) for c in load_space(kernel).configs(problem.params, 16, GPU)}
    return kernel, problem, allowed


def test_the_jobs_ahead_are_the_seeds_then_the_cost_models_order_then_the_next_studies():
    kernel, problem, allowed = _gemm()
    est = estimates(kernel, GPU, problem.params, 16, allowed)
    order = sorted(est, key=lambda t: (est[t], t))
    ahead = CompileAhead(kernel, GPU)
    other = next(p for p in gemm_problems(load_model("deepseek-v3"), 8) if p is not problem)
    later = [(other, 1, kernel.default_config(other.params, 1)), (problem, 16, kernel.default_config(problem.params, 16))]
    ahead.upcoming = list(later)
    seed = config_dict(kernel, order[10])
    batch = [config_dict(kernel, order[0])]
    measured = {order[1]: 10.0, config_tuple(kernel, seed): None}
    jobs = ahead.jobs(problem, 16, allowed, [("default", seed), ("baseline", config_dict(kernel, order[2]))],
                      measured, {order[3]: 7}, batch, 4)
    # this study's seed not measured yet, the next studies' sure configs (not this study's own), then the
    # cost model's order; the seed measured already, the batch's, the measured and the held ones skipped
    assert [config_tuple(kernel, c) for _, _, c in jobs[:1]] == [order[2]]
    assert jobs[1:2] == later[:1]
    assert [config_tuple(kernel, c) for _, _, c in jobs[2:]] == [order[4], order[5], order[6], order[7]]
    ahead.studied(other, 1)
    assert ahead.upcoming == later[1:]
    # the rows a study's close times against its winner (the engine's today) are built with its seeds
    ahead.studied(problem, 16, [config_dict(kernel, order[9])])
    jobs = ahead.jobs(problem, 16, allowed, [], {}, {}, batch, 0)
    assert [config_tuple(kernel, c) for _, _, c in jobs] == [order[9]] and ahead.upcoming == []


def test_the_runner_hands_the_jobs_to_a_measurer_that_builds_ahead(tmp_path):
    """A replay measurer that says it builds ahead: before each batch it is told this study's
    likely next configs, none of them the batch's or measured."""
    from tuner.measure.measurers import Measurement
    from tuner.search.runner import StudyRunner
    from tuner.search.settings import default_settings
    from tuner.search.storage import open_journal
    kernel, problem, allowed = _gemm()
    est = estimates(kernel, GPU, problem.params, 16, allowed)

    class Measurer:
        label = "gpu"
        told: list = []
        asked: list = []

        def environment(self):
            return {"device": "NVIDIA H200", "device_kind": "cuda", "timing": "graph", "code_version": "x"}

        def candidates(self, problem, M):
            return None

        def compile_ahead(self, jobs):
            self.told.append([config_tuple(kernel, c) for _, _, c in jobs])

        def measure(self, problem, M, configs):
            self.asked.append([config_tuple(kernel, c) for c in configs])
            return [Measurement(est.get(config_tuple(kernel, c), 50.0), 0.01, None) for c in configs]

        def check_numerics(self, problem, M, config, seed=None):
            from tuner.measure.measurers import NumericsCheck
            return NumericsCheck("passed", 0.0, "")

        def close(self):
            pass

    m = Measurer()
    settings = default_settings(12, parallel=4, patience=12)   # the whole budget: batches, not the stop, are tested
    runner = StudyRunner(kernel, load_space(kernel), GPU, m, open_journal(tmp_path / "s.journal"), settings)
    runner.tune(problem, 16, [("default", kernel.default_config(problem.params, 16))])
    search = m.asked[:len(m.told)]
    assert len(m.told) >= 3 and all(len(t) >= 4 for t in m.told)
    for k, (told, batch) in enumerate(zip(m.told, search)):
        before = {t for b in search[:k + 1] for t in b}
        assert not set(told) & before                              # never what is measured or in the batch


def test_a_studys_sure_configs_are_what_it_times_first(tmp_path):
    """What the pipeline hands out ahead for a study to come (runner.sure_configs: its default and
    seeds, as pinned, and the cost model's first) is what that study then times in its first batches."""
    from tuner.measure.measurers import Measurement, NumericsCheck
    from tuner.search.runner import StudyRunner
    from tuner.search.settings import default_settings
    from tuner.search.storage import open_journal
    kernel, problem, allowed = _gemm()

    class Measurer:
        label = "gpu"
        asked: list = []

        def environment(self):
            return {"device": "NVIDIA H200", "device_kind": "cuda", "timing": "graph", "code_version": "x"}

        def candidates(self, problem, M):
            return None

        def measure(self, problem, M, configs):
            self.asked.append([config_tuple(kernel, c) for c in configs])
            return [Measurement(10.0 + len(self.asked), 0.01, None) for c in configs]

        def check_numerics(self, problem, M, config, seed=None):
            return NumericsCheck("passed", 0.0, "")

        def close(self):
            pass

    m = Measurer()
    runner = StudyRunner(kernel, load_space(kernel), GPU, m, open_journal(tmp_path / "s.journal"),
                         default_settings(12, parallel=8))
    sure = [config_tuple(kernel, c) for c in runner.sure_configs(problem, 16, [])]
    assert len(sure) == 7                                           # the default and the cost model's 6
    runner.tune(problem, 16, [("default", kernel.default_config(problem.params, 16))])
    assert set(sure) <= set(m.asked[0])                             # the first batch, whole


# triton_incidental: which worker builds what, and when; compiling for sm_90 under the newest Triton is
# test_compile_workers' and test_moe_precisions_cpu's
@pytest.mark.triton
@pytest.mark.triton_incidental
def test_the_measuring_child_builds_ahead_with_its_idle_workers_and_waits_for_them_when_asked():
    """On the CPU device, through the isolated child and its compile workers (compiling for
    sm_90): 3 workers, batches of one config; the config handed out ahead is built by an idle
    worker and, asked next, waited for (not built again)."""
    from tuner.measure.device import require
    from tuner.measure.isolation import isolated_gpu_measurer
    require("cpu", GPU, "a test")
    kernel = get_kernel("fp8_gemm")
    problem = next(p for p in gemm_problems(load_model("configs/examples/small-moe.json"), 1)
                   if p.key.startswith("N=256,K=256,"))
    space = [c for c in load_space(kernel).configs(problem.params, 1, GPU)]
    first, second = space[0], space[1]
    m = isolated_gpu_measurer(kernel, "H200", 3, 300, device="cpu")
    try:
        m.compile_ahead([(problem, 1, second)])
        assert m.measure(problem, 1, [first])[0].time_us
        assert m.measure(problem, 1, [second])[0].time_us
        compiles = m.environment()["compiles"]
    finally:
        m.close()
    assert compiles["ahead"] == 1 and compiles["ahead_used"] == 1 and compiles["built"] == 2, compiles
    assert compiles["wait_s"] >= 0
