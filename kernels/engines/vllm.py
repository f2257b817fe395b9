"""vLLM's own Triton kernels (fused MoE, block-FP8 GEMM), launched as vLLM 0.31.0, 0.32.0 and
0.33.0 launch them (RELEASES: each version's wrapper hashes, kernel signatures and launch
differences; any other code is refused when it is loaded).

Mirrored from vLLM's wrappers (all in this file, checked against RELEASES' hashes):
- fused MoE (`fused_experts_impl`, `_prepare_expert_assignment`,
  `invoke_fused_moe_triton_kernel`, `enable_swap_ab`, `moe_align_block_size`):
  * swap-AB: fp8_w8a8 configs with BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 run with
    SWAP_AB on compute capability 9.0 (wgmma with the weight tile as the M side);
  * small batches skip the alignment when M * topk * 4 <= E ("naive block assignment":
    one (token, expert) pair per program, grid M * topk * BLOCK_SIZE_M rows);
  * the grid covers min(sorted length, M * topk * BLOCK_SIZE_M) rows when M < BLOCK_SIZE_M;
  * BLOCK_SIZE_K is clamped to the smaller weight-block side (256 runs as 128);
  * the sorted length is numel + E * (BLOCK_SIZE_M - 1), at most numel * BLOCK_SIZE_M;
  * expert parallelism (an expert map): the router's global ids are aligned over the global
    expert count with the pairs of other GPUs' experts dropped (`ignore_invalid_experts`),
    never on the small-batch path, and the second GEMM's output is zeroed first;
  * the weight-scale strides: 0.33.0 passes stride 0 along N when the weight has a single
    128-row scale block (`B_scale.size(1) == 1`) and the expert stride of a per-tensor
    scale; 0.31.0 and 0.32.0 pass stride(1) always and 0 for a 1-D scale.
  What differs between the versions is said in RELEASES; 0.31.0 and 0.32.0 launch alike
  (0.32.0 only added a batch-invariant switch to the GEMM wrapper).
  What is ours, not vLLM's (same math, other code): the activation quantization, the
  alignment sort, silu-and-mul and the top-k sum (vLLM runs CUDA ops there).
- block-FP8 GEMM (`w8a8_triton_block_scaled_mm`): the kernel as launched, with vLLM's
  default config when a table has no entry.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.engines.base import (
    gemm_phantoms,
    jit_functions,
    phantom_moe_activation,
    phantom_moe_weights,
    target_capability,
)
from kernels.engines.vllm_spec import (  # noqa: F401 - the launcher's facts, imported from here too
    ALIGN_FILE,
    ENGINE,
    FILES,
    GEMM_FILE,
    KERNEL_FUNCTIONS,
    MOE_FILE,
    RELEASES,
    SUPPORTED,
    UTILS_FILE,
    WNA16_KERNEL,
    base_moe,
    gemm_default_config,
    kernel_spec,
    moe_default_config,
    moe_m_tiles,
    moe_note,
    naive_block_assignment,
)
from kernels.fused_moe import (
    QUANT_NONE,
    _quant_mode,
    _quantize,
    expert_parallel,
    max_padded_rows,
    moe_align_block_size,
    pairs_per_token,
    silu_and_mul,
)
from kernels.moe_quant import MoeQuant, quantize_activation
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params


# -- fused MoE ---------------------------------------------------------------------------
def swap_ab(config: Config) -> bool:
    """enable_swap_ab: the operand swap vLLM applies on sm_90 (fp8_w8a8 only)."""
    return target_capability() == (9, 0) and config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64


def _b_scale_strides(B_scale, launch: dict) -> tuple[int, int, int]:
    """(expert, K, N) strides of the weight scales as the version passes them."""
    if B_scale is None:
        return 0, 0, 0
    k = B_scale.stride(2) if B_scale.ndim == 3 else 0
    if launch["b_scale_strides"] == "size":          # 0.33.0
        return (B_scale.stride(0), k,
                B_scale.stride(1) if B_scale.ndim >= 2 and B_scale.size(1) > 1 else 0)
    return (B_scale.stride(0) if B_scale.ndim >= 2 else 0, k,      # 0.31.0, 0.32.0
            B_scale.stride(1) if B_scale.ndim >= 2 else 0)


def _invoke(code, launch: dict, A, B, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, num_post_padded,
            mul_routed_weight: bool, top_k: int, config: Config, quant: int, block_shape, warmup: bool = False,
            mq: MoeQuant | None = None):
    """invoke_fused_moe_triton_kernel for fp8_w8a8 (block or per-tensor), int8_w8a8 (block or
    per channel), int8_w8a16 per channel and bf16 (`mq`: an integer precision); with `warmup`
    it compiles the launch without running it."""
    (kernel,) = jit_functions(code, MOE_FILE, ["fused_moe_kernel"])
    use_fp8 = quant != QUANT_NONE
    flags = mq.flags() if mq is not None else {"use_int8_w8a8": False, "use_int8_w8a16": False,
                                                "per_channel_quant": False}
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_ids is not None:
        EM = sorted_ids.size(0)
        if A.size(0) < config["BLOCK_SIZE_M"]:
            EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    block_k = config["BLOCK_SIZE_K"]
    if block_shape is not None:
        block_k = min(block_k, min(block_shape))
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), config["BLOCK_SIZE_N"]),)
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)
    args = (
        A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, num_post_padded,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        A_scale.stride(0) if A_scale is not None and A_scale.ndim == 2 else 0,
        A_scale.stride(1) if A_scale is not None and A_scale.ndim == 2 else 0,
        *_b_scale_strides(B_scale, launch),
        0, 0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1])
    meta = dict(
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.bfloat16,
        use_fp8_w8a8=use_fp8, use_int8_w8a8=flags["use_int8_w8a8"], use_int8_w8a16=flags["use_int8_w8a16"],
        per_channel_quant=flags["per_channel_quant"],
        naive_block_assignment=sorted_ids is None, HAS_BIAS=False, BLOCK_SIZE_K=block_k,
        SWAP_AB=use_fp8 and swap_ab(config), USE_TD=False,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"], SPLIT_K=1,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _invoke_wna16(code, A, B, C, B_scale, B_zp, topk_weights, sorted_ids, expert_ids, num_post_padded,
                  mul_routed_weight: bool, top_k: int, config: Config, mq: MoeQuant, warmup: bool = False):
    """invoke_fused_moe_wna16_triton_kernel: the group-wise kernel, with the table's row as
    its launch config (SPLIT_K included; get_moe_wna16_block_config adds nothing to a row
    that has BLOCK_SIZE_N and BLOCK_SIZE_K)."""
    (kernel,) = jit_functions(code, MOE_FILE, [WNA16_KERNEL])
    num_tokens = A.size(0) * top_k
    EM = sorted_ids.size(0)
    if A.size(0) < config["BLOCK_SIZE_M"]:
        EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), config["BLOCK_SIZE_N"]),)
    args = (A, B, C, B_scale, B_zp, topk_weights, sorted_ids, expert_ids, num_post_padded,
            B.size(1), A.size(1), EM, num_tokens,
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


# the row's keys the group-wise launch passes (**config): the table's, SPLIT_K included
WNA16_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "SPLIT_K", "num_warps",
                     "num_stages")


def expert_assignment(local_ids, config: Config, E: int, ep: int = 1, naive_allowed: bool = True):
    """_prepare_expert_assignment (weights on the GPU). Under expert parallelism (an expert
    map: `local_ids` holds -1 for other GPUs' experts) never the small-batch path, and the
    alignment is sized over the global expert count with those pairs dropped."""
    M, topk = local_ids.shape
    bm = config["BLOCK_SIZE_M"]
    if naive_allowed and ep == 1 and naive_block_assignment(M, topk, E):
        import torch
        return None, local_ids.view(-1), torch.full((1,), local_ids.numel() * bm,
                                                    dtype=torch.int32, device=local_ids.device)
    return moe_align_block_size(local_ids, bm, E, rows=max_padded_rows(local_ids.numel(), E * ep, bm),
                                invalid="drop")


def wna16_assignment(topk_ids, config: Config, E: int, ep: int = 1):
    """TritonWNA16Experts.apply's moe_align_block_size (no small-batch path): over the global
    experts, every pair counted, the blocks of other GPUs' experts marked -1 (the kernel writes
    zeros for them). This GPU (rank 0) holds global experts 0 .. E-1."""
    bm = config["BLOCK_SIZE_M"]
    sorted_ids, expert_ids, padded = moe_align_block_size(
        topk_ids, bm, E * ep, rows=max_padded_rows(topk_ids.numel(), E * ep, bm), invalid="drop")
    if ep > 1:
        import torch
        expert_ids = torch.where(expert_ids < E, expert_ids, -1).to(expert_ids.dtype)
    return sorted_ids, expert_ids, padded


def _quantized(x, quant: int, gk: int, mq: MoeQuant):
    """The activation a GEMM reads: FP8 or INT8 W8A8 quantized, else as it is."""
    if mq.int8:
        return quantize_activation(x, mq)
    return _quantize(x, quant, gk)


def moe_run(code, launch: dict):
    """The whole layer, as fused_experts_impl runs it with one config (vLLM's table), or for
    a weight-only MoE in K groups as TritonWNA16Experts.apply does."""
    def run(inputs: dict, config: Config):
        import torch
        p = inputs["params"]
        block_shape = p.get("block_shape")
        quant = inputs["quant"]
        mq = MoeQuant.of(p)
        x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
        ids, weights = inputs["local_ids"], inputs["topk_weights"]
        ep = expert_parallel(p)
        M, K = x.shape
        E, two_n = w1.shape[0], w1.shape[1]
        top_k = ids.shape[1]
        gk = block_shape[1] if block_shape else 0
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
        a1, a1_scale = _quantized(x, quant, gk, mq)
        sorted_ids, expert_ids, num_post_padded = expert_assignment(ids, config, E, ep)
        _invoke(code, launch, a1, w1, cache1, a1_scale, inputs["w1_scale"], weights, sorted_ids, expert_ids,
                num_post_padded, False, top_k, config, quant, block_shape, mq=mq)
        act = silu_and_mul(cache1.view(-1, two_n))
        a2, a2_scale = _quantized(act, quant, gk, mq)
        if ep > 1:
            cache3.zero_()              # the rows of other GPUs' pairs are never written
        _invoke(code, launch, a2, w2, cache3, a2_scale, inputs["w2_scale"], weights, sorted_ids, expert_ids,
                num_post_padded, True, 1, config, quant, block_shape, mq=mq)
        return torch.sum(cache3, dim=1, out=inputs["out"])
    return run


def moe_compile_only(code, launch: dict):
    """Compile a config's two GEMM launches without running them, on tensors of the timed
    run's shapes, strides and alignment (so the timed run finds them in Triton's cache).
    The weights are views of a few bytes: nothing runs, so nothing is read."""
    def compile_only(params: Params, M: int, config: Config) -> None:
        import torch
        dev = COMPILE_DEVICE
        E, N, K = params["E"], params["N"], params["K"]
        top_k = pairs_per_token(params)
        block_shape = params.get("block_shape")
        quant = _quant_mode(params["dtype"] == "fp8_w8a8", block_shape)
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
            b, b_s, b_zp = phantom_moe_weights(E, n_out, k_in, mq, quant, block_shape, dev)
            c = torch.empty((M, top_k, n_out), dtype=torch.bfloat16, device=dev)
            if mq.wna16:
                a = torch.empty((rows_a, k_in), dtype=torch.bfloat16, device=dev)
                _invoke_wna16(code, a, b, c, b_s, b_zp, weights if mul else None, *assign, mul, tk, config, mq,
                              warmup=True)
                continue
            a, a_s = phantom_moe_activation(rows_a, k_in, mq, quant, block_shape, dev)
            _invoke(code, launch, a, b, c, a_s, b_s, weights, *assign, mul, tk, config, quant, block_shape,
                    warmup=True, mq=mq)
    return compile_only


# -- block-FP8 GEMM ----------------------------------------------------------------------
def _gemm_launch(code, A, B, As, Bs, C, block_size, config: Config, warmup: bool = False):
    """w8a8_triton_block_scaled_mm's launch."""
    (kernel,) = jit_functions(code, GEMM_FILE, ["_w8a8_triton_block_scaled_mm"])
    block_n, block_k = block_size
    M, K = A.shape
    N = B.shape[0]
    grid = (triton.cdiv(M, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    args = (A, B, C, As, Bs, M, N, K, block_n, block_k,
            A.stride(-2), A.stride(-1), B.stride(1), B.stride(0), C.stride(-2), C.stride(-1),
            As.stride(-2), As.stride(-1), Bs.stride(1), Bs.stride(0))
    meta = dict(BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def gemm_run(code):
    def run(inputs: dict, config: Config):
        _gemm_launch(code, inputs["A"], inputs["B"], inputs["As"], inputs["Bs"], inputs["out"],
                     inputs["block_size"], config)
        return inputs["out"]
    return run


def gemm_compile_only(code):
    def compile_only(params: Params, M: int, config: Config) -> None:
        _gemm_launch(code, *gemm_phantoms(params, M), params["block_shape"], config, warmup=True)
    return compile_only
