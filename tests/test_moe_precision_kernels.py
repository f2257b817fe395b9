"""Issue 52: the engines' own fused-MoE kernels at the integer precisions, read from every supported
release's wheel and run in Triton's interpreter through our launchers: against the float64
reference of the dequantized computation on fresh random inputs (outputs poisoned first; weights
quantized as the engines' checkpoint loaders lay them out), and launched exactly as each release's
own wrapper launches them (vLLM's fused_experts_impl, its TritonWNA16Experts.apply; SGLang's Triton
runner), every argument, constexpr and grid compared."""

import pytest
import torch
from engine_loaders import wheel_dir
from engine_wrappers import LaunchRecorder, differences, sglang_wrappers, vllm_wna16_apply, vllm_wrappers, wheel

from kernels.engines import sglang as sgl
from kernels.engines import sglang_quant, vllm
from kernels.engines.base import jit_functions
from kernels.engines.vllm_quant_spec import WNA16_KERNEL
from kernels.moe_quant import MoeQuant
from tuner.measure.numerics import check_config, relative_error
from tuner.plan import kernel_registry
from tuner.plan.kernel_api import config_from_entry, table_entry
from tuner.plan.kernel_sources import locate

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

SHAPE = {"E": 8, "N": 128, "K": 256, "topk": 2, "routing": "uniform"}
CHANNEL = {"dtype": "int8_w8a8", "block_shape": None}
BLOCK = {"dtype": "int8_w8a8", "block_shape": [128, 128]}
W8A16 = {"dtype": "int8_w8a16", "block_shape": None}
W8A16_GROUP = {"dtype": "int8_w8a16", "block_shape": None, "group_size": 64, "zero_point": True}
INT4 = {"dtype": "int4_w4a16", "block_shape": None, "group_size": 64}
INT4_ZP = {"dtype": "int4_w4a16", "block_shape": None, "group_size": 32, "zero_point": True}


def cfg(bm, bn, bk=64, group=1, warps=4, stages=2, **extra):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages, **extra}


def _spec(engine, version=None):
    """The engine's launcher variant for the integer precisions (kernels/engines/<engine>_quant_spec.py)."""
    version = version or (vllm.SUPPORTED if engine == "vllm" else sgl.SUPPORTED)[-1]
    spec = kernel_registry.get_kernel("fused_moe", engine, str(wheel(wheel_dir(), engine, version)), variant="quant")
    assert spec.variant == "quant" and spec.notes["launched_as"] == version
    return spec


def rel_error(kernel, params, M, config, seed=7):
    agreement, _ = check_config(kernel, params, M, config, "cpu", seed)
    assert not agreement.unwritten, "the kernel left part of the output unwritten"
    return agreement.rel_error


# -- against the float64 reference ----------------------------------------------------------------------
@pytest.mark.parametrize("precision,M,config", [
    (CHANNEL, 1, cfg(16, 64, SPLIT_K=1)),           # M * topk * 4 <= E: the small-batch path
    (CHANNEL, 5, cfg(32, 32, bk=128, SPLIT_K=1)),
    (W8A16, 5, cfg(16, 64, SPLIT_K=1)),
    (W8A16_GROUP, 5, cfg(16, 64, bk=128, SPLIT_K=1)),
    (INT4, 1, cfg(4, 32, SPLIT_K=1)),                # vLLM's own default tile at one token (no small-batch path)
    (INT4_ZP, 5, cfg(32, 64, bk=32, warps=2, stages=1, SPLIT_K=1)),
], ids=["int8-channel-m1", "int8-channel", "w8a16-channel", "w8a16-group-zp", "int4-m1", "int4-zp"])
def test_vllm_kernels_match_the_reference(precision, M, config):
    kernel = _spec("vllm")
    assert rel_error(kernel, {**SHAPE, **precision, "part": "op"}, M, config) < kernel.tolerance / 4


@pytest.mark.parametrize("part", ["up", "down"])
@pytest.mark.parametrize("precision,M,config", [
    (CHANNEL, 5, cfg(16, 64, USE_TMA=0)),
    (BLOCK, 5, cfg(16, 256, USE_TMA=0)),             # two 128-wide scale blocks per N tile
    (BLOCK, 3, cfg(64, 64, bk=128, USE_TMA=0)),
    (W8A16_GROUP, 5, cfg(16, 64, bk=128, USE_TMA=0)),
    (INT4, 5, cfg(16, 32, bk=64, USE_TMA=0)),
    (INT4_ZP, 3, cfg(32, 64, bk=32, warps=2, stages=1, USE_TMA=0)),
], ids=["int8-channel", "int8-block-wide-n", "int8-block", "w8a16-group-zp", "int4", "int4-zp"])
def test_sglang_kernels_match_the_reference(part, precision, M, config):
    kernel = _spec("sglang")
    assert rel_error(kernel, {**SHAPE, **precision, "part": part}, M, config) < kernel.tolerance / 4


