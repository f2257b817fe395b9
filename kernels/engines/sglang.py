"""SGLang's own Triton kernels (fused MoE, block-FP8 GEMM), launched as SGLang 0.5.23 launches them.

Mirrored from SGLang's wrappers (all in this file, checked against MIRRORED's hashes):
- fused MoE (`_prepare_fused_moe_run`, `_fused_moe_kernel_sequence`, `invoke_fused_moe_kernel`,
  `should_enable_swap_ab`, `moe_align_block_size`, `get_default_config`):
  * two tables: the up GEMM's and the `_down` GEMM's, sharing BLOCK_SIZE_M (one alignment);
  * `USE_TMA` (optional key, default false): in the `_down` table the down GEMM loads A and
    B through TMA descriptors, reading the activation in expert-sorted, block-padded order
    (the up GEMM then stores its output in that order, and the activation is quantized
    over the sorted rows); in the up table the up GEMM loads B through a TMA descriptor;
  * swap-AB: fp8_w8a8 configs with BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 on sm_90;
  * even-K: the K mask is dropped when BLOCK_SIZE_K divides K;
  * the sorted length: numel * BLOCK_SIZE_M when numel < E + 1, else
    numel + (E + 1) * (BLOCK_SIZE_M - 1), rounded up to a multiple of 4; the grid covers it;
  * programmatic dependent launch (USE_GDC, launch_pdl) on compute capability 9.0 and newer.
  What we time per table: the up table, its activation quantization and GEMM; the `_down`
  table, its activation quantization (over sorted rows with USE_TMA) and GEMM. The alignment
  and, with USE_TMA, the sorted copy of the activation that the up GEMM would have written
  are made before timing (the up GEMM is timed storing in token order). What is ours, not
  SGLang's (same math, other code): the activation quantization and the alignment sort.
- block-FP8 GEMM (`w8a8_block_fp8_matmul_triton`): on sm_90, a config with `SWAP_AB` true or
  `SPLIT_K` > 1 runs the Hopper kernel (swapped operands; K split over SPLIT_K programs with
  fp32 partials and a reduction kernel), any other the plain one.
"""

from __future__ import annotations

import triton
import triton.language as tl

import kernels
from kernels.engines.base import engine_spec, gemm_phantoms, jit_functions, on_cuda_device, phantom, target_capability
from kernels.fused_moe import (
    QUANT_BLOCK,
    QUANT_NONE,
    _quant_mode,
    _quantize,
    moe_align_block_size,
    pairs_per_token,
    silu_and_mul,
)
from tuner.kernel_api import COMPILE_DEVICE, MATMUL_CONFIG_KEYS, Config, KernelSpec, Params

ENGINE = "sglang"
WRITTEN_FOR = "0.5.23"
MOE_FILE = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
GEMM_FILE = "sglang/kernels/ops/gemm/fp8_kernel.py"
RUNNER = "sglang/srt/layers/moe/moe_runner/triton_utils"
KERNEL_FUNCTIONS = {
    "fused_moe": {MOE_FILE: ["fused_moe_kernel"]},
    "fp8_gemm": {GEMM_FILE: ["_w8a8_block_fp8_matmul", "_w8a8_block_fp8_matmul_hopper",
                             "_reduce_block_fp8_split_k"]},
}
MIRRORED = {
    "fused_moe": {
        f"{MOE_FILE}:invoke_fused_moe_kernel": "f68ce34e7a465e1c",
        f"{MOE_FILE}:should_enable_swap_ab": "fd7a63e1007b9d4d",
        f"{RUNNER}/fused_moe.py:_prepare_fused_moe_run": "d49eb4b8975a0dfd",
        f"{RUNNER}/fused_moe.py:_fused_moe_kernel_sequence": "1033ffaa70a23e3c",
        f"{RUNNER}/moe_align_block_size.py:moe_align_block_size": "6f09229ee755071a",
        f"{RUNNER}/fused_moe_triton_config.py:get_default_config": "e57a4a24e1a9c63a",
        f"{RUNNER}/fused_moe_triton_config.py:try_get_optimal_moe_config": "e1ab1aa5876dd06b",
    },
    "fp8_gemm": {
        f"{GEMM_FILE}:w8a8_block_fp8_matmul_triton": "cfee408d7549735e",
        f"{GEMM_FILE}:get_w8a8_block_fp8_configs": "a4b4f552d119b1b2",
    },
}
FILES = sorted({rel for fns in KERNEL_FUNCTIONS.values() for rel in fns}
               | {key.rsplit(":", 1)[0] for m in MIRRORED.values() for key in m})
