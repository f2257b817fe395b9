"""vLLM's rules as data (facts read from the source of the releases configs/engines/vllm.yaml
lists, their released wheels): how it names, places and reads its tables, which backend reads
them on Hopper and what its /metrics says of the batches it runs. The hashes of the loader
functions these rules were read from, per release, are in that file."""

from __future__ import annotations

from tuner.plan.engine_rules.schema import (
    BackendChoice,
    BackendFlag,
    Engine,
    PrecisionRule,
    ServingMetrics,
    TableFamily,
)
from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS

_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_FP8 = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
_DTYPES = (None, "fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32")

# The MoE precisions vLLM 0.31-0.33 runs on its Triton kernels (the quantization methods and the
# experts' oracles of vLLM 0.33.0; 0.31.0 and 0.32.0 alike), keyed (dtype, scheme), and how
# _get_config_dtype_str names their tables. It has no int8_w8a8 case: INT8 W8A8 experts read
# the table named as the bf16 one (no dtype part), never its shipped dtype=int8_w8a8 files.
_MOE_KERNEL, _WNA16_KERNEL = "fused_moe_kernel", "fused_moe_kernel_gptq_awq"
_WNA16_WHEN = ("{what} checkpoints run its Triton kernel with --quantization moe_wna16 (TritonWNA16Experts); by "
               "default (awq, gptq, compressed-tensors) Marlin's MoE runs, which reads no table (compressed-tensors "
               "and GPTQ: --moe-backend triton runs the Triton kernel too)")
MOE_PRECISIONS = {
    ("bf16", "none"): PrecisionRule(None, _MOE_KERNEL, "unquantized experts run the Triton fused MoE"),
    ("fp8_w8a8", "block"): PrecisionRule("fp8_w8a8", _MOE_KERNEL, "block-FP8 experts run the Triton fused MoE"),
    ("fp8_w8a8", "tensor"): PrecisionRule("fp8_w8a8", _MOE_KERNEL, "per-tensor FP8 experts run the Triton fused MoE"),
    ("int8_w8a8", "channel"): PrecisionRule(
        None, _MOE_KERNEL, "compressed-tensors INT8 W8A8 experts (channel weights, dynamic per-token activations) "
        "run the Triton fused MoE (TritonExperts) by default; its table is named as the bf16 one"),
    ("int8_w8a16", "channel"): PrecisionRule(
        "int8_w8a16", _MOE_KERNEL, "--quantization experts_int8 quantizes the experts per channel at load and runs "
        "the Triton fused MoE"),
    # invoke_fused_moe_wna16_triton_kernel launches with **config: a row without SPLIT_K fails (TypeError)
    ("int8_w8a16", "group"): PrecisionRule("int8_w8a16", _WNA16_KERNEL, _WNA16_WHEN.format(what="8-bit GPTQ"),
                                           by_default=False, row_needs=("SPLIT_K",)),
    ("int4_w4a16", "group"): PrecisionRule("int4_w4a16", _WNA16_KERNEL, _WNA16_WHEN.format(what="INT4 AWQ/GPTQ"),
                                           by_default=False, row_needs=("SPLIT_K",)),
}
MOE_REFUSED = {
    ("int8_w8a8", "block"): "vLLM 0.31-0.33 run no block-INT8 MoE (their Triton experts take INT8 W8A8 per channel "
                            "only; the shipped dtype=int8_w8a8,block_shape files are never asked for)",
}

ENGINE = Engine(
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
    device_name_folds_h200=("fused_moe",),
    device_name_drops_slash=True,
    # tensor parallel splits every expert; expert parallel splits the experts
    ep_holds_whole_experts=True,
    hopper_backends={
        "fp8_gemm": BackendChoice(False, "not read by default: {facts}"),
        "fused_moe": BackendChoice(
            True, "read by default under tensor parallelism",
            turned_off_by=("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"),
            turned_off_line="{variables}=1 is set: DeepGEMM's MoE runs, not the Triton one ({facts})",
            expert_parallel_line="under expert parallelism not read by default: {facts}"),
    },
    moe_precisions=MOE_PRECISIONS,
    moe_precisions_refused=MOE_REFUSED,
    triton_flags={
        "fp8_gemm": BackendFlag("--linear-backend triton", "FlashInfer/DeepGEMM, then CUTLASS",
                                ("vllm/engine/arg_utils.py",), '"--linear-backend"'),
        "fused_moe": BackendFlag("--moe-backend triton", "the Triton fused MoE under tensor parallelism",
                                 ("vllm/engine/arg_utils.py",), '"--moe-backend"'),
    },
)

# What /metrics says (vLLM 0.33.0): vllm/v1/metrics/loggers.py exports
# `vllm:iteration_tokens_total`, a histogram (labels model_name, engine) observed once per
# engine step with the prompt tokens computed plus the generation tokens of that step: the
# tokens one forward pass runs. Its default buckets are ITERATION_TOKENS_BUCKETS in
# vllm/v1/metrics/buckets.py. CUDA graphs (vllm/config/vllm.py, VllmConfig cudagraph sizes;
# vllm/v1/cudagraph_dispatcher.py) pad a step of up to max_cudagraph_capture_size tokens to the
# next captured size, in FULL_AND_PIECEWISE mode (the v1 default) mixed prefill/decode steps
# too; with the OpenAI server's defaults on an H100/H200 (vllm/engine/arg_utils.py:
# max_num_seqs 1024, max_num_batched_tokens 8192) the largest captured size is
# min(2 x 1024, 512) = 512.
VLLM_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _graph_sizes(tp: int | None) -> list[int]:
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 512 + 1, 16))


SERVING_METRICS = ServingMetrics(
    engine="vllm", facts_for="vLLM 0.33.0", prefix="vllm:",
    tokens_histogram="vllm:iteration_tokens_total",
    graph_sizes=_graph_sizes, pads_every_pass=True,
    padding_note="vLLM 0.33.0 pads a step of up to 512 tokens to its CUDA-graph sizes (1 2 4, 8 to 248 by 8, "
                 "256 to 512 by 16: the OpenAI server's defaults on an H100/H200), prefill chunks included; "
                 "larger steps run unpadded")

TABLE_FAMILIES = {
    "fused_moe": TableFamily(
        engine="vllm", kind="fused_moe", folder="vllm/model_executor/layers/fused_moe/configs", per_triton=False,
        env_var="VLLM_TUNED_CONFIG_FOLDER", env_replaces_root=False, fold_h200=True, device_pattern=r"[\s/]+",
        block_sep=",", dtypes=_DTYPES, dropped_keys=("triton_version",), has_down=False, clamp_block_k=True,
        raise_block_k=False, forced=(("SPLIT_K", 1),), accepted_keys=MATMUL_CONFIG_KEYS + ("SPLIT_K",),
        other_loaders=(("FlyDSL MoE (ROCm)", r",backend=flydsl\.json$"),),
        loader=f"{_MOE}:get_moe_configs", precisions=MOE_PRECISIONS,
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_paths", -1))),
    "fp8_gemm": TableFamily(
        engine="vllm", kind="fp8_gemm", folder="vllm/model_executor/layers/quantization/utils/configs",
        per_triton=False, env_var=None, env_replaces_root=False, fold_h200=False, device_pattern=r"[\s/]+",
        block_sep=",", dtypes=("fp8_w8a8",), dropped_keys=(), has_down=False, clamp_block_k=False,
        raise_block_k=False, accepted_keys=MATMUL_CONFIG_KEYS,
        loader=f"{_FP8}:get_w8a8_block_fp8_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_path", -1))),
}
