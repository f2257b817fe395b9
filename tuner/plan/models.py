"""Models: load a model description and turn it, with TP/EP, into kernel problems.

A model is a Hugging Face config.json or one of our YAML files (same field names),
named on the command line by a name in configs/models/ (any case), by a path to such a
file, or by a folder holding a config.json (a Hugging Face snapshot).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import MODELS_DIR
from tuner.plan.engines import ENGINE_NAMES, ENGINES, table_family
from tuner.plan.problems import Problem


@dataclass(frozen=True)
class MoeDims:
    """A MoE model's expert dimensions, present and checked at load time (Model.moe)."""
    experts: int                      # routed experts
    intermediate: int                 # each expert's intermediate size
    topk: int                         # experts per token


@dataclass(frozen=True)
class MlaDims:
    """A multi-head latent attention model's dimensions, present and checked at load time
    (Model.mla)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None           # None: queries are not low-rank (DeepSeek-V2-Lite)


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
    # the per-kind records, set by the loader once their fields are checked (None: not that kind)
    moe: MoeDims | None = None
    mla: MlaDims | None = None

    @property
    def architecture(self) -> str | None:
        """The first of the config's "architectures" (what the engines pick a model class by)."""
        archs = self.raw.get("architectures")
        return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

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
    from tuner.reading import parse_json, parse_yaml, read_text
    text = read_text(path, "model file ")
    where = f"model file {path}"
    data = parse_json(text, where) if path.suffix == ".json" else parse_yaml(text, where)
    if not isinstance(data, dict):
        raise TunerError(f"model file {path} does not hold a mapping of config fields")
    return data


def known_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_id_hint(text: str) -> str:
    return (f"{text} looks like a Hugging Face model id; tuner reads only the model's config.json: get it with "
            f"`huggingface-cli download {text} config.json --local-dir models/{text.split('/')[-1]}` and give "
            f"--model models/{text.split('/')[-1]} (a folder with a config.json, such as a downloaded snapshot)")


