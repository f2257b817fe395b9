"""Fused mixture-of-experts (MoE) layer: per token, the weighted sum over its top-k experts
of  w2_e . (silu(gate_e . x) * (up_e . x)),  with the engines' layout and config semantics.

Layout (as vLLM and SGLang):
  hidden_states [M, K] bf16; w1 [E, 2N, K] (gate rows, then up rows); w2 [E, K, N];
  topk_weights [M, topk] fp32; topk_ids [M, topk] int32; output [M, K] bf16.
Precisions: bf16; fp8_w8a8 with 128x128 weight blocks (activations quantized per token and
1x128 group before each GEMM, bf16 between the GEMMs); fp8_w8a8 per-tensor.

How it runs: the (token, k) pairs are sorted by expert and each expert's run padded to a
multiple of BLOCK_SIZE_M ("alignment"); then one grouped GEMM kernel per projection, where
each program computes a BLOCK_SIZE_M x BLOCK_SIZE_N tile for one expert. So BLOCK_SIZE_M
also sets the padding waste, which is why small batches want small BLOCK_SIZE_M.

A problem's inputs (weights, routing) and its float64 reference: kernels/fused_moe_inputs.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.fp8_gemm import (
    FP8,
    FP8_MAX,
    per_token_group_quant_fp8,
)
from kernels.fused_moe_spec import (  # noqa: F401 - the spec's facts, used here and imported from here
    PARTS,
    SPEC,
    bytes_moved,
    default_config,
    expected_experts_touched,
    expert_parallel,
    flops,
    local_pairs,
    m_tiles,
    max_padded_rows,
    measurement_note,
    pairs_per_token,
    routing_note,
    shared_memory,
)
from kernels.interpreter_fixes import cast_for_store, dot, interpreting
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params

QUANT_NONE, QUANT_PER_TENSOR, QUANT_BLOCK = 0, 1, 2


# ---------------------------------------------------------------------------
# Alignment: sort (token, k) pairs by expert, pad each expert's run to BLOCK_SIZE_M.
# ---------------------------------------------------------------------------


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int, rows: int | None = None,
                         invalid: str = "drop"):
    """Returns (sorted_ids, expert_ids, num_rows):
      sorted_ids [R] int32  flat (token * topk + k) indices grouped by expert, each group
                            padded to a multiple of block_m with the sentinel M * topk;
      expert_ids [R/block_m] int32  the expert of each block of block_m rows;
      num_rows   [1] int32  the padded length actually used (R is an upper bound).
    Shapes do not depend on the data, so this can be captured in a CUDA graph. `rows` sizes
    sorted_ids (at least the default bound; engines size it their own way, which sets how
    many programs a launch has).

    Negative ids are pairs routed to an expert this GPU does not hold (expert parallelism).
    invalid="drop": they take no row (vLLM's alignment with an expert map);
    invalid="bucket": they form a leading group of blocks whose expert id is -1 (SGLang's
    "+1" convention, whose kernel writes zeros for such blocks)."""
    flat = topk_ids.flatten().long()
    n = flat.numel()
    dev = flat.device
    if invalid == "bucket":
        # One more expert, number 0 for the invalid pairs; every id shifts up by one.
        ids, buckets = (flat + 1).clamp_(min=0), num_experts + 1
    elif invalid == "drop":
        # Invalid pairs go to a last bucket that takes no rows.
        ids, buckets = torch.where(flat < 0, num_experts, flat), num_experts + 1
    else:
        raise ValueError(f"invalid= takes 'drop' or 'bucket', not {invalid!r}")
    rows = max(rows or 0, max_padded_rows(n, buckets if invalid == "bucket" else num_experts, block_m))
    counts = torch.zeros(buckets, dtype=torch.long, device=dev).scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts + block_m - 1) // block_m * block_m
    if invalid == "drop":
        # a device fill: `padded[-1] = 0` would copy a host scalar into device memory, which
        # CUDA-graph capture refuses (tuner/measure/capture_rules.py)
        padded[-1].zero_()
    ends = torch.cumsum(padded, 0)
    order = torch.sort(ids, stable=True).indices
    experts_sorted = ids[order]
    rank = torch.arange(n, device=dev) - (torch.cumsum(counts, 0) - counts)[experts_sorted]
    pos = (ends - padded)[experts_sorted] + rank
    if invalid == "drop":
        pos = torch.where(experts_sorted == num_experts, rows, pos)     # a slot past the end
    sorted_ids = torch.full((rows + 1,), n, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    sorted_ids = sorted_ids[:rows]
    block_starts = torch.arange(0, rows, block_m, device=dev)
    last = num_experts if invalid == "bucket" else num_experts - 1
    expert_ids = torch.searchsorted(ends, block_starts, right=True).clamp_(max=last)
    if invalid == "bucket":
        expert_ids -= 1
    return sorted_ids, expert_ids.to(torch.int32), ends[-1:].to(torch.int32)


# ---------------------------------------------------------------------------
# The grouped GEMM: C[pair] = A[row of pair] @ B[expert]^T for every sorted pair.
# ---------------------------------------------------------------------------
@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_rows_ptr,
    N, K, EM, num_pairs,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_as_m, stride_as_k, stride_bs_e, stride_bs_n, stride_bs_k,
    group_n, group_k,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, TOP_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr, INTERPRET: tl.constexpr,
):
    # Tiles walked in groups of GROUP_SIZE_M row-blocks, as in the dense GEMM.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pids_per_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_SIZE_M
    rows_in_group = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % pids_per_group) % rows_in_group
    pid_n = (pid % pids_per_group) // rows_in_group

    # The grid covers the worst-case aligned length; blocks past the real one leave.
    if pid_m * BLOCK_SIZE_M >= tl.load(num_rows_ptr):
        return
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    valid = pairs < num_pairs                      # padding rows hold the sentinel
    a_rows = pairs // TOP_K                        # GEMM1 reads the token's row; GEMM2 (TOP_K=1) the pair's
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    if QUANT == 2:
        as_ptrs = a_scale_ptr + a_rows * stride_as_m
        bs_ptrs = b_scale_ptr + expert * stride_bs_e + (offs_n // group_n) * stride_bs_n

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=valid[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if QUANT == 2:
            # One scale group per K step (BLOCK_SIZE_K divides the group): scale in fp32.
            scale_k = (k * BLOCK_SIZE_K) // group_k
            a_s = tl.load(as_ptrs + scale_k * stride_as_k, mask=valid, other=0.0)
            b_s = tl.load(bs_ptrs + scale_k * stride_bs_k)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc += dot(a, b, INTERPRET)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if QUANT == 1:
        acc = acc * tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + pairs[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, cast_for_store(acc, c_ptr.dtype.element_ty, INTERPRET),
             mask=valid[:, None] & (offs_cn[None, :] < N))


def _quantize(x: torch.Tensor, quant: int, group_k: int):
    """Activation quantization before a GEMM: per (token, 1 x group) or per tensor."""
    if quant == QUANT_BLOCK:
        return per_token_group_quant_fp8(x, group_k)
    if quant == QUANT_PER_TENSOR:
        scale = (x.abs().amax().float() / FP8_MAX).clamp_(min=1e-10).reshape(1)
        return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale
    return x, None


def _grouped_gemm(a, a_scale, b, b_scale, out, align, topk_weights, top_k: int, mul_weight: bool,
                  quant: int, block_shape, config: Config, warmup: bool = False):
    sorted_ids, expert_ids, num_rows = align
    N, K = b.shape[1], b.shape[2]
    EM = sorted_ids.shape[0]
    gn, gk = block_shape if block_shape else (0, 0)
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    if quant == QUANT_BLOCK:
        as_strides = (a_scale.stride(0), a_scale.stride(1))
        bs_strides = (b_scale.stride(0), b_scale.stride(1), b_scale.stride(2))
    else:
        as_strides, bs_strides = (0, 0), (0, 0, 0)
    dummy = out   # pointer for scale/weight arguments the variant does not read
    args = (a, b, out, a_scale if a_scale is not None else dummy, b_scale if b_scale is not None else dummy,
            topk_weights if topk_weights is not None else dummy, sorted_ids, expert_ids, num_rows,
            N, K, EM, topk_weights.numel() if topk_weights is not None else a.shape[0] * top_k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
            *as_strides, *bs_strides, gn, gk)
    meta = dict(BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                TOP_K=top_k, MUL_ROUTED_WEIGHT=mul_weight, QUANT=quant, INTERPRET=interpreting(),
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        _moe_gemm_kernel.warmup(*args, grid=grid, **meta)
    else:
        _moe_gemm_kernel[grid](*args, **meta)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on [rows, 2N] -> [rows, N], in the input dtype (bf16 between GEMMs)."""
    n = x.shape[-1] // 2
    return F.silu(x[..., :n]) * x[..., n:]


def _quant_mode(use_fp8_w8a8: bool, block_shape) -> int:
    if not use_fp8_w8a8:
        return QUANT_NONE
    return QUANT_BLOCK if block_shape else QUANT_PER_TENSOR


def _check_config(config: Config, quant: int, block_shape) -> None:
    if quant == QUANT_BLOCK and block_shape[1] % config["BLOCK_SIZE_K"]:
        raise ValueError(f"BLOCK_SIZE_K={config['BLOCK_SIZE_K']} must divide the K group {block_shape[1]}")


def fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, *, use_fp8_w8a8=False, w1_scale=None,
              w2_scale=None, block_shape=None, config=None, down_config=None, out=None, nonlocal_pairs=False):
    """The MoE layer. `config` is one table entry (None: vLLM's default for this M);
    `down_config` optionally gives the second GEMM its own config (SGLang's `_down`
    table), which must share BLOCK_SIZE_M since both GEMMs use one alignment.
    `nonlocal_pairs`: topk_ids holds -1 for pairs routed to experts on other GPUs (expert
    parallelism); they take no part here and add nothing to the output."""
    M, K = hidden_states.shape
    E, two_n, _ = w1.shape
    top_k = topk_ids.shape[1]
    quant = _quant_mode(use_fp8_w8a8, block_shape)
    config = dict(config or default_config({"E": E, "N": two_n // 2, "K": K, "topk": top_k,
                                            "block_shape": block_shape}, M))
    down_config = dict(down_config or config)
    if down_config["BLOCK_SIZE_M"] != config["BLOCK_SIZE_M"]:
        raise ValueError("the up and down configs must use the same BLOCK_SIZE_M")
    _check_config(config, quant, block_shape)
    _check_config(down_config, quant, block_shape)
    if out is None:
        out = torch.empty((M, K), dtype=hidden_states.dtype, device=hidden_states.device)
    if M == 0:
        return out
    gk = block_shape[1] if block_shape else 0
    align = moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)
    # GEMM1: gate and up projections of every (token, expert) pair.
    a1, a1_scale = _quantize(hidden_states, quant, gk)
    h = torch.empty((M * top_k, two_n), dtype=hidden_states.dtype, device=hidden_states.device)
    _grouped_gemm(a1, a1_scale, w1, w1_scale, h, align, topk_weights, top_k, False, quant, block_shape, config)
    # Activation between the GEMMs stays in bf16, as in the engines.
    act = silu_and_mul(h)
    a2, a2_scale = _quantize(act, quant, gk)
    # GEMM2: down projection, scaled by each pair's routing weight.
    # Pairs of other GPUs' experts are never written: their rows must add nothing.
    y = (torch.zeros if nonlocal_pairs else torch.empty)((M * top_k, K), dtype=hidden_states.dtype,
                                                         device=hidden_states.device)
    _grouped_gemm(a2, a2_scale, w2, w2_scale, y, align, topk_weights, 1, True, quant, block_shape, down_config)
    return torch.sum(y.view(M, top_k, K), dim=1, out=out)


