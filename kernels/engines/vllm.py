"""vLLM's own Triton kernels (fused MoE, block-FP8 GEMM), launched as the vLLM releases of
configs/engines/vllm.yaml launch them (RELEASES, read from that data: each version's wrapper
hashes, kernel signatures and launch differences; any other code is refused when it is loaded).

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
    scale; 0.29.0-0.32.0 pass stride(1) always and 0 for a 1-D scale.
  What differs between the versions is said in the data; 0.29.0-0.32.0 launch alike.
  What is ours, not vLLM's (same math, other code): the activation quantization, the
  alignment sort, silu-and-mul and the top-k sum (vLLM runs CUDA ops there).
- block-FP8 GEMM (`w8a8_triton_block_scaled_mm`): the kernel as launched, with vLLM's
  default config when a table has no entry.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.engines.base import gemm_phantoms, jit_functions, phantom, target_capability
from kernels.engines.vllm_spec import (  # noqa: F401 - the launcher's facts, imported from here too
    ALIGN_FILE,
    ENGINE,
    GEMM_FILE,
    KERNEL_FUNCTIONS,
    MOE_FILE,
    UTILS_FILE,
    __getattr__,  # RELEASES, SUPPORTED, FILES: read from the data when asked, as the spec does
    base_moe,
    gemm_default_config,
    kernel_spec,
    moe_default_config,
    moe_m_tiles,
    moe_note,
    naive_block_assignment,
    releases,
)
from kernels.fused_moe import (
    QUANT_BLOCK,
    QUANT_NONE,
    _quant_mode,
    _quantize,
    expert_parallel,
    max_padded_rows,
    moe_align_block_size,
    pairs_per_token,
    silu_and_mul,
)
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
            mul_routed_weight: bool, top_k: int, config: Config, quant: int, block_shape, warmup: bool = False):
    """invoke_fused_moe_triton_kernel for fp8_w8a8 (block or per-tensor) and bf16; with
    `warmup` it compiles the launch without running it."""
    (kernel,) = jit_functions(code, MOE_FILE, ["fused_moe_kernel"])
    use_fp8 = quant != QUANT_NONE
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
        use_fp8_w8a8=use_fp8, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=sorted_ids is None, HAS_BIAS=False, BLOCK_SIZE_K=block_k,
        SWAP_AB=use_fp8 and swap_ab(config), USE_TD=False,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"], SPLIT_K=1,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def expert_assignment(local_ids, config: Config, E: int, ep: int = 1):
    """_prepare_expert_assignment (weights on the GPU). Under expert parallelism (an expert
    map: `local_ids` holds -1 for other GPUs' experts) never the small-batch path, and the
    alignment is sized over the global expert count with those pairs dropped."""
    M, topk = local_ids.shape
    bm = config["BLOCK_SIZE_M"]
    if ep == 1 and naive_block_assignment(M, topk, E):
        import torch
        return None, local_ids.view(-1), torch.full((1,), local_ids.numel() * bm,
                                                    dtype=torch.int32, device=local_ids.device)
    return moe_align_block_size(local_ids, bm, E, rows=max_padded_rows(local_ids.numel(), E * ep, bm),
                                invalid="drop")


def moe_run(code, launch: dict):
    """The whole layer, as fused_experts_impl runs it with one config (vLLM's table)."""
    def run(inputs: dict, config: Config):
        import torch
        p = inputs["params"]
        block_shape = p.get("block_shape")
        quant = inputs["quant"]
        x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
        ids, weights = inputs["local_ids"], inputs["topk_weights"]
        ep = expert_parallel(p)
        M, K = x.shape
        E, two_n, _ = w1.shape
        top_k = ids.shape[1]
        gk = block_shape[1] if block_shape else 0
        cache1 = torch.empty((M, top_k, two_n), dtype=x.dtype, device=x.device)
        cache3 = torch.empty((M, top_k, K), dtype=x.dtype, device=x.device)
        a1, a1_scale = _quantize(x, quant, gk)
        sorted_ids, expert_ids, num_post_padded = expert_assignment(ids, config, E, ep)
        _invoke(code, launch, a1, w1, cache1, a1_scale, inputs["w1_scale"], weights, sorted_ids, expert_ids,
                num_post_padded, False, top_k, config, quant, block_shape)
        act = silu_and_mul(cache1.view(-1, two_n))
        a2, a2_scale = _quantize(act, quant, gk)
        if ep > 1:
            cache3.zero_()              # the rows of other GPUs' pairs are never written
        _invoke(code, launch, a2, w2, cache3, a2_scale, inputs["w2_scale"], weights, sorted_ids, expert_ids,
                num_post_padded, True, 1, config, quant, block_shape)
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
        wdt = torch.bfloat16 if quant == QUANT_NONE else torch.float8_e4m3fn
        ids = torch.zeros((M, top_k), dtype=torch.int32, device=dev)
        weights = torch.empty((M, top_k), dtype=torch.float32, device=dev)
        ep = expert_parallel(params)
        if ep == 1 and naive_block_assignment(M, top_k, E):
            assign = (None, ids.view(-1), torch.empty(1, dtype=torch.int32, device=dev))
        else:
            rows = max_padded_rows(M * top_k, E * ep, config["BLOCK_SIZE_M"])
            assign = (torch.empty(rows, dtype=torch.int32, device=dev),
                      torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
                      torch.empty(1, dtype=torch.int32, device=dev))
        for rows_a, k_in, n_out, tk, mul in ((M, K, 2 * N, top_k, False), (M * top_k, N, K, 1, True)):
            a = torch.empty((rows_a, k_in), dtype=wdt, device=dev)
            b = phantom((E, n_out, k_in), wdt)
            c = torch.empty((M, top_k, n_out), dtype=torch.bfloat16, device=dev)
            a_s = b_s = None
            if quant == QUANT_BLOCK:
                a_s = torch.empty((rows_a, triton.cdiv(k_in, block_shape[1])), dtype=torch.float32, device=dev)
                b_s = torch.empty((E, triton.cdiv(n_out, block_shape[0]), triton.cdiv(k_in, block_shape[1])),
                                  dtype=torch.float32, device=dev)
            elif quant != QUANT_NONE:
                a_s = torch.empty(1, dtype=torch.float32, device=dev)
                b_s = torch.empty(E, dtype=torch.float32, device=dev)
            _invoke(code, launch, a, b, c, a_s, b_s, weights, *assign, mul, tk, config, quant, block_shape,
                    warmup=True)
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
