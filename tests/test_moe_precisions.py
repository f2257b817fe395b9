"""Issue 52: the fused MoE's integer precisions (INT8 W8A8 per channel and in blocks, INT8 W8A16 per
channel and in K groups, INT4 W4A16 in K groups with and without zero points), planned from the
checkpoint: which engine runs which on its Triton kernel, the table files each names, checked
against every release's own loader from its wheel (its dtype string, its file name, its lookup) and
against every file of those precisions the six wheels ship; and `tuner audit` of an INT8 DeepSeek-V3
on H20 with SGLang 0.5.23, resolved as its loader resolves it."""

import inspect
import json
import re
import zipfile
from pathlib import Path

import pytest
from engine_loaders import LOG, VERSIONS, load_loaders, site_from_wheel, wheel, wheel_dir

from kernels.moe_quant import MoeQuant
from tuner.cli import main
from tuner.errors import TunerError
from tuner.plan.engines import ENGINES, table_family
from tuner.plan.gpus import get_gpu
from tuner.plan.models import load_model, moe_problems
from tuner.plan.precision import checkpoint_dtype, moe_precision, served_group

REPO = Path(__file__).resolve().parents[1]
QWEN = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "moe_intermediate_size": 768,
        "num_experts_per_tok": 8, "num_hidden_layers": 48}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
CHANNEL_INT8 = {"quant_method": "w8a8_int8", "activation_scheme": "dynamic"}
RELEASES = [(e, v) for e in VERSIONS for v in VERSIONS[e]]


def needs_wheels(test):
    """The engines' released wheels (TUNER_ENGINE_WHEELS, as .ci/run sets it)."""
    skip = pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")
    return pytest.mark.ci_variables(skip(test))


def model_with(tmp_path, qc, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN, **fields, **({"quantization_config": qc} if qc else {})}))
    return load_model(str(path))


# -- the checkpoint's precision -------------------------------------------------------------------
@pytest.mark.parametrize("qc,dtype,described", [
    ({"quant_method": "blockwise_int8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "int8_w8a8", "int8_w8a8, [128, 128] weight blocks"),
    (CHANNEL_INT8, "int8_w8a8", "int8_w8a8, one scale per output channel, per-token activations"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"type": "int", "num_bits": 8, "strategy": "channel", "symmetric": True},
        "input_activations": {"type": "int", "num_bits": 8, "strategy": "token", "dynamic": True}}}},
     "int8_w8a8", "int8_w8a8, one scale per output channel"),
    (AWQ, "int4_w4a16", "int4_w4a16, K groups of 64 with zero points"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
     "int4_w4a16", "int4_w4a16, K groups of 128, zero at the format's midpoint"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": False}, "int8_w8a16",
     "int8_w8a16, K groups of 128 with zero points"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": True}}}},
     "int4_w4a16", "int4_w4a16, K groups of 32, zero at the format's midpoint"),
])
def test_the_checkpoint_says_the_moe_precision(tmp_path, qc, dtype, described):
    model = model_with(tmp_path, qc)
    assert checkpoint_dtype(model) == dtype
    assert moe_precision(model, dtype).describe().startswith(described)


def test_a_dtype_other_than_the_checkpoints_takes_what_an_engine_makes_of_it():
    fp8 = load_model("deepseek-v3")
    assert moe_precision(fp8, "int8_w8a8").block_shape == (128, 128)      # SGLang's block-INT8 DeepSeek keeps them
    assert moe_precision(fp8, "int8_w8a16").scheme == "channel"           # vLLM's experts_int8
    gptq = moe_precision(fp8, "int4_w4a16")
    assert (gptq.group_size, gptq.zero_point) == (128, False)


def test_the_k_group_is_halved_as_the_engines_loaders_halve_it():
    assert served_group(128, 768, 2048, "m") == 128
    assert served_group(128, 96, 2048, "m") == 32          # 96 % 128, 96 % 64: halved twice
    with pytest.raises(TunerError, match="no K group of 128 or a half of it down to 32 divides"):
        served_group(128, 48, 2048, "m")


# -- the plan ---------------------------------------------------------------------------------------
def _names(problems):
    return {ENGINES[p.engines[0]].table_relpath("fused_moe", p.params, get_gpu("H20").cuda_name, "3.6.0")
            for p in problems}


