"""Models -> GEMM problems per GPU, and each engine's file-name and lookup rules."""

import json

import pytest
from synthetic import block_fp8_model

from tuner.errors import TunerError
from tuner.plan.engines import ENGINES, lookup_nearest
from tuner.plan.models import gemm_problems, load_model

H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"


def shapes(model, tp):
    return {(p.params["N"], p.params["K"]): p for p in gemm_problems(model, tp)}


def test_deepseek_v3_tp8_shapes_match_the_engines():
    m = load_model("deepseek-v3")
    got = shapes(m, 8)
    assert set(got) == {(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168),
                        (7168, 2304), (512, 7168), (7168, 256)}
    assert got[(7168, 2048)].layers == ("o_proj",)
    # SGLang folds the shared expert into the MoE, so only vLLM runs those GEMMs.
    assert got[(512, 7168)].engines == ("vllm",)
    assert got[(4608, 7168)].engines == ("vllm", "sglang")


@pytest.mark.parametrize("tp,expected", [
    (1, {(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (36864, 7168), (7168, 18432),
         (4096, 7168), (7168, 2048)}),
    (4, {(2112, 7168), (6144, 1536), (8192, 512), (7168, 4096), (9216, 7168), (7168, 4608),
         (1024, 7168), (7168, 512)}),
])
def test_deepseek_v3_shapes_at_other_tp(tp, expected):
    assert set(shapes(load_model("deepseek-v3"), tp)) == expected


def test_same_shapes_merge_layers(tmp_path):
    # o_proj [1024, 8*128] and down_proj [1024, 1024] are one GEMM shape: tuned once.
    f = block_fp8_model(tmp_path / "tiny.yaml", 1024, 8, 1024)
    got = shapes(load_model(str(f)), 1)
    assert got[(1024, 1024)].layers == ("o_proj", "mlp.down_proj")
    assert len(got) == 3


def test_r1_has_v3_shapes():
    assert set(shapes(load_model("deepseek-r1"), 8)) == set(shapes(load_model("deepseek-v3"), 8))


def test_hf_config_json(tmp_path):
    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 14336, "quantization_config": {"weight_block_size": [128, 128]}}
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    assert m.name == "my-model"
    got = shapes(m, 4)
    # qkv: (32/4 + 2*8/4) heads * 128
    assert set(got) == {(1536, 4096), (4096, 1024), (7168, 4096), (4096, 3584)}


@pytest.mark.parametrize("tp,match", [(3, "attention heads"), (32, "weight blocks"), (0, "at least 1")])
def test_bad_tp_is_refused(tp, match):
    with pytest.raises(TunerError, match=match):
        gemm_problems(load_model("deepseek-v3"), tp)


def test_model_errors(tmp_path):
    with pytest.raises(TunerError, match="unknown model"):
        load_model("not-a-model")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TunerError, match="not valid JSON"):
        load_model(str(bad))
    missing = tmp_path / "missing.yaml"
    missing.write_text("hidden_size: 1024\n")
    with pytest.raises(TunerError, match="num_attention_heads"):
        load_model(str(missing))
    not_fp8 = tmp_path / "bf16.yaml"
    not_fp8.write_text("hidden_size: 1024\nnum_attention_heads: 8\nintermediate_size: 4096\n")
    with pytest.raises(TunerError, match="no block-FP8"):
        gemm_problems(load_model(str(not_fp8)), 1)


def test_gemm_file_names_per_engine():
    p = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    assert ENGINES["vllm"].table_relpath("fp8_gemm", p, H200, "3.6.0") == \
        "vllm/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert ENGINES["sglang"].table_relpath("fp8_gemm", p, H100, "3.6.0") == \
        "sglang/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"


def test_moe_file_names_per_engine():
    p = {"E": 257, "N": 256, "dtype": "fp8_w8a8", "block_shape": [128, 128]}
    assert ENGINES["sglang"].table_relpath("fused_moe", p, H200, "3.6.0+git") == \
        "sglang/fused_moe/configs/triton_3_6_0/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert ENGINES["sglang"].moe_filename(257, 256, H200, "fp8_w8a8", [128, 128], down=True).endswith(
        "block_shape=[128, 128]_down.json")
    assert ENGINES["vllm"].moe_filename(8, 14336, H100, None) == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"


def test_device_names():
    assert ENGINES["vllm"].device_name("NVIDIA H200 NVL") == "NVIDIA_H200"
    assert ENGINES["sglang"].device_name("NVIDIA H200 NVL") == "NVIDIA_H200_NVL"
    assert ENGINES["vllm"].device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"


def test_our_names_match_the_shipped_tables(shared_dir):
    shipped = {p.name for p in (shared_dir / "baselines").rglob("*.json")}
    p = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    for engine in ("vllm", "sglang"):
        name = ENGINES[engine].gemm_filename(p["N"], p["K"], H200, p["block_shape"])
        assert name in shipped


def test_lookup_nearest_like_the_engines():
    table = {"1": "a", "16": "b", "64": "c"}
    assert lookup_nearest(table, 1) == "a"
    assert lookup_nearest(table, 40) == "b"      # 40 is 24 from 16 and 24 from 64: the earlier key
    assert lookup_nearest(table, 41) == "c"
    assert lookup_nearest(table, 10_000) == "c"
    assert lookup_nearest({"triton_version": "3.1", "8": "x"}, 3) == "x"


def test_whose_table_a_file_is_follows_what_each_loader_asks_for(tmp_path):
    """tuner/plan/table_files.py reads a table's engine off its name and folder: a name only one
    engine's loader asks for (block_shape=[128,128] vs [128, 128], a _down table) is that engine's
    wherever it lies; a name both ask for (no block_shape) is SGLang's in a triton_X_Y_Z folder,
    vLLM's elsewhere (a folder merely named triton_something included)."""
    from tuner.plan.models import load_model
    from tuner.plan.table_files import parse_table_file
    model = load_model("deepseek-v3")
    entry = '{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, ' \
            '"num_warps": 4, "num_stages": 3}}'
    cases = {("triton_3_6_0", "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"): "vllm",
             ("triton_3_6_0", "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"): "sglang",
             ("configs", "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"): "sglang",
             ("triton_3_6_0", "E=64,N=1408,device_name=NVIDIA_H200.json"): "sglang",
             ("triton_runs", "E=64,N=1408,device_name=NVIDIA_H200.json"): "vllm",
             ("configs", "E=64,N=1408,device_name=NVIDIA_H200.json"): "vllm",
             ("triton_3_6_0", "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"): "vllm",
             ("configs", "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"): "sglang"}
    for (folder, name), engine in cases.items():
        path = tmp_path / folder / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(entry)
        [t] = parse_table_file(path, model)
        assert t.engine == engine, (folder, name)
