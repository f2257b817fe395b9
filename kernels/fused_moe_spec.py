"""The fused MoE layer's spec without its code: problem and config keys, vLLM's default
launch, the cost model (expected experts touched, FLOPs, bytes, shared memory), the programs
along M and how a timing was taken, all a plan reads; the Triton code (kernels/fused_moe.py) and
the inputs and reference (kernels/fused_moe_inputs.py) are imported only when something runs them
(tuner.plan.kernel_api from_code)."""

from __future__ import annotations

from tuner.plan.kernel_api import MATMUL_CONFIG_KEYS, Config, KernelSpec, Launch, Params, from_code

CODE = "kernels.fused_moe"
INPUTS = "kernels.fused_moe_inputs"


# the whole layer (vLLM's table), one projection (SGLang's two tables), or the whole layer with
# the up table's config (params["up_config"]) and the _down table's (SGLang's two, timed together)
PARTS = ("op", "up", "down", "pair")


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the aligned length: each expert adds at most block_m - 1 padding
    rows, and no more than one block per pair."""
    return min(num_pairs + num_experts * (block_m - 1), num_pairs * block_m)


def default_config(params: Params, M: int) -> Config:
    """vLLM 0.33's launch without a table. Block FP8: as in ../shared/ENGINES.md. Other
    precisions: vLLM's small/large-batch split (an approximation of its heuristic)."""
    if params.get("block_shape"):
        return {"BLOCK_SIZE_M": 16 if M <= 64 else 64, "BLOCK_SIZE_N": 64 if M <= 8 else 128,
                "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1 if M <= 16 else 32,
                "num_warps": 4, "num_stages": 4 if M <= 4 else 3}
    if M <= params.get("E", 8):
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 3}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
            "num_warps": 4, "num_stages": 3}


def pairs_per_token(params: Params) -> int:
    """Experts each token runs through: its top-k plus any fused shared experts."""
    return params["topk"] + params.get("shared_experts", 0)


def expert_parallel(params: Params) -> int:
    """How many GPUs the experts are spread over (1: tensor parallelism only)."""
    return int(params.get("ep", 1))