MOE_KEYS = MATMUL_CONFIG_KEYS + ("USE_TMA",)
GEMM_KEYS = MATMUL_CONFIG_KEYS + ("SWAP_AB", "SPLIT_K")


# -- fused MoE -----------------------------------------------------------------------------
def swap_ab(config: Config) -> bool:
    """should_enable_swap_ab (fp8_w8a8 only)."""
    return target_capability() == (9, 0) and config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64


def use_pdl() -> bool:
    """is_arch_support_pdl: programmatic dependent launch on sm_90 and newer (a CUDA
    launch option; the interpreter has no such thing)."""
    return on_cuda_device() and target_capability()[0] >= 9


def sorted_rows(numel: int, E: int, block_m: int) -> int:
    """moe_align_block_size's buffer length (E + 1 buckets, int4 stores)."""
    rows = numel * block_m if numel < E + 1 else numel + (E + 1) * (block_m - 1)
    return (rows + 3) // 4 * 4


def tma_rows(numel: int, E: int, block_m: int) -> int:
    """Rows of the sorted, padded intermediate the down GEMM reads with USE_TMA."""
    return numel + min(numel, E + 1) * (block_m - 1)


def moe_default_config(params: Params, M: int) -> Config:
    """get_default_config (CUDA): what SGLang runs with no table. Its bf16 branch names no
    warps or stages: Triton's defaults (4 warps, 3 stages) apply."""
    block = params.get("block_shape")
    if params["dtype"] == "fp8_w8a8" and block:
        cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block[0], "BLOCK_SIZE_K": block[1], "GROUP_SIZE_M": 32,
               "num_warps": 4, "num_stages": 3}
    elif params["dtype"] == "fp8_w8a8":
        cfg = ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 4} if M <= params["E"] else
               {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                "num_warps": 8, "num_stages": 4})
    elif M <= params["E"]:
        cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
               "num_warps": 4, "num_stages": 3}
    else:
        cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
               "num_warps": 4, "num_stages": 3}
    return {**cfg, "USE_TMA": 0}


_ALLOCATOR_SET = False


