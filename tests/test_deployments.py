"""Tables for the deployment the user runs: expert parallelism's workload, the checkpoint's
own dtype, SGLang's up and _down tables choosing BLOCK_SIZE_M together, vLLM's GEMM names
for H200 variants, and a first contact without traps (model folders and names, the GPU
error first, a model that cannot fit)."""

import json
import os

import pytest
from synthetic import scaled_landscape, write_synthetic_landscape

from kernels.fused_moe import local_pairs
from tuner.cli import main
from tuner.errors import TunerError
from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.plan import kernel_registry
from tuner.plan.engines import ENGINES
from tuner.plan.gpus import get_gpu
from tuner.plan.models import load_model, moe_problems
from tuner.plan.precision import checkpoint_dtype
from tuner.plan.space import load_space

QWEN_BF16 = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
             "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48, "torch_dtype": "bfloat16",
             "vocab_size": 151936}


# -- expert parallelism ------------------------------------------------------------------------
def test_ep_problems_route_over_every_gpus_experts():
    """DeepSeek-V3 at --tp 8 --ep 8: each engine's table holds 32 experts of 256; the timed
    workload routes every token over all 256 and runs only the pairs of this GPU's 32."""
    problems = moe_problems(load_model("deepseek-v3"), 8, 8, "fp8_w8a8")
    assert {(p.params["E"], p.params["N"], p.params["ep"]) for p in problems} == {(32, 2048, 8)}
    # the same routing at tiny widths: ~1/8 of M * top-8 pairs are local
    params = {**problems[0].params, "N": 128, "K": 128}
    kernel = kernel_registry.get_kernel("fused_moe")
    inputs = kernel.make_inputs(params, 256, "cpu", seed=1)
    assert int(inputs["topk_ids"].max()) >= 200                     # global ids, up to 255
    local = int((inputs["local_ids"] >= 0).sum())
    assert 200 < local < 320 and local_pairs(params, 256) == 256    # ~267 in the issue; 2048 under TP routing
    assert ((inputs["local_ids"] >= 0) == (inputs["topk_ids"] < 32)).all()


@pytest.mark.triton         # runs our kernel in Triton's interpreter
def test_ep_numerics_of_our_kernel():
    """Our kernel on an EP workload: only local pairs add, against the float64 reference."""
    from tuner.measure.numerics import check_config
    kernel = kernel_registry.get_kernel("fused_moe")
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}
    for part in ("op", "down"):
        params = {"E": 4, "N": 128, "K": 128, "topk": 2, "ep": 4, "dtype": "fp8_w8a8", "block_shape": [128, 128],
                  "part": part, "routing": "uniform"}
        agreement, _ = check_config(kernel, params, 12, cfg, "cpu", 5)
        assert agreement.passed, (part, agreement.rel_error)


def test_drift_times_an_ep_table_on_the_ep_workload(tmp_path):
    from tuner.plan.table_files import parse_table_file
    table = tmp_path / "E=32,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    table.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                                       "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}}))
    [t] = parse_table_file(table, load_model("deepseek-v3"))
    assert t.problem.params["ep"] == 8 and t.problem.params["E"] == 32


# -- the checkpoint's dtype ----------------------------------------------------------------------
def test_bf16_checkpoint_plans_bf16_tables(tmp_path, capsys):
    """A BF16 Qwen3-30B-A3B config.json: the plan names the bf16 files (no dtype part), and a
    --dtype that differs from the checkpoint's is one warning line."""
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_BF16))
    assert checkpoint_dtype(load_model(str(folder))) == "bf16"
    argv = ["moe", "--model", str(folder), "--gpu", "H200", "--batch-sizes", "1", "--dry-run",
            "--kernel-source", "ours"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "vllm/fused_moe/E=128,N=768,device_name=NVIDIA_H200.json" in out and "dtype=fp8_w8a8" not in out
    assert "dtype=bf16" in out and err == ""
    assert main(argv + ["--dtype", "fp8_w8a8"]) == 0
    out, err = capsys.readouterr()
    assert "dtype=fp8_w8a8" in out
    assert err.count("\n") == 1 and err.startswith("tuner: --dtype fp8_w8a8, but Qwen3-30B-A3B's checkpoint is bf16")


@pytest.mark.parametrize("qc,expected", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_w8a8"),
    ({"quant_method": "fp8"}, "fp8_w8a8"),
    ({"quant_method": "awq", "bits": 4}, "int4_w4a16"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8},
                                                                    "input_activations": {"num_bits": 8}}}},
     "int8_w8a8"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    (None, "bf16"),
])
def test_checkpoint_dtype(tmp_path, qc, expected):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**QWEN_BF16, **({"quantization_config": qc} if qc else {})}))
    assert checkpoint_dtype(load_model(str(f))) == expected


