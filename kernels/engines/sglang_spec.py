"""SGLang's launchers without their launch code: the files its kernels come from, the released
versions the launcher supports (RELEASES), its config keys and default configs, and the
KernelSpec of each kernel, whose run and compile_only import the launch code
(kernels/engines/sglang.py) only when something runs them. A plan reads this module alone, so
it loads neither Triton nor torch."""

from __future__ import annotations

from pathlib import Path

from kernels import fp8_gemm_spec, fused_moe_spec
from kernels.engines.base import Release, engine_spec, files_read
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


def _moe_release(version: str, invoke: str, sequence: str, align: str, kernel: str, **launch) -> Release:
    return Release(version, {
        f"{MOE_FILE}:invoke_fused_moe_kernel": invoke,
        f"{MOE_FILE}:should_enable_swap_ab": "fd7a63e1007b9d4d",
        f"{RUNNER}/fused_moe.py:_prepare_fused_moe_run": "d49eb4b8975a0dfd",
        f"{RUNNER}/fused_moe.py:_fused_moe_kernel_sequence": sequence,
        f"{RUNNER}/moe_align_block_size.py:moe_align_block_size": align,
        f"{RUNNER}/fused_moe_triton_config.py:get_default_config": "e57a4a24e1a9c63a",
        f"{RUNNER}/fused_moe_triton_config.py:try_get_optimal_moe_config": "e1ab1aa5876dd06b",
    }, {f"{MOE_FILE}:fused_moe_kernel": kernel}, launch)


def _gemm_release(version: str) -> Release:
    return Release(version, {f"{GEMM_FILE}:w8a8_block_fp8_matmul_triton": "cfee408d7549735e",
                             f"{GEMM_FILE}:get_w8a8_block_fp8_configs": "a4b4f552d119b1b2"},
                   {f"{GEMM_FILE}:_w8a8_block_fp8_matmul": "14adf0b64ce7eb69",
                    f"{GEMM_FILE}:_w8a8_block_fp8_matmul_hopper": "2e4f83218dc2b7e3",
                    f"{GEMM_FILE}:_reduce_block_fp8_split_k": "1f2ab96cd79572e4"})


# The released versions the launchers launch: the hash of every wrapper function they mirror
# (tuner.plan.kernel_sources.source_hash of its text), of each kernel's parameter list, and what
# differs in the launch (read by the one launcher below). A test runs each version's own
# wrapper from its wheel beside ours.
RELEASES = {
    "fused_moe": [
        _moe_release("0.5.21", "b3b0bef33baaa639", "ccd1ae8f899ce24b", "6ae4086d05bb8f32", "e726f7cf80332b30",
                     sorted_rows_multiple=1, kernel_flags="filter_expert", quantize_rows_read=False),
        _moe_release("0.5.22", "b3b0bef33baaa639", "98713eb442f67ce0", "a3868290dc96f66d", "e726f7cf80332b30",
                     sorted_rows_multiple=4, kernel_flags="filter_expert", quantize_rows_read=True),
        _moe_release("0.5.23", "f68ce34e7a465e1c", "1033ffaa70a23e3c", "6f09229ee755071a", "cbe61027b1c9d4fb",
                     sorted_rows_multiple=4, kernel_flags="output_slices", quantize_rows_read=True),
    ],
    "fp8_gemm": [_gemm_release(v) for v in ("0.5.21", "0.5.22", "0.5.23")],
}
SUPPORTED = ("0.5.21", "0.5.22", "0.5.23")
FILES = files_read(KERNEL_FUNCTIONS, RELEASES)
MOE_KEYS = MATMUL_CONFIG_KEYS + ("USE_TMA",)
GEMM_KEYS = MATMUL_CONFIG_KEYS + ("SWAP_AB", "SPLIT_K")
NEWEST = RELEASES["fused_moe"][-1].launch


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
            fused_moe_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], RELEASES[name], LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "moe_run", code, release.launch),
                                 compile_only=from_factory(CODE, "moe_compile_only", code, release.launch)),
            config_keys=MOE_KEYS, optional_keys={"USE_TMA": 0}, bool_keys=("USE_TMA",),
            default_config=moe_default_config, extra_seeds=lambda params, M: [], measurement_note=moe_note,
            tied_params=lambda params, up_config: {**params, "part": "pair", "up_config": dict(up_config)},
            description="SGLang's fused MoE (up and _down tables; USE_TMA, swap-AB on sm_90)")
    if name == "fp8_gemm":
        return engine_spec(
            fp8_gemm_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], RELEASES[name], LAUNCHER_FILES,
            lambda release: dict(run=from_factory(CODE, "gemm_run", code),
                                 compile_only=from_factory(CODE, "gemm_compile_only", code)),
            config_keys=GEMM_KEYS, optional_keys={"SWAP_AB": 0, "SPLIT_K": 1}, bool_keys=("SWAP_AB",),
            default_config=gemm_default_config, extra_seeds=lambda params, M: [],
            description="SGLang's block-scaled FP8 GEMM (SWAP_AB and SPLIT_K on sm_90)")
    raise TunerError(f"SGLang reads no {name} table: its {name} launch is fixed (tune our kernel with "
                     "--kernel-source ours)")
