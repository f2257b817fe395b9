"""vLLM's fused MoE at the integer precisions (issue 52) without its launch code: which problems
this launcher variant takes (`handles`), the files its kernels come from, the releases it supports
(vLLM's fused-MoE releases plus the group-wise wrappers and kernel), vLLM's default configs for
them, and their KernelSpec, whose run and compile_only import kernels/engines/vllm_quant.py only
when something runs them.

Why a variant of its own: a kernel's code version (the hash every stored study, manifest and
validation record keys on) covers its launcher's files; the FP8 and bf16 tables keep theirs
(kernels/engines/vllm.py, vllm_spec.py), so that studies tuned before continue.
What runs: INT8 W8A8 per channel (compressed-tensors: TritonExperts, fused_moe_kernel with
use_int8_w8a8 and per_channel_quant) and INT8 W8A16 per channel (--quantization experts_int8:
use_int8_w8a16), launched as fused_experts_impl does; the weight-only precisions in K groups
(moe_wna16) on fused_moe_kernel_gptq_awq, launched as TritonWNA16Experts.apply does (the
table's row as the launch config, SPLIT_K included; no small-batch path)."""

from __future__ import annotations

from pathlib import Path

from kernels.engines import vllm_spec
from kernels.engines.base import engine_spec, files_read
from tuner.plan.engine_releases import Release, kernel_releases
from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS, Config, KernelSpec, Params, from_factory

VARIANT = "quant"
CODE = "kernels.engines.vllm_quant"
# what a code version hashes of ours: this variant's launch code and spec, and vLLM's launcher they build on
LAUNCHER_FILES = (str(Path(__file__).with_name("vllm_quant.py")), __file__, *vllm_spec.LAUNCHER_FILES)
ENGINE = vllm_spec.ENGINE
MOE_FILE = vllm_spec.MOE_FILE
EXPERTS_FILE = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
WNA16_KERNEL = "fused_moe_kernel_gptq_awq"
KERNEL_FUNCTIONS = {"fused_moe": {MOE_FILE: ["fused_moe_kernel", WNA16_KERNEL]}}
DTYPES = ("int8_w8a8", "int8_w8a16", "int4_w4a16")


# the group-wise layer's wrappers and kernel, per release: data (configs/engines/vllm.yaml, 'fused_moe.quant')
def releases(kernel: str) -> list[Release]:
    """The releases whose data gives this variant's additions to `kernel` ('<kernel>.quant' in
    configs/engines/vllm.yaml), as the engine's launcher launches them, oldest first."""
    return kernel_releases(ENGINE, f"{kernel}.{VARIANT}", vllm_spec.LAUNCH_VALUES[kernel])


def supported() -> tuple[str, ...]:
    return tuple(r.version for r in releases("fused_moe"))


def __getattr__(name: str):
    """RELEASES, SUPPORTED and FILES, read from the data when asked (vllm_spec.__getattr__)."""
    if name == "RELEASES":
        return {k: releases(k) for k in KERNEL_FUNCTIONS}
    if name == "SUPPORTED":
        return supported()
    if name == "FILES":
        return files_read(KERNEL_FUNCTIONS, {k: releases(k) for k in KERNEL_FUNCTIONS})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def handles(params: Params) -> bool:
    """The problems this variant launches: the integer precisions."""
    return params.get("dtype") in DTYPES


def wna16(params: Params) -> bool:
    """A weight-only MoE in K groups: vLLM runs fused_moe_kernel_gptq_awq (TritonWNA16Experts)."""
    return params.get("dtype") in ("int8_w8a16", "int4_w4a16") and bool(params.get("group_size"))


def moe_m_tiles(params: Params, M: int, config: Config) -> int:
    """As vLLM's (kernels/engines/vllm_spec.py), with no small-batch path for the group-wise kernel."""
    if wna16(params):
        pairs = M * params["topk"]
        return pairs if pairs < min(config["BLOCK_SIZE_M"], params["E"]) else 1 << 30
    return vllm_spec.moe_m_tiles(params, M, config)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def moe_default_config(params: Params, M: int) -> Config:
    """get_default_config. INT8 W8A8 asks it for no dtype (_get_config_dtype_str has no
    int8_w8a8) and INT8 W8A16 per channel for int8_w8a16 without blocks: the bf16 branch, as
    vllm_spec's. The weight-only branch: BLOCK_SIZE_M 16 up to M 20, 32 up to 40, else 64, or,
    where should_moe_wna16_use_cuda holds on CUDA, the power of two up to 16 its CUDA kernel
    wants (TritonWNA16Experts launches the Triton kernel all the same); BLOCK_SIZE_N and K from
    get_moe_wna16_block_config's Triton branch (32 and 64 for one token, else 64 and 32: the up
    GEMM's; vLLM's down GEMM takes 64 and 32 at one token with top-k > 1, which one config cannot
    say), SPLIT_K 1, and Triton's default warps and stages (the config names none)."""
    if not wna16(params):
        return {**vllm_spec.moe_default_config({**params, "dtype": "bf16"}, M), "SPLIT_K": 1}
    tokens = M * params["topk"]
    cuda_kernel = (params["dtype"] == "int4_w4a16" and params["group_size"] in (32, 64, 128)
                   and tokens / params["E"] <= 6)
    bm = min(16, _next_power_of_2(M)) if cuda_kernel else 16 if M <= 20 else 32 if M <= 40 else 64
    bn, bk = (32, 64) if M == 1 else (64, 32)
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3, "SPLIT_K": 1}


def moe_note(params: Params) -> str:
    if wna16(params):
        return ("vLLM's fused_moe_kernel_gptq_awq, launched as TritonWNA16Experts does (the table's row passed as "
                "it is, SPLIT_K included; no small-batch path); " + vllm_spec.base_moe().measurement_note(params))
    return ("vLLM's fused_moe_kernel with its INT8 flags, launched as fused_experts does (the small-batch path "
            "when M*topk*4 <= E and no expert parallelism); " + vllm_spec.base_moe().measurement_note(params))


def moe_refuses(params: Params) -> str | None:
    if params.get("dtype") == "int8_w8a8" and params.get("block_shape"):
        return "vLLM runs no block-INT8 MoE (its Triton experts take INT8 W8A8 per channel only)"
    if params.get("dtype") == "int4_w4a16" and not params.get("group_size"):
        return "vLLM's Triton MoE runs INT4 weights in K groups only"
    return None


def kernel_spec(name: str, code) -> KernelSpec:
    from tuner.errors import TunerError
    if name != "fused_moe":
        raise TunerError(f"vLLM's integer precisions are fused-MoE ones: no {name} launch of them")
    return engine_spec(
        vllm_spec.base_moe(), code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
        lambda release: dict(run=from_factory(CODE, "moe_run", code, release.launch),
                             compile_only=from_factory(CODE, "moe_compile_only", code, release.launch)),
        variant=VARIANT, config_keys=MATMUL_CONFIG_KEYS + ("SPLIT_K",), optional_keys={"SPLIT_K": 1},
        kept_keys=lambda params: ("SPLIT_K",) if wna16(params) else (),
        space_variant=lambda params: WNA16_KERNEL.removeprefix("fused_moe_kernel_") if wna16(params) else "int8",
        default_config=moe_default_config, m_tiles=moe_m_tiles, extra_seeds=lambda params, M: [],
        measurement_note=moe_note, refuses=moe_refuses,
        description="vLLM's fused MoE at INT8/INT4 (fused_moe_kernel's INT8 flags; the group-wise kernel for "
                    "weight-only K groups)")
