"""How each serving engine names, places and reads its config tables.

Every engine-specific rule lives here (facts from vLLM 0.33 and SGLang 0.5.23,
see ../shared/ENGINES.md), so that the rest of the tool never branches on an engine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

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
    # The folder, under the one its MoE config-folder variable names, that holds the tables
    # (SGLang: SGLANG_MOE_CONFIG_DIR/configs/triton_X_Y_Z/); a results folder's <engine>/fused_moe/
    # has it too, so that it serves as the variable's folder as it is.
    moe_env_subfolder: str = ""
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
        """Where a table goes under a results folder: <engine>/<kind>/[configs/<triton>/]<file>,
        mirroring the layout the engine reads (see tuner install): <engine>/fused_moe/ is a folder
        its MoE config-folder variable takes as it is."""
        if kind == "fp8_gemm":
            name = self.gemm_filename(params["N"], params["K"], cuda_name, params["block_shape"])
            return f"{self.name}/{kind}/{name}"
        if kind == "fused_moe":
            dtype = None if params.get("dtype") in (None, "bf16", "fp16") else params["dtype"]
            down = down or params.get("part") == "down"
            name = self.moe_filename(params["E"], params["N"], cuda_name, dtype, params.get("block_shape"), down)
            sub = "/".join(p for p in (self.moe_env_subfolder, self.moe_subfolder(triton_version)) if p)
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
        moe_env_subfolder="configs",
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


# -- what each engine's /metrics says of the batches it runs (tuner/plan/traffic.py reads these) -----
# Facts read from the source of vLLM 0.33.0 and SGLang 0.5.23 (their released wheels), so that a
# traffic profile can be read from a dump of a running server's /metrics:
#
# vLLM 0.33.0: vllm/v1/metrics/loggers.py exports `vllm:iteration_tokens_total`, a histogram
#   (labels model_name, engine) observed once per engine step with the prompt tokens computed
#   plus the generation tokens of that step: the tokens one forward pass runs. Its default
#   buckets are ITERATION_TOKENS_BUCKETS in vllm/v1/metrics/buckets.py. CUDA graphs
#   (vllm/config/vllm.py, VllmConfig cudagraph sizes; vllm/v1/cudagraph_dispatcher.py) pad a
#   step of up to max_cudagraph_capture_size tokens to the next captured size, in
#   FULL_AND_PIECEWISE mode (the v1 default) mixed prefill/decode steps too; with the OpenAI
#   server's defaults on an H100/H200 (vllm/engine/arg_utils.py: max_num_seqs 1024,
#   max_num_batched_tokens 8192) the largest captured size is min(2 x 1024, 512) = 512.
# SGLang 0.5.23: sglang/srt/observability/metrics_collector.py exports no per-pass token
#   histogram. It has the gauge `sglang:num_running_reqs` (the running decode batch, set at
#   each decode log interval and prefill), the counter `sglang:cuda_graph_passes_total` by
#   mode (decode_cuda_graph, decode_none, prefill_cuda_graph, prefill_none: one per forward
#   pass) and the counter `sglang:realtime_tokens_total` by mode (prefill_compute,
#   prefill_cache, decode). Decode batches are padded to the captured batch sizes
#   (sglang/srt/arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes; the
#   default largest size is 512 at TP >= 4 and 256 below on 80-160 GB GPUs,
#   sglang/srt/arg_groups/memory_hook.py); base_cuda_graph_runner._pad_to_bucket takes the
#   smallest captured size >= the batch.
VLLM_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _vllm_graph_sizes(tp: int | None) -> list[int]:
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 512 + 1, 16))


def _sglang_graph_sizes(tp: int | None) -> list[int]:
    top = 512 if (tp or 8) >= 4 else 256
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, top + 1, 32))
    sizes = [s for s in sizes if s <= top]
    return sorted(set(sizes + [top]))


@dataclass(frozen=True)
class ServingMetrics:
    """What one engine's /metrics exports about the tokens each forward pass runs."""
    engine: str
    facts_for: str
    prefix: str                                  # every metric of the engine starts with it
    tokens_histogram: str | None = None          # tokens per forward pass (cumulative _bucket series)
    batch_gauge: str | None = None               # the running decode batch, one sample per scrape
    passes_counter: str | None = None            # forward passes, by `mode_label`
    tokens_counter: str | None = None            # tokens, by `mode_label`
    mode_label: str = "mode"
    decode_pass_modes: tuple[str, ...] = ()
    prefill_pass_modes: tuple[str, ...] = ()
    decode_token_modes: tuple[str, ...] = ()
    prefill_token_modes: tuple[str, ...] = ()
    skip_gauge_labels: dict = field(default_factory=dict)   # label -> values whose samples are not decode batches
    graph_sizes: Callable[[int | None], list[int]] | None = None   # tp -> the captured sizes passes pad to
    pads_every_pass: bool = False                # True: any pass up to the largest size is padded; False: decode only
    padding_note: str = ""


