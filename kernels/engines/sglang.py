"""SGLang's own Triton kernels (fused MoE, block-FP8 GEMM), launched as the SGLang releases
of configs/engines/sglang.yaml launch them (RELEASES, read from that data: each version's wrapper
hashes, kernel signatures and launch differences, or why a kernel is not launched there; any
other code is refused when it is loaded).

Mirrored from SGLang's wrappers (all in this file, checked against RELEASES' hashes):
- fused MoE (`_prepare_fused_moe_run`, `_fused_moe_kernel_sequence`, `invoke_fused_moe_kernel`,
  `should_enable_swap_ab`, `moe_align_block_size`, `get_default_config`):
  * two tables: the up GEMM's and the `_down` GEMM's, sharing BLOCK_SIZE_M (one alignment);
  * `USE_TMA` (optional key, default false): in the `_down` table the down GEMM loads A and
    B through TMA descriptors, reading the activation in expert-sorted, block-padded order
    (the up GEMM then stores its output in that order); in the up table the up GEMM loads B
    through a TMA descriptor;
  * the activation quantization before a TMA down GEMM: 0.5.22 and 0.5.23 quantize only the
    sorted rows the down GEMM reads (block FP8, N not one 128-wide group); 0.5.21 quantizes
    every row of the sorted buffer;
  * swap-AB: fp8_w8a8 configs with BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 on sm_90;
  * even-K: the K mask is dropped when BLOCK_SIZE_K divides K;
  * the sorted length: numel * BLOCK_SIZE_M when numel < E + 1, else
    numel + (E + 1) * (BLOCK_SIZE_M - 1), rounded up to a multiple of 4 (0.5.22, 0.5.23; not
    rounded in 0.5.21); the grid covers it;
  * expert parallelism: the dispatcher maps the router's global ids to this GPU's experts,
    -1 for the others' ("+1" alignment: those pairs form a leading group of blocks with
    expert -1, for which the kernel writes zeros); 0.5.21 and 0.5.22 pass the kernel
    `filter_expert` (true under expert parallelism) and `LORA_PRESERVE_BASE`, 0.5.23 neither
    (it skips expert -1 always) but `A_OUTPUT_SLICES`, `A_OUTPUT_SLICE_WIDTH`, `A_OUTPUT_SLICE_K`;
  * the down GEMM is launched with ROUTER_TOPK = the pairs per token (top-k, plus the fused
    shared expert); the up GEMM with 1;
  * programmatic dependent launch (USE_GDC, launch_pdl) on compute capability 9.0 and newer.
  What we time per table: the up table, its activation quantization and GEMM; the `_down`
  table, its activation quantization (with USE_TMA over the sorted rows, as the version
  does) and GEMM. The alignment and, with USE_TMA, the sorted copy of the activation that
  the up GEMM would have written are made before timing (the up GEMM is timed storing in
  token order). What is ours, not SGLang's (same math, other code): the activation
  quantization, the alignment sort, the dispatcher's id mapping and silu-and-mul.
- block-FP8 GEMM (`w8a8_block_fp8_matmul_triton`): on sm_90, a config with `SWAP_AB` true or
  `SPLIT_K` > 1 runs the Hopper kernel (swapped operands; K split over SPLIT_K programs with
  fp32 partials and a reduction kernel), any other the plain one. Alike in all three versions.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.engines.base import (
    gemm_phantoms,
    jit_functions,
    on_cuda_device,
    phantom,
    target_capability,
)
from kernels.engines.sglang_spec import (  # noqa: F401 - the launcher's facts, imported from here too
    ENGINE,
    GEMM_FILE,
    GEMM_KEYS,
    KERNEL_FUNCTIONS,
    MOE_FILE,
    MOE_KEYS,
    RUNNER,
    __getattr__,  # RELEASES, SUPPORTED, FILES: read from the data when asked, as the spec does
    gemm_default_config,
    kernel_spec,
    moe_default_config,
    moe_note,
    releases,
)
from kernels.fp8_gemm import per_token_group_quant_fp8
from kernels.fused_moe import (
    QUANT_BLOCK,
    QUANT_NONE,
    _quant_mode,
    _quantize,
    expert_parallel,
    moe_align_block_size,
    pairs_per_token,
    silu_and_mul,
)
from tuner.plan.kernel_api import COMPILE_DEVICE, Config, Params


# -- fused MoE -----------------------------------------------------------------------------
def swap_ab(config: Config) -> bool:
    """should_enable_swap_ab (fp8_w8a8 only)."""
    return target_capability() == (9, 0) and config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64


def use_pdl() -> bool:
    """is_arch_support_pdl: programmatic dependent launch on sm_90 and newer (a CUDA
    launch option; the interpreter has no such thing)."""
    return on_cuda_device() and target_capability()[0] >= 9


def sorted_rows(numel: int, E: int, block_m: int, launch: dict | None = None) -> int:
    """moe_align_block_size's buffer length (E + 1 buckets; a multiple of 4 where the
    version pads it for int4 stores; `launch`: the release's, by default the newest's)."""
    launch = launch if launch is not None else releases("fused_moe")[-1].launch
    rows = numel * block_m if numel < E + 1 else numel + (E + 1) * (block_m - 1)
    step = launch["sorted_rows_multiple"]
    return (rows + step - 1) // step * step


def tma_rows(numel: int, E: int, block_m: int) -> int:
    """Rows of the sorted, padded intermediate the down GEMM reads with USE_TMA."""
    return numel + min(numel, E + 1) * (block_m - 1)


_ALLOCATOR_SET = False


def _tma_allocator() -> None:
    """TMA descriptors want a global scratch allocator, as SGLang sets one."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET or not on_cuda_device():
        return
    import torch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    _ALLOCATOR_SET = True