# ---------------------------------------------------------------------------
# The tuner's contract. A problem is {E, N, K, topk, dtype, block_shape, part, routing}:
# part "op" times the whole layer with one config (how vLLM applies its table); "up" and
# "down" time one projection each (SGLang's table and its `_down` table).
# ---------------------------------------------------------------------------


def run(inputs: dict, config: Config):
    p = inputs["params"]
    block_shape = p.get("block_shape")
    part = p.get("part", "op")
    if part in ("op", "pair"):
        up = {k: p["up_config"][k] for k in config} if part == "pair" else config
        return fused_moe(inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["local_ids"],
                         use_fp8_w8a8=p["dtype"] == "fp8_w8a8", w1_scale=inputs["w1_scale"],
                         w2_scale=inputs["w2_scale"], block_shape=block_shape, config=up, down_config=config,
                         out=inputs["out"], nonlocal_pairs=expert_parallel(p) > 1)
    quant = inputs["quant"]
    _check_config(config, quant, block_shape)
    gk = block_shape[1] if block_shape else 0
    if expert_parallel(p) > 1:
        inputs["out"].zero_()              # rows of other GPUs' pairs: never written below
    align = moe_align_block_size(inputs["local_ids"], config["BLOCK_SIZE_M"], p["E"])
    if part == "up":
        a, a_s = _quantize(inputs["x"], quant, gk)
        _grouped_gemm(a, a_s, inputs["w1"], inputs["w1_scale"], inputs["out"], align, inputs["topk_weights"],
                      inputs["topk_ids"].shape[1], False, quant, block_shape, config)
    else:
        a, a_s = _quantize(inputs["act"], quant, gk)
        _grouped_gemm(a, a_s, inputs["w2"], inputs["w2_scale"], inputs["out"], align, inputs["topk_weights"],
                      1, True, quant, block_shape, config)
    return inputs["out"]