SERVING_METRICS: dict[str, ServingMetrics] = {
    "vllm": ServingMetrics(
        engine="vllm", facts_for="vLLM 0.33.0", prefix="vllm:",
        tokens_histogram="vllm:iteration_tokens_total",
        graph_sizes=_vllm_graph_sizes, pads_every_pass=True,
        padding_note="vLLM 0.33.0 pads a step of up to 512 tokens to its CUDA-graph sizes (1 2 4, 8 to 248 by 8, "
                     "256 to 512 by 16: the OpenAI server's defaults on an H100/H200), prefill chunks included; "
                     "larger steps run unpadded"),
    "sglang": ServingMetrics(
        engine="sglang", facts_for="SGLang 0.5.23", prefix="sglang:",
        batch_gauge="sglang:num_running_reqs",
        passes_counter="sglang:cuda_graph_passes_total", tokens_counter="sglang:realtime_tokens_total",
        decode_pass_modes=("decode_cuda_graph", "decode_none"),
        prefill_pass_modes=("prefill_cuda_graph", "prefill_none"),
        decode_token_modes=("decode",), prefill_token_modes=("prefill_compute",),
        skip_gauge_labels={"engine_type": ("prefill",)},
        graph_sizes=_sglang_graph_sizes, pads_every_pass=False,
        padding_note="SGLang 0.5.23 pads a decode batch to its CUDA-graph batch sizes (1 2 4 8 12, 16 to 256 by 8, "
                     "272 to 496 by 16, 512; up to 256 at TP < 4); prefill chunks are taken unpadded"),
}
# == Loader resolution: which file and which row each engine version reads =====================
# What follows mirrors the config loaders of vLLM 0.31.0-0.33.0 and SGLang 0.5.21-0.5.23 (the
# loader functions are identical within each engine across those releases; only wrappers
# around them changed). `LOADER_FUNCTIONS` records, per release, the hash of every engine
# function these rules were read from (tuner.plan.kernel_sources.source_hash of its source);
# tests/test_engine_loaders.py fails when a wheel's functions differ from them, and `tuner
# audit` warns when the engine it audits has other ones. Used by tuner/emit/audit.py and install.

# Batch sizes a nearest key may be from M before the snap counts as far (k > 2M or k < M/2).
FAR_KEY_FACTOR = 2
# A table whose keys are a contiguous slice of the engines' grid with fewer than this many
# keys is what the engines' multi-GPU tuning overwrite leaves behind (e.g. 2048, 3072, 4096).
TRUNCATED_BELOW = 9

_VLLM_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_VLLM_FP8 = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
_SGL_MOE_CFG = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
_SGL_MOE_KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
_SGL_FP8 = "sglang/kernels/ops/gemm/fp8_kernel.py"


def _per_release(common: dict[str, str], releases: tuple[str, ...], **changed: dict[str, str]) -> dict:
    """{release: {"file:function": hash}}: `common` for every release, with per-release
    replacements (`changed` keyed by release with dots as underscores)."""
    return {r: {**common, **changed.get("v" + r.replace(".", "_"), {})} for r in releases}


