"""The block-scaled FP8 GEMM's spec without its code: config keys, the engines' default
launch, the cost model (FLOPs, bytes, shared memory) and the seeds, all a plan reads; the Triton
code (kernels/fp8_gemm.py) is imported only when something runs it (tuner.plan.kernel_api
from_code), so that a plan loads neither Triton nor torch."""

from __future__ import annotations

from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS, Config, KernelSpec, Launch, Params, from_code

CODE = "kernels.fp8_gemm"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_config(params: Params, M: int) -> Config:
    """vLLM 0.33's launch when it finds no table for a shape (block [bn, bk])."""
    bn, bk = params.get("block_shape", (128, 128))
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
            "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2}


def flops(params: Params, M: int) -> float:
    return 2.0 * M * params["N"] * params["K"]


def bytes_moved(params: Params, M: int) -> float:
    N, K = params["N"], params["K"]
    bn, bk = params["block_shape"]
    scales = 4 * (M * _cdiv(K, bk) + _cdiv(N, bn) * _cdiv(K, bk))
    return M * K + N * K + 2 * M * N + scales


def shared_memory(params: Params, config: Config) -> int:
    # Each pipeline stage buffers one FP8 tile of A and one of B.
    return config["num_stages"] * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * config["BLOCK_SIZE_K"]


def work(params: Params, M: int, config: Config) -> list[Launch]:
    """The launches of a config for the cost model: one program per (M tile, N tile, K split),
    each loading an A and a B tile and their scales per K step; with SPLIT_K > 1 (SGLang's Hopper
    kernel) fp32 partials, reduced by a second launch; SWAP_AB puts the N tile on the MMA's rows."""
    N, K = params["N"], params["K"]
    bn_s, bk_s = params["block_shape"]
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    split = max(1, int(config.get("SPLIT_K", 1)))
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    rows = min(bm, M)                          # masked rows past M load nothing
    step_bytes = (rows + bn) * bk + 4 * (rows + _cdiv(bn, bn_s)) * _cdiv(bk, bk_s)
    mma_m, mma_n = (bn, bm) if config.get("SWAP_AB") else (bm, bn)
    partials = 4 * split * M * N if split > 1 else 0
    main = Launch(tiles * split, _cdiv(_cdiv(K, bk), split), mma_m, mma_n, bk, step_bytes, config["num_stages"],
                  config["num_warps"], shared_memory(params, config), bytes_moved(params, M) + partials,
                  flops(params, M))
    if split == 1:
        return [main]
    reduce = Launch(tiles, split, rows, bn, 1, 4 * rows * bn, 2, 4, 0, partials + 2 * M * N, float(M * N * split))
    return [main, reduce]


def sglang_default(params: Params, M: int) -> list[Config]:
    return [default_config(params, M) | {"num_stages": 3}]


SPEC = KernelSpec(
    name="fp8_gemm",
    table_kind="fp8_gemm",
    problem_keys=("N", "K", "block_shape"),
    config_keys=MATMUL_CONFIG_KEYS,
    make_inputs=from_code(CODE, "make_inputs"),
    run=from_code(CODE, "run"),
    reference=from_code(CODE, "reference"),
    # Both sides compute from the same FP8 values; what differs is the order of fp32
    # sums and the final bf16 rounding (about 2^-9 per element).
    tolerance=1e-2,
    flops=flops,
    bytes_moved=bytes_moved,
    default_config=default_config,
    shared_memory=shared_memory,
    work=work,
    extra_seeds=sglang_default,
    layers_per_pass=from_code("tuner.plan.layers", "gemm_table_layers"),
    compile_only=from_code(CODE, "compile_only"),
    description="block-scaled FP8 GEMM (w8a8, 1x128 activation groups, 128x128 weight blocks)",
)