def _invoke(code, launch: dict, A, B, C, A_scale, B_scale, topk_weights, numel: int, sorted_ids, expert_ids,
            num_post_padded, mul_routed_weight: bool, top_k: int, config: Config, quant: int, block_shape,
            a_use_tma: bool = False, b_use_tma: bool = False, c_sorted: bool = False,
            filter_expert: bool = False, router_topk: int = 1, warmup: bool = False):
    """invoke_fused_moe_kernel for fp8_w8a8 (block or per-tensor) and bf16. A is quantized
    here when it is not FP8 yet, as SGLang does."""
    (kernel,) = jit_functions(code, MOE_FILE, ["fused_moe_kernel"])
    import torch
    use_fp8 = quant != QUANT_NONE
    if use_fp8 and A.dtype != torch.float8_e4m3fn:
        A, A_scale = _quantize(A, quant, block_shape[1] if block_shape else 0)
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)
    a_desc = b_desc = None
    if a_use_tma or b_use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        _tma_allocator()
        if a_use_tma:
            a_desc = TensorDescriptor(A, A.shape, A.stride(), [config["BLOCK_SIZE_M"], config["BLOCK_SIZE_K"]])
        if b_use_tma:
            b_desc = TensorDescriptor(B, B.shape, B.stride(), [1, config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]])
    K = B.shape[2]
    grid = (triton.cdiv(sorted_ids.shape[0], config["BLOCK_SIZE_M"]) * triton.cdiv(B.shape[1], config["BLOCK_SIZE_N"]),)
    pdl = {"USE_GDC": True, "launch_pdl": True, "GDC_EARLY": A.shape[0] <= 512} if use_pdl() else {}
    if launch["kernel_flags"] == "filter_expert":          # 0.5.21, 0.5.22
        flags = {"filter_expert": filter_expert, "LORA_PRESERVE_BASE": False}
    else:                                                  # 0.5.23
        flags = {"A_OUTPUT_SLICES": 1, "A_OUTPUT_SLICE_WIDTH": 0, "A_OUTPUT_SLICE_K": 0}
    args = (A, a_desc, B, b_desc, None, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids,
            num_post_padded, None, B.shape[1], K, sorted_ids.shape[0], numel,
            A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), 0, 0, C.stride(-2), C.stride(-1),
            A_scale.stride(0) if A_scale is not None and A_scale.ndim == 2 else 0,
            A_scale.stride(1) if A_scale is not None and A_scale.ndim == 2 else 0,
            B_scale.stride(0) if B_scale is not None and B_scale.ndim >= 2 else 0,
            B_scale.stride(2) if B_scale is not None and B_scale.ndim == 3 else 0,
            B_scale.stride(1) if B_scale is not None and B_scale.ndim >= 2 else 0,
            0 if block_shape is None else block_shape[0], 0 if block_shape is None else block_shape[1])
    meta = dict(MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.bfloat16,
                use_fp8_w8a8=use_fp8, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
                even_Ks=K % config["BLOCK_SIZE_K"] == 0, c_sorted=c_sorted, swap_ab=use_fp8 and swap_ab(config),
                FUSE_ADD_TO_OUTPUT=False, MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False, ROUTER_TOPK=router_topk,
                FUSE_SWIGLU=False, **flags, **pdl,
                BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _alignment(inputs: dict, block_m: int, launch: dict):
    """The expert alignment for this BLOCK_SIZE_M, made once per input set (untimed): the
    "+1" convention, pairs of other GPUs' experts (-1) in a leading group of blocks."""
    cache = inputs.setdefault("_sglang_align", {})
    if block_m not in cache:
        ids = inputs["local_ids"]
        E = inputs["w1"].shape[0]
        cache[block_m] = moe_align_block_size(ids, block_m, E, rows=sorted_rows(ids.numel(), E, block_m, launch),
                                              invalid="bucket")
    return cache[block_m]


def _sorted_activation(inputs: dict, block_m: int, launch: dict):
    """With USE_TMA the down GEMM reads the activation in sorted, block-padded rows, as the
    up GEMM wrote it (c_sorted): built from the token-order activation, once, untimed."""
    cache = inputs.setdefault("_sglang_sorted_act", {})
    if block_m not in cache:
        import torch
        act = inputs["act"]
        sorted_ids, _, _ = _alignment(inputs, block_m, launch)
        numel = inputs["topk_ids"].numel()
        rows = tma_rows(numel, inputs["w1"].shape[0], block_m)
        out = torch.zeros((rows, act.shape[1]), dtype=act.dtype, device=act.device)
        pos = sorted_ids[:rows].long()
        valid = pos < numel
        out[torch.nonzero(valid).flatten()] = act[pos[valid]]
        cache[block_m] = out
    return cache[block_m]


def _up(code, launch: dict, inputs: dict, config: Config, out, c_sorted: bool = False) -> None:
    p = inputs["params"]
    ids = inputs["topk_ids"]
    _invoke(code, launch, inputs["x"], inputs["w1"], out, None, inputs["w1_scale"], inputs["topk_weights"],
            ids.numel(), *_alignment(inputs, config["BLOCK_SIZE_M"], launch), False, ids.shape[1], config,
            inputs["quant"], p.get("block_shape"), b_use_tma=bool(config["USE_TMA"]), c_sorted=c_sorted,
            filter_expert=expert_parallel(p) > 1)


def _down(code, launch: dict, inputs: dict, config: Config, act, out) -> None:
    """The down GEMM; `act` token-ordered, or (USE_TMA) sorted rows as the up GEMM left them."""
    p = inputs["params"]
    block_shape = p.get("block_shape")
    ids = inputs["topk_ids"]
    quant = inputs["quant"]
    tma = bool(config["USE_TMA"])
    align = _alignment(inputs, config["BLOCK_SIZE_M"], launch)
    a_scale = None
    if tma and launch["quantize_rows_read"] and quant == QUANT_BLOCK and act.shape[-1] != block_shape[1]:
        # the quantization SGLang runs before a TMA down GEMM, over the sorted rows it reads
        act, a_scale = per_token_group_quant_fp8(act, block_shape[1], sorted_token_ids=align[0],
                                                 num_tokens_post_padded=align[2], num_valid_tokens=ids.numel())
    _invoke(code, launch, act, inputs["w2"], out, a_scale, inputs["w2_scale"], inputs["topk_weights"], ids.numel(),
            *align, True, 1, config, quant, block_shape, a_use_tma=tma, b_use_tma=tma,
            filter_expert=expert_parallel(p) > 1, router_topk=ids.shape[1])


def moe_layer(code, launch: dict, inputs: dict, up_config: Config, down_config: Config):
    """The whole layer as _fused_moe_kernel_sequence runs it with the up table's and the
    `_down` table's entries: the up GEMM (storing in sorted order when the down entry has
    USE_TMA), silu-and-mul, the down GEMM, the top-k sum into inputs["out"]."""
    import torch
    x, ids = inputs["x"], inputs["topk_ids"]
    M, K = x.shape
    E, two_n, _ = inputs["w1"].shape
    numel = ids.numel()
    tma = bool(down_config["USE_TMA"])
    rows = numel + (min(numel, E + 1) * (up_config["BLOCK_SIZE_M"] - 1) if tma else 0)
    cache1 = torch.empty((rows, two_n), dtype=x.dtype, device=x.device)
    _up(code, launch, inputs, up_config, cache1, c_sorted=tma)
    act = silu_and_mul(cache1)
    cache3 = torch.empty((M, ids.shape[1], K), dtype=x.dtype, device=x.device)
    _down(code, launch, inputs, down_config, act, cache3)
    return torch.sum(cache3, dim=1, out=inputs["out"])


def moe_run(code, launch: dict):
    """One table's GEMM (part up or down), or for part "op" the whole layer with one config
    for both tables."""
    def run(inputs: dict, config: Config):
        part = inputs["params"].get("part", "op")
        if part == "up":
            _up(code, launch, inputs, config, inputs["out"])
        elif part == "down":
            tma = config["USE_TMA"]
            act = _sorted_activation(inputs, config["BLOCK_SIZE_M"], launch) if tma else inputs["act"]
            _down(code, launch, inputs, config, act, inputs["out"])
        elif part == "pair":               # the up table's entry with this _down entry
            up = {k: int(inputs["params"]["up_config"].get(k, 0)) for k in MOE_KEYS}
            moe_layer(code, launch, inputs, up, config)
        else:
            moe_layer(code, launch, inputs, config, config)
        return inputs["out"]
    return run


def moe_compile_only(code, launch: dict):
    """Compile the table's GEMM launch without running it (weights are phantoms)."""
    def compile_only(params: Params, M: int, config: Config) -> None:
        import torch
        dev = COMPILE_DEVICE
        E, N, K = params["E"], params["N"], params["K"]
        top_k = pairs_per_token(params)
        numel = M * top_k
        block_shape = params.get("block_shape")
        quant = _quant_mode(params["dtype"] == "fp8_w8a8", block_shape)
        wdt = torch.bfloat16 if quant == QUANT_NONE else torch.float8_e4m3fn
        rows = sorted_rows(numel, E, config["BLOCK_SIZE_M"], launch)
        assign = (torch.empty(rows, dtype=torch.int32, device=dev),
                  torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
                  torch.empty(1, dtype=torch.int32, device=dev))
        weights = torch.empty((M, top_k), dtype=torch.float32, device=dev)
        tma = bool(config["USE_TMA"])
        part = params.get("part", "op")
        up = {k: int(params["up_config"].get(k, 0)) for k in MOE_KEYS} if part == "pair" else config
        ep = expert_parallel(params) > 1
        gemms = []
        if part in ("op", "pair", "up"):        # the up GEMM stores sorted before a TMA down GEMM
            gemms.append((up, M, K, 2 * N, top_k, False, False, 1, part != "up" and tma))
        if part in ("op", "pair", "down"):
            gemms.append((config, tma_rows(numel, E, config["BLOCK_SIZE_M"]) if tma else numel, N, K, 1, True, tma,
                          top_k, False))
        for cfg, rows_a, k_in, n_out, tk, mul, a_tma, router_topk, c_sorted in gemms:
            a = torch.empty((rows_a, k_in), dtype=wdt, device=dev)
            b = phantom((E, n_out, k_in), wdt)
            c = torch.empty((numel, n_out), dtype=torch.bfloat16, device=dev)
            a_s = b_s = None
            if quant == QUANT_BLOCK:
                a_s = torch.empty((rows_a, triton.cdiv(k_in, block_shape[1])), dtype=torch.float32, device=dev)
                b_s = torch.empty((E, triton.cdiv(n_out, block_shape[0]), triton.cdiv(k_in, block_shape[1])),
                                  dtype=torch.float32, device=dev)
            elif quant != QUANT_NONE:
                a_s = torch.empty(1, dtype=torch.float32, device=dev)
                b_s = torch.empty(E, dtype=torch.float32, device=dev)
            _invoke(code, launch, a, b, c, a_s, b_s, weights, numel, *assign, mul, tk, cfg, quant, block_shape,
                    a_use_tma=a_tma, b_use_tma=bool(cfg["USE_TMA"]), c_sorted=c_sorted, filter_expert=ep,
                    router_topk=router_topk, warmup=True)
    return compile_only


# -- block-FP8 GEMM ------------------------------------------------------------------------
def hopper_kernel(config: Config) -> bool:
    """Which kernel runs a config: the Hopper one on sm_90 when SWAP_AB or SPLIT_K > 1."""
    return target_capability() == (9, 0) and (bool(config["SWAP_AB"]) or config["SPLIT_K"] > 1)


def _gemm_launch(code, A, B, As, Bs, C, block_size, config: Config, warmup: bool = False) -> None:
    import torch
    plain, hopper, reduce = jit_functions(code, GEMM_FILE, KERNEL_FUNCTIONS["fp8_gemm"][GEMM_FILE])
    block_n, block_k = block_size
    M, K = A.shape
    N = B.shape[0]
    use_hopper = hopper_kernel(config)
    split_k = config["SPLIT_K"] if use_hopper else 1
    partials = torch.empty((split_k, M, N), device=A.device, dtype=torch.float32) if split_k > 1 else C
    blocks = triton.cdiv(M, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"])
    grid = (blocks, split_k) if use_hopper else (blocks,)
    meta = dict(BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                num_warps=config["num_warps"], num_stages=config["num_stages"],
                needs_masking=bool(K % config["BLOCK_SIZE_K"] != 0))
    if use_hopper:
        meta.update(SWAP_AB=bool(config["SWAP_AB"]), SPLIT_K=split_k)
    args = (A, B, partials, As, Bs, M, N, K, block_n, block_k,
            A.stride(-2), A.stride(-1), B.stride(1), B.stride(0), C.stride(-2), C.stride(-1),
            As.stride(-2), As.stride(-1), Bs.stride(1), Bs.stride(0))
    kernel = hopper if use_hopper else plain
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
        if split_k > 1:
            reduce.warmup(partials, C, M * N, split_k, 256, grid=(triton.cdiv(M * N, 256),))
        return
    kernel[grid](*args, **meta)
    if split_k > 1:
        reduce[(triton.cdiv(M * N, 256),)](partials, C, M * N, split_k, 256)


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