LOADER_FUNCTIONS: dict[str, dict[str, dict[str, str]]] = {
    "vllm": _per_release(
        {f"{_VLLM_MOE}:get_config_file_name": "7c22e53cef9793ef",
         f"{_VLLM_MOE}:get_moe_configs": "db4364dfa29a27ba",
         f"{_VLLM_MOE}:try_get_optimal_moe_config": "5ada28f58e2e4303",
         f"{_VLLM_MOE}:invoke_fused_moe_triton_kernel": "e6042ec3ea54c064",     # the K clamp, SPLIT_K=1
         "vllm/model_executor/layers/fused_moe/config.py:_get_config_dtype_str": "e16da2ace1358a47",
         "vllm/utils/platform_utils.py:get_device_name_as_file_name": "9dbab90a12b77570",
         f"{_VLLM_FP8}:get_w8a8_block_fp8_configs": "4ab9c3e3c3d68d97",
         f"{_VLLM_FP8}:w8a8_triton_block_scaled_mm": "0094934606cd2df9"},
        ("0.31.0", "0.32.0", "0.33.0"),
        v0_31_0={f"{_VLLM_FP8}:w8a8_triton_block_scaled_mm": "626102ae0a9264da"},   # no batch-invariant switch yet
        v0_33_0={f"{_VLLM_MOE}:invoke_fused_moe_triton_kernel": "3b6d8285a010b8eb"},  # other scale strides
    ),
    "sglang": _per_release(
        {f"{_SGL_MOE_CFG}:get_config_file_name": "4b8c15a8e622f355",
         f"{_SGL_MOE_CFG}:get_moe_configs": "2fb82c3e8fa9387d",
         f"{_SGL_MOE_CFG}:try_get_optimal_moe_config": "e1ab1aa5876dd06b",
         f"{_SGL_MOE_CFG}:get_config_dtype_str": "d3e7d1f3773c0f1e",
         f"{_SGL_MOE_KERNELS}:invoke_fused_moe_kernel": "f68ce34e7a465e1c",     # no K clamp
         "sglang/srt/utils/common.py:get_device_name": "49aaaa1a9d07418c",
         f"{_SGL_FP8}:get_w8a8_block_fp8_configs": "a4b4f552d119b1b2",
         f"{_SGL_FP8}:w8a8_block_fp8_matmul_triton": "cfee408d7549735e"},
        ("0.5.21", "0.5.22", "0.5.23"),
        v0_5_21={"sglang/srt/utils/common.py:get_device_name": "a20d297af6963951",
                 f"{_SGL_MOE_KERNELS}:invoke_fused_moe_kernel": "b3b0bef33baaa639"},
        v0_5_22={f"{_SGL_MOE_KERNELS}:invoke_fused_moe_kernel": "b3b0bef33baaa639"},
    ),
}

# Triton's CUDA launch options: a table key among these is taken by the launch, not the kernel.
TRITON_CUDA_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "launch_cooperative_grid",
                       "enable_fp_fusion", "debug", "sanitize_overflow", "arch", "ptx_version",
                       "max_num_imprecise_acc_default", "extern_libs", "instrumentation_mode")


