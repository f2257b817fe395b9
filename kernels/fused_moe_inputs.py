"""A fused-MoE problem's inputs and its float64 reference (kernels/fused_moe.py's contract):
random expert weights made once per problem, the routing (uniform, Zipf-skewed, or a recorded
one, with SGLang's fused shared expert), the ids this GPU's experts see under expert
parallelism, and the reference computed expert by expert in float64, rounding and
re-quantizing where the kernel does.
"""

from __future__ import annotations

import math

import torch

from kernels.fp8_gemm import (
    FP8,
    FP8_MAX,
    block_quant_weight,
    per_token_group_quant_fp8_reference,
)
from kernels.fused_moe import QUANT_BLOCK, QUANT_PER_TENSOR, _quant_mode, _quantize, silu_and_mul
from kernels.fused_moe_spec import (
    expert_parallel,
    pairs_per_token,
)
from kernels.moe_quant import MoeQuant, dequantize_weight, fake_quant_activation, quantize_weight
from tuner.plan.kernel_api import ROUTING_PREFIX, Params, recorded_routing_ids

_weight_cache: dict = {}


def _weights(params: Params, device: str):
    """Random expert weights for a problem, made once and shared by every input set and M
    (they are the large part: about 2 GB for DeepSeek-V3 at TP8); integer precisions laid
    out as the engines' checkpoint loaders hold them (kernels/moe_quant.py)."""
    mq = MoeQuant.of(params)
    key = (params["E"], params["N"], params["K"], mq, device)
    if key in _weight_cache:
        return _weight_cache[key]
    _weight_cache.clear()
    E, N, K = params["E"], params["N"], params["K"]
    gen = torch.Generator(device=device).manual_seed(1234)
    w1s, w2s, s1s, s2s = [], [], [], []
    z1s: list = []
    z2s: list = []
    for e0 in range(0, E, 8):                 # a few experts at a time bounds the fp32 temporaries
        n_e = min(8, E - e0)
        w1 = torch.randn((n_e, 2 * N, K), generator=gen, device=device) / math.sqrt(K)
        w2 = torch.randn((n_e, K, N), generator=gen, device=device) / math.sqrt(N)
        if mq.int8:
            for w, ws, ss, zs in ((w1, w1s, s1s, z1s), (w2, w2s, s2s, z2s)):
                held = quantize_weight(w, mq)
                ws.append(held["w"])
                ss.append(held["scale"])
                if held["zp"] is not None:
                    zs.append(held["zp"])
        elif params["dtype"] == "bf16":
            w1s.append(w1.to(torch.bfloat16))
            w2s.append(w2.to(torch.bfloat16))
        elif params.get("block_shape"):
            for w, ws, ss in ((w1, w1s, s1s), (w2, w2s, s2s)):
                q = [block_quant_weight(w[i], params["block_shape"]) for i in range(n_e)]
                ws.append(torch.stack([x[0] for x in q]))
                ss.append(torch.stack([x[1] for x in q]))
        else:
            for w, ws, ss in ((w1, w1s, s1s), (w2, w2s, s2s)):
                scale = w.abs().amax(dim=(1, 2)) / FP8_MAX
                ws.append((w / scale[:, None, None]).to(FP8))
                ss.append(scale.float())
    out = {"w1": torch.cat(w1s), "w2": torch.cat(w2s),
           "w1_scale": torch.cat(s1s) if s1s else None, "w2_scale": torch.cat(s2s) if s2s else None,
           "w1_zp": torch.cat(z1s) if z1s else None, "w2_zp": torch.cat(z2s) if z2s else None}
    _weight_cache[key] = out
    return out


def route(M: int, E: int, topk: int, routing: str, gen: torch.Generator, device: str, shared: int = 0):
    """Top-k experts per token: uniformly random like the engines' tuners, or Zipf-skewed
    (expert popularity ~ 1/rank^1.2 over a random ranking), since real routing is uneven.
    `shared` fused shared experts (SGLang folds DeepSeek's shared expert into the MoE as
    the last expert) are drawn by no router: every token also goes to each of them, so the
    launch is top-(k + shared) with those experts always full."""
    routed = E - shared
    if routing.startswith(ROUTING_PREFIX):
        ids = _recorded(routing, M, topk, routed, gen).to(device)
        scores = None
    elif routing == "uniform":
        scores = torch.rand((M, routed), generator=gen, device=device)
    elif routing == "zipf":
        rank = torch.randperm(routed, generator=gen, device=device).float() + 1.0
        probs = (rank ** -1.2).expand(M, routed)
        # Gumbel top-k draws k distinct experts with these probabilities.
        scores = probs.log() - torch.log(-torch.log(torch.rand((M, routed), generator=gen, device=device)))
    else:
        raise ValueError(f"unknown routing {routing!r}")
    if scores is not None:
        ids = scores.topk(topk, dim=1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn((M, topk), generator=gen, device=device), dim=1)
    if shared:
        always = torch.arange(routed, E, dtype=torch.int32, device=device).expand(M, shared)
        ids = torch.cat([ids, always], dim=1)
        weights = torch.cat([weights, torch.ones((M, shared), device=device)], dim=1)
    return weights.float(), ids


