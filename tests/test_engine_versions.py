"""Every supported engine version: its own wrapper (from its released wheel, CUDA ops shimmed,
tests/engine_wrappers.py) and our launcher launch the engine's kernel identically (grid,
every argument and constexpr, warps, stages) and compute the same thing (each against the
float64 reference on fresh random inputs, outputs poisoned first); for tensor and expert
parallelism, both sides of the swap-AB rule, BLOCK_SIZE_M 8, TMA and the fused shared
expert. And what is not supported is refused in one line."""

import json
import zipfile

import pytest
import torch
from engine_loaders import wheel_dir
from engine_wrappers import LaunchRecorder, differences, sglang_wrappers, vllm_wrappers, wheel

from kernels.engines import sglang as sgl
from kernels.engines import vllm
from kernels.engines.base import files_read, jit_functions
from tuner.cli import main
from tuner.errors import TunerError
from tuner.measure.numerics import relative_error
from tuner.plan import kernel_registry
from tuner.plan.kernel_api import config_from_entry, table_entry
from tuner.plan.kernel_registry import launcher
from tuner.plan.kernel_sources import extract, function_source, locate, source_hash

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

BLOCK = [128, 128]
VLLM_MOE = {"E": 8, "N": 256, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": BLOCK, "routing": "uniform",
            "part": "op"}
SGL_MOE = {**VLLM_MOE, "E": 9, "shared_experts": 1}          # 8 routed + SGLang's fused shared expert
EP = {"ep": 2}                                                # this GPU holds 8 of 16 experts


def cfg(bm, bn, bk=128, group=1, warps=4, stages=3, **extra):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages, **extra}


def _spec(engine, version):
    return kernel_registry.get_kernel("fused_moe", engine, str(wheel(wheel_dir(), engine, version)))


def _poisoned(t):
    return t.fill_(float("nan"))


# The interpreter's numerics run once per distinct (kernel source, case): a release whose jit
# kernels' source is identical to one already run in that case has its launches compared (every
# argument, constexpr, grid, warps and stages, against ours, as every release does) but not
# executed again; the same code launched the same way computes the same thing, and CI's time
# goes to what differs (9 releases of the two engines, most sharing a kernel's source).
_RAN: set = set()


def numerics_first_time(origin: str, engine: str, rel: str, names: list[str], case: str) -> bool:
    """Whether this case's numerics run for this release: no release whose kernels `names` in
    `rel` have the same source has run them yet (in this process)."""
    text = locate(engine, origin).read(rel)
    key = (tuple(source_hash(function_source(text, n)) for n in names), rel, case)
    if key in _RAN:
        return False
    _RAN.add(key)
    return True


# -- fused MoE: vLLM ---------------------------------------------------------------------------
# Every case's launches are compared; the kernels run (and both outputs are checked against
# the reference) where `run` says so: the interpreter takes seconds per launch.
VLLM_CASES = [
    # (problem, M, config, run): TP small-batch path with swap-AB; TP aligned with BLOCK_SIZE_M 8
    # and swap; TP without swap, hidden size 128 (one scale block along K: 0.33.0 passes
    # another scale stride); EP at M=1 (where TP would take the small-batch path), swap; EP
    # without swap.
    pytest.param(VLLM_MOE, 1, cfg(16, 64), True, id="tp-smallbatch-swap"),
    pytest.param(VLLM_MOE, 6, cfg(8, 128), False, id="tp-bm8-swap"),
    pytest.param({**VLLM_MOE, "K": 128}, 6, cfg(64, 128), False, id="tp-noswap-k128"),
    pytest.param({**VLLM_MOE, **EP}, 1, cfg(16, 64), True, id="ep-m1-swap"),
    pytest.param({**VLLM_MOE, **EP}, 9, cfg(64, 128), False, id="ep-noswap"),
]