@dataclass(frozen=True)
class TableFamily:
    """One table family (fused MoE, block-FP8 GEMM) of one engine, as its loader reads it."""
    engine: str
    kind: str                          # "fused_moe" or "fp8_gemm"
    folder: str                        # the package folder the loader reads (under site-packages)
    per_triton: bool                   # SGLang's MoE: <folder>/triton_X_Y_Z/<name>, other versions as fallback
    env_var: str | None                # the override folder's variable (None: none exists)
    env_replaces_root: bool            # SGLang: the variable replaces the package folder; vLLM: searched first
    fold_h200: bool                    # vLLM MoE: any device name with an H200 word looks up NVIDIA_H200
    device_pattern: str                # what the device name's characters become "_": regex
    block_sep: str                     # inside block_shape=[bn<sep>bk]
    dtypes: tuple                      # the dtype= parts the loader can ask for (None: no dtype part)
    dropped_keys: tuple[str, ...]      # top-level keys the loader drops before int()
    has_down: bool                     # SGLang's optional `_down` table, falling back to the up table
    clamp_block_k: bool                # the launch clamps BLOCK_SIZE_K to the smaller weight-block side
    raise_block_k: bool                # the loader raises a BLOCK_SIZE_K that does not divide block_k to it
    forced: tuple = ()                 # (key, value) pairs the launch sets whatever the table says
    per_channel_part: bool = False     # SGLang's MoE names end ",per_channel_quant=True" for per-channel scales
    accepted_keys: tuple[str, ...] = ()   # row keys the launch passes to the kernel besides Triton options
    tied_down_keys: tuple[str, ...] = ()  # keys the down GEMM takes from the up config at every M
    # Other loaders of the same engine reading the same folder (file-name patterns), whose
    # tables are not this family's: they are counted, not audited.
    other_loaders: tuple[tuple[str, str], ...] = ()
    # Where the loader function lives and which of its log calls say "loaded" / "not loaded" /
    # "fell back": (what, level, a local variable the call names, first (0) or last (-1) such
    # call), to quote the engine's own lines from its source.
    loader: str = ""
    log_calls: tuple = ()

    @property
    def label(self) -> str:
        return f"{self.engine} {self.kind}"

    def device_file_name(self, cuda_name: str) -> str:
        """The device_name= part this loader builds on a GPU CUDA calls `cuda_name`."""
        name = re.sub(self.device_pattern, "_", cuda_name)
        if self.fold_h200 and "H200" in name.split("_"):
            return "NVIDIA_H200"
        return name

    def lookup_name(self, cuda_name: str, *, E: int | None = None, N: int, K: int | None = None,
                    dtype: str | None = None, block_shape=None, down: bool = False) -> str:
        """The file name this loader asks for (get_config_file_name / get_w8a8_block_fp8_configs)."""
        dev = self.device_file_name(cuda_name)
        block = ""
        if block_shape and all(block_shape):
            block = f",block_shape=[{block_shape[0]}{self.block_sep}{block_shape[1]}]"
        if self.kind == "fp8_gemm":
            return f"N={N},K={K},device_name={dev},dtype=fp8_w8a8{block}.json"
        return (f"E={E},N={N},device_name={dev}" + (f",dtype={dtype}" if dtype else "") + block
                + ("_down" if down and self.has_down else "") + ".json")

    def name_pattern(self) -> re.Pattern:
        """File names this loader can ask for, with groups E, N, K, device, dtype, bn, bk, down."""
        sep = re.escape(self.block_sep)
        block = rf"(?:,block_shape=\[(?P<bn>\d+){sep}(?P<bk>\d+)\])"
        if self.kind == "fp8_gemm":
            return re.compile(rf"^N=(?P<N>\d+),K=(?P<K>\d+),device_name=(?P<device>[^,]*),dtype=(?P<dtype>fp8_w8a8)"
                              rf"{block}\.json$")
        dtypes = "|".join(re.escape(d) for d in self.dtypes if d)
        down = r"(?P<down>_down)?" if self.has_down else r"(?P<down>(?!))?"
        channel = r"(?:,per_channel_quant=True)?" if self.per_channel_part else ""
        return re.compile(rf"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]*?)(?:,dtype=(?P<dtype>{dtypes}))?"
                          rf"{block}?{channel}{down}\.json$")

    def triton_folder(self, triton_version: str) -> str:
        """SGLang's folder for a Triton version, built as its loader builds it (dots to
        underscores, nothing stripped)."""
        return "triton_" + triton_version.replace(".", "_")

    def loaded_config(self, entry: dict, block_shape=None, up_entry: dict | None = None) -> tuple[dict, list[str]]:
        """What the loader hands the launch for a table entry, and its rewrites in words:
        SGLang's GEMM loader raises a BLOCK_SIZE_K that does not divide block_k to it, and
        SGLang runs the down GEMM with the up entry's BLOCK_SIZE_M (`up_entry`)."""
        cfg = dict(entry)
        changes: list[str] = []
        bk = cfg.get("BLOCK_SIZE_K")
        if self.raise_block_k and block_shape and isinstance(bk, int) and 0 < bk < block_shape[1] \
                and block_shape[1] % bk:
            cfg["BLOCK_SIZE_K"] = block_shape[1]
            changes.append(f"BLOCK_SIZE_K {bk}->{block_shape[1]} (raised by the loader)")
        if up_entry is not None:
            for key in self.tied_down_keys:
                if key in up_entry and cfg.get(key) != up_entry[key]:
                    changes.append(f"{key} {cfg.get(key)}->{up_entry[key]} (the up table's)")
                    cfg[key] = up_entry[key]
        return cfg, changes

    def effective(self, entry: dict, block_shape=None, up_entry: dict | None = None) -> tuple[dict, list[str]]:
        """What the kernel gets for a table entry after every rewrite of the engine: the
        loader's (loaded_config) and the launch's (vLLM clamps BLOCK_SIZE_K to the weight
        block and launches SPLIT_K=1), with the rewrites in words."""
        cfg, changes = self.loaded_config(entry, block_shape, up_entry)
        bk = cfg.get("BLOCK_SIZE_K")
        if self.clamp_block_k and block_shape and isinstance(bk, int) and bk > min(block_shape):
            cfg["BLOCK_SIZE_K"] = min(block_shape)
            changes.append(f"BLOCK_SIZE_K {bk}->{min(block_shape)} (clamped at launch)")
        for key, value in self.forced:
            if key in cfg and cfg[key] != value:
                changes.append(f"{key} {cfg[key]}->{value} (set at launch)")
            if key in cfg:
                cfg[key] = value
        return cfg, changes

    def block_k_runs_wrong(self, block_shape, K: int | None) -> bool:
        """Whether a BLOCK_SIZE_K above the weight block computes wrong results here: the
        kernels read one scale per K step, so a step over two scale groups mixes them
        (unless the launch clamps it, or K holds one group only)."""
        return not self.clamp_block_k and (K is None or K > block_shape[1])


