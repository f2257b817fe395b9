"""SGLang's fused MoE at the integer precisions, launched as SGLang 0.5.21-0.5.23's Triton runner
launches it (the spec: kernels/engines/sglang_quant_spec.py; the releases: SGLang's fused-MoE ones
plus the group-wise kernel's parameter list, checked when the code is loaded).

Mirrored from SGLang's runner (_prepare_fused_moe_run, _fused_moe_kernel_sequence,
invoke_fused_moe_kernel, moe_align_block_size):
- INT8 W8A8: fused_moe_kernel with use_int8_w8a8, per_channel_quant without blocks; the
  activation quantized inside invoke_fused_moe_kernel per token (per_token_quant_int8) or per
  token and K group (sglang_per_token_group_quant_int8); ours here, same math; no swap-AB (FP8
  only); the version's kernel flags (filter_expert in 0.5.21 and 0.5.22, A_OUTPUT_SLICES... in
  0.5.23) and PDL on sm_90, as kernels/engines/sglang.py launches FP8.
- weight-only in K groups: invoke_fused_moe_kernel's group-wise branch, fused_moe_kernel_gptq_awq
  over the whole sorted length, block_shape [0, group], even_Ks from the stored (for INT4 packed)
  K, the row's keys (USE_TMA popped by the runner) as its launch config, filter_expert where the
  version takes it.
What we time per table is kernels/engines/sglang.py's: the up table, its GEMM; the `_down` table,
its GEMM over the token-order activation; the alignment made before timing. USE_TMA is FP8's:
a row of these precisions that sets it is refused in one line."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.engines.base import jit_functions
from kernels.engines.sglang import _alignment, sorted_rows, use_pdl
from kernels.engines.sglang_quant_spec import MOE_FILE, WNA16_KERNEL
from kernels.engines.sglang_spec import MOE_KEYS
from kernels.fused_moe import expert_parallel, pairs_per_token, silu_and_mul
from kernels.moe_quant import MoeQuant, phantom_moe_activation, phantom_moe_weights, quantize_activation
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params


def _no_tma(config: Config) -> None:
    if config.get("USE_TMA"):
        from tuner.errors import TunerError
        raise TunerError("USE_TMA is set in a row of an INT8/INT4 table: SGLang's TMA path is FP8's (its down GEMM "
                         "asserts FP8 blocks; the group-wise kernel takes no descriptor)")


def _invoke(code, launch: dict, A, B, C, B_scale, B_zp, topk_weights, numel: int, sorted_ids, expert_ids,
            num_post_padded, mul_routed_weight: bool, top_k: int, config: Config, mq: MoeQuant,
            filter_expert: bool = False, router_topk: int = 1, warmup: bool = False, A_scale=None) -> None:
    """invoke_fused_moe_kernel for INT8 W8A8 (A quantized here unless it is INT8 already) and
    its group-wise branch for the weight-only precisions."""
    import torch
    _no_tma(config)
    grid = (triton.cdiv(sorted_ids.shape[0], config["BLOCK_SIZE_M"]) * triton.cdiv(B.shape[1], config["BLOCK_SIZE_N"]),)
    flags = mq.flags()
    tile = dict(BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    if mq.wna16:
        (kernel,) = jit_functions(code, MOE_FILE, [WNA16_KERNEL])
        args: tuple = (A, B, C, B_scale, B_zp, topk_weights, sorted_ids, expert_ids, num_post_padded,
                       B.shape[1], A.shape[1], sorted_ids.shape[0], numel,
                       A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(-2), C.stride(-1),
                       B_scale.stride(0), B_scale.stride(2), B_scale.stride(1),
                       B_zp.stride(0) if B_zp is not None else 0, B_zp.stride(2) if B_zp is not None else 0,
                       B_zp.stride(1) if B_zp is not None else 0)
        version = {"filter_expert": filter_expert} if launch["kernel_flags"] == "filter_expert" else {}
        meta = dict(group_size=mq.group_size, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
                    compute_type=tl.bfloat16, has_zp=B_zp is not None, use_int4_w4a16=flags["use_int4_w4a16"],
                    use_int8_w8a16=flags["use_int8_w8a16"], even_Ks=B.shape[2] % config["BLOCK_SIZE_K"] == 0,
                    **version, **tile)
    else:
        (kernel,) = jit_functions(code, MOE_FILE, ["fused_moe_kernel"])
        if A.dtype != torch.int8:
            A, A_scale = quantize_activation(A, mq)
        block = mq.block_shape
        pdl = {"USE_GDC": True, "launch_pdl": True, "GDC_EARLY": A.shape[0] <= 512} if use_pdl() else {}
        version = ({"filter_expert": filter_expert, "LORA_PRESERVE_BASE": False}
                   if launch["kernel_flags"] == "filter_expert" else
                   {"A_OUTPUT_SLICES": 1, "A_OUTPUT_SLICE_WIDTH": 0, "A_OUTPUT_SLICE_K": 0})
        K = B.shape[2]
        args = (A, None, B, None, None, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids,
                num_post_padded, None, B.shape[1], K, sorted_ids.shape[0], numel,
                A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), 0, 0, C.stride(-2), C.stride(-1),
                A_scale.stride(0), A_scale.stride(1), B_scale.stride(0), B_scale.stride(2), B_scale.stride(1),
                block[0] if block else 0, block[1] if block else 0)
        meta = dict(MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.bfloat16, use_fp8_w8a8=False,
                    use_int8_w8a8=True, use_int8_w8a16=False, per_channel_quant=flags["per_channel_quant"],
                    even_Ks=K % config["BLOCK_SIZE_K"] == 0, c_sorted=False, swap_ab=False,
                    FUSE_ADD_TO_OUTPUT=False, MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False, ROUTER_TOPK=router_topk,
                    FUSE_SWIGLU=False, **version, **pdl, **tile)
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _gemm(code, launch: dict, inputs: dict, config: Config, a, out, down: bool) -> None:
    p = inputs["params"]
    ids = inputs["topk_ids"]
    w = "w2" if down else "w1"
    _invoke(code, launch, a, inputs[w], out, inputs[f"{w}_scale"], inputs[f"{w}_zp"], inputs["topk_weights"],
            ids.numel(), *_alignment(inputs, config["BLOCK_SIZE_M"], launch), down, 1 if down else ids.shape[1],
            config, MoeQuant.of(p), filter_expert=expert_parallel(p) > 1, router_topk=ids.shape[1] if down else 1)


def moe_layer(code, launch: dict, inputs: dict, up_config: Config, down_config: Config):
    """The whole layer as _fused_moe_kernel_sequence runs it with the up and _down tables' entries."""
    import torch
    x, ids = inputs["x"], inputs["topk_ids"]
    M, K = x.shape
    cache1 = torch.empty((ids.numel(), inputs["w1"].shape[1]), dtype=x.dtype, device=x.device)
    _gemm(code, launch, inputs, up_config, x, cache1, down=False)
    cache3 = torch.empty((M, ids.shape[1], K), dtype=x.dtype, device=x.device)
    _gemm(code, launch, inputs, down_config, silu_and_mul(cache1), cache3, down=True)
    return torch.sum(cache3, dim=1, out=inputs["out"])


