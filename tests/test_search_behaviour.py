"""How the search treats its trials (tuner/search/runner.py, tuner/search/surrogate.py), over a SYNTHETIC
landscape in an in-memory storage: repeats told their value, the parameter encoding and
older studies, batches sized by the compile workers, the Gaussian-process sampler's picks,
and the SQLite storage's journal. The search's merit is judged on real landscapes
(tests/test_search_real.py, scripts/search_benchmark.py), not here."""

import sqlite3

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.errors import TunerError
from tuner.measure.landscape import read_landscape
from tuner.measure.measurers import ReplayMeasurer
from tuner.pipeline.planning import load_common
from tuner.pipeline.request import TuneRequest
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import SearchSettings, StudyRunner, default_settings, make_sampler, study_name
from tuner.search.storage import open_storage
from tuner.search.study_match import ENCODING

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), GPU, [P], [1, 16])
    return ReplayMeasurer(read_landscape(path, KERNEL))


def run(replay, storage, M=1, **settings):
    runner = StudyRunner(KERNEL, load_space(KERNEL), GPU, replay, storage, SearchSettings(**settings))
    result = runner.tune(Problem("fp8_gemm", P), M, [("default", KERNEL.default_config(P, M))])
    return result, optuna.load_study(study_name=study_name(Problem("fp8_gemm", P), M), storage=storage)


def test_a_repeat_is_told_its_measured_value_and_costs_no_budget(replay):
    # TPE over M=1's small grid proposes measured configs again; each such trial must carry
    # the value measured before (not PRUNED: TPE would read that as a bad config).
    result, study = run(replay, optuna.storages.InMemoryStorage(), sampler="tpe", budget=24, patience=1000, batch=1)
    measured = {tuple(t.user_attrs["config"].values()): t.value for t in study.trials
                if "config" in t.user_attrs and t.state == optuna.trial.TrialState.COMPLETE}
    repeats = [t for t in study.trials if "repeat" in t.user_attrs]
    assert repeats, "the sampler proposed no repeat: the test shows nothing"
    for t in repeats:
        assert "config" not in t.user_attrs                      # never counted as a measurement
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert t.value == measured[tuple(t.user_attrs["repeat"].values())]
    assert not [t for t in study.trials if t.user_attrs.get("pruned") == "repeat"]
    assert result.trials == 24 == len(measured) + sum(
        t.state == optuna.trial.TrialState.FAIL and "error" in t.user_attrs for t in study.trials)


def test_parameters_are_categorical_values_and_the_encoding_is_stored(replay):
    _, study = run(replay, optuna.storages.InMemoryStorage(), sampler="tpe", budget=6, batch=1)
    assert study.user_attrs["encoding"] == ENCODING
    t = next(t for t in study.trials if "config" in t.user_attrs)
    assert t.params == t.user_attrs["config"]
    assert all(isinstance(d, optuna.distributions.CategoricalDistribution) for d in t.distributions.values())


def test_a_study_stored_with_the_older_index_encoding_is_refused_in_one_line(replay):
    storage = optuna.storages.InMemoryStorage()
    old = optuna.create_study(study_name=study_name(Problem("fp8_gemm", P), 1), storage=storage)
    old.set_user_attr("choices", {k: [1, 2] for k in KERNEL.config_keys})   # no "encoding": indices
    with pytest.raises(TunerError) as e:
        run(replay, storage, budget=6)
    assert "older tuner that encoded configs as indices" in str(e.value) and "\n" not in str(e.value)


def test_the_gp_sampler_measures_distinct_candidates_only(replay):
    storage = optuna.storages.InMemoryStorage()
    result, study = run(replay, storage, M=16, sampler="gp", budget=30, patience=1000, batch=1, seed=3)
    configs = [tuple(t.user_attrs["config"].values()) for t in study.trials if "config" in t.user_attrs]
    allowed = replay.candidates(Problem("fp8_gemm", P), 16)
    assert len(configs) == len(set(configs)) == 30 == result.trials
    assert set(configs) <= allowed
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]   # nothing wasted
    # the same seed, the same search
    _, again = run(replay, optuna.storages.InMemoryStorage(), M=16, sampler="gp", budget=30, patience=1000,
                   batch=1, seed=3)
    assert [tuple(t.user_attrs["config"].values()) for t in again.trials if "config" in t.user_attrs] == configs


def test_the_gp_sampler_spreads_a_batch_over_distinct_configs(replay):
    _, study = run(replay, optuna.storages.InMemoryStorage(), M=16, sampler="gp", budget=24, patience=1000, batch=8)
    configs = [tuple(t.user_attrs["config"].values()) for t in study.trials if "config" in t.user_attrs]
    assert len(configs) == len(set(configs)) == 24


def test_batches_follow_the_compile_workers_and_a_replay_compiles_nothing(tmp_path):
    assert default_settings(48).batch == 1
    assert default_settings(48, parallel=16).batch == 8 and default_settings(48, parallel=3).batch == 3
    assert not make_sampler(SearchSettings(sampler="tpe", batch=1))._constant_liar
    assert make_sampler(SearchSettings(sampler="tpe", batch=8))._constant_liar
    common = dict(command="gemm", model="deepseek-v3", gpu="H200", compile_workers=16)
    (tmp_path / "land.jsonl").write_text("")
    assert load_common(TuneRequest(**common, replay=str(tmp_path / "land.jsonl")))[2].batch == 1
    assert load_common(TuneRequest(**common))[2].batch == 8


def test_sqlite_storage_keeps_a_write_ahead_log_synced_at_checkpoints(tmp_path):
    path = tmp_path / "studies.db"
    storage = open_storage(f"sqlite:///{path}")
    optuna.create_study(study_name="s", storage=storage).enqueue_trial({"x": 1})
    with storage.engine.connect() as conn:
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    assert sync == 1                                           # NORMAL: no fsync per commit
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_moe_group_sizes_at_or_above_the_programs_along_m_are_folded():
    """Our fused MoE: the programs along M are the aligned rows over BLOCK_SIZE_M (as
    moe_align_block_size sizes them); GROUP_SIZE_M values at or above that count walk the
    programs alike, so the space keeps the smallest (M=1, top-8: 8 programs, 16 stands
    for 16, 32 and 64)."""
    import torch

    from kernels.fused_moe import m_tiles, moe_align_block_size
    kernel = get_kernel("fused_moe")
    params = {"E": 256, "N": 256, "K": 7168, "topk": 8, "shared_experts": 0, "dtype": "fp8_w8a8",
              "block_shape": [128, 128], "part": "op", "routing": "uniform"}
    for M in (1, 3, 40):
        ids = torch.randint(0, 256, (M, 8), dtype=torch.int32)
        for bm in (16, 64):
            sorted_ids = moe_align_block_size(ids, bm, 256)[0]
            assert m_tiles(params, M, {"BLOCK_SIZE_M": bm}) == -(-sorted_ids.shape[0] // bm)
    space = load_space(kernel)
    groups = {c["GROUP_SIZE_M"] for c in space.configs(params, 1, GPU)}
    assert groups == {1, 16}
    assert space.canonical(params, 1, GPU, {**kernel.default_config(params, 1), "GROUP_SIZE_M": 64})["GROUP_SIZE_M"] == 16
    assert {c["GROUP_SIZE_M"] for c in space.configs(params, 64, GPU)} == {1, 16, 32, 64}