@pytest.mark.parametrize("version", vllm.SUPPORTED)
@pytest.mark.parametrize("params,M,config,run", VLLM_CASES)
def test_vllm_launches_as_its_own_wrapper(version, params, M, config, run):
    spec = _spec("vllm", version)
    assert spec.notes["launched_as"] == version and spec.source_version == version
    run = run and numerics_first_time(spec.origin, "vllm", vllm.MOE_FILE, ["fused_moe_kernel"], repr((params, M, config)))
    (kernel,) = jit_functions(locate("vllm", str(wheel(wheel_dir(), "vllm", version))), vllm.MOE_FILE,
                              ["fused_moe_kernel"])
    inputs = spec.make_inputs(params, M, "cpu", seed=11)
    ep = params.get("ep", 1)
    E = params["E"]
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as ours:
        out_ours = spec.run({**inputs, "out": _poisoned(inputs["out"])}, config).clone()
    ns = vllm_wrappers(wheel_dir(), version, {"fused_moe_kernel": kernel}, config)
    expert_map = None
    if ep > 1:       # vLLM's expert map on EP rank 0: global experts 0..E-1 are local
        expert_map = torch.full((E * ep,), -1, dtype=torch.int32)
        expert_map[:E] = torch.arange(E, dtype=torch.int32)
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as engine:
        out_engine = ns["fused_experts_impl"](
            inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
            use_fp8_w8a8=True, global_num_experts=E * ep, expert_map=expert_map,
            w1_scale=inputs["w1_scale"], w2_scale=inputs["w2_scale"], block_shape=BLOCK)
    assert differences(engine.launches, ours.launches) == []
    naive = engine.launches[0]["args"]["naive_block_assignment"]
    assert naive == (ep == 1 and M * params["topk"] * 4 <= E)      # never under expert parallelism
    if not run:
        return
    ref = spec.reference(inputs)
    assert relative_error(out_ours, ref) < spec.tolerance / 4
    assert relative_error(out_engine, ref) < spec.tolerance / 4


def test_vllm_ep_runs_only_the_local_pairs():
    """Under EP the alignment holds exactly this GPU's pairs (about 1/ep of them)."""
    spec = _spec("vllm", vllm.SUPPORTED[-1])
    inputs = spec.make_inputs({**VLLM_MOE, "ep": 4}, 64, "cpu", seed=3)
    sorted_ids, expert_ids, npp = vllm.expert_assignment(inputs["local_ids"], cfg(16, 64), 8, 4)
    kept = sorted(i for i in sorted_ids.tolist() if i < 64 * 2)
    local = [i for i, e in enumerate(inputs["topk_ids"].flatten().tolist()) if e < 8]
    assert kept == local and 0.1 < len(local) / 128 < 0.45                  # ~1/4 of 128 pairs
    assert sorted_ids.numel() == 128 + 32 * 15                               # sized over the 32 global experts


# -- fused MoE: SGLang -------------------------------------------------------------------------
SGL_CASES = [
    # (problem, M, up config, down config): the fused shared expert (TP), swap-AB with two scale
    # blocks per N tile, TMA in the _down table (the up GEMM then stores sorted); BLOCK_SIZE_M 8;
    # no swap; expert parallelism (pairs of other GPUs' experts as -1) with and without TMA.
    pytest.param(SGL_MOE, 5, cfg(16, 256, bk=64), cfg(16, 256, bk=64, USE_TMA=1), True, id="tp-shared-swap-tma"),
    pytest.param(SGL_MOE, 5, cfg(8, 256, bk=64, USE_TMA=1), cfg(8, 256, bk=64), False, id="tp-bm8-uptma"),
    pytest.param(SGL_MOE, 3, cfg(64, 128, bk=64), cfg(64, 128, bk=64), False, id="tp-noswap"),
    pytest.param({**VLLM_MOE, **EP}, 6, cfg(64, 128), cfg(64, 128, USE_TMA=1), True, id="ep-tma"),
    pytest.param({**VLLM_MOE, **EP}, 6, cfg(16, 256, bk=64), cfg(16, 256, bk=64), False, id="ep-swap"),
]