def load_model(name_or_path: str) -> Model:
    """Read a model by name (configs/models/NAME.yaml, any case), by path (.json/.yaml), or
    from a folder holding a config.json (a Hugging Face snapshot)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TunerError(f"--model {name_or_path} is a folder without a config.json (give a Hugging Face "
                             "snapshot folder, a config.json, or a name from configs/models/)")
        path = path / "config.json"
    if not path.is_file():
        by_name = {m.lower(): m for m in known_models()}
        if name_or_path.lower() in by_name:
            path = MODELS_DIR / f"{by_name[name_or_path.lower()]}.yaml"
        elif _HUB_ID.match(name_or_path) and path.suffix not in (".json", ".yaml", ".yml") \
                and not path.parent.exists():
            raise TunerError(_hub_id_hint(name_or_path))
        elif path.suffix in (".json", ".yaml", ".yml") or "/" in name_or_path:
            raise TunerError(f"model file {name_or_path} not found")
        else:
            import difflib
            # a misspelling, or the start of one name only (qwen3-30b: qwen3-30b-a3b-gptq-int4)
            starts = [m for m in by_name if m.startswith(name_or_path.lower())]
            close = difflib.get_close_matches(name_or_path.lower(), list(by_name), n=1, cutoff=0.75) or \
                (starts if len(starts) == 1 else [])
            hint = f"did you mean {by_name[close[0]]}? " if close else ""
            raise TunerError(f"unknown model {name_or_path!r}; {hint}known: {', '.join(known_models())}, "
                             "or give a path to a config.json or to a folder holding one")
    raw = _read_file(path)
    # Some HF configs nest the language model's fields (multimodal wrappers).
    if "text_config" in raw and "hidden_size" not in raw:
        if not isinstance(raw["text_config"], dict):
            raise TunerError(f"model file {path}: 'text_config' is not a mapping of config fields")
        raw = {**raw["text_config"], "quantization_config": raw.get("quantization_config")}
    return _model_from_fields(raw, path)


def _folder_name(path: Path) -> str:
    """A model's name from where its file is: the file's stem, the folder of a config.json,
    or for a Hugging Face cache snapshot (models--ORG--NAME/snapshots/<hash>/) its NAME."""
    if path.name != "config.json":
        return path.stem
    folder = path.resolve().parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name


# The largest value each field may take: far above any model there is (DeepSeek-V3: hidden
# size 7168, 256 experts, 61 layers), far below what would overflow a shape or a landscape.
_SIZE_LIMIT = 1 << 20
_FIELD_LIMITS = {"num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14, "n_routed_experts": 1 << 16,
                 "num_experts": 1 << 16, "num_local_experts": 1 << 16, "n_shared_experts": 1 << 10,
                 "num_experts_per_tok": 1 << 10, "num_hidden_layers": 1 << 14, "first_k_dense_replace": 1 << 14,
                 "max_position_embeddings": 1 << 31, "vocab_size": 1 << 24}


def _int_field(raw: dict, key: str, path: Path, required: bool = False):
    value = raw.get(key)
    if value is None:
        if required:
            raise TunerError(f"model file {path} lacks the field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TunerError(f"model file {path}: field {key!r} must be a non-negative integer, got {value!r}")
    limit = _FIELD_LIMITS.get(key, _SIZE_LIMIT)
    if value > limit:
        raise TunerError(f"model file {path}: field {key!r} is {value}, beyond any model (at most {limit})")
    return value


def _model_from_fields(raw: dict, path: Path) -> Model:
    f = lambda key, required=False: _int_field(raw, key, path, required)  # noqa: E731
    block = None
    qc = raw.get("quantization_config") or {}
    if isinstance(qc, dict) and qc.get("weight_block_size") is not None:
        wbs = qc["weight_block_size"]
        if (not isinstance(wbs, (list, tuple)) or len(wbs) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and 16 <= v <= 1024 and not v & (v - 1)
                           for v in wbs)):
            raise TunerError(f"model file {path}: quantization_config.weight_block_size must be two powers of "
                             f"two from 16 to 1024 (the engines' blocks are [128, 128]), got {wbs!r}")
        block = (int(wbs[0]), int(wbs[1]))
    f("vocab_size")                            # checked: the weights' size counts it
    if qc is not None and not isinstance(qc, dict):
        raise TunerError(f"model file {path}: quantization_config is not a mapping")
    n_experts = f("n_routed_experts") or f("num_experts") or f("num_local_experts")
    moe_inter = f("moe_intermediate_size")
    if n_experts and moe_inter is None:
        moe_inter = f("intermediate_size")   # Mixtral: every expert has the dense width
    model = Model(
        name=str(raw.get("name") or _folder_name(path)),
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
    if model.kv_lora_rank is not None:
        nope, rope, v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        for key, value in (("qk_nope_head_dim", nope), ("qk_rope_head_dim", rope), ("v_head_dim", v)):
            if value is None:
                raise TunerError(f"model file {path} has kv_lora_rank (MLA) but lacks the field {key!r}")
        assert nope is not None and rope is not None and v is not None      # for mypy: checked just above
        model.mla = MlaDims(model.kv_lora_rank, nope, rope, v, model.q_lora_rank)
    if n_experts:
        topk = model.num_experts_per_tok
        if not topk:
            raise TunerError(f"model file {path} has experts but lacks the field 'num_experts_per_tok'")
        if topk > n_experts:
            raise TunerError(f"model file {path}: num_experts_per_tok ({topk}) exceeds the "
                             f"{n_experts} routed experts")
        if moe_inter is not None:      # moe_problems says what is missing when it is needed
            model.moe = MoeDims(n_experts, moe_inter, topk)
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
        experts = model.n_routed_experts or 0
        if experts % ep:
            raise TunerError(f"--ep {ep} does not divide {model.name}'s {experts} routed experts")
        if tp % ep:
            raise TunerError(f"--ep {ep} must divide --tp {tp} (experts are spread over the TP ranks)")


@dataclass(frozen=True)
class Linear:
    """One linear layer as a GPU runs it after sharding: weight [N, K]."""
    name: str
    N: int
    K: int
    sharded: str | None = None        # "N" (column-parallel), "K" (row-parallel), None (replicated)
    engines: tuple[str, ...] = ENGINE_NAMES


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
    mla = model.mla
    if mla is not None:
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim
        if mla.q_lora_rank:
            # Both engines fuse q_a_proj and kv_a_proj_with_mqa into one replicated GEMM.
            out.append(Linear("q_a_proj+kv_a_proj_with_mqa", mla.q_lora_rank + kv_a, h))
            out.append(Linear("q_b_proj", heads * qk_head, mla.q_lora_rank, "N"))
        else:
            out.append(Linear("q_proj", heads * qk_head, h, "N"))
            out.append(Linear("kv_a_proj_with_mqa", kv_a, h))
        out.append(Linear("kv_b_proj", heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, "N"))
        out.append(Linear("o_proj", h, heads * mla.v_head_dim, "K"))
    else:
        head_dim = model.head_dim or h // model.num_attention_heads
        kv_heads = model.num_key_value_heads or model.num_attention_heads
        kv_per_gpu = max(1, kv_heads // tp)   # KV heads are replicated when TP exceeds them
        out.append(Linear("qkv_proj", (heads + 2 * kv_per_gpu) * head_dim, h, "N"))
        out.append(Linear("o_proj", h, heads * head_dim, "K"))
    if model.has_dense_mlp and model.intermediate_size:
        inter = split(model.intermediate_size, "intermediate_size")
        out.append(Linear("mlp.gate_up_proj", 2 * inter, h, "N"))
        out.append(Linear("mlp.down_proj", h, inter, "K"))
    if model.is_moe and model.shared_intermediate:
        inter = split(model.shared_intermediate, "shared-expert intermediate size")
        # An engine that can fold a shared expert into its fused MoE (SGLang, by default) runs
        # no GEMM for it; the others (vLLM) run it as GEMMs.
        engines = tuple(e for e in ENGINE_NAMES if not (model.n_shared_experts and ENGINES[e].shared_expert_fusion))
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
        shard = {"N": lin.N // (2 if "gate_up" in lin.name else 1), "K": lin.K}.get(lin.sharded or "")
        block = {"N": bn, "K": bk}.get(lin.sharded or "")
        if tp > 1 and shard is not None and block is not None and shard % block:
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
                tuple(e for e in ENGINE_NAMES if e in engines))
        for (n, k), (names, engines) in merged.items()
    ]


def moe_problems(model: Model, tp: int, ep: int, dtype: str, routing: str = "uniform",
                 engines=ENGINE_NAMES, fuse_shared: bool = True, quiet: bool = False) -> list[Problem]:
    """The fused-MoE problems one GPU runs, per engine: vLLM's whole-layer table, and
    SGLang's up table plus its `_down` table (tied to the up table's BLOCK_SIZE_M). The
    weights' layout at `dtype` (blocks, K groups, zero points) is the checkpoint's
    (tuner/plan/precision.py); an engine that runs no Triton MoE of that precision is
    skipped with a line saying why (none with `quiet`: a caller that only asks whether the
    deployment can be planned), and none left is refused. `fuse_shared=False`: as SGLang runs
    with --disable-shared-experts-fusion."""
    import logging

    from tuner.plan.precision import MOE_DTYPES, moe_precision, served_group
    check_parallel(model, tp, ep)
    if not model.is_moe:
        raise TunerError(f"{model.name} has no routed experts; `tuner moe` tunes MoE layers")
    if dtype not in MOE_DTYPES:
        raise TunerError(f"--dtype {dtype} is not supported by `tuner moe`; choose from {', '.join(MOE_DTYPES)}")
    if model.moe is None:
        raise TunerError(f"{model.name} lacks moe_intermediate_size")
    precision = moe_precision(model, dtype)
    block = list(precision.block_shape) if precision.block_shape else None
    key = (dtype, precision.scheme)
    refused = {name: ENGINES[name].moe_precisions_refused.get(key, f"{name} runs no {precision.describe()} MoE")
               for name in engines if key not in ENGINES[name].moe_precisions}
    if refused and len(refused) == len(engines):
        raise TunerError(f"{model.name} at {precision.describe()}: " + "; ".join(refused.values()))
    for name, why in refused.items() if not quiet else ():
        logging.getLogger("tuner").warning("%s: no %s tables planned: %s", name, dtype, why)
    inter, experts = model.moe.intermediate, model.moe.experts
    checkpoint = (str((model.raw.get("quantization_config") or {}).get("quant_method") or "").lower(), dtype)
    out: list[Problem] = []
    for name in (e for e in engines if e not in refused):
        engine = ENGINES[name]
        if engine.ep_holds_whole_experts:
            # vLLM: tensor parallel splits every expert; expert parallel splits the experts.
            shards, parallel = (1 if ep > 1 else tp), f"--tp {tp}"
        else:
            # SGLang: the experts are split by TP / EP as well
            shards, parallel = tp // ep, f"--tp {tp} / --ep {ep}"
        if inter % shards:
            raise TunerError(f"{parallel} does not divide {model.name}'s moe_intermediate_size ({inter})")
        fused = (fuse_shared and engine.fuses_shared_expert(model.architecture, experts, model.n_shared_experts, ep,
                                                            checkpoint)
                 and model.shared_intermediate == inter)
        E, N = experts // ep + (1 if fused else 0), inter // shards
        shared = {"shared_experts": 1} if fused else {}
        if block and N % block[0]:
            raise TunerError(f"--tp {tp} leaves {model.name}'s experts {N} wide, not a multiple of the "
                             f"{block[0]}-wide weight blocks (the engines refuse it); try a smaller --tp or --ep")
        scheme = precision.params()
        if precision.group_size:
            scheme["group_size"] = served_group(precision.group_size, N, model.hidden_size,
                                                f"{model.name} at {parallel}")
        base = {"E": E, "N": N, "K": model.hidden_size, "topk": model.moe.topk,
                # under expert parallelism one GPU sees every token routed over all experts
                **({"ep": ep} if ep > 1 else {}), **scheme}
        if not table_family(name, "fused_moe").has_down:
            # one table for the whole layer (vLLM)
            out.append(Problem("fused_moe", {**base, "part": "op", "routing": routing}, ("experts",), (name,)))
        else:
            # an up table and a `_down` table (SGLang); with the shared expert fused, every
            # token also goes to expert E-1 (top-k+1).
            up = Problem("fused_moe", {**base, **shared, "part": "up", "routing": routing}, ("experts.w13",),
                         (name,))
            down = Problem("fused_moe", {**base, **shared, "part": "down", "routing": routing}, ("experts.w2",),
                           (name,), tied_to=up.key, tied_keys=engine.tied_keys("fused_moe"))
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
