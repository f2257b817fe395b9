"""`tuner moe`: E/N and file names per engine, and a replay run over a SYNTHETIC landscape."""

import json

import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.errors import TunerError
from tuner.plan.engines import ENGINES
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import load_model, moe_problems
from tuner.plan.space import load_space

KERNEL = get_kernel("fused_moe")
H200 = "NVIDIA H200"


def files(problems):
    return {ENGINES[p.engines[0]].table_relpath("fused_moe", p.params, H200, "3.6.0") for p in problems}


@pytest.mark.parametrize("tp,ep,vllm,sglang", [
    (8, 1, "E=256,N=256", "E=257,N=256"),
    (4, 1, "E=256,N=512", "E=257,N=512"),
    (8, 8, "E=32,N=2048", "E=32,N=2048"),        # SGLang fuses the shared expert only at EP 1
])
def test_deepseek_v3_experts_per_engine(tp, ep, vllm, sglang):
    got = files(moe_problems(load_model("deepseek-v3"), tp, ep, "fp8_w8a8"))
    assert got == {
        f"vllm/fused_moe/{vllm},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        f"sglang/fused_moe/configs/triton_3_6_0/{sglang},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
        f"sglang/fused_moe/configs/triton_3_6_0/{sglang},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
    }


def test_other_models():
    kimi = moe_problems(load_model("kimi-k2"), 8, 1, "fp8_w8a8")
    # SGLang 0.5.23 fuses the shared expert for 256 routed experts only (384: Quark checkpoints)
    assert {(p.params["E"], p.params["N"], p.params["topk"]) for p in kimi} == {(384, 256, 8)}
    mixtral = moe_problems(load_model("mixtral-8x7b"), 2, 1, "bf16")
    assert "vllm/fused_moe/E=8,N=7168,device_name=NVIDIA_H200.json" in files(mixtral)
    qwen = moe_problems(load_model("qwen3-235b-a22b-fp8"), 4, 1, "fp8_w8a8")
    assert {(p.params["E"], p.params["N"]) for p in qwen} == {(128, 384)}   # no shared expert to fold
    with pytest.raises(TunerError, match="192 wide"):
        moe_problems(load_model("qwen3-235b-a22b-fp8"), 8, 1, "fp8_w8a8")
    with pytest.raises(TunerError, match="no routed experts"):
        moe_problems(load_model(str(_dense_model())), 1, 1, "fp8_w8a8")
    # fp8 on a bf16 checkpoint: per-tensor scales, no block_shape in the name
    per_tensor = moe_problems(load_model("mixtral-8x7b"), 2, 1, "fp8_w8a8", engines=("vllm",))
    assert files(per_tensor) == {"vllm/fused_moe/E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"}


def _dense_model():
    import tempfile
    from pathlib import Path
    f = Path(tempfile.mkdtemp()) / "dense.yaml"
    f.write_text("hidden_size: 1024\nnum_attention_heads: 8\nintermediate_size: 4096\n")
    return f


MS = [1, 16, 256]


@pytest.fixture(scope="module")
def moe_landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "moe.jsonl.gz"
    problems = [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8")]
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), problems, MS)
    return path


def test_replay_writes_both_engines_and_ties_block_m(moe_landscape, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--tp", "8",
               "--replay", str(moe_landscape), "--out", str(out), "--trials", "20",
               "--batch-sizes", *map(str, MS)])
    assert rc == 0, capsys.readouterr().err
    base = "device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape="
    vllm = json.loads((out / f"vllm/fused_moe/E=256,N=256,{base}[128,128].json").read_text())
    import triton
    folder = out / "sglang/fused_moe/configs" / ("triton_" + triton.__version__.replace(".", "_"))   # the running Triton
    up = json.loads((folder / f"E=257,N=256,{base}[128, 128].json").read_text())
    down = json.loads((folder / f"E=257,N=256,{base}[128, 128]_down.json").read_text())
    for table in (vllm, up, down):
        assert list(table) == [str(m) for m in MS]
        assert all(list(cfg) == list(KERNEL.config_keys) for cfg in table.values())
    for m in map(str, MS):
        assert down[m]["BLOCK_SIZE_M"] == up[m]["BLOCK_SIZE_M"]
    manifest = json.loads((out / "manifest.json").read_text())
    how = {t["problem"]["part"]: t["how"] for t in manifest["tables"]}
    assert "as vLLM applies its table" in how["op"]
    assert "shared with the up table" in how["down"]
    compared = 0
    for t in manifest["tables"]:
        for e in t["entries"].values():
            if e["default_time_us"] is not None:     # None: the default itself failed (synthetic)
                assert e["time_us"] <= e["default_time_us"]
                compared += 1
    assert compared >= 7


def test_tied_tables_choose_among_equal_times(moe_landscape, tmp_path, capsys):
    """Configs of the same time (a flat landscape) are ranked by time alone: the choice of
    SGLang's shared BLOCK_SIZE_M never compares two configs (it raised TypeError on dicts)."""
    from synthetic import scaled_landscape
    flat = tmp_path / "flat.jsonl"
    scaled_landscape(moe_landscape, flat, KERNEL, 1.0)
    lines = flat.read_text().splitlines()
    flat.write_text("\n".join([lines[0], *(json.dumps({**rec, "time_us": 10.0} if "time_us" in rec else rec)
                                           for rec in map(json.loads, lines[1:]))]) + "\n")
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--engines", "sglang",
                 "--replay", str(flat), "--out", str(out), "--trials", "6", "--batch-sizes", "16", "--quiet"]) == 0, \
        capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert {t["problem"]["part"] for t in manifest["tables"]} == {"up", "down"}
