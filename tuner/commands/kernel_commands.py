"""`tuner gemm`, `tuner moe` and `tuner mla`: the options they share (what to tune, the search,
whose kernel, measuring and output), each one's parser, and the run, which makes the parsed
options the request and hands it to the pipeline (tuner/pipeline/: the tuning itself, heavy with
Optuna and pandas, imported only when a run starts)."""

from __future__ import annotations

import os

from tuner.commands.options import (
    Parser,
    batch,
    context,
    device_option,
    fraction,
    minutes,
    page,
    parallel_options,
    positive,
    seed,
    trust_option,
    workers,
)
from tuner.plan.engines import ENGINE_NAMES
from tuner.plan.gpus import gpu_keys_text
from tuner.search.samplers import SAMPLERS


def common_options() -> Parser:
    p = Parser(add_help=False)
    g = p.add_argument_group("what to tune")
    g.add_argument("--model", required=True, help="name in configs/models/ (deepseek-v3, ...) or a path to "
                   "a Hugging Face config.json or one of our YAML files")
    g.add_argument("--gpu", required=True, help=gpu_keys_text())
    g.add_argument("--dtype", default=None, help="precision (moe: fp8_w8a8, bf16, int8_w8a8, int8_w8a16 or "
                   "int4_w4a16, default the checkpoint's own (its quantization_config, which also gives the blocks, "
                   "K groups and zero points; bf16 when it has none); gemm: fp8_w8a8; mla: bf16 KV cache)")
    parallel_options(g)
    g.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None,
                   help="batch sizes to tune (default: the engines' grid, 1 to 4096; mla: 1 to 256)")
    g.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES),
                   help="whose tables to write (default both)")
    g.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                   help="tune only the problems whose key holds one of these texts, e.g. N=7168,K=2048 "
                   "(the plan lists the keys)")
    s = p.add_argument_group("search")
    s.add_argument("--trials", type=positive, default=None,
                   help="measured configs per batch size at most (default: sized by its pruned space, 2*sqrt(configs) "
                   "within 24..160, as the plan prints; with --traffic 48 for gemm, 32 for moe and mla, split by "
                   "traffic); a study stops earlier when no config it has not measured is likely to change the table")
    s.add_argument("--patience", type=positive, default=None,
                   help="stop a study after this many trials without a 0.5%% gain instead (default: on that evidence)")
    s.add_argument("--sampler", default=SAMPLERS[0], choices=SAMPLERS,
                   help="gp (default): a Gaussian process over the study's own candidates; tpe, random: Optuna's")
    s.add_argument("--seed", type=seed, default=0, help="sampler seed (0 to 2^32-1)")
    s.add_argument("--space", default=None, help="search-space YAML (default configs/spaces/<kernel>.yaml)")
    s.add_argument("--baseline", default=None, metavar="DIR",
                   help="folder of shipped tables: seeds each study with the shipped config")
    s.add_argument("--warm-start", nargs="+", default=None, metavar="PATH",
                   help="seed every study from earlier results folders, table files or folders of tables (any GPU, "
                   "M or nearby shape); each seed is measured again; the engines' shipped tables of this shape on "
                   "sibling Hopper GPUs and of the nearest shapes seed it by default")
    s.add_argument("--no-warm-start", action="store_true",
                   help="no seeds from the engines' shipped tables (--warm-start and the batch sizes already done "
                   "still seed)")
    s.add_argument("--min-gain", type=fraction, default=0.02, metavar="FRACTION",
                   help="a row changes only where the tuned config beats the installed row (or the default) by more "
                   "than this in paired, interleaved re-timing (default 0.02: 2%%)")
    s.add_argument("--traffic", default=None, metavar="FILE",
                   help="gemm, moe: a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): "
                   "the table's keys, the trial budget and kept defaults follow the batch sizes served")
    s.add_argument("--minutes", type=minutes, default=None, metavar="M",
                   help="a time-boxed window: the studies by expected value per GPU second, as many as fit in M "
                   "minutes; every table written with what it has (rows not tuned keep the incumbent); the same "
                   "command again continues (docs/tuning.md)")
    s.add_argument("--storage", default=None, metavar="URL",
                   help="journal:///FILE or an Optuna database URL (default journal:///OUT/studies.journal); "
                   "a stopped run resumes from it")
    s.add_argument("--study-prefix", default="", metavar="NAME",
                   help="prefix of this run's study names, so several runs can share one storage "
                   "(and `tuner worker` processes can join it)")
    k = p.add_argument_group("whose kernel is timed")
    k.add_argument("--kernel-source", choices=("engine", "ours", *ENGINE_NAMES), default=None,
                   help="engine (default): each engine's tables are timed on that engine's own Triton kernel, "
                   "read from the installed engine or --engine-source; vllm or sglang: that engine's kernel, for "
                   "its tables only; ours: on our kernels in kernels/ (with --replay: the landscape's)")
    k.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                   help="the engines' released wheels, folders holding them, or folders made by "
                   "`tuner engine-source extract` (default: the installed engines, then $TUNER_ENGINE_WHEELS, "
                   "then the wheels `tuner engine-source fetch` got)")
    trust_option(k)
    o = p.add_argument_group("measuring and output")
    o.add_argument("--out", default=None, metavar="DIR", help="results folder (default runs/<kernel>-<model>-<gpu>-tp<N>; "
                   "-synthetic or -cpu-device added where no GPU timed it)")
    o.add_argument("--replay", default=None, metavar="FILE", help="time by replaying a recorded landscape (no GPU)")
    o.add_argument("--synthetic", action="store_true",
                   help="no GPU: make a SYNTHETIC landscape (a cost model) for this plan on the fly and replay it, "
                   "the whole run labelled SYNTHETIC (default --out runs/...-synthetic); to try the tool, never "
                   "to choose configs")
    o.add_argument("--record", default=None, metavar="FILE", help="time the whole pruned grid on the GPU into a landscape")
    o.add_argument("--gpus", default=None, metavar="LIST",
                   help="GPUs to use, e.g. 0,1,2,3 (default: every visible GPU); more than one runs a "
                   "worker process per GPU on shared studies")
    o.add_argument("--compile-workers", type=workers, default=min(16, os.cpu_count() or 1),
                   help="parallel compile processes on a GPU run (default: CPU count, at most 16)")
    o.add_argument("--measure-timeout", type=positive, default=120, metavar="S",
                   help="seconds one config may take (compile included) before it counts as hung (default 120; "
                   "compile workers are waited for at most half of it)")
    device_option(o)
    o.add_argument("--timing", choices=("graph", "eager"), default="graph",
                   help="time CUDA-graph replays (default; how engines run decode) or eager launches (prefill)")
    o.add_argument("--l2", choices=("cold", "warm"), default="cold",
                   help="flush the L2 cache before each timed run (cold, default) or leave it warm")
    o.add_argument("--recycle-after", type=positive, default=256, metavar="N",
                   help="configs a measuring worker serves before it is replaced (default 256)")
    o.add_argument("--dry-run", action="store_true", help="print the plan and stop (no GPU needed)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def add_gemm_parser(sub, common) -> None:
    """`tuner gemm`: the block-FP8 GEMM of every linear layer."""
    sub.add_parser("gemm", parents=[common], help="tune the block-FP8 GEMM of every linear layer",
                   description="Tune the block-scaled FP8 GEMM for every linear-layer shape a model runs per GPU.")


def add_moe_parser(sub, common) -> None:
    """`tuner moe`: the fused MoE layer."""
    moe = sub.add_parser("moe", parents=[common], help="tune the fused MoE layer",
                         description="Tune the fused MoE layer: vLLM's table (whole layer, one config) and "
                         "SGLang's up and _down tables.")
    moe.add_argument("--routing", default="uniform", metavar="uniform|zipf|FILE",
                     help="top-k routing used for timing: uniformly random like the engines' tuners (default), "
                     "Zipf-skewed, or recorded from a served model: SGLang's per-token expert-distribution dump, "
                     "or a .npy/.pt of expert ids [tokens, topk] (sampled per M; named in the table's identity)")


def add_mla_parser(sub, common) -> None:
    """`tuner mla`: MLA decode attention."""
    mla = sub.add_parser("mla", parents=[common], help="tune MLA decode attention",
                         description="Tune the two-stage MLA decode kernel per batch size and context bucket.")
    mla.add_argument("--contexts", type=context, nargs="+", metavar="TOKENS", default=None,
                     help="context buckets (default 1024 ... 65536, as far as the model reaches)")
    mla.add_argument("--page-size", type=page, default=64, help="KV cache page size (default 64)")


def run(args) -> int:
    """tuner gemm, moe and mla: 0, or 1 when a study of a requested batch size timed no config
    (said in one line on stderr, with the first failure's text) or a --minutes window too short to
    make progress (said with the length it needs)."""
    import sys

    from tuner.pipeline.request import TuneRequest
    from tuner.pipeline.tune import tune
    from tuner.search.outcomes import untimed_line
    left: dict = {}
    done = tune(TuneRequest.from_args(args), left=left)
    line = untimed_line(done)
    if line:
        print(f"tuner: {line}", file=sys.stderr)
        return 1
    if left.get("stalled"):          # a --minutes window that cannot make progress: said, and not a success
        print(f"tuner: {left['stalled']}", file=sys.stderr)
        return 1
    return 0