def test_an_unsupported_quantization_is_refused_unless_dtype_is_given(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**QWEN_BF16, "quantization_config": {"quant_method": "mxfp4"}}))
    argv = ["moe", "--model", str(f), "--gpu", "H200", "--batch-sizes", "1", "--dry-run", "--kernel-source", "ours"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "quantized as mxfp4" in err and "give --dtype" in err


def test_our_kernel_refuses_an_int4_checkpoint_in_one_line(tmp_path, capsys):
    """An AWQ INT4 checkpoint is planned from its quantization_config (issue 52); our kernel
    has no group-wise INT4 launch, and says so before anything is timed."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**QWEN_BF16, "quantization_config": {"quant_method": "awq", "bits": 4}}))
    argv = ["moe", "--model", str(f), "--gpu", "H200", "--batch-sizes", "1", "--dry-run", "--kernel-source", "ours"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kernel-source ours: our fused MoE runs bf16 and fp8_w8a8 only" in err
    assert main(argv + ["--dtype", "bf16"]) == 0


# -- SGLang's up and _down tables decide BLOCK_SIZE_M together ------------------------------------
MS = [64]


@pytest.fixture(scope="module")
def sglang_land(tmp_path_factory):
    """A SYNTHETIC landscape of SGLang's kernel at DeepSeek-V3 TP8 where the up GEMM alone
    prefers BLOCK_SIZE_M 16 (10 % faster) and the down GEMM 64 (3x faster)."""
    d = tmp_path_factory.mktemp("tied")
    kernel = kernel_registry.get_kernel("fused_moe", "sglang", load_code=False)
    problems = [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", "uniform", ["sglang"])]
    raw, up_fast, land = d / "raw.jsonl", d / "up.jsonl", d / "land.jsonl"
    write_synthetic_landscape(raw, kernel, load_space(kernel), get_gpu("H200"), problems, MS)
    scaled_landscape(raw, up_fast, kernel, 0.9, only=lambda p, M, c: p["part"] == "up" and c["BLOCK_SIZE_M"] == 16)
    scaled_landscape(up_fast, land, kernel, 1 / 3, only=lambda p, M, c: p["part"] == "down" and c["BLOCK_SIZE_M"] == 64)
    return kernel, land


def _tables(out):
    folder = next((out / "sglang" / "fused_moe" / "configs").glob("triton_*"))
    name = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
    return (json.loads((folder / f"{name}.json").read_text()), json.loads((folder / f"{name}_down.json").read_text()),
            json.loads((out / "manifest.json").read_text()))


def _run(land, out):
    # --min-gain 0: the chosen pair is raced against the pair the engine runs (tied_race.py; in a
    # plain clone, no engine installed, the defaults, whose BLOCK_SIZE_M 64 is already the joint
    # choice's, so the tuned pair gains only ~1 %); these tests check the joint choice, not that race
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land), "--engines",
                 "sglang", "--batch-sizes", *map(str, MS), "--trials", "16", "--min-gain", "0", "--out", str(out),
                 "--quiet"]) == 0
    return _tables(out)


def test_block_m_is_chosen_for_up_and_down_together(sglang_land, tmp_path):
    kernel, land = sglang_land
    up, down, manifest = _run(land, tmp_path / "out")
    assert up["64"]["BLOCK_SIZE_M"] == down["64"]["BLOCK_SIZE_M"] == 64     # up alone would take 16
    entry = next(t for t in manifest["tables"] if t["problem"]["part"] == "down")["entries"]["64"]
    tied = entry["tied"]
    assert tied["keys"] == {"BLOCK_SIZE_M": 64} and tied["timed_together"] is False   # a replay: sums
    assert tied["up_alone"] == {"BLOCK_SIZE_M": 16}                                   # the old rule's choice
    sums = [c["sum_us"] for c in tied["candidates"]]
    assert sums == sorted(sums) and tied["chosen"] == 0
    up_entry = next(t for t in manifest["tables"] if t["problem"]["part"] == "up")["entries"]["64"]
    assert up_entry["config"]["BLOCK_SIZE_M"] == 64 and up_entry["numerics"]["status"] == "not checked"


def test_pairs_are_timed_together_where_they_can_be(sglang_land, tmp_path):
    """Where the measurer can time the pair as SGLang runs it (here: a landscape that holds
    the candidate pairs, as one recorded on a GPU does), that time decides, not the sum: the
    candidate ranked last by the sum wins when it is fastest together (e.g. a TMA _down entry
    whose sorted up store pays off)."""
    kernel, land = sglang_land
    up, down, manifest = _run(land, tmp_path / "first")
    tied = next(t for t in manifest["tables"] if t["problem"]["part"] == "down")["entries"]["64"]["tied"]
    assert len(tied["candidates"]) >= 2
    down_params = next(t for t in manifest["tables"] if t["problem"]["part"] == "down")["problem"]
    with_pairs = tmp_path / "pairs.jsonl"
    original = read_landscape(land, kernel)
    w = LandscapeWriter(with_pairs, kernel, original.header)
    for (key, M), pts in original.points.items():
        for cfg, p in pts.items():
            w.write(original.problems[key], M, dict(zip(kernel.config_keys, cfg)), p)
    last = len(tied["candidates"]) - 1
    for i, c in enumerate(tied["candidates"]):
        params = kernel.tied_params(down_params, c["up"])
        w.write(params, 64, c["down"], Point(5.0 if i == last else 50.0 + i, None, 0.01))
    w.close()
    up, down, manifest = _run(with_pairs, tmp_path / "second")
    tied = next(t for t in manifest["tables"] if t["problem"]["part"] == "down")["entries"]["64"]["tied"]
    assert tied["timed_together"] is True and tied["chosen"] == last
    assert [c["together_us"] for c in tied["candidates"]][last] == 5.0
    chosen = tied["candidates"][last]
    assert down["64"]["BLOCK_SIZE_M"] == up["64"]["BLOCK_SIZE_M"] == chosen["down"]["BLOCK_SIZE_M"]


# -- file names --------------------------------------------------------------------------------
def test_h200_variants_per_table_family():
    """vLLM's MoE loader folds an H200 NVL onto NVIDIA_H200, its GEMM loader does not (the
    loaders themselves are run from the wheel in test_engine_loaders)."""
    nvl = get_gpu("H200-NVL").cuda_name
    gemm = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    assert "device_name=NVIDIA_H200_NVL," in ENGINES["vllm"].table_relpath("fp8_gemm", gemm, nvl, "3.6.0")
    moe = {"E": 256, "N": 256, "dtype": "fp8_w8a8", "block_shape": [128, 128]}
    assert "device_name=NVIDIA_H200," in ENGINES["vllm"].table_relpath("fused_moe", moe, nvl, "3.6.0")
    assert "device_name=NVIDIA_H200_NVL," in ENGINES["sglang"].table_relpath("fused_moe", moe, nvl, "3.6.0")


# -- first contact ---------------------------------------------------------------------------------
def test_model_from_a_snapshot_folder_and_any_case(tmp_path):
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN_BF16))
    assert load_model(str(snap)).name == "Qwen3-30B-A3B"
    assert load_model("DeepSeek-V3").name == load_model("deepseek-v3").name == "deepseek-v3"
    with pytest.raises(TunerError, match="folder without a config.json"):
        load_model(str(tmp_path))


def test_a_hub_id_says_how_to_get_its_config(capsys):
    assert main(["moe", "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H200", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "huggingface-cli download Qwen/Qwen3-30B-A3B config.json --local-dir models/Qwen3-30B-A3B" in err


def test_without_a_gpu_the_gpu_error_comes_first(tmp_path, capsys, monkeypatch):
    """No GPU, no engine wheels, an --out that is a file: the GPU is what a run says."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    bad_out = tmp_path / "file"
    bad_out.write_text("")
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--out", str(bad_out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no CUDA GPU is visible" in err