def test_each_engine_plans_the_precisions_it_runs_and_names_them_as_it_does(tmp_path, caplog):
    h20 = "device_name=NVIDIA_H20"
    ds = load_model("deepseek-v3-int8")
    assert _names(moe_problems(ds, 8, 1, "int8_w8a8")) == {
        f"sglang/fused_moe/configs/triton_3_6_0/E=257,N=256,{h20},dtype=int8_w8a8,block_shape=[128, 128].json",
        f"sglang/fused_moe/configs/triton_3_6_0/E=257,N=256,{h20},dtype=int8_w8a8,block_shape=[128, 128]_down.json"}
    assert "vllm: no int8_w8a8 tables planned: vLLM 0.31-0.33 run no block-INT8 MoE" in caplog.text
    with pytest.raises(TunerError, match="run no block-INT8 MoE"):
        moe_problems(ds, 8, 1, "int8_w8a8", engines=("vllm",))
    # SGLang folds the shared expert in, unless told not to
    assert {p.params["E"] for p in moe_problems(ds, 8, 1, "int8_w8a8", fuse_shared=False)} == {256}
    # INT8 W8A8 per channel: vLLM names it as the bf16 table; SGLang with a per-channel part
    assert _names(moe_problems(model_with(tmp_path, CHANNEL_INT8), 1, 1, "int8_w8a8")) == {
        f"vllm/fused_moe/E=128,N=768,{h20}.json",
        f"sglang/fused_moe/configs/triton_3_6_0/E=128,N=768,{h20},dtype=int8_w8a8,per_channel_quant=True.json",
        f"sglang/fused_moe/configs/triton_3_6_0/E=128,N=768,{h20},dtype=int8_w8a8,per_channel_quant=True_down.json"}
    # INT4 in K groups: vLLM names the expert width, SGLang w2's packed one (two values a byte)
    awq = moe_problems(model_with(tmp_path, AWQ), 2, 1, "int4_w4a16")
    assert _names(awq) == {f"vllm/fused_moe/E=128,N=384,{h20},dtype=int4_w4a16.json",
                           f"sglang/fused_moe/configs/triton_3_6_0/E=128,N=192,{h20},dtype=int4_w4a16.json",
                           f"sglang/fused_moe/configs/triton_3_6_0/E=128,N=192,{h20},dtype=int4_w4a16_down.json"}
    assert all(p.params["group_size"] == 64 and p.params["zero_point"] is True for p in awq)
    # INT8 W8A16 per channel: vLLM's experts_int8 only
    caplog.clear()
    assert _names(moe_problems(load_model(str(REPO / "configs/examples/qwen3-30b-a3b")), 1, 1, "int8_w8a16")) == {
        f"vllm/fused_moe/E=128,N=768,{h20},dtype=int8_w8a16.json"}
    assert "sglang: no int8_w8a16 tables planned: SGLang 0.5.21-0.5.23 run no per-channel INT8" in caplog.text


def test_dry_runs_plan_the_precisions_and_say_when_the_engine_reads_them(capsys):
    assert main(["moe", "--model", "qwen3-30b-a3b-gptq-int4", "--gpu", "H20", "--dry-run", "--batch-sizes", "1",
                 "16"]) == 0
    out = capsys.readouterr().out
    assert "precision: int4_w4a16, K groups of 128, zero at the format's midpoint" in out
    assert "vllm/fused_moe/E=128,N=768,device_name=NVIDIA_H20,dtype=int4_w4a16.json" in out
    assert "E=128,N=384,device_name=NVIDIA_H20,dtype=int4_w4a16_down.json" in out
    assert "configs/spaces/fused_moe.vllm.gptq_awq.yaml" in out and "configs/spaces/fused_moe.sglang.gptq_awq" in out
    assert "--quantization moe_wna16" in out and "Marlin's MoE runs, which reads no table" in out
    assert main(["moe", "--model", "deepseek-v3-int8", "--gpu", "H20", "--tp", "8", "--per-rank", "--dry-run",
                 "--engines", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM 0.31-0.33 run no block-INT8 MoE" in err


# -- the engines' own loaders -------------------------------------------------------------------------
PRECISIONS = [  # (params beside E, N, K), as a checkpoint lays them out
    {"dtype": "int8_w8a8", "block_shape": None},
    {"dtype": "int8_w8a8", "block_shape": [128, 128]},
    {"dtype": "int8_w8a16", "block_shape": None},
    {"dtype": "int8_w8a16", "block_shape": None, "group_size": 64, "zero_point": True},
    {"dtype": "int4_w4a16", "block_shape": None, "group_size": 64},
    {"dtype": "int4_w4a16", "block_shape": None, "group_size": 128, "zero_point": True},
]
ROWS = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 2},
        "64": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 8,
               "num_stages": 3}}


