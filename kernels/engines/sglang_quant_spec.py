"""SGLang's fused MoE at the integer precisions (issue 52) without its launch code: which problems
this launcher variant takes (`handles`), the files its kernels come from, the releases it supports
(SGLang's fused-MoE releases plus the group-wise kernel's parameter list), SGLang's default configs
for them, and their KernelSpec, whose run and compile_only import kernels/engines/sglang_quant.py
only when something runs them.

A variant of its own for the reason kernels/engines/vllm_quant_spec.py gives (the FP8 and bf16
tables' code version stays theirs). What runs: INT8 W8A8 per channel (w8a8_int8:
fused_moe_kernel with use_int8_w8a8 and per_channel_quant) and in blocks (blockwise_int8), and the
weight-only precisions in K groups (moe_wna16; compressed-tensors W4A16 with --moe-runner-backend
triton) on fused_moe_kernel_gptq_awq, as its Triton runner launches them: the up table and the
`_down` table, BLOCK_SIZE_M shared; no TMA (SGLang's TMA path is FP8's)."""

from __future__ import annotations

from pathlib import Path

from kernels import fused_moe_spec
from kernels.engines import sglang_spec
from kernels.engines.base import engine_spec, files_read
from tuner.plan.engine_releases import Release, kernel_releases
from tuner.plan.kernel_api import KernelSpec, Params, from_factory

VARIANT = "quant"
CODE = "kernels.engines.sglang_quant"
# what a code version hashes of ours: this variant's launch code and spec, and SGLang's launcher they build on
LAUNCHER_FILES = (str(Path(__file__).with_name("sglang_quant.py")), __file__, *sglang_spec.LAUNCHER_FILES)
ENGINE = sglang_spec.ENGINE
MOE_FILE = sglang_spec.MOE_FILE
WNA16_KERNEL = "fused_moe_kernel_gptq_awq"
KERNEL_FUNCTIONS = {"fused_moe": {MOE_FILE: ["fused_moe_kernel", WNA16_KERNEL]}}
DTYPES = ("int8_w8a8", "int8_w8a16", "int4_w4a16")


# the group-wise kernel's parameter list, per release: data (configs/engines/sglang.yaml, 'fused_moe.quant')
def releases(kernel: str) -> list[Release]:
    """The releases whose data gives this variant's additions to `kernel` ('<kernel>.quant' in
    configs/engines/sglang.yaml), as the engine's launcher launches them, oldest first."""
    return kernel_releases(ENGINE, f"{kernel}.{VARIANT}", sglang_spec.LAUNCH_VALUES[kernel])


def supported() -> tuple[str, ...]:
    return tuple(r.version for r in releases("fused_moe"))


def __getattr__(name: str):
    """RELEASES, SUPPORTED and FILES, read from the data when asked (sglang_spec.__getattr__)."""
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
    """A weight-only MoE in K groups: SGLang's runner launches fused_moe_kernel_gptq_awq."""
    return params.get("dtype") in ("int8_w8a16", "int4_w4a16") and bool(params.get("group_size"))


def moe_refuses(params: Params) -> str | None:
    if params.get("dtype") in ("int8_w8a16", "int4_w4a16") and not params.get("group_size"):
        return "SGLang runs no per-channel weight-only MoE (its weight-only MoE is moe_wna16's, in K groups)"
    return None


def moe_note(params: Params) -> str:
    kernel = "fused_moe_kernel_gptq_awq" if wna16(params) else "fused_moe_kernel with its INT8 flags"
    return sglang_spec.moe_note(params).replace("fused_moe_kernel as its Triton runner launches it (swap-AB on sm_90, "
                                                "USE_TMA from the table)", f"{kernel} as its Triton runner launches it "
                                                "(no TMA)")


def kernel_spec(name: str, code) -> KernelSpec:
    from tuner.errors import TunerError
    if name != "fused_moe":
        raise TunerError(f"SGLang's integer precisions are fused-MoE ones: no {name} launch of them")
    return engine_spec(
        fused_moe_spec.SPEC, code, ENGINE, KERNEL_FUNCTIONS[name], releases(name), LAUNCHER_FILES,
        lambda release: dict(run=from_factory(CODE, "moe_run", code, release.launch),
                             compile_only=from_factory(CODE, "moe_compile_only", code, release.launch)),
        variant=VARIANT, config_keys=sglang_spec.MOE_KEYS, optional_keys={"USE_TMA": 0}, bool_keys=("USE_TMA",),
        space_variant=lambda params: WNA16_KERNEL.removeprefix("fused_moe_kernel_") if wna16(params) else "int8",
        default_config=sglang_spec.moe_default_config, extra_seeds=lambda params, M: [], measurement_note=moe_note,
        refuses=moe_refuses,
        tied_params=lambda params, up_config: {**params, "part": "pair", "up_config": dict(up_config)},
        description="SGLang's fused MoE at INT8/INT4 (up and _down tables; fused_moe_kernel's INT8 flags, the "
                    "group-wise kernel for weight-only K groups)")
