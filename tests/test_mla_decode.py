"""MLA decode: numerics in the interpreter, the table lookup, and `tuner mla` over a
SYNTHETIC landscape."""

import json

import pytest
import torch
from synthetic import write_synthetic_landscape

from kernels import mla_decode as md
from tuner.cli import main
from tuner.measure.numerics import relative_error
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import load_model, mla_problems
from tuner.plan.space import load_space

pytestmark = pytest.mark.triton         # runs Triton kernels (tests/conftest.py)


def cfg(bn=32, bh=16, splits=4, warps=4, stages=2, merge=4):
    return {"BLOCK_N": bn, "BLOCK_H": bh, "num_kv_splits": splits, "num_warps": warps, "num_stages": stages,
            "merge_warps": merge}


@pytest.mark.parametrize("page_size,lens,config", [
    (1, [1, 37, 64], cfg(32, 16, 4)),          # page size 1; a 1-token request; 37 not a multiple of 32
    (16, [33, 100], cfg(16, 16, 8)),
    (64, [1, 200, 70], cfg(64, 16, 2)),
    (16, [5, 9], cfg(32, 16, 16)),             # 16 splits of a 5-token request: most are empty
    (64, [130], cfg(32, 16, 1)),               # one split: no merge work to speak of
])
def test_decode_matches_reference(page_size, lens, config):
    p = {"heads": 16, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": page_size, "context": 64,
         "seq_lens": lens}
    inputs = md.make_inputs(p, len(lens), "cpu", seed=page_size + len(lens))
    pages = inputs["block_table"].flatten()
    if pages.numel() > 4:   # pages really are scattered: not in ascending order
        assert not torch.equal(pages.sort().values, pages)
    inputs["out"].fill_(float("nan"))
    out = md.run(inputs, config)
    assert not torch.isnan(out).any()
    ref = md.reference(inputs)
    err = relative_error(out, ref)
    assert err < md.KERNEL.tolerance, err


def test_fewer_heads_than_the_head_block():
    p = {"heads": 8, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": 16, "context": 40, "seq_lens": [40, 17]}
    inputs = md.make_inputs(p, 2, "cpu", seed=2)
    out = md.run(inputs, cfg(32, 16, 2))
    assert relative_error(out, md.reference(inputs)) < 1e-2


TABLE = {"format": md.TABLE_FORMAT, "configs": {
    "1024": {"1": cfg(splits=1), "64": cfg(splits=2)},
    "8192": {"1": cfg(splits=8), "64": cfg(splits=16)},
    "65536": {"1": cfg(splits=64), "64": cfg(splits=32)}}}


@pytest.mark.parametrize("batch,context,splits", [
    (1, 1000, 1), (40, 1024, 2), (32, 1024, 1),     # 32 is 31 from 1 and 32 from 64
    (2, 6000, 8), (100, 40000, 32), (1, 10 ** 6, 64), (1, 4608, 1),   # 4608: equidistant -> smaller bucket
])
def test_lookup_picks_the_nearest_bucket(batch, context, splits):
    assert md.lookup(TABLE, batch, context)["num_kv_splits"] == splits


def test_find_table_by_device_and_folder(tmp_path, monkeypatch):
    name = md.table_filename(16, 64, "NVIDIA H200")
    assert name == "heads=16,kv_lora_rank=512,qk_rope_dim=64,page_size=64,device_name=NVIDIA_H200.json"
    (tmp_path / name).write_text(json.dumps(TABLE))
    monkeypatch.setenv("TUNER_MLA_CONFIG_DIR", str(tmp_path))
    assert md.find_table(16, 64, "NVIDIA H200") == TABLE
    assert md.find_table(16, 16, "NVIDIA H200") is None
    assert md.find_table(16, 64, None) is None


def test_problems_from_the_model():
    problems, skipped = mla_problems(load_model("deepseek-v3"), 8, [4096, 32768, 10 ** 6], 64)
    assert [p.params["heads"] for p in problems] == [16, 16]
    assert [p.params["context"] for p in problems] == [4096, 32768] and skipped == [10 ** 6]


def test_tune_mla_over_a_replay(tmp_path, capsys):
    kernel = get_kernel("mla_decode")
    problems, _ = mla_problems(load_model("deepseek-v3"), 8, [4096, 32768], 64)
    land = tmp_path / "mla.jsonl"
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"), [p.params for p in problems],
                              [1, 64])
    out = tmp_path / "out"
    assert main(["mla", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--contexts", "4096", "32768",
                 "--batch-sizes", "1", "64", "--replay", str(land), "--out", str(out), "--trials", "16"]) == 0
    printed = capsys.readouterr().out
    assert "--triton-attention-num-kv-splits" in printed
    table = json.loads((out / "tuner/mla_decode" / md.table_filename(16, 64, "NVIDIA H200")).read_text())
    assert table["format"] == md.TABLE_FORMAT and table["heads"] == 16
    assert list(table["configs"]) == ["4096", "32768"]
    assert all(list(row) == ["1", "64"] for row in table["configs"].values())
    assert list(md.lookup(table, 64, 30000)) == list(md.CONFIG_KEYS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["tables"]) == 2 and all(t["files"]["tuner"] for t in manifest["tables"])