def _their_dtype(f: dict, engine: str, mq: MoeQuant):
    """The dtype string the engine's own function gives the flags its wrappers pass (only those
    its signature takes: vLLM's has no use_int8_w8a8)."""
    fn = f["_get_config_dtype_str" if engine == "vllm" else "get_config_dtype_str"]
    taken = inspect.signature(fn).parameters
    return fn("torch.bfloat16", **{k: v for k, v in mq.flags().items() if k in taken})


@needs_wheels
@pytest.mark.parametrize("engine,version", RELEASES)
@pytest.mark.parametrize("gpu_key", ["H20", "H200", "H100"])
def test_the_tables_we_write_are_the_ones_each_releases_loader_reads(engine, version, gpu_key, tmp_path):
    """Our table for each precision the engine runs, put where it reads tables, is what its own
    try_get_optimal_moe_config returns for that precision's flags and weight shapes (w2 packed
    as its loader holds INT4): the file name, the dtype string and N as the release builds them."""
    if wheel(engine, version) is None:
        pytest.skip(f"no {engine} {version} wheel in TUNER_ENGINE_WHEELS")
    site = site_from_wheel(engine, version, tmp_path)
    gpu = get_gpu(gpu_key)
    f = load_loaders(engine, site, gpu.cuda_name, "3.6.0", version)
    fam = table_family(engine, "fused_moe")
    folder = site / fam.folder / ("triton_3_6_0" if fam.per_triton else "")
    served = 0
    for scheme in PRECISIONS:
        params = {"E": 5, "N": 256, "K": 512, "topk": 2, **scheme, "part": "op" if engine == "vllm" else "up"}
        mq = MoeQuant.of(params)
        if fam.precisions.get((mq.dtype, _scheme(mq))) is None:
            continue
        served += 1
        name = ENGINES[engine].table_relpath("fused_moe", params, gpu.cuda_name, "3.6.0").rsplit("/", 1)[1]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(ROWS))
        for fn in f.values():
            getattr(fn, "cache_clear", lambda: None)()
        E, N, K = params["E"], params["N"], params["K"]
        w1, w2 = (E, 2 * N, K // mq.pack), (E, K, N // mq.pack)      # as the loader holds them
        dtype = _their_dtype(f, engine, mq)
        for M, key in ((1, "1"), (40, "64")):
            if engine == "vllm":
                got = f["try_get_optimal_moe_config"](w1, w2, 2, dtype, M, mq.engine_block_shape)
            else:
                got = f["try_get_optimal_moe_config"](w1, w2, 2, dtype, M, block_shape=mq.engine_block_shape,
                                                      per_channel_quant=mq.flags()["per_channel_quant"])
            assert got == ROWS[key], (engine, version, gpu_key, scheme, name, dtype)
        (folder / name).unlink()
    assert served == 5              # each engine runs five of the six (vLLM no block INT8, SGLang no W8A16 per channel)


def _scheme(mq: MoeQuant) -> str:
    return "block" if mq.block_shape else "group" if mq.group_size else "channel"


_SHIPPED = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]*),dtype=(int8_w8a8|int8_w8a16|int4_w4a16)"
                      r"(?:,block_shape=\[(\d+), ?(\d+)\])?(,per_channel_quant=True)?(_down)?\.json$")