# -- the deployment a plan is for: the tensor-parallel size --------------------------------------
def test_the_missions_command_as_typed_plans_tp8(capsys):
    """`tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8`, no --tp: the plan is for the
    deployment that serves the model (8 H200s), said in its first line, with TP8's shapes."""
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == ("tp=8: the smallest that holds deepseek-v3's 669 GB of fp8 weights on H200s "
                                   "with room for the KV cache; --tp to choose")
    assert "E=256,N=256,K=7168" in out and "E=257,N=256,K=7168" in out and "N=2048" not in out
    assert "deepseek-v3  tp=8  ep=1" in out and "runs/moe-deepseek-v3-H200-tp8/" in out
    assert "do not fit" not in err and "cannot serve" not in err


@pytest.mark.parametrize("command", ["gemm", "mla"])
def test_every_kernel_command_defaults_to_the_serving_tp(command, capsys):
    assert main([command, "--model", "deepseek-v3", "--gpu", "H200", "--batch-sizes", "1", "--dry-run",
                 "--kernel-source", "ours"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tp=8: the smallest that holds deepseek-v3's") and "tp=8  ep=1" in out


def test_a_tp_that_cannot_hold_the_weights_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """An explicit --tp whose GPUs cannot hold the weights: one line naming the TP that can and
    --per-rank, exit 2, before the missing GPU is said, nothing written."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    out = tmp_path / "out"
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--tp 2 cannot serve deepseek-v3" in err
    assert "give --tp 8" in err and "--per-rank" in err and not out.exists()
    # no TP of one node holds it on H100s: the default is refused too, naming two nodes
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H100", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "do not fit one node of 8 H100s" in err and "--tp 16" in err and err.count("\n") == 1


@pytest.mark.parametrize("flags,why", [(["--tp", "2", "--per-rank"], "--per-rank"),
                                       (["--tp", "2", "--ep", "2"], "--ep 2")])
def test_one_ranks_shapes_on_purpose_are_planned(flags, why, capsys):
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--batch-sizes", "1", "--dry-run",
                 "--kernel-source", "ours", *flags]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"tp=2 ({why}): one rank's shapes, on purpose")
    assert "tp=2  ep=" in out


def test_the_kv_cache_rule_picks_the_smallest_tp_that_leaves_a_quarter():
    """The rule of tuner/plan/deployment.py: weights at most 3/4 of 90% of each GPU."""
    from tuner.plan.deployment import WEIGHT_ROOM, WEIGHT_SHARE, serving_tp, weight_bytes
    assert (WEIGHT_ROOM, WEIGHT_SHARE) == (0.9, 0.75)
    mixtral = load_model("mixtral-8x7b")                       # 93 GB of bf16 weights
    assert serving_tp(mixtral, get_gpu("H200"), None).tp == 1  # 93 <= 95 GB
    assert serving_tp(mixtral, get_gpu("H100"), None).tp == 2  # 93 > 54; 47 <= 54 GB
    qwen = load_model("qwen3-235b-a22b-fp8")
    gb = weight_bytes(qwen, "fp8_w8a8") / 1e9
    assert 2 * 95 < gb <= 4 * 95 and serving_tp(qwen, get_gpu("H200"), "fp8_w8a8").tp == 4
    with pytest.raises(TunerError, match="do not fit one node of 8 H200s.*--tp 16"):
        serving_tp(load_model("kimi-k2"), get_gpu("H200"), "fp8_w8a8")


def test_a_nightly_job_without_tp_plans_the_serving_tp(capsys, tmp_path):
    from tuner import api
    from tuner.jobs.nightly import job_request
    req = job_request({"name": "j", "kernel": "moe", "model": "deepseek-v3", "gpu": "H200", "batch_sizes": [1],
                       "kernel_source": "ours"}, tmp_path / "o")
    assert req.tp is None
    req.dry_run = True
    api.tune(req)
    assert capsys.readouterr().out.startswith("tp=8: the smallest") and req.tp is None


@pytest.mark.ci_variables        # quotes the engine's loader from its wheel where TUNER_ENGINE_WHEELS is set
def test_install_says_how_to_confirm_the_tables_were_read(tmp_path, capsys):
    import triton
    land = tmp_path / "l.jsonl"
    kernel = kernel_registry.get_kernel("fused_moe")
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"),
                              [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8",
                                                              engines=("vllm",))], [1])
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--engines", "vllm", "--replay",
                 str(land), "--batch-sizes", "1", "--trials", "4", "--out", str(out), "--quiet"]) == 0
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / f"triton-{triton.__version__}.dist-info").mkdir()
    (site / "vllm-0.33.0.dist-info").mkdir()
    capsys.readouterr()
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site), "--gpu", "H200",
                 "--force"]) == 0
    printed = capsys.readouterr().out
    # the engine's own lines, quoted from its loader (the package has none here: the same
    # version's wheel when CI has it), else a line saying they cannot be quoted
    if os.environ.get("TUNER_ENGINE_WHEELS"):
        assert "vllm 0.33.0 logs when it loads E=256,N=256,device_name=NVIDIA_H200" in printed
        assert "Using configuration from " in printed and "for MoE layer." in printed
    else:
        assert "cannot be quoted: its loader source is not in" in printed
    assert "removed when vllm is upgraded or reinstalled" in printed
    assert "VLLM_TUNED_CONFIG_FOLDER covers fused_moe tables only" in printed
