"""vLLM's rules as data (facts read from the source of the releases configs/engines/vllm.yaml
lists, their released wheels): how it names, places and reads its tables, which backend reads
them on Hopper and what its /metrics says of the batches it runs. The hashes of the loader
functions these rules were read from, per release, are in that file."""

from __future__ import annotations

from tuner.plan.engine_rules.schema import BackendChoice, BackendFlag, Engine, ServingMetrics, TableFamily
from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS

_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_FP8 = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
_DTYPES = (None, "fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32")

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
        loader=f"{_MOE}:get_moe_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_paths", -1))),
    "fp8_gemm": TableFamily(
        engine="vllm", kind="fp8_gemm", folder="vllm/model_executor/layers/quantization/utils/configs",
        per_triton=False, env_var=None, env_replaces_root=False, fold_h200=False, device_pattern=r"[\s/]+",
        block_sep=",", dtypes=("fp8_w8a8",), dropped_keys=(), has_down=False, clamp_block_k=False,
        raise_block_k=False, accepted_keys=MATMUL_CONFIG_KEYS,
        loader=f"{_FP8}:get_w8a8_block_fp8_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_path", -1))),
}