@needs_wheels
@pytest.mark.parametrize("engine,version", RELEASES)
def test_every_shipped_table_of_these_precisions_is_planned_by_name_or_never_asked_for(engine, version):
    """Every dtype=int8_w8a8 / int8_w8a16 / int4_w4a16 table the release ships: the name our
    planner writes for the precision its name stands for (E and N from the name, SGLang's INT4 N
    unpacked), or a name its loader never asks for, for the reason its own code gives."""
    path = wheel(engine, version)
    if path is None:
        pytest.skip(f"no {engine} {version} wheel in TUNER_ENGINE_WHEELS")
    fam = table_family(engine, "fused_moe")
    with zipfile.ZipFile(path) as z:
        names = sorted({Path(n).name for n in z.namelist() if n.startswith(fam.folder)})
        invoke = z.read("sglang/kernels/ops/moe/fused_moe_triton_kernels.py").decode() if engine == "sglang" else ""
    f = load_loaders(engine, Path("/nonexistent"), "NVIDIA H20", "3.6.0", version)
    planned, never = [], []
    for name in names:
        m = _SHIPPED.match(name)
        if m is None:
            continue
        e, n, device, dtype, bn, bk, channel, down = m.groups()
        cuda = device.replace("_", " ")
        ours = set()
        for (d, scheme), rule in fam.precisions.items():
            if d != dtype:
                continue
            params = {"E": int(e), "N": int(n) * rule.packed_n, "K": 7168, "topk": 8, "dtype": d,
                      "block_shape": [int(bn), int(bk)] if scheme == "block" and bn else [128, 128]
                      if scheme == "block" else None, **({"group_size": 128} if scheme == "group" else {}),
                      "part": "down" if down else "op" if engine == "vllm" else "up"}
            ours.add(ENGINES[engine].table_relpath("fused_moe", params, cuda, "3.6.0").rsplit("/", 1)[1])
        if name in ours:
            planned.append(name)
            continue
        never.append(name)
        if engine == "vllm":
            # its dtype string takes no INT8 W8A8 flag: it never names a table dtype=int8_w8a8
            assert dtype == "int8_w8a8" and "use_int8_w8a8" not in inspect.signature(f["_get_config_dtype_str"]).parameters
        else:
            # INT8 W8A8 without blocks runs only per channel there (the name then says so)
            assert dtype == "int8_w8a8" and not bn and not channel
            assert "int8 quantization only supports channel-wise quantization except for block-wise" in invoke
    assert planned, f"{engine} {version}: none of its shipped tables of these precisions is one we plan"
    if engine == "vllm":
        assert "E=16,N=3072,device_name=NVIDIA_H200,dtype=int8_w8a16.json" in planned
        assert "E=256,N=256,device_name=NVIDIA_H20,dtype=int8_w8a8,block_shape=[128,128].json" in never
    else:
        assert "E=256,N=256,device_name=NVIDIA_H20,dtype=int8_w8a8,block_shape=[128, 128].json" in planned
        assert "E=384,N=128,device_name=,dtype=int4_w4a16_down.json" in planned       # Kimi K2's 256 wide, packed


# -- the audit -----------------------------------------------------------------------------------------
@needs_wheels
@pytest.mark.parametrize("fuse", [True, False])
def test_audit_of_an_int8_deepseek_on_h20_with_sglang_resolves_as_its_loader(fuse, tmp_path, capsys):
    """SGLang 0.5.23 folds DeepSeek-V3's shared expert into the block-INT8 MoE (E=257): no file;
    the shipped E=256 table (triton_3_1_0, the loader's fallback under Triton 3.6.0) is named as
    the one read with --disable-shared-experts-fusion, and read with it, as the engine's own
    loader returns it."""
    if wheel("sglang", "0.5.23") is None:
        pytest.skip("no sglang 0.5.23 wheel in TUNER_ENGINE_WHEELS")
    out = tmp_path / "audit"
    argv = ["audit", "--engine", "sglang", "--model", "deepseek-v3-int8", "--gpu", "H20", "--tp", "8", "--per-rank",
            "--engine-source", str(wheel("sglang", "0.5.23")), "--triton", "3.6.0", "--moe-config-dir", "",
            "--batch-sizes", "1", "64", "--out", str(out)] + ([] if fuse else ["--disable-shared-experts-fusion"])
    assert main(argv) == 0
    capsys.readouterr()
    audit = json.loads((out / "audit.json").read_text())
    shipped = "E=256,N=256,device_name=NVIDIA_H20,dtype=int8_w8a8,block_shape=[128, 128].json"
    up, down = audit["kernels"]
    assert audit["dtype"] == "int8_w8a8" and up["read_by_default"]
    kinds = {f["kind"] for f in up["findings"]}
    if fuse:
        assert up["lookup"] == "E=257,N=256,device_name=NVIDIA_H20,dtype=int8_w8a8,block_shape=[128, 128].json"
        assert up["file"] is None and {"no_table", "unfused_table"} <= kinds
        assert any(f"triton_3_1_0/{shipped} is for the 256 routed experts alone" in f["reason"]
                   and "--disable-shared-experts-fusion" in f["reason"] for f in up["findings"])
        return
    assert up["lookup"] == shipped and up["how"] == "Triton fallback" and up["triton_folder"] == "triton_3_1_0"
    assert down["how"] == "the up table"
    site = site_from_wheel("sglang", "0.5.23", tmp_path / "site")
    f = load_loaders("sglang", site, "NVIDIA H20", "3.6.0", "0.5.23")
    LOG.clear()
    theirs = f["get_moe_configs"](256, 256, "int8_w8a8", 128, 128)
    assert any("Fallback to triton version 3.1.0" in line for _, line in LOG)
    rows = {r["key"]: r["entry"] for r in up["rows"]}
    assert rows and all(theirs[int(k)] == entry for k, entry in rows.items())