def _recorded(routing: str, M: int, topk: int, experts: int, gen: torch.Generator) -> torch.Tensor:
    """M tokens of a recorded routing (tuner/plan/routing.py): one layer and M consecutive
    tokens (a batch as it was served; wrapping round a short recording), drawn from `gen`."""
    table = recorded_routing_ids(routing)                 # int32 [layers, tokens, topk]
    layers, tokens, width = table.shape
    if width != topk or int(table.max()) >= experts:
        raise ValueError(f"the recorded routing {routing} is top-{width} over {int(table.max()) + 1}+ experts, "
                         f"not top-{topk} over {experts}")
    pick = torch.randint(0, layers * tokens, (1,), generator=gen, device=gen.device).item()
    layer, start = divmod(int(pick), tokens)
    rows = (torch.arange(M) + start) % tokens
    return torch.from_numpy(table[layer]).index_select(0, rows).to(torch.int32)


def local_ids(params: Params, topk_ids: torch.Tensor) -> torch.Tensor:
    """The ids as this GPU's experts see them: under expert parallelism this GPU (rank 0)
    holds global experts 0 .. E-1, and a pair routed elsewhere becomes -1 (SGLang's
    dispatcher maps them so; vLLM's expert map does the same)."""
    if expert_parallel(params) == 1:
        return topk_ids
    return torch.where(topk_ids < params["E"], topk_ids, -1).to(torch.int32)


def make_inputs(params: Params, M: int, device: str = "cuda", seed: int = 0) -> dict:
    E, N, K = params["E"], params["N"], params["K"]
    topk = pairs_per_token(params)
    part = params.get("part", "op")
    ep = expert_parallel(params)
    if ep > 1 and params.get("shared_experts"):
        raise ValueError("a fused shared expert under expert parallelism: no engine runs that on NVIDIA GPUs")
    gen = torch.Generator(device=device).manual_seed(seed)
    # Under expert parallelism the router picks among every GPU's experts (E * ep): one GPU
    # sees every token with its global top-k ids and runs only the pairs it holds (~1/ep).
    weights, ids = route(M, E * ep, params["topk"], params.get("routing", "uniform"), gen, device,
                         params.get("shared_experts", 0))
    inputs = {**_weights(params, device), "topk_weights": weights, "topk_ids": ids, "params": params,
              "local_ids": local_ids(params, ids),
              "quant": _quant_mode(params["dtype"] == "fp8_w8a8", params.get("block_shape"))}
    x = torch.randn((M, K), generator=gen, device=device).to(torch.bfloat16)
    if part == "down":
        # the down projection's input: a plausible activation per (token, expert) pair
        inputs["act"] = (torch.randn((M * topk, N), generator=gen, device=device) * 0.3).to(torch.bfloat16)
        shape = (M * topk, K)
    else:
        inputs["x"] = x
        shape = (M, K) if part in ("op", "pair") else (M * topk, 2 * N)
    inputs["out"] = torch.empty(shape, dtype=torch.bfloat16, device=device)
    return inputs


def _dequant_weight(w, scale, block_shape):
    if scale is None:
        return w.double()
    if block_shape:
        bn, bk = block_shape
        return w.double() * scale.double().repeat_interleave(bn, 0)[: w.shape[0]] \
            .repeat_interleave(bk, 1)[:, : w.shape[1]]
    return w.double() * scale.double()


def _fake_quant(x: torch.Tensor, quant: int, gk: int) -> torch.Tensor:
    """What the kernel's activation quantization keeps of x, as float64."""
    if quant == QUANT_BLOCK:
        q, s = per_token_group_quant_fp8_reference(x, gk)
        return q.double() * s.double().repeat_interleave(gk, 1)
    if quant == QUANT_PER_TENSOR:
        q, s = _quantize(x, quant, gk)
        return q.double() * s.double()
    return x.double()


def reference(inputs: dict) -> torch.Tensor:
    """Float64 expert by expert, rounding to bf16 and re-quantizing exactly where the kernel
    does (GEMM outputs, the activation), so the remaining error is accumulation order."""
    p = inputs["params"]
    part = p.get("part", "op")
    quant, block_shape = inputs["quant"], p.get("block_shape")
    gk = block_shape[1] if block_shape else 0
    ids, wts = inputs["local_ids"].long(), inputs["topk_weights"].double()
    M, topk = ids.shape
    K, N = p["K"], p["N"]
    dev = ids.device
    experts = []
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue                     # another GPU's expert: this GPU adds nothing for it
        tok, kk = torch.nonzero(ids == e, as_tuple=True)
        experts.append((e, tok, kk, tok * topk + kk))

    mq = MoeQuant.of(p)

    def weight(name, e):
        scale = inputs[name + "_scale"]
        if mq.int8:
            zp = inputs.get(name + "_zp")
            return dequantize_weight(inputs[name][e], None if scale is None else scale[e],
                                     None if zp is None else zp[e], mq)
        return _dequant_weight(inputs[name][e], None if scale is None else scale[e], block_shape)

    def activation(x):
        return fake_quant_activation(x, mq) if mq.int8 else _fake_quant(x, quant, gk)

    if part == "down":
        act = inputs["act"]
    else:
        x_q = activation(inputs["x"])
        h = torch.zeros((M * topk, 2 * N), dtype=torch.float64, device=dev)
        for e, tok, kk, pair in experts:
            h[pair] = x_q[tok] @ weight("w1", e).T
        if part == "up":
            return h
        act = silu_and_mul(h.to(torch.bfloat16))
    act_q = activation(act)                      # per-tensor scales span all pairs
    y = torch.zeros((M * topk, K), dtype=torch.float64, device=dev)
    for e, tok, kk, pair in experts:
        y[pair] = (act_q[pair] @ weight("w2", e).T) * wts[tok, kk][:, None]
    if part == "down":
        return y
    return y.to(torch.bfloat16).double().view(M, topk, K).sum(dim=1)