class Quantizations(list):
    # where a case's numerics do not run, the values quantized are never read: the quantization
    # runs in torch (same shapes and dtypes), not in the interpreter (tens of seconds for the
    # sorted buffers of SGLang 0.5.19-0.5.21, which quantize every sorted row)
    cheap = False


@pytest.fixture
def quantizations(monkeypatch):
    """Every activation quantization either side runs: (rows, restricted to the sorted rows a
    GEMM reads?). Both sides end in our per_token_group_quant_fp8 (the engines' CUDA op, shimmed)."""
    import engine_wrappers

    import kernels.fused_moe as ours
    from kernels.fp8_gemm import per_token_group_quant_fp8_reference
    calls = Quantizations()
    original = engine_wrappers.per_token_group_quant_fp8

    def recording(x, group_size=128, *args, **kw):
        calls.append((x.shape[0], kw.get("sorted_token_ids") is not None))
        if calls.cheap:
            return per_token_group_quant_fp8_reference(x, group_size)
        return original(x, group_size, *args, **kw)
    for module in (engine_wrappers, ours, sgl):
        monkeypatch.setattr(module, "per_token_group_quant_fp8", recording)
    return calls


@pytest.mark.parametrize("version", sgl.SUPPORTED)
@pytest.mark.parametrize("params,M,up,down,run", SGL_CASES)
def test_sglang_launches_as_its_own_wrapper(version, params, M, up, down, run, quantizations):
    spec = _spec("sglang", version)
    assert spec.notes["launched_as"] == version
    run = run and numerics_first_time(spec.origin, "sglang", sgl.MOE_FILE, ["fused_moe_kernel"],
                                      repr((params, M, up, down)))
    quantizations.cheap = not run
    (kernel,) = jit_functions(locate("sglang", str(wheel(wheel_dir(), "sglang", version))), sgl.MOE_FILE,
                              ["fused_moe_kernel"])
    launch = next(r.launch for r in sgl.releases("fused_moe") if r.version == version)
    ep = params.get("ep", 1)
    inputs = spec.make_inputs(params, M, "cpu", seed=5)
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as ours:
        out_ours = sgl.moe_layer(spec_code(spec), launch, {**inputs, "out": _poisoned(inputs["out"])},
                                 config_from_entry(spec, up), config_from_entry(spec, down)).clone()
    ours_quantized = list(quantizations)
    quantizations.clear()
    ns = sglang_wrappers(wheel_dir(), version, {"fused_moe_kernel": kernel},
                         table_entry(spec, config_from_entry(spec, up)), table_entry(spec, config_from_entry(spec, down)))
    x = inputs["x"]
    flags = dict(use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                 per_channel_quant=False, block_shape=BLOCK)
    # SGLang's dispatcher hands the runner this GPU's expert ids, -1 for the others'
    ids = inputs["local_ids"]
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as engine:
        prepared = ns["_prepare_fused_moe_run"](x, inputs["w1"], inputs["w2"], ids, **flags)
        config, down_config, down_tma, up_tma, sorted_ids, expert_ids, npp = prepared
        out_engine = ns["_fused_moe_kernel_sequence"](
            x, inputs["w1"], inputs["w2"], inputs["topk_weights"], ids, sorted_ids, expert_ids, npp, config,
            down_config, down_tma, up_tma, b1=None, b2=None, w1_scale=inputs["w1_scale"],
            w2_scale=inputs["w2_scale"], w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None,
            activation="silu", is_gated=True, no_combine=False, inplace=False, apply_router_weight_on_input=False,
            routed_scaling_factor=None, gemm1_alpha=None, gemm1_limit=None, filter_expert=ep > 1, **flags)
    assert differences(engine.launches, ours.launches) == []
    # the activation quantizations: the same rows; before a TMA down GEMM only the sorted rows
    # it reads (0.5.22 on: the release's quantize_rows_read), or every row of the sorted buffer
    assert quantizations == ours_quantized
    assert quantizations[-1][1] == (bool(down.get("USE_TMA")) and launch["quantize_rows_read"])
    up_launch, down_launch = engine.launches
    assert up_launch["args"]["c_sorted"] == bool(down.get("USE_TMA"))      # the up GEMM stores sorted
    assert (up_launch["args"]["b_desc"] is not None) == bool(up.get("USE_TMA"))
    assert (down_launch["args"]["a_desc"] is not None) == bool(down.get("USE_TMA"))
    if ep > 1:
        assert -1 in up_launch["args"]["expert_ids_ptr"][4]                # other GPUs' pairs: expert -1 blocks
    if not run:
        return
    ref = spec.reference({**inputs, "params": {**inputs["params"], "part": "op"}})
    assert relative_error(out_ours, ref) < spec.tolerance / 4
    assert relative_error(out_engine, ref) < spec.tolerance / 4