def m_tiles(params: Params, M: int, config: Config) -> int:
    """Programs along M of both grouped GEMMs: the aligned rows (one sort serves both) over
    BLOCK_SIZE_M."""
    rows = max_padded_rows(M * pairs_per_token(params), params["E"], config["BLOCK_SIZE_M"])
    return -(-rows // config["BLOCK_SIZE_M"])


def expected_experts_touched(params: Params, M: int) -> float:
    """Expected number of distinct experts M tokens route to (uniform routing; a Zipf
    skew touches fewer, so this stays an upper bound on the weight bytes read)."""
    shared = params.get("shared_experts", 0)
    routed = params["E"] - shared
    drawn_from = routed * expert_parallel(params)          # every GPU's experts under EP
    return routed * (1.0 - (1.0 - params["topk"] / drawn_from) ** M) + shared


def local_pairs(params: Params, M: int) -> float:
    """Expected (token, expert) pairs this GPU runs: all of them, or under expert
    parallelism the ~1/ep of the routed ones whose expert it holds."""
    return M * (params["topk"] / expert_parallel(params) + params.get("shared_experts", 0))


def flops(params: Params, M: int) -> float:
    per_pair = {"op": 3, "pair": 3, "up": 2, "down": 1}[params.get("part", "op")] * params["N"] * params["K"]
    return 2.0 * local_pairs(params, M) * per_pair


def element_bytes(params: Params) -> tuple[int, float]:
    """(bytes of an activation element, of a weight element) the GEMMs load: 8-bit W8A8,
    16-bit activations for bf16 and the weight-only precisions, half a byte an INT4 weight."""
    dtype = params["dtype"]
    act = 1 if dtype in ("fp8_w8a8", "int8_w8a8") else 2
    return act, {"bf16": 2, "int4_w4a16": 0.5}.get(dtype, 1)


def bytes_moved(params: Params, M: int) -> float:
    part = params.get("part", "op")
    wbytes = element_bytes(params)[1]
    mats = {"op": 3, "pair": 3, "up": 2, "down": 1}[part]
    weights = expected_experts_touched(params, M) * mats * params["N"] * params["K"] * wbytes
    pairs = local_pairs(params, M)
    io = {"op": 2 * M * params["K"] * 2, "pair": 2 * M * params["K"] * 2,
          "up": M * params["K"] * 2 + pairs * 2 * params["N"] * 2,
          "down": pairs * (params["N"] + params["K"]) * 2}[part]
    return weights + io


def shared_memory(params: Params, config: Config) -> int:
    act, weight = element_bytes(params)
    return int(config["num_stages"] * (config["BLOCK_SIZE_M"] * act + config["BLOCK_SIZE_N"] * weight)
               * config["BLOCK_SIZE_K"])


def _grouped_gemm(params: Params, M: int, config: Config, n_out: int, k_in: int) -> Launch:
    """One grouped GEMM for the cost model: each touched expert's rows in BLOCK_SIZE_M blocks
    (the padding of its last block computed too), times the N tiles; every block streams its
    expert's weights over K."""
    act, weight = element_bytes(params)
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    touched = max(expected_experts_touched(params, M), 1.0)
    per_expert = local_pairs(params, M) / touched
    blocks = max(1, round(touched * -(-per_expert // bm)))
    rows = int(min(bm, max(1, round(per_expert))))
    block = params.get("block_shape") or (bn, bk)
    scales = 4 * (rows + -(-bn // block[0])) if params.get("block_shape") else 0
    weights = touched * n_out * k_in * weight
    return Launch(blocks * -(-n_out // bn), -(-k_in // bk), bm, bn, bk, int((rows * act + bn * weight) * bk) + scales,
                  config["num_stages"], config["num_warps"], shared_memory(params, config),
                  weights + local_pairs(params, M) * (n_out + k_in) * 2, 2.0 * local_pairs(params, M) * n_out * k_in)


def work(params: Params, M: int, config: Config) -> list[Launch]:
    """The grouped GEMMs a config runs (up: gate and up, 2N x K; down: K x N); a whole layer
    timed with two tables (part "pair") runs its up GEMM with the up table's config."""
    part = params.get("part", "op")
    N, K = params["N"], params["K"]
    up_cfg = {**config, **params["up_config"]} if part == "pair" and params.get("up_config") else config
    up = [_grouped_gemm(params, M, up_cfg, 2 * N, K)] if part in ("op", "pair", "up") else []
    down = [_grouped_gemm(params, M, config, K, N)] if part in ("op", "pair", "down") else []
    return up + down


def routing_note(params: Params) -> str:
    """How tokens were routed for timing, in words."""
    ep = expert_parallel(params)
    text = f"{params.get('routing', 'uniform')} top-{params['topk']} routing"
    if ep > 1:
        text += (f" over all {params['E'] * ep} experts of {ep} GPUs, of which this GPU holds {params['E']} and "
                 f"runs only those pairs (~1/{ep})")
    return text


def measurement_note(params: Params) -> str:
    return {
        "op": "the whole MoE layer (alignment, activation quantization, both grouped GEMMs, "
              "activation, top-k sum) timed with one config, as vLLM applies its table",
        "up": "the first grouped GEMM (w1: gate and up) with its alignment and activation quantization",
        "down": "the second grouped GEMM (w2) with its alignment and activation quantization, "
                "BLOCK_SIZE_M shared with the up table's at each M",
        "pair": "the whole MoE layer with the up table's config for the first GEMM and the _down table's for "
                "the second",
    }[params.get("part", "op")] + f"; {routing_note(params)}" + (
        f" plus {params['shared_experts']} fused shared expert(s) every token goes to"
        if params.get("shared_experts") else "")


def refuses(params: Params) -> str | None:
    """Our kernel's precisions: bf16 and FP8 (block, per tensor)."""
    if params.get("dtype") in ("bf16", "fp8_w8a8"):
        return None
    return (f"our fused MoE runs bf16 and fp8_w8a8 only, not {params.get('dtype')}: time the engines' own kernels "
            "(--kernel-source engine)")


SPEC = KernelSpec(
    name="fused_moe",
    table_kind="fused_moe",
    problem_keys=("E", "N", "K", "topk", "shared_experts", "ep", "dtype", "block_shape", "group_size", "zero_point",
                  "part", "routing", "up_config"),
    config_keys=MATMUL_CONFIG_KEYS,
    make_inputs=from_code(INPUTS, "make_inputs"),
    run=from_code(CODE, "run"),
    reference=from_code(INPUTS, "reference"),
    # Same FP8 inputs on both sides; fp32-vs-fp64 sums can flip a bf16 rounding of the
    # intermediate, which the second quantization can turn into one FP8 step.
    tolerance=2e-2,
    flops=flops,
    bytes_moved=bytes_moved,
    default_config=default_config,
    shared_memory=shared_memory,
    work=work,
    compile_only=from_code(CODE, "compile_only"),
    m_tiles=m_tiles,
    layers_per_pass=from_code("tuner.plan.layers", "moe_table_layers"),
    measurement_note=measurement_note,
    refuses=refuses,
    description="fused MoE (sorted tokens, grouped GEMMs)",
)