_VLLM_DTYPES = (None, "fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32")
_SGLANG_DTYPES = (None, "fp8_w8a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "float32")
_MATMUL = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

TABLE_FAMILIES: dict[tuple[str, str], TableFamily] = {
    ("vllm", "fused_moe"): TableFamily(
        engine="vllm", kind="fused_moe", folder="vllm/model_executor/layers/fused_moe/configs", per_triton=False,
        env_var="VLLM_TUNED_CONFIG_FOLDER", env_replaces_root=False, fold_h200=True, device_pattern=r"[\s/]+",
        block_sep=",", dtypes=_VLLM_DTYPES, dropped_keys=("triton_version",), has_down=False, clamp_block_k=True,
        raise_block_k=False, forced=(("SPLIT_K", 1),), accepted_keys=_MATMUL + ("SPLIT_K",),
        other_loaders=(("FlyDSL MoE (ROCm)", r",backend=flydsl\.json$"),),
        loader=f"{_VLLM_MOE}:get_moe_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_paths", -1))),
    ("vllm", "fp8_gemm"): TableFamily(
        engine="vllm", kind="fp8_gemm", folder="vllm/model_executor/layers/quantization/utils/configs",
        per_triton=False, env_var=None, env_replaces_root=False, fold_h200=False, device_pattern=r"[\s/]+",
        block_sep=",", dtypes=("fp8_w8a8",), dropped_keys=(), has_down=False, clamp_block_k=False,
        raise_block_k=False, accepted_keys=_MATMUL,
        loader=f"{_VLLM_FP8}:get_w8a8_block_fp8_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_path", -1))),
    ("sglang", "fused_moe"): TableFamily(
        engine="sglang", kind="fused_moe", folder="sglang/srt/layers/moe/moe_runner/triton_utils/configs",
        per_triton=True, env_var="SGLANG_MOE_CONFIG_DIR", env_replaces_root=True, fold_h200=False, device_pattern=" ",
        block_sep=", ", dtypes=_SGLANG_DTYPES, dropped_keys=(), has_down=True, per_channel_part=True, clamp_block_k=False,
        raise_block_k=False, accepted_keys=_MATMUL + ("USE_TMA",), tied_down_keys=("BLOCK_SIZE_M",),
        loader=f"{_SGL_MOE_CFG}:get_moe_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("fell back", "warning", "try_config_file_path", 0),
                   ("not loaded", "warning", "config_file_path", -1))),
    ("sglang", "fp8_gemm"): TableFamily(
        engine="sglang", kind="fp8_gemm", folder="sglang/kernels/ops/gemm/configs", per_triton=False, env_var=None,
        env_replaces_root=False, fold_h200=False, device_pattern=" ", block_sep=", ", dtypes=("fp8_w8a8",),
        dropped_keys=(), has_down=False, clamp_block_k=False, raise_block_k=True,
        accepted_keys=_MATMUL + ("SWAP_AB", "SPLIT_K"),
        other_loaders=(("block-INT8 GEMM", r",dtype=int8_w8a8,block_shape=\[\d+, \d+\]\.json$"),
                       ("channelwise FP8 GEMM", r",dtype=fp8_w8a8_channelwise\.json$")),
        loader=f"{_SGL_FP8}:get_w8a8_block_fp8_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_path", -1))),
}


