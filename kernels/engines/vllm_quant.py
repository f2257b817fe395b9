"""vLLM's fused MoE at the integer precisions, launched as vLLM 0.31.0-0.33.0 launch it (the spec:
kernels/engines/vllm_quant_spec.py; the releases: vLLM's fused-MoE ones plus the group-wise
wrappers, checked when the code is loaded).

Mirrored from vLLM's wrappers:
- INT8 W8A8 per channel and INT8 W8A16 per channel (fused_experts_impl, _prepare_expert_assignment,
  invoke_fused_moe_triton_kernel): fused_moe_kernel with use_int8_w8a8 and per_channel_quant (the
  activations quantized per token before each GEMM: vLLM's per_token_quant_int8, ours here: same
  math) or use_int8_w8a16 (bf16 activations, the weight's per-row scale applied after the loop);
  no swap-AB (FP8 only); the small-batch path when M * topk * 4 <= E and no expert parallelism;
  the scale strides as the version passes them (kernels/engines/vllm.py).
- weight-only INT4/INT8 in K groups (TritonWNA16Experts.apply, invoke_fused_moe_wna16_triton_kernel,
  get_moe_wna16_block_config): moe_align_block_size over the global experts, every pair counted
  and other GPUs' experts' blocks marked -1 (no small-batch path); fused_moe_kernel_gptq_awq with
  the table's row as its launch config (SPLIT_K included: the row must hold it), the grid over
  min(sorted length, M * top_k * BLOCK_SIZE_M) rows when M < BLOCK_SIZE_M, block_k_diviable from
  K, the zero points' strides when the checkpoint has them; the up GEMM without routing weights.
What is ours, not vLLM's (same math, other code): the INT8 activation quantization, the alignment
sort, silu-and-mul and the top-k sum."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.engines.base import jit_functions
from kernels.engines.vllm import _b_scale_strides, expert_assignment
from kernels.engines.vllm_quant_spec import MOE_FILE, WNA16_KERNEL
from kernels.engines.vllm_spec import naive_block_assignment
from kernels.fused_moe import expert_parallel, max_padded_rows, moe_align_block_size, pairs_per_token, silu_and_mul
from kernels.moe_quant import MoeQuant, phantom_moe_activation, phantom_moe_weights, quantize_activation
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params

# the row's keys the group-wise launch passes (**config): the table's, SPLIT_K included
WNA16_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "SPLIT_K", "num_warps",
                     "num_stages")


def _invoke(code, launch: dict, A, B, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, num_post_padded,
            mul_routed_weight: bool, top_k: int, config: Config, mq: MoeQuant, warmup: bool = False):
    """invoke_fused_moe_triton_kernel for INT8 W8A8 and W8A16 per channel (no block shape)."""
    (kernel,) = jit_functions(code, MOE_FILE, ["fused_moe_kernel"])
    flags = mq.flags()
    num_tokens = A.size(0) * top_k
    if sorted_ids is not None:
        EM = sorted_ids.size(0)
        if A.size(0) < config["BLOCK_SIZE_M"]:
            EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), config["BLOCK_SIZE_N"]),)
    args = (
        A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, num_post_padded,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        A_scale.stride(0) if A_scale is not None and A_scale.ndim == 2 else 0,
        A_scale.stride(1) if A_scale is not None and A_scale.ndim == 2 else 0,
        *_b_scale_strides(B_scale, launch), 0, 0, 0, 0)
    meta = dict(
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.bfloat16, use_fp8_w8a8=False,
        use_int8_w8a8=flags["use_int8_w8a8"], use_int8_w8a16=flags["use_int8_w8a16"],
        per_channel_quant=flags["per_channel_quant"], naive_block_assignment=sorted_ids is None, HAS_BIAS=False,
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"], SWAP_AB=False, USE_TD=False,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"], SPLIT_K=1, num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _invoke_wna16(code, A, B, C, B_scale, B_zp, topk_weights, sorted_ids, expert_ids, num_post_padded,
                  mul_routed_weight: bool, top_k: int, config: Config, mq: MoeQuant, warmup: bool = False):
    """invoke_fused_moe_wna16_triton_kernel: the group-wise kernel, with the table's row as
    its launch config (get_moe_wna16_block_config adds nothing to a row that has BLOCK_SIZE_N
    and BLOCK_SIZE_K)."""
    (kernel,) = jit_functions(code, MOE_FILE, [WNA16_KERNEL])
    EM = sorted_ids.size(0)
    if A.size(0) < config["BLOCK_SIZE_M"]:
        EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), config["BLOCK_SIZE_N"]),)
    args = (A, B, C, B_scale, B_zp, topk_weights, sorted_ids, expert_ids, num_post_padded,
            B.size(1), A.size(1), EM, A.size(0) * top_k,
            A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
            B_scale.stride(0), B_scale.stride(2), B_scale.stride(1),
            B_zp.stride(0) if B_zp is not None else 0, B_zp.stride(2) if B_zp is not None else 0,
            B_zp.stride(1) if B_zp is not None else 0)
    flags = mq.flags()
    meta = dict(block_k_diviable=A.size(1) % config["BLOCK_SIZE_K"] == 0, group_size=mq.group_size,
                MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.bfloat16,
                has_zp=B_zp is not None, use_int4_w4a16=flags["use_int4_w4a16"],
                use_int8_w8a16=flags["use_int8_w8a16"], **{k: config[k] for k in WNA16_CONFIG_KEYS})
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def wna16_assignment(topk_ids, config: Config, E: int, ep: int = 1):
    """TritonWNA16Experts.apply's moe_align_block_size: over the global experts, every pair
    counted, the blocks of other GPUs' experts marked -1 (the kernel writes zeros for them).
    This GPU (rank 0) holds global experts 0 .. E-1."""
    bm = config["BLOCK_SIZE_M"]
    sorted_ids, expert_ids, padded = moe_align_block_size(
        topk_ids, bm, E * ep, rows=max_padded_rows(topk_ids.numel(), E * ep, bm), invalid="drop")
    if ep > 1:
        import torch
        expert_ids = torch.where(expert_ids < E, expert_ids, -1).to(expert_ids.dtype)
    return sorted_ids, expert_ids, padded


def moe_run(code, launch: dict):
    """The whole layer with one config (vLLM's table): INT8 as fused_experts_impl runs it, the
    weight-only precisions in K groups as TritonWNA16Experts.apply does."""
    def run(inputs: dict, config: Config):
        import torch
        p = inputs["params"]
        mq = MoeQuant.of(p)
        x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
        weights = inputs["topk_weights"]
        ep = expert_parallel(p)
        M, K = x.shape
        E, two_n = w1.shape[0], w1.shape[1]
        top_k = inputs["local_ids"].shape[1]
        cache1 = torch.empty((M, top_k, two_n), dtype=x.dtype, device=x.device)
        cache3 = torch.empty((M, top_k, K), dtype=x.dtype, device=x.device)
        if mq.wna16:
            align = wna16_assignment(inputs["topk_ids"], config, E, ep)
            _invoke_wna16(code, x, w1, cache1, inputs["w1_scale"], inputs["w1_zp"], None, *align, False, top_k,
                          config, mq)
            act = silu_and_mul(cache1.view(-1, two_n))
            _invoke_wna16(code, act, w2, cache3, inputs["w2_scale"], inputs["w2_zp"], weights, *align, True, 1,
                          config, mq)
            return torch.sum(cache3, dim=1, out=inputs["out"])
        a1, a1_scale = quantize_activation(x, mq)
        align = expert_assignment(inputs["local_ids"], config, E, ep)
        _invoke(code, launch, a1, w1, cache1, a1_scale, inputs["w1_scale"], weights, *align, False, top_k, config, mq)
        act = silu_and_mul(cache1.view(-1, two_n))
        a2, a2_scale = quantize_activation(act, mq)
        if ep > 1:
            cache3.zero_()              # the rows of other GPUs' pairs are never written
        _invoke(code, launch, a2, w2, cache3, a2_scale, inputs["w2_scale"], weights, *align, True, 1, config, mq)
        return torch.sum(cache3, dim=1, out=inputs["out"])
    return run


def moe_compile_only(code, launch: dict):
    """Compile a config's two GEMM launches without running them, on tensors of the timed
    run's shapes, strides and alignment; the weights are phantoms."""
    def compile_only(params: Params, M: int, config: Config) -> None:
        import torch
        dev = COMPILE_DEVICE
        E, N, K = params["E"], params["N"], params["K"]
        top_k = pairs_per_token(params)
        mq = MoeQuant.of(params)
        ids = torch.zeros((M, top_k), dtype=torch.int32, device=dev)
        weights = torch.empty((M, top_k), dtype=torch.float32, device=dev)
        ep = expert_parallel(params)
        if not mq.wna16 and ep == 1 and naive_block_assignment(M, top_k, E):
            assign = (None, ids.view(-1), torch.empty(1, dtype=torch.int32, device=dev))
        else:
            rows = max_padded_rows(M * top_k, E * ep, config["BLOCK_SIZE_M"])
            assign = (torch.empty(rows, dtype=torch.int32, device=dev),
                      torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
                      torch.empty(1, dtype=torch.int32, device=dev))
        for rows_a, k_in, n_out, tk, mul in ((M, K, 2 * N, top_k, False), (M * top_k, N, K, 1, True)):
            b, b_s, b_zp = phantom_moe_weights(E, n_out, k_in, mq, dev)
            a, a_s = phantom_moe_activation(rows_a, k_in, mq, dev)
            c = torch.empty((M, top_k, n_out), dtype=torch.bfloat16, device=dev)
            if mq.wna16:
                _invoke_wna16(code, a, b, c, b_s, b_zp, weights if mul else None, *assign, mul, tk, config, mq,
                              warmup=True)
            else:
                _invoke(code, launch, a, b, c, a_s, b_s, weights, *assign, mul, tk, config, mq, warmup=True)
    return compile_only
