"""SGLang's launchers without their launch code: the files its kernels come from, the released
versions the launcher supports (RELEASES), its config keys and default configs, and the
KernelSpec of each kernel, whose run and compile_only import the launch code
(kernels/engines/sglang.py) only when something runs them. A plan reads this module alone, so
it loads neither Triton nor torch."""

from __future__ import annotations

from pathlib import Path

from kernels import fp8_gemm_spec, fused_moe_spec
from kernels.engines.base import engine_spec, files_read
from tuner.plan.engine_releases import Release, kernel_releases, supported_versions
from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS, Config, KernelSpec, Params, from_factory

CODE = "kernels.engines.sglang"
# what a code version hashes of ours: the launch code and this spec
LAUNCHER_FILES = (str(Path(__file__).with_name("sglang.py")), __file__)

ENGINE = "sglang"
MOE_FILE = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
GEMM_FILE = "sglang/kernels/ops/gemm/fp8_kernel.py"
RUNNER = "sglang/srt/layers/moe/moe_runner/triton_utils"
KERNEL_FUNCTIONS = {
    "fused_moe": {MOE_FILE: ["fused_moe_kernel"]},
    "fp8_gemm": {GEMM_FILE: ["_w8a8_block_fp8_matmul", "_w8a8_block_fp8_matmul_hopper",
                             "_reduce_block_fp8_split_k"]},
}


# The released versions the launchers launch are data (configs/engines/sglang.yaml, read and
# checked by tuner/plan/engine_releases.py): the hash of every wrapper function they mirror, of
# each kernel's parameter list, and what differs in the launch: here, the values the one launcher
# below reads. A test runs each version's own wrapper from its wheel beside ours
# (tests/test_engine_versions.py).
LAUNCH_VALUES: dict[str, dict[str, tuple]] = {
    "fused_moe": {"sorted_rows_multiple": (1, 4), "kernel_flags": ("filter_expert", "output_slices"),
                  "quantize_rows_read": (False, True)},
    "fp8_gemm": {},
}
MOE_KEYS = MATMUL_CONFIG_KEYS + ("USE_TMA",)
GEMM_KEYS = MATMUL_CONFIG_KEYS + ("SWAP_AB", "SPLIT_K")


def releases(kernel: str) -> list[Release]:
    """The releases whose `kernel` this launcher launches, oldest first (the data's, checked)."""
    return kernel_releases(ENGINE, kernel, LAUNCH_VALUES[kernel])


def supported() -> tuple[str, ...]:
    return tuple(supported_versions(ENGINE))


def __getattr__(name: str):
    """RELEASES, SUPPORTED, FILES and NEWEST (the newest release's MoE launch), read from the
    data when asked (not at import: a plan that never launches reads no release file, and a bad
    one is a line where it is used)."""
    if name == "RELEASES":
        return {k: releases(k) for k in KERNEL_FUNCTIONS}
    if name == "SUPPORTED":
        return supported()
    if name == "FILES":
        return files_read(KERNEL_FUNCTIONS, {k: releases(k) for k in KERNEL_FUNCTIONS})
    if name == "NEWEST":
        return releases("fused_moe")[-1].launch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- fused MoE -----------------------------------------------------------------------------
def moe_default_config(params: Params, M: int) -> Config:
    """get_default_config (CUDA): what SGLang runs with no table. Its bf16 branch names no
    warps or stages: Triton's defaults (4 warps, 3 stages) apply."""
    block = params.get("block_shape")
    if params["dtype"] == "fp8_w8a8" and block:
        cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block[0], "BLOCK_SIZE_K": block[1], "GROUP_SIZE_M": 32,
               "num_warps": 4, "num_stages": 3}
    elif params["dtype"] == "fp8_w8a8":
        cfg = ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 4} if M <= params["E"] else
               {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                "num_warps": 8, "num_stages": 4})
    elif M <= params["E"]:
        cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
               "num_warps": 4, "num_stages": 3}
    else:
        cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
               "num_warps": 4, "num_stages": 3}
    return {**cfg, "USE_TMA": 0}


def moe_note(params: Params) -> str:
    part = params.get("part", "op")
    what = {"up": "the up GEMM (w1: gate and up) and its activation quantization, storing in token order",
            "down": "the down GEMM (w2) and its activation quantization (with USE_TMA over the sorted rows it "
                    "reads, as the version does), BLOCK_SIZE_M shared with the up table",
            "op": "the whole layer with one config for both GEMMs",
            "pair": "the whole layer with the up table's entry and the _down table's, as SGLang runs the two (the "
                    "up GEMM storing in sorted order and the activation quantized over the rows the down GEMM "
                    "reads when the _down entry has USE_TMA)"}[part]
    shared = params.get("shared_experts", 0)
    return (f"SGLang's fused_moe_kernel as its Triton runner launches it (swap-AB on sm_90, USE_TMA from the "
            f"table): {what}; the alignment (and, with USE_TMA, the sorted activation) made before timing; "
            f"{fused_moe_spec.routing_note(params)}"
            + (f" plus {shared} fused shared expert(s) every token goes to" if shared else ""))


# -- block-FP8 GEMM ------------------------------------------------------------------------
def gemm_default_config(params: Params, M: int) -> Config:
    bn, bk = params["block_shape"]
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 32,
            "num_warps": 4, "num_stages": 3, "SWAP_AB": 0, "SPLIT_K": 1}


# -- the specs -------------------------------------------------------------------------------
def kernel_spec(name: str, code) -> KernelSpec:
    from tuner.errors import TunerError
    if name == "fused_moe":
        return engine_spec(
            fused_moe_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "moe_run", code, release.launch),
                                 compile_only=from_factory(CODE, "moe_compile_only", code, release.launch)),
            config_keys=MOE_KEYS, optional_keys={"USE_TMA": 0}, bool_keys=("USE_TMA",),
            default_config=moe_default_config, extra_seeds=lambda params, M: [], measurement_note=moe_note,
            tied_params=lambda params, up_config: {**params, "part": "pair", "up_config": dict(up_config)},
            description="SGLang's fused MoE (up and _down tables; USE_TMA, swap-AB on sm_90)")
    if name == "fp8_gemm":
        return engine_spec(
            fp8_gemm_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "gemm_run", code),
                                 compile_only=from_factory(CODE, "gemm_compile_only", code)),
            config_keys=GEMM_KEYS, optional_keys={"SWAP_AB": 0, "SPLIT_K": 1}, bool_keys=("SWAP_AB",),
            default_config=gemm_default_config, extra_seeds=lambda params, M: [],
            description="SGLang's block-scaled FP8 GEMM (SWAP_AB and SPLIT_K on sm_90)")
    raise TunerError(f"SGLang reads no {name} table: its {name} launch is fixed (tune our kernel with "
                     "--kernel-source ours)")
