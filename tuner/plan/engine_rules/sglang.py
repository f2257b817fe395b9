"""SGLang's rules as data (facts read from the source of the releases configs/engines/sglang.yaml
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

_MOE_CFG = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
_MOE_KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
_FP8 = "sglang/kernels/ops/gemm/fp8_kernel.py"
# where its server flags are defined (0.5.20 on; 0.5.19: server_args.py)
_FLAG_FILES = ("sglang/srt/arg_groups/fields/exec_.py", "sglang/srt/server_args.py")
_DTYPES = (None, "fp8_w8a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "float32")

# The MoE precisions SGLang 0.5.21-0.5.23 runs on its Triton runner (its quantization methods of
# 0.5.23; the earlier two alike), keyed (dtype, scheme), and how get_config_dtype_str and
# get_config_file_name name their tables: per-channel INT8 with ",per_channel_quant=True", and
# INT4 by w2's packed width (two values a byte: N // 2).
_MOE_KERNEL, _WNA16_KERNEL = "fused_moe_kernel", "fused_moe_kernel_gptq_awq"
MOE_PRECISIONS = {
    ("bf16", "none"): PrecisionRule(None, _MOE_KERNEL, "unquantized experts run the Triton MoE runner"),
    ("fp8_w8a8", "block"): PrecisionRule("fp8_w8a8", _MOE_KERNEL, "block-FP8 experts run the Triton MoE runner"),
    ("fp8_w8a8", "tensor"): PrecisionRule("fp8_w8a8", _MOE_KERNEL, "per-tensor FP8 experts run the Triton MoE runner"),
    ("int8_w8a8", "channel"): PrecisionRule(
        "int8_w8a8", _MOE_KERNEL, "w8a8_int8 checkpoints (channel weights, dynamic per-token activations) run the "
        "Triton MoE runner by default", per_channel_part=True),
    ("int8_w8a8", "block"): PrecisionRule(
        "int8_w8a8", _MOE_KERNEL, "blockwise_int8 checkpoints run the Triton MoE runner by default"),
    ("int8_w8a16", "group"): PrecisionRule(
        "int8_w8a16", _WNA16_KERNEL, "8-bit GPTQ checkpoints run its Triton kernel with --quantization moe_wna16; by "
        "default GPTQ Marlin runs, which reads no table", by_default=False),
    ("int4_w4a16", "group"): PrecisionRule(
        "int4_w4a16", _WNA16_KERNEL, "INT4 AWQ/GPTQ checkpoints run its Triton kernel with --quantization moe_wna16, "
        "compressed-tensors W4A16 ones (symmetric, groups of 32 or 128) with --moe-runner-backend triton; by default "
        "Marlin's MoE runs, which reads no table", by_default=False, packed_n=2),
}
MOE_REFUSED = {
    ("int8_w8a16", "channel"): "SGLang 0.5.21-0.5.23 run no per-channel INT8 weight-only MoE (no experts_int8 method; "
                               "its 8-bit weight-only MoE is moe_wna16's, in K groups)",
}

ENGINE = Engine(
    name="sglang",
    block_shape_sep=", ",
    # (not for compressed-tensors W4A16 checkpoints: their routed and shared experts are quantized
    # apart, deepseek_v2.py shared_experts_fusion_disable_reason)
    shared_expert_fusion={"architectures": ("DeepseekV3ForCausalLM",), "routed_experts": (256,),
                          "shared_experts": 1, "max_ep": 1,
                          "not_for": (("compressed-tensors", "int4_w4a16"),)},
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
    # the experts are split by TP / EP: each GPU holds its experts' TP/EP-th slices
    ep_holds_whole_experts=False,
    hopper_backends={
        "fp8_gemm": BackendChoice(
            False, "not read by default: {facts}", turned_on_by=("SGLANG_ENABLE_JIT_DEEPGEMM",),
            turned_on_line="{variables}=0 is set: the Triton GEMM reads these tables"),
        "fused_moe": BackendChoice(True, "read by default ({facts})"),
    },
    moe_precisions=MOE_PRECISIONS,
    moe_precisions_refused=MOE_REFUSED,
    triton_flags={
        "fp8_gemm": BackendFlag("--fp8-gemm-backend triton", "DeepGEMM", _FLAG_FILES, 'cli_name="--fp8-gemm-backend"'),
        "fused_moe": BackendFlag("--moe-runner-backend triton", "the Triton MoE runner (auto)", _FLAG_FILES,
                                 "moe_runner_backend:"),
    },
)

# What /metrics says (SGLang 0.5.23): sglang/srt/observability/metrics_collector.py exports no
# per-pass token histogram. It has the gauge `sglang:num_running_reqs` (the running decode
# batch, set at each decode log interval and prefill), the counter
# `sglang:cuda_graph_passes_total` by mode (decode_cuda_graph, decode_none, prefill_cuda_graph,
# prefill_none: one per forward pass) and the counter `sglang:realtime_tokens_total` by mode
# (prefill_compute, prefill_cache, decode). Decode batches are padded to the captured batch
# sizes (sglang/srt/arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes; the
# default largest size is 512 at TP >= 4 and 256 below on 80-160 GB GPUs,
# sglang/srt/arg_groups/memory_hook.py); base_cuda_graph_runner._pad_to_bucket takes the
# smallest captured size >= the batch.


def _graph_sizes(tp: int | None) -> list[int]:
    top = 512 if (tp or 8) >= 4 else 256
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, top + 1, 32))
    sizes = [s for s in sizes if s <= top]
    return sorted(set(sizes + [top]))


SERVING_METRICS = ServingMetrics(
    engine="sglang", facts_for="SGLang 0.5.23", prefix="sglang:",
    batch_gauge="sglang:num_running_reqs",
    passes_counter="sglang:cuda_graph_passes_total", tokens_counter="sglang:realtime_tokens_total",
    decode_pass_modes=("decode_cuda_graph", "decode_none"),
    prefill_pass_modes=("prefill_cuda_graph", "prefill_none"),
    decode_token_modes=("decode",), prefill_token_modes=("prefill_compute",),
    skip_gauge_labels={"engine_type": ("prefill",)},
    graph_sizes=_graph_sizes, pads_every_pass=False,
    padding_note="SGLang 0.5.23 pads a decode batch to its CUDA-graph batch sizes (1 2 4 8 12, 16 to 256 by 8, "
                 "272 to 496 by 16, 512; up to 256 at TP < 4); prefill chunks are taken unpadded")

TABLE_FAMILIES = {
    "fused_moe": TableFamily(
        engine="sglang", kind="fused_moe", folder="sglang/srt/layers/moe/moe_runner/triton_utils/configs",
        per_triton=True, env_var="SGLANG_MOE_CONFIG_DIR", env_replaces_root=True, fold_h200=False, device_pattern=" ",
        block_sep=", ", dtypes=_DTYPES, dropped_keys=(), has_down=True, per_channel_part=True, clamp_block_k=False,
        raise_block_k=False, accepted_keys=MATMUL_CONFIG_KEYS + ("USE_TMA",), tied_down_keys=("BLOCK_SIZE_M",),
        loader=f"{_MOE_CFG}:get_moe_configs", precisions=MOE_PRECISIONS,
        log_calls=(("loaded", "info", "config_file_path", 0), ("fell back", "warning", "try_config_file_path", 0),
                   ("not loaded", "warning", "config_file_path", -1))),
    "fp8_gemm": TableFamily(
        engine="sglang", kind="fp8_gemm", folder="sglang/kernels/ops/gemm/configs", per_triton=False, env_var=None,
        env_replaces_root=False, fold_h200=False, device_pattern=" ", block_sep=", ", dtypes=("fp8_w8a8",),
        dropped_keys=(), has_down=False, clamp_block_k=False, raise_block_k=True,
        accepted_keys=MATMUL_CONFIG_KEYS + ("SWAP_AB", "SPLIT_K"),
        other_loaders=(("block-INT8 GEMM", r",dtype=int8_w8a8,block_shape=\[\d+, \d+\]\.json$"),
                       ("channelwise FP8 GEMM", r",dtype=fp8_w8a8_channelwise\.json$")),
        loader=f"{_FP8}:get_w8a8_block_fp8_configs",
        log_calls=(("loaded", "info", "config_file_path", 0), ("not loaded", "warning", "config_file_path", -1))),
}