def spec_code(spec):
    return locate(spec.source, spec.origin)


@pytest.mark.parametrize("version", sgl.SUPPORTED)
def test_sglang_table_parts_launch_as_the_layer_does(version, quantizations):
    """What a table is timed on (part up, part down) launches its GEMM exactly as the
    engine's whole layer launches it with that table's entry (the up table without a TMA
    _down entry; the _down table, TMA reading sorted rows, with its activation quantized over
    the rows it reads as the version does)."""
    spec = _spec("sglang", version)
    (kernel,) = jit_functions(spec_code(spec), sgl.MOE_FILE, ["fused_moe_kernel"])
    up, down = cfg(32, 256, bk=64), cfg(32, 256, bk=64, USE_TMA=1)      # swap-AB, BLOCK_SIZE_N > 128
    execute = numerics_first_time(spec.origin, "sglang", sgl.MOE_FILE, ["fused_moe_kernel"], "table parts")
    quantizations.cheap = not execute
    layer = []
    for part, config in (("up", up), ("down", down)):
        params = {**SGL_MOE, "part": part}
        inputs = spec.make_inputs(params, 4, "cpu", seed=2)
        with LaunchRecorder({"fused_moe_kernel": kernel}, execute) as rec:
            spec.run({**inputs, "out": _poisoned(inputs["out"])}, config_from_entry(spec, config))
        layer.append(rec.launches[0])
        if execute:
            assert relative_error(inputs["out"], spec.reference(inputs)) < spec.tolerance / 4
    launch = next(r.launch for r in sgl.releases("fused_moe") if r.version == version)
    inputs = spec.make_inputs(SGL_MOE, 4, "cpu", seed=2)
    with LaunchRecorder({"fused_moe_kernel": kernel}) as whole:
        sgl.moe_layer(spec_code(spec), launch, inputs, config_from_entry(spec, up), config_from_entry(spec, down))
    # the pair the tables are chosen together on (tuner.search.tied_choice.choose_tied) is that same layer
    pair = spec.tied_params({**SGL_MOE, "part": "down"}, config_from_entry(spec, up))
    with LaunchRecorder({"fused_moe_kernel": kernel}, execute=False) as together:
        spec.run(spec.make_inputs(pair, 4, "cpu", seed=2), config_from_entry(spec, down))
    assert differences(whole.launches, together.launches) == []
    # the _down part writes [pairs, K] where the layer writes [tokens, top-k, K]: the same strides
    assert differences(whole.launches[1:], layer[1:], ignore=("c_ptr",)) == []
    assert whole.launches[1]["args"]["stride_cm"] == layer[1]["args"]["stride_cm"]
    # the up table is timed storing in token order; with a TMA _down entry SGLang stores sorted
    assert set(x.split(" = ")[0].split(": ")[-1] for x in differences(whole.launches[:1], layer[:1])) == \
        {"c_ptr", "c_sorted"}


