"""The real kernels' timed runs under CUDA-graph capture's rules (tuner/measure/capture_rules.py).

On a GPU every timed run is captured in a CUDA graph; on the CPU device it is timed under the
rules that capture enforces. Here every kernel the tuner times runs through the CPU device's
own timing (DeviceMeasurer._time_once -> CpuDevice.time_runs, the code the measuring child
runs): ours, and vLLM's and SGLang's through our launchers with their kernels read from
their wheels ($TUNER_ENGINE_WHEELS, as tests/test_engine_kernels.py), down every launch path
at M below and above each switch; and each engine's own Python wrapper (from its wheel, its
CUDA ops shimmed: tests/engine_wrappers.py) under the same rules, where it takes the same paths.

Shapes are tiny (Triton's interpreter). One measurer per kernel is shared by the module; each
(problem, M) times all its configs in one call (inputs made once), with one input set and one
timed call per config: the warm-up runs outside the rules and the timed call inside, exactly
as with more of each.
"""

import pytest
import torch
from engine_loaders import wheel_dir
from test_engine_kernels import triton_unsqueezes_scalars

from kernels.engines import sglang as sgl
from kernels.engines import vllm
from tuner.measure.device_measurer import DeviceMeasurer
from tuner.plan import kernel_registry
from tuner.plan.gpus import get_gpu
from tuner.plan.problems import Problem

BLOCK = [128, 128]
MOE = {"E": 8, "N": 128, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": BLOCK, "routing": "uniform",
       "part": "op"}