def table_family(engine: str, kind: str) -> TableFamily:
    return TABLE_FAMILIES[(engine, kind)]


def loader_release(engine: str, version: str | None) -> str:
    """The release whose loader rules apply to `version`: itself when known, else the newest
    known release (the audit then compares the engine's loader functions with it)."""
    known = LOADER_FUNCTIONS[engine]
    if version and version.split("+")[0] in known:
        return version.split("+")[0]
    return max(known, key=lambda v: tuple(int(x) for x in v.split(".")))


def supported_releases(engine: str) -> list[str]:
    return sorted(LOADER_FUNCTIONS[engine], key=lambda v: tuple(int(x) for x in v.split(".")))


def parse_table_keys(raw, family: TableFamily) -> dict[int, object]:
    """A table's JSON object as the loader turns it into {M: entry}: its dropped keys
    removed, every other key through int() (a ValueError there is the loader's crash)."""
    if not isinstance(raw, dict):
        raise TypeError(f"a JSON {type(raw).__name__}, not an object of batch sizes")
    table = {k: v for k, v in raw.items() if k not in family.dropped_keys}
    return {int(key): val for key, val in table.items()}


def nearest_key(keys: list[int], M: int) -> int:
    """The key both engines take for batch size M: min(keys, key=|k - M|), so a tie goes to
    the key that comes first in the file."""
    return min(keys, key=lambda k: abs(k - M))


