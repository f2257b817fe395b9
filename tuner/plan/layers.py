"""Layer counts: how often one forward pass of a model runs a problem's kernel (the weight a
table's time has in a forward pass)."""

from __future__ import annotations

from tuner.errors import TunerError
from tuner.plan.models import Model, gemm_problems


def moe_layers(model: Model) -> int:
    """Decoder layers with routed experts (DeepSeek-V3: 61 - 3 dense = 58)."""
    if not model.is_moe:
        return 0
    return max(0, model.num_hidden_layers - model.first_k_dense_replace)


def dense_mlp_layers(model: Model) -> int:
    """Decoder layers with a dense MLP: the first_k_dense_replace of an MoE model, every
    layer of a dense one."""
    if not model.has_dense_mlp:
        return 0
    return model.first_k_dense_replace if model.is_moe else model.num_hidden_layers


def layers_per_pass(model: Model, layer_names) -> int:
    """How many times one forward pass runs a problem's kernel: the problem's layer names
    (as moe_problems, mla_problems and sharded_linears name them) times the decoder layers
    holding each: experts and shared experts in every MoE layer, the dense MLP in the dense
    layers, attention projections in every layer."""
    total = 0
    for name in layer_names:
        if name.startswith(("experts", "shared_experts.")):
            total += moe_layers(model)
        elif name.startswith("mlp."):
            total += dense_mlp_layers(model)
        else:
            total += model.num_hidden_layers
    return total


def moe_table_layers(model: Model, params: dict, tp: int | None = None) -> int:
    """Layers per pass that run a fused-MoE table: every MoE layer (a table's name holds no
    hidden size, so any expert shape of the model is taken as its)."""
    return moe_layers(model)


def gemm_table_layers(model: Model, params: dict, tp: int | None = None) -> int | None:
    """Layers per pass that run a GEMM table's (N, K), from the table's problem alone (drift
    reads tables by file name, without --tp): the linears of the first TP size at which the
    model runs that shape; None when it runs none. `tp`: the TP the tables are for, where known."""
    for size in (tp,) if tp else (1, 2, 4, 8, 16, 32, 64):
        try:
            problems = gemm_problems(model, size)
        except TunerError:
            continue
        for p in problems:
            if p.params["N"] == params.get("N") and p.params["K"] == params.get("K"):
                return layers_per_pass(model, p.layers)
    return None