def moe_run(code, launch: dict):
    """One table's GEMM (part up or down), the layer with the up table's entry and this _down
    one (part pair), or for part "op" the whole layer with one config."""
    def run(inputs: dict, config: Config):
        part = inputs["params"].get("part", "op")
        if part == "up":
            _gemm(code, launch, inputs, config, inputs["x"], inputs["out"], down=False)
        elif part == "down":
            _gemm(code, launch, inputs, config, inputs["act"], inputs["out"], down=True)
        elif part == "pair":
            up = {k: int(inputs["params"]["up_config"].get(k, 0)) for k in MOE_KEYS}
            moe_layer(code, launch, inputs, up, config)
        else:
            moe_layer(code, launch, inputs, config, config)
        return inputs["out"]
    return run


def moe_compile_only(code, launch: dict):
    """Compile the table's GEMM launches without running them (weights are phantoms)."""
    def compile_only(params: Params, M: int, config: Config) -> None:
        import torch
        dev = COMPILE_DEVICE
        E, N, K = params["E"], params["N"], params["K"]
        top_k = pairs_per_token(params)
        numel = M * top_k
        mq = MoeQuant.of(params)
        rows = sorted_rows(numel, E, config["BLOCK_SIZE_M"], launch)
        assign = (torch.empty(rows, dtype=torch.int32, device=dev),
                  torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
                  torch.empty(1, dtype=torch.int32, device=dev))
        weights = torch.empty((M, top_k), dtype=torch.float32, device=dev)
        part = params.get("part", "op")
        up = {k: int(params["up_config"].get(k, 0)) for k in MOE_KEYS} if part == "pair" else config
        gemms = ([(up, M, K, 2 * N, top_k, False, 1)] if part in ("op", "pair", "up") else []) + \
            ([(config, numel, N, K, 1, True, top_k)] if part in ("op", "pair", "down") else [])
        for cfg, rows_a, k_in, n_out, tk, mul, router_topk in gemms:
            b, b_s, b_zp = phantom_moe_weights(E, n_out, k_in, mq, dev)
            a, a_s = phantom_moe_activation(rows_a, k_in, mq, dev)
            c = torch.empty((numel, n_out), dtype=torch.bfloat16, device=dev)
            _invoke(code, launch, a, b, c, b_s, b_zp, weights, numel, *assign, mul, tk, cfg, mq,
                    filter_expert=expert_parallel(params) > 1, router_topk=router_topk, warmup=True, A_scale=a_s)
    return compile_only