def snap_ranges(keys: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """[(key, first M, last M)] covering lo..hi: which key the nearest-key rule takes for
    every M, as ranges (keys in file order; ties at a midpoint to the earlier one)."""
    order = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ks = sorted(order)
    bounds: list[tuple[int, int, int]] = []          # (key, first, last) over all integers
    start = -(1 << 62)
    for a, b in zip(ks, ks[1:]):
        if (a + b) % 2 == 0:
            mid = (a + b) // 2
            last_a = mid if order[a] < order[b] else mid - 1
        else:
            last_a = (a + b) // 2
        bounds.append((a, start, last_a))
        start = last_a + 1
    bounds.append((ks[-1], start, 1 << 62))
    out: list[tuple[int, int, int]] = []
    for key, first, last in bounds:
        first, last = max(first, lo), min(last, hi)
        if first <= last:
            out.append((key, first, last))
    return out


def far_ranges(ranges: list[tuple[int, int, int]], factor: int = FAR_KEY_FACTOR) -> list[tuple[int, int, int, float]]:
    """Of snap ranges, the parts whose key is more than `factor` times away from M:
    [(key, first M, last M, worst ratio)]."""
    out = []
    for key, first, last in ranges:
        if key < 1:             # no batch size (a loader takes "0" or "-8" all the same): every M is far
            out.append((key, first, last, math.inf))
            continue
        below = (first, min(last, -(-key // factor) - 1))          # key > factor * M
        if below[0] <= below[1]:
            out.append((key, below[0], below[1], key / below[0]))
        above = (max(first, factor * key + 1), last)                # M > factor * key
        if above[0] <= above[1]:
            out.append((key, above[0], above[1], above[1] / key))
    return out


def truncated_slice(keys: list[int], grid: list[int] = DEFAULT_BATCH_SIZES) -> bool:
    """Whether a table's keys are a contiguous slice of the engines' grid with fewer than
    TRUNCATED_BELOW of its keys: what an overwritten multi-GPU tuning run leaves."""
    ks = sorted(set(keys))
    if not ks or not set(ks) <= set(grid) or len(ks) >= TRUNCATED_BELOW:
        return False
    i = grid.index(ks[0])
    return grid[i:i + len(ks)] == ks


def gpu_family(device_file_name: str) -> str | None:
    """The GPU model word of a device name (NVIDIA_H200_NVL -> H200), to tell variants apart."""
    m = re.search(r"(?:^|_)([A-Z]+\d+[A-Z]*)(?=$|[_-])", device_file_name.replace("NVIDIA_", "_", 1))
    return m.group(1) if m else None


def backend_reads_table(engine: str, kind: str, ep: int, env: dict) -> tuple[bool, str]:
    """(whether the engine's default backend choice on Hopper reads this table family, and
    a line saying what runs and the server setting that makes it read the table). Read from
    the source of vLLM 0.33.0 and SGLang 0.5.23 (same order of backends in the earlier
    releases above); `env` is the engine's environment (its variables decide too)."""
    facts = ENGINES[engine].reads_on_hopper.get(kind, "")
    def on(name: str) -> bool:
        return str(env.get(name, "")).strip().lower() in ("1", "true", "yes")
    if engine == "vllm" and kind == "fp8_gemm":
        return False, "not read by default: " + facts
    if engine == "vllm" and kind == "fused_moe":
        deep = [v for v in ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM") if on(v)]
        if deep:
            return False, f"{'/'.join(deep)}=1 is set: DeepGEMM's MoE runs, not the Triton one ({facts})"
        if ep > 1:
            return False, "under expert parallelism not read by default: " + facts
        return True, "read by default under tensor parallelism"
    if engine == "sglang" and kind == "fp8_gemm":
        if str(env.get("SGLANG_ENABLE_JIT_DEEPGEMM", "")).strip().lower() in ("0", "false", "no"):
            return True, "SGLANG_ENABLE_JIT_DEEPGEMM=0 is set: the Triton GEMM reads these tables"
        return False, "not read by default: " + facts
    if engine == "sglang" and kind == "fused_moe":
        return True, "read by default (" + facts + ")"
    return True, facts


@dataclass
class Resolved:
    """Which file a loader reads for one lookup, and how it got there."""
    name: str                          # the file name the loader asks for
    files: Any = None                  # the TableFiles holding what it reads (None: nothing)
    rel: str | None = None             # that file, relative to `files`
    how: str = "none"                  # "override folder", "package", "Triton fallback", "the up table", "none"
    triton_folder: str | None = None   # SGLang: the triton_X_Y_Z folder read
    tried: list[str] = field(default_factory=list)   # the paths the loader looked at, in order
    crash: str | None = None           # why the loader raises instead (a bad folder name, ...)

    @property
    def found(self) -> bool:
        return self.rel is not None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def resolve_table(family: TableFamily, name: str, package, override, triton_version: str,
                  down_of: str | None = None) -> Resolved:
    """The file `family`'s loader reads when asked for `name`, as it searches: vLLM's MoE
    loader tries the override folder, then the package; SGLang's reads <root>/configs/
    triton_<version>/ (root: the override folder if set, else the package's), then every
    other triton_* folder there, newest first; for a `_down` name (`down_of`: the up name)
    found nowhere, the up table. `package` and `override` are TableFiles (or None)."""
    res = Resolved(name)
    if family.per_triton:
        files, configs = (override, "configs") if override is not None else (package, family.folder)
        if files is None:
            return res
        exact = f"{configs}/{family.triton_folder(triton_version)}/{name}"
        res.tried.append(files.display(exact))
        if files.exists(exact):
            res.files, res.rel, res.how, res.triton_folder = files, exact, "exact Triton folder", \
                family.triton_folder(triton_version)
            return res
        listing = files.listdir(configs)
        if listing is None:
            res.crash = (f"{files.display(configs)} does not exist: the loader's fallback lists it and raises "
                         "FileNotFoundError; " + (
                             f"point {family.env_var} at a folder holding configs/{family.triton_folder(triton_version)}/"
                             f" (a results folder's {family.engine}/{family.kind}/, or the DIR of `tuner install "
                             f"RESULTS --engine {family.engine} --moe-config-dir DIR`), or unset it"
                             if override is not None else f"reinstall {family.engine}: its package lacks the folder"))
            return res
        versions = [d.removeprefix("triton_").replace("_", ".") for d in listing if d.startswith("triton_")]
        try:
            ordered = sorted(versions, key=_version_tuple, reverse=True)
        except ValueError:
            bad = next(v for v in versions if not all(x.isdigit() for x in v.split(".")))
            res.crash = (f"{files.display(configs)}/triton_{bad.replace('.', '_')} is not a version folder: the "
                         "loader's fallback sorts the folder names as integers and raises ValueError; rename it "
                         "triton_X_Y_Z (digits only) or move it out of configs/")
            return res
        for v in ordered:
            if v == triton_version:
                continue
            rel = f"{configs}/triton_{v.replace('.', '_')}/{name}"
            if files.exists(rel):
                res.files, res.rel, res.how, res.triton_folder = files, rel, "Triton fallback", f"triton_{v.replace('.', '_')}"
                return res
        if down_of is not None:
            up = resolve_table(family, down_of, package, override, triton_version)
            if up.found:
                res.files, res.rel, res.how, res.triton_folder = up.files, up.rel, "the up table", up.triton_folder
            res.crash = up.crash
        return res
    places = []
    if override is not None and family.env_var and not family.env_replaces_root:
        places.append((override, name, "override folder"))
    if package is not None:
        places.append((package, f"{family.folder}/{name}", "package"))
    for files, rel, how in places:
        res.tried.append(files.display(rel))
        if files.exists(rel):
            res.files, res.rel, res.how = files, rel, how
            return res
    return res


# The nesting at which an engine's json.load raises RecursionError: Python's default recursion
# limit (1000) less the frames of the engine's loader (a few dozen).
ENGINE_JSON_DEPTH = 950


def load_table(family: TableFamily, raw: bytes) -> tuple[dict[int, object] | None, str | None]:
    """({M: entry} as the loader returns it, None) or (None, why the loader raises on it)."""
    import json

    from tuner.reading import nests_deeper
    # what the engine's json.load does under Python's default recursion limit (1000), whatever
    # this process's limit is
    if nests_deeper(raw, ENGINE_JSON_DEPTH):
        return None, "nested too deeply for Python's JSON reader: json.load raises RecursionError"
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"not valid JSON ({str(e).splitlines()[0]}): json.load raises"
    except RecursionError:
        return None, "nested too deeply for Python's JSON reader: json.load raises RecursionError"
    try:
        return parse_table_keys(obj, family), None
    except ValueError:
        bad = next(k for k in obj if k not in family.dropped_keys and not _int_like(k))
        return None, f"key {bad!r} is not a batch size: the loader's int() raises ValueError"
    except TypeError as e:
        return None, f"{e}: the loader raises on it"


def _int_like(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


# -- after an install: what undoes the tables, and what the config-folder variables cover -------
# (the engines' own log lines for a table loaded or not found are quoted from their loader
# source at run time: tuner/emit/engine_tables.py log_lines, printed by tuner install)
def install_notes(engine: str, into_package: bool) -> list[str]:
    """What `tuner install` tells after putting tables where `engine` reads them (besides the
    engine's log lines for each table): that tables inside the package are gone when the
    engine is upgraded or reinstalled, and what the config-folder variable covers."""
    covered = {kind: fam.env_var for (e, kind), fam in TABLE_FAMILIES.items() if e == engine and fam.env_var}
    variable = " / ".join(sorted(set(covered.values())))
    lines = []
    if into_package:
        lines.append(f"tables in {engine}'s package folder are removed when {engine} is upgraded or reinstalled "
                     f"(pip replaces the folder): install them again after that"
                     + (f", or keep the MoE tables outside with --moe-config-dir ({variable})" if "fused_moe" in covered
                        else ""))
    if covered:
        lines.append(f"{variable} covers {' and '.join(sorted(covered))} tables only: the other tables are read from "
                     "the package's own folder")
    return lines