# -- block-FP8 GEMM ------------------------------------------------------------------------------
@pytest.mark.parametrize("engine,version,config", [
    *[("vllm", v, cfg(32, 128, bk=64, group=4)) for v in vllm.SUPPORTED],
    *[("sglang", r.version, c) for r in sgl.releases("fp8_gemm")
      for c in (cfg(32, 128, bk=64, group=4, SWAP_AB=0, SPLIT_K=1), cfg(16, 64, SWAP_AB=1, SPLIT_K=2))],
])
def test_gemm_launches_as_its_own_wrapper(engine, version, config):
    origin = str(wheel(wheel_dir(), engine, version))
    spec = kernel_registry.get_kernel("fp8_gemm", engine, origin)
    module = vllm if engine == "vllm" else sgl
    names = module.KERNEL_FUNCTIONS["fp8_gemm"][module.GEMM_FILE]
    jits = dict(zip(names, jit_functions(locate(engine, origin), module.GEMM_FILE, names)))
    params = {"N": 256, "K": 384, "block_shape": BLOCK}
    run = numerics_first_time(origin, engine, module.GEMM_FILE, names, repr(config))
    inputs = spec.make_inputs(params, 33, "cpu", 4)
    with LaunchRecorder(jits, run) as ours:
        out_ours = spec.run({**inputs, "out": _poisoned(inputs["out"])}, config_from_entry(spec, config)).clone()
    entry = table_entry(spec, config_from_entry(spec, config))
    if engine == "vllm":
        ns = vllm_wrappers(wheel_dir(), version, jits, entry)
        call = ns["w8a8_triton_block_scaled_mm"]
    else:
        ns = sglang_wrappers(wheel_dir(), version, jits, entry, None)
        call = ns["w8a8_block_fp8_matmul_triton"]
    with LaunchRecorder(jits, run) as theirs:
        out_engine = call(inputs["A"], inputs["B"], inputs["As"], inputs["Bs"], BLOCK, torch.bfloat16)
    # our launcher writes into the given output, the wrapper allocates its own
    assert differences(theirs.launches, ours.launches, ignore=("c_ptr",)) == []
    assert [x["kernel"] for x in ours.launches][:1] == (
        ["_w8a8_block_fp8_matmul_hopper"] if config.get("SWAP_AB") else [names[0]])
    if not run:
        return
    ref = spec.reference(inputs)
    assert relative_error(out_ours, ref) < spec.tolerance / 4 and relative_error(out_engine, ref) < spec.tolerance / 4


# -- what is not supported -------------------------------------------------------------------------
def _edited_copy(tmp_path, engine, version, rel, edit):
    folder = extract(engine, str(wheel(wheel_dir(), engine, version)), tmp_path / f"{engine}-{version}", launcher(engine).FILES)
    path = folder / rel
    path.write_text(edit(path.read_text()))
    return folder


def test_unknown_version_is_refused_in_one_line(tmp_path, capsys):
    """A version whose wrappers match no supported one (here 0.5.23's invoke with another
    line) is refused at load time, by tune and check alike, naming the versions that work."""
    def edit(text):
        old = function_source(text, "invoke_fused_moe_kernel")
        return text.replace(old, old.replace("assert topk_weights.stride(1) == 1",
                                             "assert topk_weights.stride(1) == 1\n    pass"))
    folder = _edited_copy(tmp_path, "sglang", "0.5.23", sgl.MOE_FILE, edit)
    manifest = folder / "tuner-engine-source.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": "0.5.24"}))
    with pytest.raises(TunerError, match=r"sglang 0\.5\.24 .*cannot be launched.*invoke_fused_moe_kernel.*"
                                         r"0\.5\.21, 0\.5\.22, 0\.5\.23.*--kernel-source ours"):
        kernel_registry.get_kernel("fused_moe", "sglang", str(folder))
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"hidden_size": 256, "num_attention_heads": 2, "n_routed_experts": 8,
                                 "moe_intermediate_size": 256, "num_experts_per_tok": 2,
                                 "quantization_config": {"quant_method": "fp8", "weight_block_size": BLOCK}}))
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"1": cfg(64, 64)}))
    for argv in (["check", "--model", str(model), "--kernel", "moe", "--kernel-source", "sglang", "--table",
                  str(table), "--engine-source", str(folder)],):
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and \
            f"tuner launches sglang {', '.join(sgl.SUPPORTED)}:" in err, err
    # the GEMM wrappers of that folder are 0.5.23's: its GEMM kernel still loads
    assert kernel_registry.get_kernel("fp8_gemm", "sglang", str(folder)).notes["launched_as"] == "0.5.23"


