"""The deployment a plan is for: how many GPUs of one node (the tensor-parallel size) hold a
model's weights with room left for the KV cache. Tables are for the shapes one GPU runs, and
those depend on --tp: tuning TP1 shapes of a model that only fits eight GPUs tunes shapes
nobody serves. So `gemm`, `moe`, `mla`, `audit`, `bench`, `landscape synth` and nightly jobs
take, without --tp, the smallest power of two up to a node's eight GPUs that holds the
weights (`serving_tp`), and refuse an explicit --tp that cannot (`check_tp`), unless the user
says the shapes are one rank's on purpose (--per-rank, or --ep above 1).

The rule ("room for the KV cache"): an engine may use WEIGHT_ROOM of each GPU's memory
(vLLM's default --gpu-memory-utilization is 0.9; SGLang's static fraction is about the
same); the weights' share per GPU may take at most WEIGHT_SHARE (three quarters) of that, so
at least a quarter of it (22% of the GPU) stays for the KV cache and activations. Batching,
and so the batch sizes the tables are tuned for, lives in that quarter: DeepSeek-V3 at TP8 on
H200 keeps 43 GB a GPU for it, about 600K tokens of its MLA cache. Weights that fill the GPU to
the brim would serve a handful of requests at a time; a quarter is what serving needs to batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import TunerError

NODE_GPUS = 8                     # the GPUs of one node (NVLink domain of an HGX board)
WEIGHT_ROOM = 0.9                 # the share of a GPU's memory an engine uses (vLLM's default)
WEIGHT_SHARE = 0.75               # of that, the most the weights may take: the rest is the KV cache's
_BYTES_PER_WEIGHT = {"fp8_w8a8": 1.0, "int8_w8a8": 1.0, "int8_w8a16": 1.0, "int4_w4a16": 0.5, "fp32": 4.0}
_SHORT = {"fp8_w8a8": "fp8", "int8_w8a8": "int8", "int8_w8a16": "int8", "int4_w4a16": "int4"}


def weight_bytes(model, dtype: str | None) -> float:
    """About how many bytes the model's weights take (linear layers, experts and embeddings;
    norms and biases are too small to matter)."""
    from tuner.plan.models import sharded_linears
    h = model.hidden_size
    attention = sum(lin.N * lin.K for lin in sharded_linears(model, 1)
                    if not lin.name.startswith(("mlp.", "shared_experts.")))
    moe_layers = max(model.num_hidden_layers - model.first_k_dense_replace, 0) if model.is_moe else 0
    dense_layers = model.num_hidden_layers - moe_layers
    dense = 3 * h * (model.intermediate_size or 0) if model.has_dense_mlp or not model.is_moe else 0
    experts = (model.n_routed_experts or 0) * 3 * h * (model.moe_intermediate_size or 0) \
        + 3 * h * model.shared_intermediate
    vocab = model.raw.get("vocab_size") or 0
    embeddings = vocab * h * (1 if model.raw.get("tie_word_embeddings") else 2)
    params = model.num_hidden_layers * attention + dense_layers * dense + moe_layers * experts
    return params * _BYTES_PER_WEIGHT.get(dtype or "", 2.0) + embeddings * 2.0


def weight_limit(gpu) -> float:
    """The most bytes of weights one GPU may hold and still keep room for the KV cache."""
    return gpu.memory_gb * 1e9 * WEIGHT_ROOM * WEIGHT_SHARE


def holds(model, gpu, tp: int, dtype: str | None) -> bool:
    """Whether `tp` GPUs hold the weights with room for the KV cache (the module's rule)."""
    return weight_bytes(model, dtype) / tp <= weight_limit(gpu)


def _admits(model, tp: int) -> bool:
    return model.num_attention_heads % tp == 0


def smallest_tp(model, gpu, dtype: str | None, most: int = 64, ep: int = 1) -> int | None:
    """The smallest power of two up to `most` that holds the weights and divides the model's
    heads (one that --ep divides, where one does), or None."""
    sizes = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    fitting = [t for t in sizes if holds(model, gpu, t, dtype) and _admits(model, t)]
    return next((t for t in fitting if t % ep == 0), fitting[0] if fitting else None)


@dataclass(frozen=True)
class Parallelism:
    """The tensor-parallel size a plan is for, and the line that says why ("" for a --tp given
    that holds the weights: the plan shows it)."""
    tp: int
    chosen: bool                  # True: the default (serving_tp); False: the user's --tp
    line: str


def _gb(n: float) -> str:
    return f"{n / 1e9:.0f}" if n >= 1e10 else f"{n / 1e9:.2g}"


def _weights_text(model, dtype: str | None) -> str:
    return f"{model.name}'s {_gb(weight_bytes(model, dtype))} GB of {_SHORT.get(dtype or '', dtype or 'bf16')} weights"


def _more_than_a_node(model, gpu, dtype: str | None, ep: int) -> str:
    beyond = smallest_tp(model, gpu, dtype, most=1024, ep=ep)
    return (f"{_weights_text(model, dtype)} do not fit one node of {NODE_GPUS} {gpu.key}s ({gpu.memory_gb:g} GB "
            f"each, at most {weight_limit(gpu) / 1e9:.0f} GB of weights a GPU to keep room for the KV cache)"
            + (f": give --tp {beyond} (several nodes)" if beyond else "")
            + ", or --per-rank with the --tp of one rank's shapes")


def serving_tp(model, gpu, dtype: str | None, ep: int = 1) -> Parallelism:
    """The default --tp: the smallest power of two up to one node that holds the weights
    with room for the KV cache. One line when not even a node does."""
    tp = smallest_tp(model, gpu, dtype, most=NODE_GPUS, ep=ep)
    if tp is None:
        raise TunerError(_more_than_a_node(model, gpu, dtype, ep))
    what = "fit one" if tp == 1 else "the smallest that holds"
    where = f"{gpu.key}" if tp == 1 else f"{gpu.key}s"
    line = (f"tp={tp}: {what} {_weights_text(model, dtype)} on {where} with room for the KV cache; --tp to choose"
            if tp > 1 else f"tp=1: {_weights_text(model, dtype)} fit one {where} with room for the KV cache; "
            "--tp to choose")
    return Parallelism(tp, True, line)


def fit_hint(model, gpu, tp: int, dtype: str | None) -> str | None:
    """Why `tp` GPUs cannot serve the model (one line naming the smallest TP that can), or
    None when they hold its weights with room for the KV cache."""
    if holds(model, gpu, tp, dtype):
        return None
    fits = smallest_tp(model, gpu, dtype, most=1024)
    return (f"--tp {tp} cannot serve {model.name}: {_weights_text(model, dtype)} over "
            f"{'one ' + gpu.key if tp == 1 else f'{tp} {gpu.key}s'} ({gpu.memory_gb:g} GB{'' if tp == 1 else ' each'}) "
            f"leave no room for the KV cache (at most {weight_limit(gpu) / 1e9:.0f} GB of weights a GPU); the tables "
            "are for the shapes of the parallelism you serve with: "
            + (f"give --tp {fits} (the smallest that holds them)" if fits else "no TP holds them")
            + ", or --per-rank to tune one rank's shapes on purpose")


def check_tp(model, gpu, tp: int | None, ep: int, dtype: str | None, per_rank: bool = False) -> Parallelism:
    """The plan's --tp: the default when not given (serving_tp); a given one that cannot
    hold the weights is refused (one line) unless the shapes are one rank's on purpose
    (--per-rank, or --ep above 1: an expert-parallel deployment sized by the user), which
    the returned line then says."""
    from tuner.plan.models import check_parallel
    if tp is None:
        if per_rank:
            raise TunerError("--per-rank says --tp is one rank's of a deployment you size yourself: give that --tp")
        chosen = serving_tp(model, gpu, dtype, ep)
        check_parallel(model, chosen.tp, ep)
        return chosen
    check_parallel(model, tp, ep)           # a --tp the engines refuse is said first
    hint = fit_hint(model, gpu, tp, dtype)
    if hint is None:
        return Parallelism(tp, False, "")       # the user's, and it serves: nothing to say
    if not per_rank and ep == 1:
        raise TunerError(hint)
    why = "--per-rank" if per_rank else f"--ep {ep}"
    return Parallelism(tp, False, f"tp={tp} ({why}): one rank's shapes, on purpose; {tp} {gpu.key}"
                       f"{'s' if tp > 1 else ''} alone would not hold {_weights_text(model, dtype)}")


# -- the deployments a model is served with (tuner coverage) ---------------------------------------
TWO_NODES = 2 * NODE_GPUS


@dataclass(frozen=True)
class Served:
    """One deployment as one GPU (rank) sees it: the tensor- and expert-parallel sizes of the
    experts, and the tensor-parallel size of the other linear layers (1 under data-parallel
    attention: every rank holds the attention whole and runs its own requests)."""
    tp: int
    ep: int = 1
    dp_attention: bool = False

    @property
    def label(self) -> str:
        """"TP8", "TP16", "TP8 EP8" (expert parallelism here always comes with data-parallel attention)."""
        return f"TP{self.tp}" + (f" EP{self.ep}" if self.ep > 1 else "")

    @property
    def kind(self) -> str:
        """Which of the deployments it is: "one node", "two nodes", "EP" (with data-parallel attention)."""
        return "EP" if self.ep > 1 else "one node" if self.tp <= NODE_GPUS else "two nodes"

    @property
    def attention_tp(self) -> int:
        return 1 if self.dp_attention else self.tp


def served_deployments(model, gpu, dtype: str | None) -> tuple[list[Served], list[str]]:
    """(the deployments `model` is served with on `gpu` at `dtype`, a line for each left out):
    the smallest TP of one node that holds the weights (serving_tp); TP16 over two nodes when
    a model fills a node (or one does not hold it); expert parallelism with data-parallel
    attention (EP = that TP, the experts split over the ranks) where the experts divide."""
    from tuner.plan.models import check_parallel
    out: list[Served] = []
    notes: list[str] = []
    node = smallest_tp(model, gpu, dtype, most=NODE_GPUS)
    if node is None:
        notes.append(f"{_weights_text(model, dtype)} do not fit one node of {NODE_GPUS} {gpu.key}s")
    else:
        out.append(Served(node))
    if node is None or node == NODE_GPUS:
        if holds(model, gpu, TWO_NODES, dtype) and _admits(model, TWO_NODES):
            out.append(Served(TWO_NODES))
        else:
            notes.append(f"{_weights_text(model, dtype)} do not fit two nodes of {NODE_GPUS} {gpu.key}s (TP{TWO_NODES})"
                         if _admits(model, TWO_NODES) else f"TP{TWO_NODES} does not divide {model.name}'s "
                         f"{model.num_attention_heads} attention heads")
    if out and model.is_moe and out[0].tp > 1:
        base = out[0].tp
        try:
            check_parallel(model, base, base)
            out.append(Served(base, base, dp_attention=True))
        except TunerError as e:
            notes.append(f"no EP{base}: {e}")
    kept = []
    for served in out:                # the shapes the engines take (experts split into whole weight blocks)
        try:
            if model.is_moe:
                from tuner.plan.models import moe_problems
                # only whether it plans: the plan that tunes it says what an engine runs none of
                moe_problems(model, served.tp, served.ep, dtype or "bf16", quiet=True)
            kept.append(served)
        except TunerError as e:
            notes.append(f"no {served.label}: {e}")
    return kept, notes
