"""How each serving engine names, places and reads its config tables.

Every engine-specific rule lives here (facts from vLLM 0.33 and SGLang 0.5.23,
see ../shared/ENGINES.md), so that the rest of the tool never branches on an engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ENGINE_NAMES = ("vllm", "sglang")

# The batch sizes both engines' tuners write, and our default grid.
DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def _underscored(cuda_name: str) -> str:
    return cuda_name.replace(" ", "_")


@dataclass(frozen=True)
class Engine:
    name: str
    block_shape_sep: str            # "," (vLLM) or ", " (SGLang) inside block_shape=[...]
    # Which models' shared expert the engine folds into its fused MoE as expert E-1 (SGLang:
    # DeepSeek-V3/R1's, at expert-parallel size 1 on NVIDIA GPUs); None: it never does.
    shared_expert_fusion: dict | None
    gemm_folder: str                # where the package reads block-FP8 GEMM tables
    moe_folder: str                 # where the package reads fused-MoE tables
    moe_folder_per_triton: bool     # SGLang keys its MoE folder by Triton version
    # What makes this engine read each table family on Hopper (H100/H200), read from the
    # source of the version named in `facts_for`; printed by the plan and by tuner install.
    reads_on_hopper: dict = field(default_factory=dict)
    facts_for: str = ""
    # Config keys a table family's second (`_down`) table must share with the first at
    # every M ({table kind: keys}): SGLang runs the two MoE GEMMs with one BLOCK_SIZE_M.
    down_table_tied_keys: dict = field(default_factory=dict)

    def tied_keys(self, kind: str) -> tuple[str, ...]:
        return tuple((self.down_table_tied_keys or {}).get(kind, ()))

    def fuses_shared_expert(self, architecture: str | None, routed: int, shared: int, ep: int) -> bool:
        rule = self.shared_expert_fusion
        if not rule:
            return False
        return (architecture in rule["architectures"] and routed in rule["routed_experts"]
                and shared == rule["shared_experts"] and ep <= rule["max_ep"])

    def device_name(self, cuda_name: str, kind: str = "fused_moe") -> str:
        """The device_name= part of the file name of a `kind` table ("fused_moe", "fp8_gemm")
        for a GPU CUDA calls `cuda_name`."""
        if self.name == "vllm":
            # vLLM's MoE loader folds every H200 variant onto one name (its GEMM loader does
            # not: an H200 NVL reads NVIDIA_H200_NVL GEMM tables); both drop '/'.
            if kind == "fused_moe" and re.search(r"\bH200\b", cuda_name):
                return "NVIDIA_H200"
            return _underscored(cuda_name).replace("/", "_")
        return _underscored(cuda_name)

    def block_shape(self, block_shape) -> str:
        bn, bk = block_shape
        return f"[{bn}{self.block_shape_sep}{bk}]"

    def gemm_filename(self, N: int, K: int, cuda_name: str, block_shape, dtype: str = "fp8_w8a8") -> str:
        return (
            f"N={N},K={K},device_name={self.device_name(cuda_name, 'fp8_gemm')},"
            f"dtype={dtype},block_shape={self.block_shape(block_shape)}.json"
        )

    def moe_filename(self, E: int, N: int, cuda_name: str, dtype: str | None,
                     block_shape=None, down: bool = False) -> str:
        name = f"E={E},N={N},device_name={self.device_name(cuda_name)}"
        if dtype:
            name += f",dtype={dtype}"
        if block_shape:
            name += f",block_shape={self.block_shape(block_shape)}"
        return name + ("_down" if down else "") + ".json"

    def moe_subfolder(self, triton_version: str) -> str:
        """The folder under the MoE root that holds tables for a Triton version."""
        if not self.moe_folder_per_triton:
            return ""
        return "triton_" + triton_version.split("+")[0].replace(".", "_")

    def table_relpath(self, kind: str, params: dict, cuda_name: str, triton_version: str,
                      down: bool = False) -> str:
        """Where a table goes under a results folder: <engine>/<kind>/[<triton>/]<file>,
        mirroring the layout the engine reads (see tuner install)."""
        if kind == "fp8_gemm":
            name = self.gemm_filename(params["N"], params["K"], cuda_name, params["block_shape"])
            return f"{self.name}/{kind}/{name}"
        if kind == "fused_moe":
            dtype = None if params.get("dtype") in (None, "bf16", "fp16") else params["dtype"]
            down = down or params.get("part") == "down"
            name = self.moe_filename(params["E"], params["N"], cuda_name, dtype, params.get("block_shape"), down)
            sub = self.moe_subfolder(triton_version)
            return f"{self.name}/{kind}/{sub + '/' if sub else ''}{name}"
        raise ValueError(f"no {self.name} table family {kind!r}")


ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        name="vllm",
        block_shape_sep=",",
        shared_expert_fusion=None,
        gemm_folder="vllm/model_executor/layers/quantization/utils/configs",
        moe_folder="vllm/model_executor/layers/fused_moe/configs",
        moe_folder_per_triton=False,
        facts_for="vLLM 0.33.0",
        reads_on_hopper={
            "fp8_gemm": "block-FP8 linear layers run FlashInfer/DeepGEMM, then CUTLASS, by default; the Triton "
                        "GEMM reads these tables only with --linear-backend triton (or --kernel-config "
                        "'{\"linear_backend_per_quant\":{\"fp8_block_w8a8\":\"triton\"}}')",
            "fused_moe": "the Triton fused MoE reads these tables by default under tensor parallelism; with "
                         "--enable-expert-parallel vLLM prefers FlashInfer's CUTLASS MoE (add --moe-backend "
                         "triton), and VLLM_USE_DEEP_GEMM=1 or VLLM_MOE_USE_DEEP_GEMM=1 set explicitly runs "
                         "DeepGEMM's MoE at every batch size instead",
        },
    ),
    "sglang": Engine(
        name="sglang",
        block_shape_sep=", ",
        shared_expert_fusion={"architectures": ("DeepseekV3ForCausalLM",), "routed_experts": (256,),
                              "shared_experts": 1, "max_ep": 1},
        gemm_folder="sglang/kernels/ops/gemm/configs",
        moe_folder="sglang/srt/layers/moe/moe_runner/triton_utils/configs",
        moe_folder_per_triton=True,
        facts_for="SGLang 0.5.23",
        down_table_tied_keys={"fused_moe": ("BLOCK_SIZE_M",)},
        reads_on_hopper={
            "fp8_gemm": "block-FP8 linear layers run DeepGEMM by default; the Triton GEMM reads these tables only "
                        "with --fp8-gemm-backend triton (or SGLANG_ENABLE_JIT_DEEPGEMM=0), or for shapes DeepGEMM "
                        "cannot take",
            "fused_moe": "the Triton MoE runner (--moe-runner-backend auto) reads these tables under tensor "
                         "parallelism and under expert parallelism without a DeepEP-class all-to-all "
                         "(--moe-a2a-backend deepep runs DeepGEMM); E counts the fused shared expert, which SGLang "
                         "fuses by default at expert-parallel size 1 (--disable-shared-experts-fusion turns it off)",
        },
    ),
}


def lookup_nearest(table: dict, M: int):
    """The entry an engine uses for batch size M: nearest integer key, ties to the
    earlier key in file order (both engines use min() over the keys in order)."""
    keys = [int(k) for k in table if k != "triton_version"]
    if not keys:
        raise KeyError("empty table")
    best = min(keys, key=lambda k: abs(k - M))
    return table[str(best)]


# -- after an install: how to see that the engine read the tables, and what undoes them --------
# The log lines each engine writes when it loads a table (or falls back), verbatim up to the
# path, from vLLM 0.31.0-0.33.0 and SGLang 0.5.21-0.5.23 (the same in those versions):
# vLLM logs at INFO (the MoE line once per process), SGLang at INFO (the GEMM line on rank 0).
LOADED_LOG_LINES = {
    "vllm": {
        "fused_moe": ("Using configuration from <file> for MoE layer.",
                      "Using default MoE config. Performance might be sub-optimal! Config file not found at <paths>"),
        "fp8_gemm": ("Using configuration from <file> for W8A8 Block FP8 kernel.",
                     "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! Config file not "
                     "found at <file>"),
    },
    "sglang": {
        "fused_moe": ("Using MoE kernel config from <file>.",
                      "Using default MoE kernel config. Performance might be sub-optimal! Config file not found at "
                      "<file>"),
        "fp8_gemm": ("Using configuration from <file> for W8A8 Block FP8 kernel.",
                     "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! Config file not "
                     "found at <file>"),
    },
}
# Which table families each engine's config-folder variable redirects (the others are read
# from the package's own folder only).
CONFIG_DIR_VARIABLE = {"vllm": ("VLLM_TUNED_CONFIG_FOLDER", ("fused_moe",)),
                       "sglang": ("SGLANG_MOE_CONFIG_DIR", ("fused_moe",))}


def install_notes(engine: str, kinds, into_package: bool) -> list[str]:
    """What `tuner install` tells after putting tables of `kinds` where `engine` reads them:
    the log line that shows each was read (and the one that shows it was not), that tables
    inside the package are gone when the engine is upgraded or reinstalled, and what the
    config-folder variable covers."""
    lines = []
    for kind in sorted(set(kinds) & set(LOADED_LOG_LINES.get(engine, {}))):
        read, fallback = LOADED_LOG_LINES[engine][kind]
        lines.append(f"to confirm {engine} read a {kind} table, look in its log (INFO level) for \"{read}\"; "
                     f"\"{fallback.split('!')[0]}!\" means it did not find one")
    variable, covers = CONFIG_DIR_VARIABLE[engine]
    if into_package:
        lines.append(f"tables in {engine}'s package folder are removed when {engine} is upgraded or reinstalled "
                     f"(pip replaces the folder): install them again after that"
                     + (f", or keep the MoE tables outside with --moe-config-dir ({variable})" if "fused_moe" in covers
                        else ""))
    lines.append(f"{variable} covers {' and '.join(covers)} tables only: block-FP8 GEMM tables are read from the "
                 "package's own folder")
    return lines