def test_a_wrong_zero_point_is_caught():
    """The reference dequantizes with the stored zero points: a kernel reading the format's
    midpoint instead (has_zp dropped) is far off, so the tolerance means something here."""
    kernel = _spec("vllm")
    params = {**SHAPE, **INT4_ZP, "part": "op"}
    inputs = kernel.make_inputs(params, 5, "cpu", 3)
    ref = kernel.reference(inputs)
    assert relative_error(kernel.run({**inputs, "out": inputs["out"].fill_(float("nan"))}, cfg(16, 32, SPLIT_K=1)),
                          ref) < kernel.tolerance / 4
    wrong = kernel.run({**inputs, "w1_zp": None, "w2_zp": None, "out": inputs["out"].fill_(float("nan"))},
                       cfg(16, 32, SPLIT_K=1))
    assert relative_error(wrong, ref) > 10 * kernel.tolerance


# -- launched as each release's own wrapper launches them ----------------------------------------------
def _poisoned(t):
    return t.fill_(float("nan"))


def _unrun(launches: list[dict]) -> list[dict]:
    """Launches recorded without running: the second GEMM's INT8 activation is quantized from an
    output the first never wrote, so its values are whatever memory held (dtype, shape and
    strides still compared)."""
    out = []
    for x in launches:
        a = x["args"].get("a_ptr")
        if isinstance(a, tuple) and a[0] == "tensor" and a[1] == "torch.int8":
            x = {**x, "args": {**x["args"], "a_ptr": a[:4]}}
        out.append(x)
    return out


@pytest.mark.parametrize("version", vllm.SUPPORTED)
@pytest.mark.parametrize("precision,M,config,run", [
    (CHANNEL, 1, cfg(16, 64), False),
    (CHANNEL, 6, cfg(32, 128, bk=128), True),
    (W8A16, 6, cfg(16, 64), False),
], ids=["int8-channel-m1", "int8-channel", "w8a16-channel"])
def test_vllm_int8_launches_as_fused_experts_impl(version, precision, M, config, run):
    run = run and version == vllm.SUPPORTED[-1]          # launches compared at every version, run at the newest
    spec = _spec("vllm", version)
    (kernel,) = jit_functions(locate("vllm", spec.origin), vllm.MOE_FILE, ["fused_moe_kernel"])
    params = {**SHAPE, **precision, "part": "op"}
    inputs = spec.make_inputs(params, M, "cpu", seed=11)
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as ours:
        out_ours = spec.run({**inputs, "out": _poisoned(inputs["out"])}, {**config, "SPLIT_K": 1}).clone()
    ns = vllm_wrappers(wheel_dir(), version, {"fused_moe_kernel": kernel}, config)
    flags = MoeQuant.of(params).flags()
    with LaunchRecorder({"fused_moe_kernel": kernel}, run) as engine:
        out_engine = ns["fused_experts_impl"](
            inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
            use_int8_w8a8=flags["use_int8_w8a8"], use_int8_w8a16=flags["use_int8_w8a16"],
            per_channel_quant=flags["per_channel_quant"], w1_scale=inputs["w1_scale"], w2_scale=inputs["w2_scale"])
    assert differences(_unrun(engine.launches), _unrun(ours.launches)) == []
    assert engine.launches[0]["args"]["naive_block_assignment"] == (M * 2 * 4 <= 8)
    if run:
        ref = spec.reference(inputs)
        assert relative_error(out_ours, ref) < spec.tolerance / 4
        assert relative_error(out_engine, ref) < spec.tolerance / 4


