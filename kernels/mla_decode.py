"""Multi-head latent attention (MLA) decode, DeepSeek's absorbed form, over a paged KV cache.

  q          [B, H, 576] bf16   per head: 512 latent dims + 64 rope dims
  kv_cache   [pages, page_size, 576] bf16   one shared KV head; its first 512 dims are the value
  block_table[B, max_pages] int32   the pages of each request, in order (pages may be scattered)
  seq_lens   [B] int32 (>= 1)
  returns    [B, H, 512] bf16

Two stages, as in the engines' Triton backends. Stage 1 splits each request's KV range into
`num_kv_splits` parts and runs them as separate programs (so a small batch still fills the
GPU), each keeping a running max and sum over BLOCK_N tokens at a time for BLOCK_H heads.
Stage 2 merges the parts by their log-sum-exp. Both engines launch this with a fixed
BLOCK_N 32, BLOCK_H 16, 4 warps, 2 stages and a heuristic split count; here they are tuned
per (batch, context) and looked up at run time from a table (nearest bucket).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.interpreter_fixes import cast_for_store, dot, interpreting
from kernels.mla_decode_spec import (  # noqa: F401 - the spec's facts, used here and imported from here
    CONFIG_KEYS,
    LATENT,
    ROPE,
    SPEC,
    TABLE_FORMAT,
    bytes_moved,
    default_config,
    emit_table,
    engine_hints,
    find_table,
    flops,
    lookup,
    read_table,
    sglang_default,
    shared_memory,
    table_filename,
)
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params


@triton.jit
def _mla_split_kernel(
    q_ptr, kv_ptr, block_table_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, H, page_size,
    stride_qb, stride_qh, stride_kv_page, stride_kv_slot, stride_bt,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    D_LATENT: tl.constexpr, D_ROPE: tl.constexpr, INTERPRET: tl.constexpr,
):
    # Program (request b, head block, split s) attends BLOCK_H heads over its share of the
    # request's tokens, BLOCK_N tokens per step, with an online softmax in base 2.
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    s = tl.program_id(2)
    head_ok = heads < H
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(seq_len, NUM_SPLITS)
    start = s * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_d = tl.arange(0, D_LATENT)
    offs_r = tl.arange(0, D_ROPE)
    q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_d[None, :], mask=head_ok[:, None], other=0.0)
    q_pe = tl.load(q_rows + D_LATENT + offs_r[None, :], mask=head_ok[:, None], other=0.0)

    m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D_LATENT), dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        # token t lives in slot t % page_size of the request's (t // page_size)-th page
        page = tl.load(block_table_ptr + b * stride_bt + t // page_size, mask=t_ok, other=0)
        rows = kv_ptr + page.to(tl.int64) * stride_kv_page + (t % page_size) * stride_kv_slot
        k_nope = tl.load(rows[:, None] + offs_d[None, :], mask=t_ok[:, None], other=0.0)
        k_pe = tl.load(rows[:, None] + D_LATENT + offs_r[None, :], mask=t_ok[:, None], other=0.0)
        qk = dot(q_nope, tl.trans(k_nope), INTERPRET) + dot(q_pe, tl.trans(k_pe), INTERPRET)
        qk = tl.where(t_ok[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        # the value is the latent part of the same cached rows
        acc = acc * alpha[:, None] + dot(p.to(k_nope.dtype), k_nope, INTERPRET)
        m = m_new

    nonempty = denom > 0.0
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, denom, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m + tl.log2(tl.where(nonempty, denom, 1.0)), float("-inf"))
    o_ptrs = part_out_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :]
    tl.store(o_ptrs, out, mask=head_ok[:, None])
    tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + s, lse, mask=head_ok)


@triton.jit
def _mla_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_yb, stride_yh,
    NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, D_LATENT: tl.constexpr, INTERPRET: tl.constexpr,
):
    # One program per (request, head): weight each split's output by 2^(lse_s - max lse).
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, D_LATENT)
    lse_ptr = part_lse_ptr + b * stride_lb + h * stride_lh
    offs_s = tl.arange(0, SPLITS_POW2)
    lse = tl.load(lse_ptr + offs_s, mask=offs_s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    total = tl.sum(tl.exp2(lse - m), 0)             # empty splits: 2^-inf = 0
    acc = tl.zeros((D_LATENT,), dtype=tl.float32)
    for s in range(NUM_SPLITS):
        w = tl.exp2(tl.load(lse_ptr + s) - m)
        acc += w * tl.load(part_out_ptr + b * stride_ob + h * stride_oh + s * stride_os + offs_d)
    y = acc / total
    tl.store(out_ptr + b * stride_yb + h * stride_yh + offs_d, cast_for_store(y, out_ptr.dtype.element_ty, INTERPRET))


def _launch(q, kv_cache, block_table, seq_lens, sm_scale, config: Config, out, warmup=False):
    B, H, _ = q.shape
    S = config["num_kv_splits"]
    part_out = torch.empty((B, H, S, LATENT), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    grid1 = (B, triton.cdiv(H, config["BLOCK_H"]), S)
    args1 = (q, kv_cache, block_table, seq_lens, part_out, part_lse, sm_scale * math.log2(math.e), H,
             kv_cache.shape[1], q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
             block_table.stride(0), part_out.stride(0), part_out.stride(1), part_out.stride(2),
             part_lse.stride(0), part_lse.stride(1))
    meta1 = dict(NUM_SPLITS=S, BLOCK_N=config["BLOCK_N"], BLOCK_H=config["BLOCK_H"], D_LATENT=LATENT,
                 D_ROPE=ROPE, INTERPRET=interpreting(), num_warps=config["num_warps"],
                 num_stages=config["num_stages"])
    args2 = (part_out, part_lse, out, part_out.stride(0), part_out.stride(1), part_out.stride(2),
             part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1))
    meta2 = dict(NUM_SPLITS=S, SPLITS_POW2=triton.next_power_of_2(S), D_LATENT=LATENT, INTERPRET=interpreting(),
                 num_warps=config["merge_warps"])
    if warmup:
        _mla_split_kernel.warmup(*args1, grid=grid1, **meta1)
        _mla_merge_kernel.warmup(*args2, grid=(B, H), **meta2)
        return out
    _mla_split_kernel[grid1](*args1, **meta1)
    _mla_merge_kernel[(B, H)](*args2, **meta2)
    return out


def mla_decode(q, kv_cache, block_table, seq_lens, sm_scale, config=None, out=None, max_seq_len=None):
    """Decode attention for one new token per request. `config` None: the tuned table for
    this GPU (see find_table), at the nearest (batch, context) bucket, else the engines' launch."""
    B, H, D = q.shape
    assert D == LATENT + ROPE and kv_cache.shape[-1] == LATENT + ROPE, "q and kv rows must be 576 wide"
    assert block_table.shape[0] == B and seq_lens.shape[0] == B
    if config is None:
        ctx = int(max_seq_len if max_seq_len is not None else seq_lens.max().item())
        dev_name = torch.cuda.get_device_name(q.device) if q.device.type == "cuda" else None
        table = find_table(H, kv_cache.shape[1], dev_name)
        config = lookup(table, B, ctx) if table else default_config({"context": ctx}, B)
    if out is None:
        out = torch.empty((B, H, LATENT), dtype=q.dtype, device=q.device)
    if B:
        _launch(q, kv_cache, block_table, seq_lens, sm_scale, config, out)
    return out


