"""Issue 52: `tuner moe` tunes each integer precision on each engine's own kernel on the CPU device
(the GPU's code path, its isolated measuring child, Triton's interpreter), planned from a tiny
model's quantization_config, with the numerics of every row checked against the float64
reference; and the engines' new jit kernels (the group-wise one, the INT8 paths of the other)
compile for sm_90, as a GPU run's compile workers build them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_loaders import wheel_dir

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

REPO = Path(__file__).resolve().parents[1]
# a tiny MoE (configs/examples/small-moe.json's idea, smaller): 4 experts of 64, hidden 128, top-2
TINY = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128, "num_attention_heads": 2, "head_dim": 64,
        "num_experts": 4, "moe_intermediate_size": 64, "num_experts_per_tok": 2}
CASES = {
    # checkpoint -> {engine: the table it writes}
    "int8-channel": ({"quant_method": "w8a8_int8"}, None,
                     {"vllm": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3.json",
                      "sglang": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a8,per_channel_quant=True.json"}),
    "int8-block": ({"quant_method": "blockwise_int8", "weight_block_size": [128, 128]}, None,
                   {"sglang": "E=4,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a8,block_shape=[128, 128].json"}),
    "int8-w8a16-channel": (None, "int8_w8a16", {"vllm": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json"}),
    "int8-w8a16-group": ({"quant_method": "gptq", "bits": 8, "group_size": 32, "sym": False}, None,
                         {"vllm": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json",
                          "sglang": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json"}),
    "int4-awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}, None,
                 {"vllm": "E=4,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=int4_w4a16.json",
                  "sglang": "E=4,N=32,device_name=NVIDIA_H100_80GB_HBM3,dtype=int4_w4a16.json"}),
}


def tuner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


# triton_incidental: the run's path per precision (plan, measuring child, files, install); the same kernels'
# launches and numerics under the newest Triton are test_moe_precision_kernels', their compile below
@pytest.mark.triton_incidental
@pytest.mark.parametrize("case", list(CASES))
def test_the_cpu_device_tunes_each_precision_on_each_engines_kernel(case, tmp_path):
    qc, dtype, files = CASES[case]
    model = tmp_path / "config.json"
    blocks = {"hidden_size": 256, "moe_intermediate_size": 128} if case == "int8-block" else {}   # whole 128 blocks
    model.write_text(json.dumps({**TINY, **blocks, **({"quantization_config": qc} if qc else
                                                      {"torch_dtype": "bfloat16"})}))
    out = tmp_path / "run"
    result = tuner("moe", "--model", str(model), "--gpu", "H100", "--device", "cpu", "--batch-sizes", "1",
                   "--trials", "1", "--patience", "1", "--compile-workers", "0", "--out", str(out), "--quiet",
                   *(["--dtype", dtype] if dtype else []))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["measured_by"] == "cpu-device"
    written: dict = {}
    for t in manifest["tables"]:
        for engine, rel in t["files"].items():
            written.setdefault(engine, set()).add(Path(rel).name)
    assert set(written) == set(files)
    for engine, name in files.items():          # the up table, and SGLang's _down unless it is a copy of it
        assert name in written[engine] and written[engine] <= {name, name.replace(".json", "_down.json")}
    for table in manifest["tables"]:
        assert table["kernel_source"]["source"] in ("vllm", "sglang")
        for M, entry in table["entries"].items():
            assert entry["numerics"]["status"] == "passed" and entry["time_us"] > 0, (case, table["files"], M)
    for engine, name in files.items():
        rel = next(rel for t in manifest["tables"] for e, rel in t["files"].items() if e == engine)
        rows = json.loads((out / rel).read_text())
        assert set(rows) == {"1"}
        if engine == "vllm" and case in ("int4-awq", "int8-w8a16-group"):
            assert rows["1"]["SPLIT_K"] == 1            # the group-wise launch passes the row as it is
        if case == "int4-awq":
            _installed_and_read(out, engine, name, rows, tmp_path / f"site-{engine}")


def _installed_and_read(out: Path, engine: str, name: str, rows: dict, site: Path) -> None:
    """`tuner install` puts the table where the engine's own loader (from its wheel) finds it
    for that precision: its lookup by the dtype string, N and block shape it builds."""
    from engine_loaders import load_loaders, site_from_wheel

    from kernels.moe_quant import MoeQuant
    site_from_wheel(engine, {"vllm": "0.33.0", "sglang": "0.5.23"}[engine], site)
    result = tuner("install", str(out), "--engine", engine, "--site-packages", str(site), "--force")
    assert result.returncode == 0, result.stderr
    f = load_loaders(engine, site, "NVIDIA H100 80GB HBM3", "3.6.0")
    mq = MoeQuant("int4_w4a16", None, 32, True)
    dtype = (f["_get_config_dtype_str"]("torch.bfloat16", use_int4_w4a16=True) if engine == "vllm"
             else f["get_config_dtype_str"]("torch.bfloat16", use_int4_w4a16=True))
    w1, w2 = (4, 128, 128 // 2), (4, 128, 64 // 2)           # as the loader holds INT4: packed along K
    got = (f["try_get_optimal_moe_config"](w1, w2, 2, dtype, 1, mq.engine_block_shape) if engine == "vllm" else
           f["try_get_optimal_moe_config"](w1, w2, 2, dtype, 1, block_shape=mq.engine_block_shape))
    assert got == rows["1"], (engine, name)


_COMPILE = """
import sys
sys.path.insert(0, {repo!r})
from tuner.measure.device import compile_for_sm90
compile_for_sm90()
from tuner.plan import kernel_registry
shape = {{"E": 4, "N": 64, "K": 128, "topk": 2, "routing": "uniform"}}
cases = [({{"dtype": "int8_w8a8", "block_shape": None}}, "vllm"), ({{"dtype": "int8_w8a16", "block_shape": None}}, "vllm"),
         ({{"dtype": "int4_w4a16", "block_shape": None, "group_size": 32, "zero_point": True}}, "vllm"),
         ({{"dtype": "int8_w8a8", "block_shape": [128, 128]}}, "sglang"),
         ({{"dtype": "int4_w4a16", "block_shape": None, "group_size": 32}}, "sglang")]
for precision, engine in cases:
    spec = kernel_registry.get_kernel("fused_moe", engine, variant="quant")
    part = {{"part": "op" if engine == "vllm" else "up"}}
    config = {{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 2, **({{"SPLIT_K": 1}} if engine == "vllm" else {{"USE_TMA": 0}})}}
    spec.compile_only({{**shape, **precision, **part}}, 3, config)
    print("compiled", engine, precision["dtype"], flush=True)
"""


def test_the_new_kernels_compile_for_sm90(tmp_path):
    """As a CPU-device compile worker builds them (no GPU): a launch that does not compile for
    Hopper is refused there, so these would fail a GPU run's compile step too."""
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", _COMPILE.format(repo=str(REPO))], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 5