@pytest.mark.parametrize("version", vllm.SUPPORTED)
@pytest.mark.parametrize("precision,M,config,run", [
    (INT4, 1, cfg(1, 32), False),
    (INT4_ZP, 5, cfg(16, 64, bk=32), True),
    (W8A16_GROUP, 9, cfg(64, 32, bk=128, group=16), False),
], ids=["int4-m1", "int4-zp", "w8a16-group"])
def test_vllm_group_wise_launches_as_triton_wna16_experts(version, precision, M, config, run):
    """The table's row (SPLIT_K included) reaches fused_moe_kernel_gptq_awq as vLLM's
    TritonWNA16Experts.apply passes it."""
    run = run and version == vllm.SUPPORTED[-1]          # launches compared at every version, run at the newest
    spec = _spec("vllm", version)
    (kernel,) = jit_functions(locate("vllm", spec.origin), vllm.MOE_FILE, [WNA16_KERNEL])
    params = {**SHAPE, **precision, "part": "op"}
    inputs = spec.make_inputs(params, M, "cpu", seed=5)
    row = table_entry(spec, config_from_entry(spec, config), params)
    assert row["SPLIT_K"] == 1                                   # kept in the row: the launch passes it
    with LaunchRecorder({WNA16_KERNEL: kernel}, run) as ours:
        out_ours = spec.run({**inputs, "out": _poisoned(inputs["out"])}, config_from_entry(spec, row)).clone()
    mq = MoeQuant.of(params)
    flags = mq.flags()
    apply = vllm_wna16_apply(wheel_dir(), version, {WNA16_KERNEL: kernel}, row, {
        "w1_scale": inputs["w1_scale"], "w2_scale": inputs["w2_scale"], "w1_zp": inputs["w1_zp"],
        "w2_zp": inputs["w2_zp"], "use_int4_w4a16": flags["use_int4_w4a16"],
        "use_int8_w8a16": flags["use_int8_w8a16"], "block_shape": mq.engine_block_shape})
    with LaunchRecorder({WNA16_KERNEL: kernel}, run) as engine:
        out_engine = apply(torch.empty_like(inputs["out"]), inputs["x"], inputs["w1"], inputs["w2"],
                           inputs["topk_weights"], inputs["topk_ids"])
    assert differences(engine.launches, ours.launches) == []
    assert engine.launches[0]["args"]["SPLIT_K"] == 1 and engine.launches[0]["args"]["has_zp"] == bool(mq.zero_point)
    if run:
        ref = spec.reference(inputs)
        assert relative_error(out_ours, ref) < spec.tolerance / 4
        assert relative_error(out_engine, ref) < spec.tolerance / 4


@pytest.mark.parametrize("version", sgl.SUPPORTED)
@pytest.mark.parametrize("precision,M,config,run", [
    (CHANNEL, 5, cfg(16, 64), False),
    (BLOCK, 5, cfg(32, 256), True),
    (INT4_ZP, 5, cfg(16, 64, bk=32), True),
    (W8A16_GROUP, 3, cfg(32, 32, bk=128), False),
], ids=["int8-channel", "int8-block", "int4-zp", "w8a16-group"])
def test_sglang_launches_as_its_own_runner(version, precision, M, config, run):
    run = run and version == sgl.SUPPORTED[-1]           # launches compared at every version, run at the newest
    spec = _spec("sglang", version)
    code = locate("sglang", spec.origin)
    # loaded one name at a time, as the launcher loads them (the same jit function objects)
    kernels = {name: jit_functions(code, sgl.MOE_FILE, [name])[0] for name in ("fused_moe_kernel", WNA16_KERNEL)}
    launch = next(r.launch for r in sgl.RELEASES["fused_moe"] if r.version == version)
    params = {**SHAPE, **precision, "part": "op"}
    inputs = spec.make_inputs(params, M, "cpu", seed=5)
    entry = config_from_entry(spec, config)
    with LaunchRecorder(kernels, run) as ours:
        out_ours = sglang_quant.moe_layer(code, launch, {**inputs, "out": _poisoned(inputs["out"])}, entry, entry).clone()
    ns = sglang_wrappers(wheel_dir(), version, kernels, table_entry(spec, entry), table_entry(spec, entry))
    mq = MoeQuant.of(params)
    flags = {**mq.flags(), "block_shape": mq.engine_block_shape}
    x, ids = inputs["x"], inputs["local_ids"]
    with LaunchRecorder(kernels, run) as engine:
        prepared = ns["_prepare_fused_moe_run"](x, inputs["w1"], inputs["w2"], ids, **flags)
        config_, down_config, down_tma, up_tma, sorted_ids, expert_ids, npp = prepared
        out_engine = ns["_fused_moe_kernel_sequence"](
            x, inputs["w1"], inputs["w2"], inputs["topk_weights"], ids, sorted_ids, expert_ids, npp, config_,
            down_config, down_tma, up_tma, b1=None, b2=None, w1_scale=inputs["w1_scale"],
            w2_scale=inputs["w2_scale"], w1_zp=inputs["w1_zp"], w2_zp=inputs["w2_zp"], a1_scale=None, a2_scale=None,
            activation="silu", is_gated=True, no_combine=False, inplace=False, apply_router_weight_on_input=False,
            routed_scaling_factor=None, gemm1_alpha=None, gemm1_limit=None, filter_expert=False, **flags)
    assert differences(_unrun(engine.launches), _unrun(ours.launches)) == []
    assert [x["kernel"] for x in engine.launches] == 2 * [WNA16_KERNEL if mq.wna16 else "fused_moe_kernel"]
    if run:
        ref = spec.reference(inputs)
        assert relative_error(out_ours, ref) < spec.tolerance / 4
        assert relative_error(out_engine, ref) < spec.tolerance / 4