# ---------------------------------------------------------------------------
# The tuned table: {"format", "heads", ..., "configs": {context: {batch: config}}}
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# The tuner's contract. Problem: {heads, kv_lora_rank, qk_rope_dim, page_size, context};
# M is the batch. Request lengths vary around the context bucket (0.75x to 1.25x).
# ---------------------------------------------------------------------------
_kv_cache: dict = {}


def request_lengths(context: int, B: int, gen, device) -> torch.Tensor:
    lo, hi = max(1, int(context * 0.75)), max(1, int(context * 1.25))
    return torch.randint(lo, hi + 1, (B,), generator=gen, device=device, dtype=torch.int32)


def make_inputs(params: Params, M: int, device: str = "cuda", seed: int = 0) -> dict:
    H, page, ctx = params["heads"], params["page_size"], params["context"]
    gen = torch.Generator(device=device).manual_seed(seed)
    lens = params.get("seq_lens")
    lens = (torch.tensor(lens, dtype=torch.int32, device=device) if lens is not None
            else request_lengths(ctx, M, gen, device))
    max_pages = triton.cdiv(int(lens.max()), page)
    pages_needed = M * max_pages
    # The cache (the large part) is shared by every input set of a (problem, batch).
    key = (H, page, ctx, M, device)
    if key not in _kv_cache:
        _kv_cache.clear()
        cap = M * triton.cdiv(max(int(ctx * 1.25), 1), page) + 8
        cache_gen = torch.Generator(device=device).manual_seed(4321)
        _kv_cache[key] = torch.randn((max(cap, pages_needed + 8), page, LATENT + ROPE), generator=cache_gen,
                                     device=device).to(torch.bfloat16)
    kv = _kv_cache[key]
    if kv.shape[0] < pages_needed:
        kv = torch.randn((pages_needed + 8, page, LATENT + ROPE), generator=gen, device=device).to(torch.bfloat16)
    # scattered pages: a random permutation of the cache's pages, split among the requests
    perm = torch.randperm(kv.shape[0], generator=gen, device=device)[:pages_needed].to(torch.int32)
    block_table = perm.view(M, max_pages).contiguous()
    q = torch.randn((M, H, LATENT + ROPE), generator=gen, device=device).to(torch.bfloat16)
    out = torch.empty((M, H, LATENT), dtype=torch.bfloat16, device=device)
    return {"q": q, "kv_cache": kv, "block_table": block_table, "seq_lens": lens,
            "sm_scale": 1.0 / math.sqrt(128 + ROPE), "out": out}


