"""vLLM's launchers without their launch code: the files its kernels come from, the released
versions the launcher supports (RELEASES), vLLM's default configs and programs along M, and the
KernelSpec of each kernel, whose run and compile_only import the launch code
(kernels/engines/vllm.py) only when something runs them. A plan reads this module alone, so it
loads neither Triton nor torch."""

from __future__ import annotations

from pathlib import Path

from kernels import fp8_gemm_spec, fused_moe_spec
from kernels.engines.base import engine_spec, files_read
from tuner.plan.engine_releases import Release, kernel_releases, supported_versions
from tuner.plan.kernel_api import Config, KernelSpec, Params, from_factory

CODE = "kernels.engines.vllm"
# what a code version hashes of ours: the launch code and this spec
LAUNCHER_FILES = (str(Path(__file__).with_name("vllm.py")), __file__)

ENGINE = "vllm"
MOE_FILE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
GEMM_FILE = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
UTILS_FILE = "vllm/model_executor/layers/fused_moe/utils.py"
ALIGN_FILE = "vllm/model_executor/layers/fused_moe/moe_align_block_size.py"
KERNEL_FUNCTIONS = {
    "fused_moe": {MOE_FILE: ["fused_moe_kernel"]},
    "fp8_gemm": {GEMM_FILE: ["_w8a8_triton_block_scaled_mm"]},
}


# The released versions the launchers launch are data (configs/engines/vllm.yaml, read and checked
# by tuner/plan/engine_releases.py): the hash of every wrapper function they mirror, of each
# kernel's parameter list, and what differs in the launch: here, the values this launcher reads.
# A test runs each version's own wrapper from its wheel beside ours (tests/test_engine_versions.py).
LAUNCH_VALUES: dict[str, dict[str, tuple]] = {"fused_moe": {"b_scale_strides": ("ndim", "size")}, "fp8_gemm": {}}


def releases(kernel: str) -> list[Release]:
    """The releases whose `kernel` this launcher launches, oldest first (the data's, checked)."""
    return kernel_releases(ENGINE, kernel, LAUNCH_VALUES[kernel])


def supported() -> tuple[str, ...]:
    return tuple(supported_versions(ENGINE))


def __getattr__(name: str):
    """RELEASES, SUPPORTED and FILES, read from the data when asked (not at import: a plan that
    never launches reads no release file, and a bad one is a line where it is used)."""
    if name == "RELEASES":
        return {k: releases(k) for k in KERNEL_FUNCTIONS}
    if name == "SUPPORTED":
        return supported()
    if name == "FILES":
        return files_read(KERNEL_FUNCTIONS, {k: releases(k) for k in KERNEL_FUNCTIONS})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- fused MoE ---------------------------------------------------------------------------
def naive_block_assignment(M: int, topk: int, E: int) -> bool:
    """vLLM's small-batch path: no alignment when so few pairs meet so many experts."""
    return M * topk * 4 <= E


def moe_m_tiles(params: Params, M: int, config: Config) -> int:
    """Programs along M of both of the layer's GEMMs where vLLM's wrapper fixes them to the
    pairs: the naive path (EM = pairs x BLOCK_SIZE_M), or fewer pairs than BLOCK_SIZE_M and
    than experts (EM capped at A's rows x top_k x BLOCK_SIZE_M in the up and the down GEMM).
    Elsewhere the count depends on the alignment's padding: a number past every
    GROUP_SIZE_M, so nothing is folded."""
    pairs = M * params["topk"]
    naive = params.get("ep", 1) == 1 and naive_block_assignment(M, params["topk"], params["E"])   # never under EP
    if naive or pairs < min(config["BLOCK_SIZE_M"], params["E"]):
        return pairs
    return 1 << 30


def moe_default_config(params: Params, M: int) -> Config:
    """get_default_config (CUDA branch): what vLLM runs for a batch size with no table."""
    block = params.get("block_shape")
    dtype = params["dtype"]
    if dtype == "fp8_w8a8" and block:
        if M <= 8 and block[0] % 64 == 0:
            bn, stages = 64, (4 if M <= 4 else 3)
        else:
            bn, stages = block[0], 3
        return {"BLOCK_SIZE_M": 16 if M <= 64 else 64, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": block[1],
                "GROUP_SIZE_M": 1 if M <= 16 else 32, "num_warps": 4, "num_stages": stages}
    bm = 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64 if M <= 64 else 128,
            "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or M <= 64 else 64,
            "GROUP_SIZE_M": 16 if M // max(params["E"], 1) > 128 else 1,
            "num_warps": 4 if M <= 128 else 8, "num_stages": 4 if M <= 32 else 3}


def base_moe() -> KernelSpec:
    return fused_moe_spec.SPEC


def moe_note(params: Params) -> str:
    return ("vLLM's fused_moe_kernel, launched as fused_experts does (swap-AB on sm_90, the small-batch path "
            "when M*topk*4 <= E and no expert parallelism); " + base_moe().measurement_note(params))


# -- block-FP8 GEMM ----------------------------------------------------------------------
def gemm_default_config(params: Params, M: int) -> Config:
    bn, bk = params["block_shape"]
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 32,
            "num_warps": 4, "num_stages": 2}


# -- the specs -----------------------------------------------------------------------------
def kernel_spec(name: str, code) -> KernelSpec:
    from tuner.errors import TunerError
    if name == "fused_moe":
        return engine_spec(
            base_moe(), code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "moe_run", code, release.launch),
                                 compile_only=from_factory(CODE, "moe_compile_only", code, release.launch)),
            default_config=moe_default_config, m_tiles=moe_m_tiles, extra_seeds=lambda params, M: [], measurement_note=moe_note,
            description="vLLM's fused MoE (whole layer, one config; swap-AB on sm_90)")
    if name == "fp8_gemm":
        return engine_spec(
            fp8_gemm_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "gemm_run", code),
                                 compile_only=from_factory(CODE, "gemm_compile_only", code)),
            default_config=gemm_default_config, extra_seeds=lambda params, M: [],
            description="vLLM's block-scaled FP8 GEMM (_w8a8_triton_block_scaled_mm)")
    raise TunerError(f"vLLM reads no {name} table: its {name} launch is fixed (tune our kernel with "
                     "--kernel-source ours)")
