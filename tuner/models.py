"""Models: load a model description and turn it, with TP/EP, into kernel problems.

A model is a Hugging Face config.json or one of our YAML files (same field names),
named on the command line by a name in configs/models/ or by a path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.errors import TunerError
from tuner.paths import MODELS_DIR
from tuner.problems import Problem


@dataclass
class Model:
    name: str
    source: str                       # the file it was read from
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None          # dense MLP
    moe_intermediate_size: int | None = None
    n_routed_experts: int | None = None
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    num_experts_per_tok: int | None = None
    num_hidden_layers: int = 0
    first_k_dense_replace: int = 0
    # multi-head latent attention (DeepSeek); None for ordinary attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    max_position_embeddings: int | None = None
    weight_block_size: tuple[int, int] | None = None   # block-FP8 checkpoints
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return bool(self.n_routed_experts)

    @property
    def has_dense_mlp(self) -> bool:
        # MoE models with first_k_dense_replace > 0 keep dense layers first.
        return bool(self.intermediate_size) and (not self.is_moe or self.first_k_dense_replace > 0)

    @property
    def shared_intermediate(self) -> int:
        if self.shared_expert_intermediate_size:
            return self.shared_expert_intermediate_size
        if self.n_shared_experts and self.moe_intermediate_size:
            return self.n_shared_experts * self.moe_intermediate_size
        return 0


def _read_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise TunerError(f"cannot read model file {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise TunerError(f"model file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise TunerError(f"model file {path} does not hold a mapping of config fields")
    return data


def known_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def load_model(name_or_path: str) -> Model:
    """Read a model by name (configs/models/NAME.yaml) or by path (.json/.yaml)."""
    path = Path(name_or_path)
    if not path.is_file():
        candidate = MODELS_DIR / f"{name_or_path}.yaml"
        if candidate.is_file():
            path = candidate
        elif path.suffix in (".json", ".yaml", ".yml") or "/" in name_or_path:
            raise TunerError(f"model file {name_or_path} not found")
        else:
            raise TunerError(f"unknown model {name_or_path!r}; known: {', '.join(known_models())}, "
                             "or give a path to a config.json")
    raw = _read_file(path)
    # Some HF configs nest the language model's fields (multimodal wrappers).
    if "text_config" in raw and "hidden_size" not in raw:
        raw = {**raw["text_config"], "quantization_config": raw.get("quantization_config")}
    return _model_from_fields(raw, path)


def _int_field(raw: dict, key: str, path: Path, required: bool = False):
    value = raw.get(key)
    if value is None:
        if required:
            raise TunerError(f"model file {path} lacks the field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TunerError(f"model file {path}: field {key!r} must be a non-negative integer, got {value!r}")
    return value


def _model_from_fields(raw: dict, path: Path) -> Model:
    f = lambda key, required=False: _int_field(raw, key, path, required)  # noqa: E731
    block = None
    qc = raw.get("quantization_config") or {}
    if isinstance(qc, dict) and qc.get("weight_block_size") is not None:
        wbs = qc["weight_block_size"]
        if (not isinstance(wbs, (list, tuple)) or len(wbs) != 2
                or not all(isinstance(v, int) and v > 0 for v in wbs)):
            raise TunerError(f"model file {path}: quantization_config.weight_block_size must be two "
                             f"positive integers, got {wbs!r}")
        block = (int(wbs[0]), int(wbs[1]))
    n_experts = f("n_routed_experts") or f("num_experts") or f("num_local_experts")
    moe_inter = f("moe_intermediate_size")
    if n_experts and moe_inter is None:
        moe_inter = f("intermediate_size")   # Mixtral: every expert has the dense width
    model = Model(
        name=str(raw.get("name") or (path.parent.name if path.name == "config.json" else path.stem)),
        source=str(path),
        hidden_size=f("hidden_size", True),
        num_attention_heads=f("num_attention_heads", True),
        num_key_value_heads=f("num_key_value_heads"),
        head_dim=f("head_dim"),
        intermediate_size=f("intermediate_size"),
        moe_intermediate_size=moe_inter,
        n_routed_experts=n_experts,
        n_shared_experts=f("n_shared_experts") or 0,
        shared_expert_intermediate_size=f("shared_expert_intermediate_size"),
        num_experts_per_tok=f("num_experts_per_tok"),
        num_hidden_layers=f("num_hidden_layers") or 0,
        first_k_dense_replace=f("first_k_dense_replace") or 0,
        q_lora_rank=f("q_lora_rank"),
        kv_lora_rank=f("kv_lora_rank"),
        qk_nope_head_dim=f("qk_nope_head_dim"),
        qk_rope_head_dim=f("qk_rope_head_dim"),
        v_head_dim=f("v_head_dim"),
        max_position_embeddings=f("max_position_embeddings"),
        weight_block_size=block,
        raw=raw,
    )
    if model.hidden_size == 0 or model.num_attention_heads == 0:
        raise TunerError(f"model file {path}: hidden_size and num_attention_heads must be positive")
    if model.is_mla:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(model, key) is None:
                raise TunerError(f"model file {path} has kv_lora_rank (MLA) but lacks the field {key!r}")
    if n_experts and model.is_moe and not model.num_experts_per_tok:
        raise TunerError(f"model file {path} has experts but lacks the field 'num_experts_per_tok'")
    if model.is_moe and model.num_experts_per_tok > model.n_routed_experts:
        raise TunerError(f"model file {path}: num_experts_per_tok ({model.num_experts_per_tok}) exceeds the "
                         f"{model.n_routed_experts} routed experts")
    return model


def check_parallel(model: Model, tp: int, ep: int) -> None:
    """Refuse TP/EP sizes the engines would refuse for this model."""
    if tp < 1 or ep < 1:
        raise TunerError(f"--tp and --ep must be at least 1 (got tp={tp}, ep={ep})")
    if model.num_attention_heads % tp:
        raise TunerError(f"--tp {tp} does not divide {model.name}'s {model.num_attention_heads} attention heads")
    if ep > 1:
        if not model.is_moe:
            raise TunerError(f"--ep {ep} given but {model.name} has no experts")
        if model.n_routed_experts % ep:
            raise TunerError(f"--ep {ep} does not divide {model.name}'s {model.n_routed_experts} routed experts")
        if tp % ep:
            raise TunerError(f"--ep {ep} must divide --tp {tp} (experts are spread over the TP ranks)")


@dataclass(frozen=True)
class Linear:
    """One linear layer as a GPU runs it after sharding: weight [N, K]."""
    name: str
    N: int
    K: int
    sharded: str | None = None        # "N" (column-parallel), "K" (row-parallel), None (replicated)
    engines: tuple[str, ...] = ("vllm", "sglang")


def sharded_linears(model: Model, tp: int) -> list[Linear]:
    """The linear layers one GPU runs at tensor parallelism `tp` (MoE experts excluded:
    they run in the fused-MoE kernel). Raises if a shard is not a whole number."""

    def split(size: int, what: str) -> int:
        if size % tp:
            raise TunerError(f"--tp {tp} does not divide {model.name}'s {what} ({size})")
        return size // tp

    h = model.hidden_size
    heads = split(model.num_attention_heads, "attention heads")
    out: list[Linear] = []
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        kv_a = model.kv_lora_rank + model.qk_rope_head_dim
        if model.q_lora_rank:
            # Both engines fuse q_a_proj and kv_a_proj_with_mqa into one replicated GEMM.
            out.append(Linear("q_a_proj+kv_a_proj_with_mqa", model.q_lora_rank + kv_a, h))
            out.append(Linear("q_b_proj", heads * qk_head, model.q_lora_rank, "N"))
        else:
            out.append(Linear("q_proj", heads * qk_head, h, "N"))
            out.append(Linear("kv_a_proj_with_mqa", kv_a, h))
        out.append(Linear("kv_b_proj", heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank, "N"))
        out.append(Linear("o_proj", h, heads * model.v_head_dim, "K"))
    else:
        head_dim = model.head_dim or h // model.num_attention_heads
        kv_heads = model.num_key_value_heads or model.num_attention_heads
        kv_per_gpu = max(1, kv_heads // tp)   # KV heads are replicated when TP exceeds them
        out.append(Linear("qkv_proj", (heads + 2 * kv_per_gpu) * head_dim, h, "N"))
        out.append(Linear("o_proj", h, heads * head_dim, "K"))
    if model.has_dense_mlp:
        inter = split(model.intermediate_size, "intermediate_size")
        out.append(Linear("mlp.gate_up_proj", 2 * inter, h, "N"))
        out.append(Linear("mlp.down_proj", h, inter, "K"))
    if model.is_moe and model.shared_intermediate:
        inter = split(model.shared_intermediate, "shared-expert intermediate size")
        # SGLang folds the shared expert into the fused MoE by default; vLLM runs it as GEMMs.
        engines = ("vllm",) if model.n_shared_experts else ("vllm", "sglang")
        out.append(Linear("shared_experts.gate_up_proj", 2 * inter, h, "N", engines))
        out.append(Linear("shared_experts.down_proj", h, inter, "K", engines))
    return out


def gemm_problems(model: Model, tp: int, ep: int = 1) -> list[Problem]:
    """The distinct block-FP8 GEMM shapes one GPU runs, each with the layers that use it."""
    check_parallel(model, tp, ep)
    if model.weight_block_size is None:
        raise TunerError(f"{model.name} has no block-FP8 weights (quantization_config.weight_block_size); "
                         "`tuner gemm` tunes block-scaled FP8 linear layers")
    bn, bk = model.weight_block_size
    merged: dict[tuple[int, int], tuple[list[str], set[str]]] = {}
    for lin in sharded_linears(model, tp):
        # The engines refuse a shard that cuts through a weight block; gate_up's shard is
        # two halves (gate, up), each of which must hold whole blocks.
        shard = {"N": lin.N // (2 if "gate_up" in lin.name else 1), "K": lin.K}.get(lin.sharded)
        block = {"N": bn, "K": bk}.get(lin.sharded)
        if tp > 1 and shard is not None and shard % block:
            raise TunerError(f"--tp {tp} splits {model.name}'s {lin.name} into shards of {shard} "
                             f"along {lin.sharded}, not a multiple of the {block}-wide weight blocks")
        names, engines = merged.setdefault((lin.N, lin.K), ([], set()))
        names.append(lin.name)
        engines.update(lin.engines)
    for (n, k), (names, _) in merged.items():
        # activations are quantized in 1 x block_k groups along K: a partial group has no scale
        if k % bk:
            raise TunerError(f"{model.name}'s {names[0]} runs a GEMM with K={k}, not a multiple of the "
                             f"{bk}-wide weight blocks: no engine quantizes it in blocks")
    return [
        Problem("fp8_gemm", {"N": n, "K": k, "block_shape": [bn, bk]}, tuple(names),
                tuple(e for e in ("vllm", "sglang") if e in engines))
        for (n, k), (names, engines) in merged.items()
    ]


def moe_problems(model: Model, tp: int, ep: int, dtype: str, routing: str = "uniform",
                 engines=("vllm", "sglang")) -> list[Problem]:
    """The fused-MoE problems one GPU runs, per engine: vLLM's whole-layer table, and
    SGLang's up table plus its `_down` table (tied to the up table's BLOCK_SIZE_M)."""
    from tuner.engines import ENGINES

    check_parallel(model, tp, ep)
    if not model.is_moe:
        raise TunerError(f"{model.name} has no routed experts; `tuner moe` tunes MoE layers")
    if dtype == "fp8_w8a8":
        block = list(model.weight_block_size) if model.weight_block_size else None
    elif dtype == "bf16":
        block = None
    else:
        raise TunerError(f"--dtype {dtype} is not supported by `tuner moe`; choose fp8_w8a8 or bf16")
    inter, experts = model.moe_intermediate_size, model.n_routed_experts
    if inter is None:
        raise TunerError(f"{model.name} lacks moe_intermediate_size")
    out: list[Problem] = []
    for name in engines:
        engine = ENGINES[name]
        if name == "vllm":
            # vLLM: tensor parallel splits every expert; expert parallel splits the experts.
            E, N = (experts // ep, inter) if ep > 1 else (experts, inter // tp)
            if ep == 1 and inter % tp:
                raise TunerError(f"--tp {tp} does not divide {model.name}'s moe_intermediate_size ({inter})")
        else:
            arch = (model.raw.get("architectures") or [None])[0]
            fused = (engine.fuses_shared_expert(arch, experts, model.n_shared_experts, ep)
                     and model.shared_intermediate == inter)
            shards = tp // ep
            if inter % shards:
                raise TunerError(f"--tp {tp} / --ep {ep} does not divide {model.name}'s moe_intermediate_size ({inter})")
            E, N = experts // ep + (1 if fused else 0), inter // shards
            shared = {"shared_experts": 1} if fused else {}
        if block and N % block[0]:
            raise TunerError(f"--tp {tp} leaves {model.name}'s experts {N} wide, not a multiple of the "
                             f"{block[0]}-wide weight blocks (the engines refuse it); try a smaller --tp or --ep")
        base = {"E": E, "N": N, "K": model.hidden_size, "topk": model.num_experts_per_tok, "dtype": dtype,
                "block_shape": block}
        if name == "vllm":
            out.append(Problem("fused_moe", {**base, "part": "op", "routing": routing}, ("experts",), ("vllm",)))
        else:
            # With the shared expert fused, every token also goes to expert E-1 (top-k+1).
            up = Problem("fused_moe", {**base, **shared, "part": "up", "routing": routing}, ("experts.w13",),
                         ("sglang",))
            down = Problem("fused_moe", {**base, **shared, "part": "down", "routing": routing}, ("experts.w2",),
                           ("sglang",), tied_to=up.key, tied_keys=engine.tied_keys("fused_moe"))
            out += [up, down]
    return out


DEFAULT_CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def mla_problems(model: Model, tp: int, contexts: list[int], page_size: int) -> tuple[list[Problem], list[int]]:
    """MLA decode problems, one per context bucket; returns (problems, contexts skipped
    because the model cannot reach them)."""
    check_parallel(model, tp, 1)
    if not model.is_mla:
        raise TunerError(f"{model.name} does not use multi-head latent attention (no kv_lora_rank)")
    if model.kv_lora_rank != 512 or model.qk_rope_head_dim != 64:
        raise TunerError(f"{model.name} has kv_lora_rank {model.kv_lora_rank} and rope dim "
                         f"{model.qk_rope_head_dim}; the MLA kernel is built for 512 + 64 (DeepSeek)")
    if page_size < 1:
        raise TunerError(f"--page-size must be at least 1 (got {page_size})")
    limit = model.max_position_embeddings or max(contexts)
    kept = [c for c in sorted(set(contexts)) if c <= limit]
    skipped = [c for c in sorted(set(contexts)) if c > limit]
    if not kept:
        raise TunerError(f"every --contexts value exceeds {model.name}'s {limit} positions")
    heads = model.num_attention_heads // tp
    return [Problem("mla_decode", {"heads": heads, "kv_lora_rank": 512, "qk_rope_dim": 64,
                                   "page_size": page_size, "context": c},
                    ("self_attn (decode)",), ("tuner",)) for c in kept], skipped


# -- layer counts: how often one forward pass runs a problem's kernel -----------------------------
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


def table_layers(model: Model, kernel: str, params: dict, tp: int | None = None) -> int | None:
    """Layers per pass that run a table's kernel, from the table's problem alone (drift reads
    tables by file name, without --tp): every MoE layer for a fused-MoE table; for a GEMM
    shape, the linears of the first TP size at which the model runs that (N, K). None when
    the model runs no such shape. `tp`: the TP the tables are for, where known."""
    if kernel == "fused_moe":
        return moe_layers(model)
    if kernel != "fp8_gemm":
        return None
    for size in (tp,) if tp else (1, 2, 4, 8, 16, 32, 64):
        try:
            problems = gemm_problems(model, size)
        except TunerError:
            continue
        for p in problems:
            if p.params["N"] == params.get("N") and p.params["K"] == params.get("K"):
                return layers_per_pass(model, p.layers)
    return None
def checkpoint_dtype(model: Model) -> str:
    """The precision the checkpoint's weights are stored in, as the engines name it in their
    table files: "fp8_w8a8" for an FP8 checkpoint (quantization_config with quant_method
    "fp8", or weight blocks), "bf16" for an unquantized one. Other quantization methods
    (AWQ, GPTQ, ...) run kernels whose tables tuner does not write: one clear line."""
    qc = model.raw.get("quantization_config") or {}
    if not isinstance(qc, dict) or not qc:
        return "bf16"
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8" or (not method and qc.get("weight_block_size") is not None):
        return "fp8_w8a8"
    raise TunerError(f"{model.name}'s checkpoint is quantized with {method or qc!r}; tuner handles fp8 (fp8_w8a8) and "
                     "unquantized (bf16) checkpoints: give --dtype")