@needs_wheels
def test_audit_says_a_weight_only_table_is_not_read_by_default_and_vllm_int8_reads_the_bf16_name(tmp_path, capsys):
    if wheel("vllm", "0.33.0") is None:
        pytest.skip("no vllm 0.33.0 wheel in TUNER_ENGINE_WHEELS")
    src = ["--engine-source", str(wheel("vllm", "0.33.0")), "--triton", "3.6.0", "--moe-config-dir", "",
           "--batch-sizes", "1", "--gpu", "H200", "--tp", "1", "--per-rank"]
    (tmp_path / "awq.json").write_text(json.dumps({**QWEN, "quantization_config": AWQ}))
    assert main(["audit", "--engine", "vllm", "--model", str(tmp_path / "awq.json"), *src,
                 "--out", str(tmp_path / "a")]) == 0
    (kernel,) = json.loads((tmp_path / "a" / "audit.json").read_text())["kernels"]
    assert kernel["lookup"] == "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    assert not kernel["read_by_default"] and "--quantization moe_wna16" in kernel["read_why"]
    (tmp_path / "int8.json").write_text(json.dumps({**QWEN, "quantization_config": CHANNEL_INT8}))
    assert main(["audit", "--engine", "vllm", "--model", str(tmp_path / "int8.json"), *src,
                 "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    (kernel,) = json.loads((tmp_path / "b" / "audit.json").read_text())["kernels"]
    assert kernel["lookup"] == "E=128,N=768,device_name=NVIDIA_H200.json" and kernel["read_by_default"]


# -- the GPU run's validation list ----------------------------------------------------------------------
@needs_wheels
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_validation_list_runs_each_precision_case_on_the_launcher_that_runs_it(engine):
    """The validation list groups its cases by kernel: a precision case goes to the engine's
    integer launcher (kernels/engines/<engine>_quant.py), the FP8 cases to its main one (one group
    per launcher: an INT8 case on the FP8 launch fed int8 weights to a bf16 dot)."""
    from tuner.jobs.proof_validation import groups
    model = load_model(str(REPO / "configs" / "examples" / "small-moe.json"))
    found = {}
    for _, kernel, work in groups([engine], model, 1, None, None, None, [str(wheel_dir())], log=lambda _: None):
        for problem, M, cfg, _ in work:
            if problem.kernel == "fused_moe":
                dtype = problem.params["dtype"]
                found.setdefault(dtype, set()).add(kernel.variant)
                assert not kernel.refuses(problem.params), (dtype, kernel.variant)
                assert set(cfg) <= set(kernel.config_keys)
    assert found.pop("fp8_w8a8") == {""}
    assert found and all(v == {"quant"} for v in found.values()), found


@needs_wheels
def test_re_timing_tables_of_two_precisions_builds_a_measurer_for_each_launcher(monkeypatch):
    """`tuner drift` and the nightly keep one measurer per kernel: an INT8 table and an FP8 one of
    the same engine are two kernels (its integer launcher and its main one), not one."""
    import tuner.measure.isolation as isolation
    from tuner.jobs.drift import Measurers
    made = []
    monkeypatch.setattr(isolation, "isolated_gpu_measurer", lambda kernel, *a, **k: made.append(kernel) or kernel)
    measurers = Measurers(get_gpu("H100"), device="cpu")
    int8 = measurers.kernel("fused_moe", "vllm", {**PRECISIONS[0], "E": 8, "N": 128, "K": 256, "topk": 2})
    fp8 = measurers.kernel("fused_moe", "vllm", {"dtype": "fp8_w8a8", "block_shape": [128, 128]})
    assert (int8.variant, fp8.variant) == ("quant", "")
    assert measurers(int8) is int8 and measurers(fp8) is fp8 and measurers(int8) is int8
    assert made == [int8, fp8]