def compile_only(params: Params, M: int, config: Config) -> None:
    """Compile the config's GEMM variants without launching them (memoryless tensors)."""
    E, N, K = params["E"], params["N"], params["K"]
    topk = pairs_per_token(params)
    block_shape = params.get("block_shape")
    quant = _quant_mode(params["dtype"] == "fp8_w8a8", block_shape)
    wdt = torch.bfloat16 if quant == QUANT_NONE else FP8
    dev = COMPILE_DEVICE
    rows = max_padded_rows(M * topk, E, config["BLOCK_SIZE_M"])
    align = (torch.empty(rows, dtype=torch.int32, device=dev),
             torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
             torch.empty(1, dtype=torch.int32, device=dev))
    weights = torch.empty((M, topk), dtype=torch.float32, device=dev)
    part = params.get("part", "op")
    gemms = []
    if part in ("op", "pair", "up"):
        gemms.append((M, K, 2 * N, topk, False))
    if part in ("op", "pair", "down"):
        gemms.append((M * topk, N, K, 1, True))
    for rows_a, k_in, n_out, top_k, mul in gemms:
        a = torch.empty((rows_a, k_in), dtype=wdt, device=dev)
        b = torch.empty((E, n_out, k_in), dtype=wdt, device=dev)
        c = torch.empty((M * topk, n_out), dtype=torch.bfloat16, device=dev)
        a_s = b_s = None
        if quant == QUANT_BLOCK:
            a_s = torch.empty((rows_a, triton.cdiv(k_in, block_shape[1])), dtype=torch.float32, device=dev)
            b_s = torch.empty((E, triton.cdiv(n_out, block_shape[0]), triton.cdiv(k_in, block_shape[1])),
                              dtype=torch.float32, device=dev)
        elif quant == QUANT_PER_TENSOR:
            a_s = torch.empty(1, dtype=torch.float32, device=dev)
            b_s = torch.empty(E, dtype=torch.float32, device=dev)
        _grouped_gemm(a, a_s, b, b_s, c, align, weights, top_k, mul, quant, block_shape, config, warmup=True)


KERNEL = SPEC      # one spec (kernels/fused_moe_spec.py): its code is this module's