def test_renamed_kernel_function_is_refused_in_one_line(tmp_path, capsys):
    folder = _edited_copy(tmp_path, "vllm", "0.33.0", vllm.MOE_FILE,
                          lambda t: t.replace("def fused_moe_kernel(", "def fused_moe_kernel_v2("))
    with pytest.raises(TunerError, match="its kernel moved or was renamed.*fused_moe_kernel.*--kernel-source ours"):
        kernel_registry.get_kernel("fused_moe", "vllm", str(folder))


def test_changed_signature_is_refused(tmp_path):
    folder = _edited_copy(tmp_path, "sglang", "0.5.22", sgl.MOE_FILE,
                          lambda t: t.replace("    LORA_PRESERVE_BASE: tl.constexpr,\n", "", 1))
    with pytest.raises(TunerError, match="fused_moe_kernel takes other arguments"):
        kernel_registry.get_kernel("fused_moe", "sglang", str(folder))


def test_same_wrappers_under_another_number_launch_as_that_release(tmp_path):
    """A build that reports another version but carries a release's exact wrappers (a
    post-release, a rebuilt wheel) is launched as that release."""
    folder = extract("vllm", str(wheel(wheel_dir(), "vllm", "0.32.0")), tmp_path / "v", launcher("vllm").FILES)
    manifest = folder / "tuner-engine-source.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": "0.32.0.post1"}))
    spec = kernel_registry.get_kernel("fused_moe", "vllm", str(folder))
    assert spec.notes["launched_as"] in ("0.31.0", "0.32.0") and spec.source_version == "0.32.0.post1"


def test_newest_wheel_of_a_folder_is_read():
    assert locate("sglang").version == sgl.SUPPORTED[-1] and locate("vllm").version == vllm.SUPPORTED[-1]


def test_plan_says_which_versions_are_supported(capsys):
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1", "--dry-run",
                 "--engine-source", str(wheel(wheel_dir(), "sglang", "0.5.22")),
                 str(wheel(wheel_dir(), "vllm", "0.31.0"))]) == 0
    out = capsys.readouterr().out
    assert "sglang 0.5.22 (supported: launched as 0.5.22" in out and "vllm 0.31.0 (supported" in out


def test_every_supported_wheel_is_in_ci():
    names = {p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in wheel_dir().glob("*.whl")}
    assert {f"vllm-{v}" for v in vllm.SUPPORTED} | {f"sglang-{v}" for v in sgl.SUPPORTED} <= names
    for engine, module in (("vllm", vllm), ("sglang", sgl)):
        for version in module.SUPPORTED:
            # the files of the kernels the data launches for that release (SGLang 0.5.19-0.5.20: its MoE's)
            launched = {k: [r for r in module.releases(k) if r.version == version] for k in module.KERNEL_FUNCTIONS}
            files = files_read({k: module.KERNEL_FUNCTIONS[k] for k in launched if launched[k]}, launched)
            with zipfile.ZipFile(wheel(wheel_dir(), engine, version)) as z:
                assert files and set(files) <= set(z.namelist())
