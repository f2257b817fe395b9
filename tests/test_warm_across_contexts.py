"""An MLA study is seeded with the best configs of the nearest context already tuned in the run
(KernelSpec.warm_across; tuner/search/warm_start.py study_seeds, tuner/pipeline/studies.py
tuned_shapes), the same batch size first; on a SYNTHETIC landscape (a cost model, labelled so)."""

from __future__ import annotations

import json

from kernels.mla_decode_spec import SPEC as MLA
from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_tuple
from tuner.search.warm_start import NEAR_SHAPE, SHAPE_SEEDS, study_seeds

GPU = get_gpu("H200")
BASE = {"heads": 16, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": 64}


def _cfg(splits: int, block_n: int = 32) -> dict:
    return {"BLOCK_N": block_n, "BLOCK_H": 16, "num_kv_splits": splits, "num_warps": 4, "num_stages": 2,
            "merge_warps": 4}


def _measured(*cfgs_times) -> dict:
    return {config_tuple(MLA, c): t for c, t in cfgs_times}


def test_seeds_come_from_the_nearest_context_at_the_nearest_batch_size():
    near = {**BASE, "context": 1024}
    far = {**BASE, "context": 8192}
    shapes = [(far, {4: _measured((_cfg(64), 1.0))}),
              (near, {1: _measured((_cfg(2), 3.0)),
                      4: _measured((_cfg(8), 1.0), (_cfg(16), 2.0), (_cfg(4), 5.0), (_cfg(1), None))})]
    seeds = study_seeds(None, MLA, {**BASE, "context": 2048}, 4, GPU, 24, {}, shapes=shapes)
    assert [label for label, _ in seeds] == [NEAR_SHAPE] * SHAPE_SEEDS
    # context 1024 (|log2| 1 from 2048, 8192 is 2) at M=4 (not M=1), its best first
    assert [s["num_kv_splits"] for _, s in seeds] == [8, 16]
    assert study_seeds(None, MLA, {**BASE, "context": 2048}, 4, GPU, 24, {}) == []


def test_a_replayed_mla_run_seeds_each_context_from_the_one_tuned_before(tmp_path):
    land = tmp_path / "mla.jsonl.gz"
    common = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
    assert main(["landscape", "synth", "--kernel", "mla", *common, "--contexts", "512", "1024",
                 "--batch-sizes", "1", "--out", str(land)]) == 0
    assert main(["mla", *common, "--replay", str(land), "--contexts", "512", "1024", "--batch-sizes", "1",
                 "--trials", "8", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["warm_start"]["seeds_taken"].get("this run (neighbouring shapes)") == SHAPE_SEEDS
    by_context = {t["problem"]["context"]: t["entries"]["1"] for t in manifest["tables"]}
    assert "this run (neighbouring shapes)" not in by_context[512]["search"].get("seeds", {})
    assert by_context[1024]["search"]["seeds"]["this run (neighbouring shapes)"] == SHAPE_SEEDS


def test_the_plan_says_so_where_there_is_another_context(tmp_path, capsys):
    land = tmp_path / "mla.jsonl.gz"
    common = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
    assert main(["landscape", "synth", "--kernel", "mla", *common, "--contexts", "512", "1024",
                 "--batch-sizes", "1", "--out", str(land)]) == 0
    said = "seeds per study from the nearest context already tuned in this run"
    for contexts, says in ((["512", "1024"], True), (["512"], False)):
        capsys.readouterr()
        assert main(["mla", *common, "--replay", str(land), "--contexts", *contexts, "--batch-sizes", "1",
                     "--out", str(tmp_path / "plan"), "--dry-run"]) == 0
        assert (said in capsys.readouterr().out) is says