def _tma_allocator() -> None:
    """TMA descriptors want a global scratch allocator, as SGLang sets one."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET or not on_cuda_device():
        return
    import torch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    _ALLOCATOR_SET = True


def _invoke(code, A, B, C, A_scale, B_scale, topk_weights, numel: int, sorted_ids, expert_ids,
            num_post_padded, mul_routed_weight: bool, top_k: int, config: Config, quant: int, block_shape,
            a_use_tma: bool = False, b_use_tma: bool = False, c_sorted: bool = False, warmup: bool = False):
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
                FUSE_ADD_TO_OUTPUT=False, A_OUTPUT_SLICES=1, A_OUTPUT_SLICE_WIDTH=0, A_OUTPUT_SLICE_K=0,
                MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False, ROUTER_TOPK=1, FUSE_SWIGLU=False, **pdl,
                BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=config["BLOCK_SIZE_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
                num_warps=config["num_warps"], num_stages=config["num_stages"])
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _alignment(inputs: dict, block_m: int):
    """The expert alignment for this BLOCK_SIZE_M, made once per input set (untimed)."""
    cache = inputs.setdefault("_sglang_align", {})
    if block_m not in cache:
        ids = inputs["topk_ids"]
        E = inputs["w1"].shape[0]
        cache[block_m] = moe_align_block_size(ids, block_m, E, rows=sorted_rows(ids.numel(), E, block_m))
    return cache[block_m]


def _sorted_activation(inputs: dict, block_m: int):
    """With USE_TMA the down GEMM reads the activation in sorted, block-padded rows, as the
    up GEMM wrote it (c_sorted): built from the token-order activation, once, untimed."""
    cache = inputs.setdefault("_sglang_sorted_act", {})
    if block_m not in cache:
        import torch
        act = inputs["act"]
        sorted_ids, _, _ = _alignment(inputs, block_m)
        numel = inputs["topk_ids"].numel()
        rows = tma_rows(numel, inputs["w1"].shape[0], block_m)
        out = torch.zeros((rows, act.shape[1]), dtype=act.dtype, device=act.device)
        pos = sorted_ids[:rows].long()
        valid = pos < numel
        out[torch.nonzero(valid).flatten()] = act[pos[valid]]
        cache[block_m] = out
    return cache[block_m]


def _up(code, inputs: dict, config: Config, out, c_sorted: bool = False) -> None:
    p = inputs["params"]
    ids = inputs["topk_ids"]
    _invoke(code, inputs["x"], inputs["w1"], out, None, inputs["w1_scale"], inputs["topk_weights"], ids.numel(),
            *_alignment(inputs, config["BLOCK_SIZE_M"]), False, ids.shape[1], config, inputs["quant"],
            p.get("block_shape"), b_use_tma=bool(config["USE_TMA"]), c_sorted=c_sorted)


def _down(code, inputs: dict, config: Config, act, out) -> None:
    """The down GEMM; `act` token-ordered, or (USE_TMA) sorted rows as the up GEMM left them."""
    p = inputs["params"]
    block_shape = p.get("block_shape")
    ids = inputs["topk_ids"]
    quant = inputs["quant"]
    tma = bool(config["USE_TMA"])
    a_scale = None
    if tma:
        # the quantization over sorted rows that SGLang runs before a TMA down GEMM
        act, a_scale = _quantize(act, quant, block_shape[1])
    _invoke(code, act, inputs["w2"], out, a_scale, inputs["w2_scale"], inputs["topk_weights"], ids.numel(),
            *_alignment(inputs, config["BLOCK_SIZE_M"]), True, 1, config, quant, block_shape,
            a_use_tma=tma, b_use_tma=tma)


def moe_run(code):
    """One table's GEMM (part up or down), or for part "op" the whole layer with one config
    for both tables, as _fused_moe_kernel_sequence runs it."""
    def run(inputs: dict, config: Config):
        import torch
        part = inputs["params"].get("part", "op")
        if part == "up":
            _up(code, inputs, config, inputs["out"])
        elif part == "down":
            act = _sorted_activation(inputs, config["BLOCK_SIZE_M"]) if config["USE_TMA"] else inputs["act"]
            _down(code, inputs, config, act, inputs["out"])
        else:
            x, ids = inputs["x"], inputs["topk_ids"]
            M, K = x.shape
            E, two_n, _ = inputs["w1"].shape
            numel = ids.numel()
            tma = bool(config["USE_TMA"])
            rows = numel + (min(numel, E + 1) * (config["BLOCK_SIZE_M"] - 1) if tma else 0)
            cache1 = torch.zeros((rows, two_n), dtype=x.dtype, device=x.device)
            _up(code, inputs, config, cache1, c_sorted=tma)
            act = silu_and_mul(cache1)
            cache3 = torch.empty((M, ids.shape[1], K), dtype=x.dtype, device=x.device)
            _down(code, inputs, config, act, cache3)
            torch.sum(cache3, dim=1, out=inputs["out"])
        return inputs["out"]
    return run


def moe_compile_only(code):
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
        rows = sorted_rows(numel, E, config["BLOCK_SIZE_M"])
        assign = (torch.empty(rows, dtype=torch.int32, device=dev),
                  torch.empty(triton.cdiv(rows, config["BLOCK_SIZE_M"]), dtype=torch.int32, device=dev),
                  torch.empty(1, dtype=torch.int32, device=dev))
        weights = torch.empty((M, top_k), dtype=torch.float32, device=dev)
        tma = bool(config["USE_TMA"])
        part = params.get("part", "op")
        gemms = []
        if part in ("op", "up"):
            gemms.append((M, K, 2 * N, top_k, False, False))
        if part in ("op", "down"):
            gemms.append((tma_rows(numel, E, config["BLOCK_SIZE_M"]) if tma else numel, N, K, 1, True, tma))
        for rows_a, k_in, n_out, tk, mul, a_tma in gemms:
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
            _invoke(code, a, b, c, a_s, b_s, weights, numel, *assign, mul, tk, config, quant, block_shape,
                    a_use_tma=a_tma, b_use_tma=tma, warmup=True)
    return compile_only


def moe_note(params: Params) -> str:
    part = params.get("part", "op")
    what = {"up": "the up GEMM (w1: gate and up) and its activation quantization, storing in token order",
            "down": "the down GEMM (w2) and its activation quantization (over the sorted rows with USE_TMA), "
                    "BLOCK_SIZE_M fixed to the up table's at each M",
            "op": "the whole layer with one config for both GEMMs"}[part]
    shared = params.get("shared_experts", 0)
    return (f"SGLang's fused_moe_kernel as its Triton runner launches it (swap-AB on sm_90, USE_TMA from the "
            f"table): {what}; the alignment (and, with USE_TMA, the sorted activation) made before timing; "
            f"{params.get('routing', 'uniform')} top-{params['topk']} routing"
            + (f" plus {shared} fused shared expert(s) every token goes to" if shared else ""))


# -- block-FP8 GEMM ------------------------------------------------------------------------
def gemm_default_config(params: Params, M: int) -> Config:
    bn, bk = params["block_shape"]
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 32,
            "num_warps": 4, "num_stages": 3, "SWAP_AB": 0, "SPLIT_K": 1}


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


# -- the specs -------------------------------------------------------------------------------
def kernel_spec(name: str, code) -> KernelSpec:
    from tuner.errors import TunerError
    if name == "fused_moe":
        return engine_spec(
            kernels.get_kernel("fused_moe"), code, ENGINE, KERNEL_FUNCTIONS[name], MIRRORED[name], __file__,
            WRITTEN_FOR, config_keys=MOE_KEYS, optional_keys={"USE_TMA": 0}, bool_keys=("USE_TMA",),
            run=moe_run(code), compile_only=moe_compile_only(code), default_config=moe_default_config,
            extra_seeds=lambda params, M: [], measurement_note=moe_note,
            description="SGLang's fused MoE (up and _down tables; USE_TMA, swap-AB on sm_90)")
    if name == "fp8_gemm":
        return engine_spec(
            kernels.get_kernel("fp8_gemm"), code, ENGINE, KERNEL_FUNCTIONS[name], MIRRORED[name], __file__,
            WRITTEN_FOR, config_keys=GEMM_KEYS, optional_keys={"SWAP_AB": 0, "SPLIT_K": 1},
            bool_keys=("SWAP_AB",), run=gemm_run(code), compile_only=gemm_compile_only(code),
            default_config=gemm_default_config, extra_seeds=lambda params, M: [],
            description="SGLang's block-scaled FP8 GEMM (SWAP_AB and SPLIT_K on sm_90)")
    raise TunerError(f"SGLang reads no {name} table: its {name} launch is fixed (tune our kernel with "
                     "--kernel-source ours)")