def run(inputs: dict, config: Config):
    return mla_decode(inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"],
                      inputs["sm_scale"], config=config, out=inputs["out"])


def reference(inputs: dict) -> torch.Tensor:
    """Softmax attention per request in float64 over its gathered cache rows."""
    q, kv, bt, lens = inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"]
    page = kv.shape[1]
    out = torch.empty((q.shape[0], q.shape[1], LATENT), dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        n = int(lens[b])
        t = torch.arange(n, device=q.device)
        rows = kv[bt[b, t // page].long(), t % page].double()        # [n, 576]
        scores = (q[b].double() @ rows.T) * inputs["sm_scale"]       # [H, n]
        out[b] = torch.softmax(scores, dim=-1) @ rows[:, :LATENT]
    return out


def compile_only(params: Params, M: int, config: Config) -> None:
    H, page = params["heads"], params["page_size"]
    dev = COMPILE_DEVICE
    pages = triton.cdiv(int(params["context"] * 1.25) + 1, page)
    q = torch.empty((M, H, LATENT + ROPE), dtype=torch.bfloat16, device=dev)
    kv = torch.empty((M * pages + 8, page, LATENT + ROPE), dtype=torch.bfloat16, device=dev)
    bt = torch.empty((M, pages), dtype=torch.int32, device=dev)
    lens = torch.empty((M,), dtype=torch.int32, device=dev)
    out = torch.empty((M, H, LATENT), dtype=torch.bfloat16, device=dev)
    _launch(q, kv, bt, lens, 1.0, config, out, warmup=True)


KERNEL = SPEC      # one spec (kernels/mla_decode_spec.py): its code is this module's