SGL_MOE = {**MOE, "E": 9, "shared_experts": 1}          # 8 routed experts + SGLang's fused shared one
GEMM = {"N": 256, "K": 384, "block_shape": BLOCK}
MLA = {"heads": 16, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": 16, "context": 48}
ENGINES = wheel_dir() is not None
pytestmark = pytest.mark.triton


def needs_wheels(test):
    return pytest.mark.ci_variables(pytest.mark.skipif(
        not ENGINES, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")(test))


# SGLang 0.5.23's kernel with swap-AB at BLOCK_SIZE_N <= 128 needs a Triton that takes `scalar[:, None]`
# (3.6 does, the GPU machines' Triton; 3.9 refuses it: tests/test_engine_kernels.py)
def skip_scalar_swap(*configs: dict | None) -> None:
    """Skip where a config takes SGLang's swap-AB path (BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64) at
    BLOCK_SIZE_N <= 128, which the running Triton cannot compile (3.6, the GPU machines' Triton, can)."""
    if any(c and c["BLOCK_SIZE_M"] < 64 and 64 <= c["BLOCK_SIZE_N"] <= 128 for c in configs) \
            and not triton_unsqueezes_scalars():
        pytest.skip("this Triton refuses `scalar[:, None]`, which SGLang's swap-AB path at BLOCK_SIZE_N <= 128 does")


def cfg(bm, bn, bk=128, group=1, warps=4, stages=3, **extra):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages, **extra}


def mla_cfg(bn=32, bh=16, splits=4):
    return {"BLOCK_N": bn, "BLOCK_H": bh, "num_kv_splits": splits, "num_warps": 4, "num_stages": 2, "merge_warps": 4}


@pytest.fixture(scope="module")
def measurers():
    """One CPU-device measurer per kernel (source and version), made when first asked for."""
    made: dict = {}

    def get(name: str, source: str = "ours", version: str | None = None) -> DeviceMeasurer:
        key = (name, source, version)
        if key not in made:
            if source == "ours":
                kernel = kernel_registry.get_kernel(name)
            else:
                from engine_wrappers import wheel
                kernel = kernel_registry.get_kernel(name, source, str(wheel(wheel_dir(), source, version)))
            made[key] = DeviceMeasurer(kernel, get_gpu("H200"), compile_workers=0, device="cpu", input_sets=1,
                                       reps=1)
        return made[key]
    yield get
    for m in made.values():
        m.close()


def timed_under_the_rules(measurer: DeviceMeasurer, params: dict, M: int, configs: list[dict]) -> None:
    problem = Problem(measurer.kernel.name, params)
    got = measurer.measure(problem, M, configs)
    failed = [(c, m.error) for c, m in zip(configs, got) if m.time_us is None]
    assert not failed, failed
    assert measurer.device.clock_warmups >= 1


# -- ours ----------------------------------------------------------------------------------------
OURS = [
    # our MoE always aligns: M=1, and more pairs than a block holds
    pytest.param("fused_moe", MOE, 1, [cfg(16, 64)], id="moe-m1"),
    pytest.param("fused_moe", MOE, 16, [cfg(16, 128, bk=64)], id="moe-m16"),
    # expert parallelism: pairs of other GPUs' experts dropped by the alignment, rows zeroed
    pytest.param("fused_moe", {**MOE, "ep": 2}, 4, [cfg(16, 64)], id="moe-ep2"),
    # SGLang's tables on our kernel: one projection each, and both with two configs
    pytest.param("fused_moe", {**MOE, "part": "up"}, 4, [cfg(16, 64)], id="moe-up"),
    pytest.param("fused_moe", {**MOE, "part": "down"}, 4, [cfg(16, 64)], id="moe-down"),
    pytest.param("fused_moe", {**MOE, "part": "pair", "up_config": cfg(16, 128)}, 4, [cfg(16, 64)], id="moe-pair"),
    # the other precisions: bf16, and fp8 with one scale per tensor
    pytest.param("fused_moe", {**MOE, "dtype": "bf16", "block_shape": None}, 4, [cfg(16, 64, bk=64)], id="moe-bf16"),
    pytest.param("fused_moe", {**MOE, "block_shape": None}, 4, [cfg(16, 64, bk=64)], id="moe-fp8-per-tensor"),
    pytest.param("fp8_gemm", GEMM, 1, [cfg(16, 64)], id="gemm-m1"),
    pytest.param("fp8_gemm", GEMM, 33, [cfg(32, 128, bk=64, group=4)], id="gemm-m33"),
    # MLA decode: one split per request, and several splits merged
    pytest.param("mla_decode", MLA, 1, [mla_cfg(splits=1)], id="mla-b1"),
    pytest.param("mla_decode", MLA, 3, [mla_cfg(bn=16, splits=4)], id="mla-b3"),
]


@pytest.mark.parametrize("name,params,M,configs", OURS)
def test_our_kernels_time_under_the_capture_rules(measurers, name, params, M, configs):
    timed_under_the_rules(measurers(name), params, M, configs)


# -- vLLM's kernels through our launcher ------------------------------------------------------------
VLLM = [
    # small-batch path (M * topk * 4 <= E: no alignment), with and without swap-AB
    pytest.param(MOE, 1, [cfg(16, 64), cfg(64, 32, bk=64)], True, "0.33.0", id="moe-smallbatch"),
    # aligned, fewer pairs than BLOCK_SIZE_M (the grid capped to the pairs), swap-AB
    pytest.param(MOE, 2, [cfg(16, 64)], False, "0.33.0", id="moe-aligned-capped"),
    # aligned past every cap (M >= BLOCK_SIZE_M): swap-AB and not
    pytest.param(MOE, 16, [cfg(16, 128), cfg(64, 128, bk=64)], False, "0.33.0", id="moe-aligned"),
    # expert parallelism at M=1: never the small-batch path; other GPUs' pairs dropped
    pytest.param({**MOE, "ep": 2}, 1, [cfg(16, 64)], False, "0.33.0", id="moe-ep2"),
    pytest.param({**MOE, "dtype": "bf16", "block_shape": None}, 4, [cfg(16, 64, bk=64)], False, "0.33.0", id="moe-bf16"),
    # 0.31.0 passes the weight-scale strides its own way
    pytest.param(MOE, 4, [cfg(16, 64)], False, "0.31.0", id="moe-0.31"),
]


@needs_wheels
@pytest.mark.parametrize("params,M,configs,small_batch,version", VLLM)
def test_vllm_moe_times_under_the_capture_rules(measurers, params, M, configs, small_batch, version):
    taken = params.get("ep", 1) == 1 and vllm.naive_block_assignment(M, params["topk"], params["E"])
    assert taken == small_batch                   # the path this case is for
    timed_under_the_rules(measurers("fused_moe", "vllm", version), params, M, configs)


@needs_wheels
@pytest.mark.parametrize("M,config", [(1, cfg(16, 64)), (33, cfg(32, 128, bk=64, group=4))])
def test_vllm_gemm_times_under_the_capture_rules(measurers, M, config):
    timed_under_the_rules(measurers("fp8_gemm", "vllm", "0.33.0"), GEMM, M, [config])


# -- SGLang's kernels through our launcher --------------------------------------------------------
T0, T1 = {"USE_TMA": 0}, {"USE_TMA": 1}
SGLANG = [
    # sorted length numel * BLOCK_SIZE_M (3 pairs < E + 1) with swap-AB; TMA for B in the up GEMM
    pytest.param({**SGL_MOE, "part": "up"}, 1, [cfg(16, 64, **T0)], True, "0.5.23", id="up-short-swap"),
    pytest.param({**SGL_MOE, "part": "up"}, 1, [cfg(32, 256, bk=64, **T1)], True, "0.5.23", id="up-short-tma"),
    # numel + (E + 1) * (BLOCK_SIZE_M - 1) (12 pairs >= E + 1); down with TMA: A and B descriptors over
    # the sorted activation, quantized over the rows it reads (0.5.22+)
    pytest.param({**SGL_MOE, "part": "up"}, 4, [cfg(32, 128, **T0)], False, "0.5.23", id="up-long"),
    pytest.param({**SGL_MOE, "part": "down"}, 1, [cfg(32, 128, **T0)], True, "0.5.23", id="down-short"),
    pytest.param({**SGL_MOE, "part": "down"}, 4, [cfg(64, 128, bk=64, **T1)], False, "0.5.23", id="down-long-tma"),
    # the whole layer (the tied pair) with the up GEMM storing sorted rows for a TMA down GEMM
    pytest.param({**SGL_MOE, "part": "pair", "up_config": cfg(32, 64, **T0)}, 4, [cfg(32, 256, bk=64, **T1)],
                 False, "0.5.23", id="pair-tma"),
    # expert parallelism: other GPUs' pairs in a leading bucket of expert -1
    pytest.param({**MOE, "ep": 2, "part": "up"}, 8, [cfg(32, 128, **T0)], False, "0.5.23", id="up-ep2"),
    # 0.5.21: filter_expert under EP, and the TMA down GEMM's quantization over every sorted row
    pytest.param({**MOE, "ep": 2, "part": "up"}, 4, [cfg(32, 128, **T0)], True, "0.5.21", id="up-ep2-0.5.21"),
    pytest.param({**SGL_MOE, "part": "down"}, 4, [cfg(32, 256, bk=64, **T1)], False, "0.5.21", id="down-tma-0.5.21"),
]


@needs_wheels
@pytest.mark.parametrize("params,M,configs,short,version", SGLANG)
def test_sglang_moe_times_under_the_capture_rules(measurers, params, M, configs, short, version):
    numel = M * (params["topk"] + params.get("shared_experts", 0))
    assert (numel < params["E"] + 1) == short     # which sorted length this case is for
    skip_scalar_swap(*configs, params.get("up_config"))
    timed_under_the_rules(measurers("fused_moe", "sglang", version), params, M, configs)


@needs_wheels
@pytest.mark.parametrize("M", [1, 33])
def test_sglang_gemm_times_under_the_capture_rules(measurers, M):
    """The plain kernel, the Hopper one with swapped operands, and split-K with its reduction."""
    configs = [cfg(16, 64, SWAP_AB=0, SPLIT_K=1), cfg(16, 64, SWAP_AB=1, SPLIT_K=1), cfg(32, 128, bk=64, SWAP_AB=1,
                                                                                      SPLIT_K=2)]
    assert [sgl.hopper_kernel(c) for c in configs] == [False, True, True]
    timed_under_the_rules(measurers("fp8_gemm", "sglang", "0.5.23"), GEMM, M, configs)


# -- the engines' own wrappers, from their wheels -------------------------------------------------
def _exempt(fn):
    """An engine's CUDA op, shimmed (tests/engine_wrappers.py): one device op on the GPU, so
    not held to the rules here (as a kernel launch is not)."""
    from tuner.measure.capture_rules import exempt

    def op(*args, **kwargs):
        with exempt():
            return fn(*args, **kwargs)
    return op


def _engine_jit(engine: str, version: str):
    from engine_wrappers import wheel

    from kernels.engines.base import jit_functions
    from tuner.plan.kernel_sources import locate
    module = vllm if engine == "vllm" else sgl
    return jit_functions(locate(engine, str(wheel(wheel_dir(), engine, version))), module.MOE_FILE,
                         ["fused_moe_kernel"])[0]


def _warm_then_under_the_rules(call):
    """The warm-up outside the rules, then the same call under them (as the GPU captures it)."""
    from tuner.measure.capture_rules import capture_rules
    call()
    with capture_rules():
        out = call()
    assert torch.isfinite(out.float()).all()


@needs_wheels
@pytest.mark.parametrize("params,M,config", [
    pytest.param({**MOE, "ep": 2}, 4, cfg(16, 64), id="ep2-aligned-swap"),
])
def test_vllms_own_wrapper_under_the_capture_rules(params, M, config):
    """vLLM 0.33.0's fused_experts_impl, alignment (with an expert map) and launch wrapper, its CUDA
    ops shimmed: one case takes them all (the paths differ in the launch's arguments)."""
    from engine_wrappers import vllm_wrappers
    jit = _engine_jit("vllm", "0.33.0")
    ns = vllm_wrappers(wheel_dir(), "0.33.0", {"fused_moe_kernel": jit}, config)
    ns["ops"].moe_align_block_size = _exempt(ns["ops"].moe_align_block_size)
    kernel = kernel_registry.get_kernel("fused_moe", "vllm")
    inputs = kernel.make_inputs(params, M, "cpu", 3)
    E, ep = params["E"], params.get("ep", 1)
    expert_map = None
    if ep > 1:                     # rank 0 of EP: global experts 0..E-1 are this GPU's
        expert_map = torch.full((E * ep,), -1, dtype=torch.int32)
        expert_map[:E] = torch.arange(E, dtype=torch.int32)
    _warm_then_under_the_rules(lambda: ns["fused_experts_impl"](
        inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"], use_fp8_w8a8=True,
        global_num_experts=E * ep, expert_map=expert_map, w1_scale=inputs["w1_scale"], w2_scale=inputs["w2_scale"],
        block_shape=BLOCK))


@needs_wheels
@pytest.mark.parametrize("params,M,up,down", [
    pytest.param({**MOE, "ep": 2}, 5, cfg(32, 128, **T0), cfg(32, 128, bk=64, **T1), id="ep2-long-tma-down"),
])
def test_sglangs_own_wrapper_under_the_capture_rules(params, M, up, down):
    """SGLang 0.5.23's Triton runner (_prepare_fused_moe_run, _fused_moe_kernel_sequence, its
    alignment and launch wrappers, TMA descriptors; its CUDA ops shimmed), under expert
    parallelism with the long sorted length (10 pairs, 9 buckets) and a TMA down GEMM."""
    skip_scalar_swap(up, down)
    from engine_wrappers import sglang_wrappers
    jit = _engine_jit("sglang", "0.5.23")
    ns = sglang_wrappers(wheel_dir(), "0.5.23", {"fused_moe_kernel": jit}, up, down)
    for op in ("sgl_moe_align_block_size", "moe_align_small_numel"):
        ns[op] = _exempt(ns[op])
    kernel = kernel_registry.get_kernel("fused_moe", "sglang")
    inputs = kernel.make_inputs(params, M, "cpu", 5)
    ep = params.get("ep", 1)
    flags = dict(use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                 per_channel_quant=False, block_shape=BLOCK)
    x, ids = inputs["x"], inputs["local_ids"]

    def call():
        config, down_config, down_tma, up_tma, sorted_ids, expert_ids, npp = ns["_prepare_fused_moe_run"](
            x, inputs["w1"], inputs["w2"], ids, **flags)
        return ns["_fused_moe_kernel_sequence"](
            x, inputs["w1"], inputs["w2"], inputs["topk_weights"], ids, sorted_ids, expert_ids, npp, config,
            down_config, down_tma, up_tma, b1=None, b2=None, w1_scale=inputs["w1_scale"], w2_scale=inputs["w2_scale"],
            w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None, activation="silu", is_gated=True, no_combine=False,
            inplace=False, apply_router_weight_on_input=False, routed_scaling_factor=None, gemm1_alpha=None,
            gemm1_limit=None, filter_expert=ep > 1, **flags)
    _warm_then_under_the_rules(call)