def test_sglang_table_parts_launch_as_the_layer_does():
    """What an int4 table is timed on (part up, part down) launches its GEMM as the whole layer
    does with that table's entry."""
    spec = _spec("sglang")
    code = locate("sglang", spec.origin)
    (kernel,) = jit_functions(code, sgl.MOE_FILE, [WNA16_KERNEL])
    launch = sgl.RELEASES["fused_moe"][-1].launch
    config = config_from_entry(spec, cfg(16, 64, bk=32))
    layer_inputs = spec.make_inputs({**SHAPE, **INT4_ZP, "part": "op"}, 5, "cpu", seed=2)
    with LaunchRecorder({WNA16_KERNEL: kernel}, execute=False) as whole:
        sglang_quant.moe_layer(code, launch, layer_inputs, config, config)
    for i, part in enumerate(("up", "down")):
        inputs = spec.make_inputs({**SHAPE, **INT4_ZP, "part": part}, 5, "cpu", seed=2)
        with LaunchRecorder({WNA16_KERNEL: kernel}, execute=False) as one:
            spec.run(inputs, config)
        # the inputs (activation, output buffer) differ in content, not in what the launch passes
        assert differences([whole.launches[i]], one.launches, ignore=("a_ptr", "c_ptr")) == []


def test_a_vllm_group_wise_row_without_split_k_fails_its_launch_and_the_audit_says_so(tmp_path, capsys):
    """vLLM's group-wise launch passes the table's row as the kernel's arguments: its own
    TritonWNA16Experts.apply raises TypeError on a row without SPLIT_K (which is why ours keep
    it), and `tuner audit` reads such a table as an error."""
    import json

    from tuner.cli import main
    spec = _spec("vllm")
    (kernel,) = jit_functions(locate("vllm", spec.origin), vllm.MOE_FILE, [WNA16_KERNEL])
    params = {**SHAPE, **INT4, "part": "op"}
    inputs = spec.make_inputs(params, 3, "cpu", seed=1)
    row = cfg(16, 64)                                          # no SPLIT_K
    mq = MoeQuant.of(params)
    apply = vllm_wna16_apply(wheel_dir(), vllm.SUPPORTED[-1], {WNA16_KERNEL: kernel}, row, {
        "w1_scale": inputs["w1_scale"], "w2_scale": inputs["w2_scale"], "w1_zp": None, "w2_zp": None,
        "use_int4_w4a16": True, "use_int8_w8a16": False, "block_shape": mq.engine_block_shape})
    with pytest.raises(TypeError, match="SPLIT_K"):
        apply(torch.empty_like(inputs["out"]), inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"],
              inputs["topk_ids"])
    folder = tmp_path / "override"
    folder.mkdir()
    (folder / "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json").write_text(
        json.dumps({"1": row, "64": {**row, "SPLIT_K": 1}}))
    model = tmp_path / "awq.json"
    model.write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
                                 "num_attention_heads": 32, "num_experts": 128, "moe_intermediate_size": 768,
                                 "num_experts_per_tok": 8, "quantization_config": {
                                     "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}))
    code = main(["audit", "--engine", "vllm", "--model", str(model), "--gpu", "H200", "--tp", "1", "--per-rank",
                 "--engine-source", str(wheel(wheel_dir(), "vllm", vllm.SUPPORTED[-1])), "--triton", "3.6.0",
                 "--moe-config-dir", str(folder), "--batch-sizes", "1", "64", "--out", str(tmp_path / "a")])
    capsys.readouterr()
    assert code == 1
    (audited,) = json.loads((tmp_path / "a" / "audit.json").read_text())["kernels"]
    bad = [f for f in audited["findings"] if f["kind"] == "bad_row"]
    assert [f["rows"] for f in bad] == [[1]] and "lack SPLIT_K" in bad[0]["reason"]
