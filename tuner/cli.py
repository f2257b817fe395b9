"""Command line: `tuner gemm ...` (and the other kernel commands built on the same options).

Bad input ends with one line on stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tuner import __version__
from tuner.api import DEFAULT_TRIALS, DTYPES, MLA_BATCH_SIZES, SAMPLERS, check_out_dir, kernel_runs, only_problems  # noqa: F401
from tuner.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES
from tuner.errors import TunerError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise TunerError(f"{message} (see `{self.prog} --help`)")


def _integer(lo: int, hi: int, power_of_two: bool = False, why: str = ""):
    """An argparse type: an integer in [lo, hi] (and a power of two where asked)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}: {v}{why}")
        if power_of_two and v & (v - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two: {v}{why}")
        return v
    return parse


def _fraction(text: str) -> float:
    """A relative noise band: a number from 0 up to (not including) 1."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= v < 1:                    # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1 (0.02 is 2%): {text}")
    return v


_positive = _integer(1, 1 << 20)
_batch = _integer(1, 1 << 20, why=" (batch sizes are tokens per step)")
_parallel = _integer(1, 1024)
_workers = _integer(0, 256)
_page = _integer(1, 1024, power_of_two=True, why=" (the KV cache block size of vLLM and SGLang)")
_context = _integer(1, 1 << 24)


def _common_options() -> _Parser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("what to tune")
    g.add_argument("--model", required=True, help="name in configs/models/ (deepseek-v3, ...) or a path to "
                   "a Hugging Face config.json or one of our YAML files")
    g.add_argument("--gpu", required=True, help="H100, H200, H100-PCIe, H100-NVL, H200-NVL, H800, H20")
    g.add_argument("--dtype", default=None, help="precision (gemm, moe: fp8_w8a8 (default); moe: bf16; "
                   "mla: bf16 KV cache)")
    g.add_argument("--tp", type=_parallel, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--ep", type=_parallel, default=1, help="expert-parallel size (default 1)")
    g.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None,
                   help="batch sizes to tune (default: the engines' grid, 1 to 4096; mla: 1 to 256)")
    g.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES),
                   help="whose tables to write (default both)")
    g.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                   help="tune only the problems whose key holds one of these texts, e.g. N=7168,K=2048 "
                   "(the plan lists the keys)")
    s = p.add_argument_group("search")
    s.add_argument("--trials", type=_positive, default=None,
                   help="measured configs per batch size (default 48 for gemm, 32 for moe)")
    s.add_argument("--patience", type=_positive, default=None,
                   help="stop a study after this many trials without a 0.5%% gain, once 3/4 of the budget "
                   "is measured (default trials/2)")
    s.add_argument("--sampler", default=SAMPLERS[0], choices=SAMPLERS,
                   help="gp (default): a Gaussian process over the study's own candidates; tpe, random, cmaes: Optuna's")
    s.add_argument("--seed", type=int, default=0, help="sampler seed")
    s.add_argument("--space", default=None, help="search-space YAML (default configs/spaces/<kernel>.yaml)")
    s.add_argument("--baseline", default=None, metavar="DIR",
                   help="folder of shipped tables: seeds each study with the shipped config")
    s.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL (default sqlite:///OUT/studies.db); a stopped run resumes from it")
    s.add_argument("--study-prefix", default="", metavar="NAME",
                   help="prefix of this run's study names, so several runs can share one storage "
                   "(and `tuner worker` processes can join it)")
    k = p.add_argument_group("whose kernel is timed")
    k.add_argument("--kernel-source", choices=("engine", "ours"), default=None,
                   help="engine (default): each engine's tables are timed on that engine's own Triton kernel, "
                   "read from the installed engine or --engine-source; ours: on our kernels in kernels/ "
                   "(with --replay: the landscape's)")
    k.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                   help="the engines' released wheels, folders holding them, or folders made by "
                   "`tuner engine-source extract` (default: the installed engines, then $TUNER_ENGINE_WHEELS)")
    o = p.add_argument_group("measuring and output")
    o.add_argument("--out", default=None, metavar="DIR", help="results folder (default runs/<kernel>-<model>-<gpu>-tp<N>)")
    o.add_argument("--replay", default=None, metavar="FILE", help="time by replaying a recorded landscape (no GPU)")
    o.add_argument("--record", default=None, metavar="FILE", help="time the whole pruned grid on the GPU into a landscape")
    o.add_argument("--gpus", default=None, metavar="LIST",
                   help="GPUs to use, e.g. 0,1,2,3 (default: every visible GPU); more than one runs a "
                   "worker process per GPU on shared studies")
    o.add_argument("--compile-workers", type=_workers, default=min(16, os.cpu_count() or 1),
                   help="parallel compile processes on a GPU run (default: CPU count, at most 16)")
    o.add_argument("--measure-timeout", type=_positive, default=300, metavar="S",
                   help="seconds one config may take (compile included) before it counts as hung (default 300)")
    o.add_argument("--recycle-after", type=_positive, default=256, metavar="N",
                   help="configs a measuring worker serves before it is replaced (default 256)")
    o.add_argument("--dry-run", action="store_true", help="print the plan and stop (no GPU needed)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Autotune Triton kernel launch configs for Hopper GPUs "
                     "and write the tables vLLM and SGLang read.")
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _common_options()
    sub.add_parser("gemm", parents=[common], help="tune the block-FP8 GEMM of every linear layer",
                   description="Tune the block-scaled FP8 GEMM for every linear-layer shape a model runs per GPU.")
    worker = sub.add_parser("worker", help="join a run stored in a shared storage and measure on this GPU",
                            description="Measure trials of the runs stored under a study prefix, on this "
                            "machine's GPU (or a replayed landscape). Start any number, on any hosts.")
    worker.add_argument("--storage", required=True, metavar="URL", help="the run's Optuna storage URL")
    worker.add_argument("--study-prefix", default="", metavar="NAME")
    worker.add_argument("--replay", default=None, metavar="FILE", help="measure by replaying a landscape")
    worker.add_argument("--compile-workers", type=_workers, default=min(16, os.cpu_count() or 1))
    worker.add_argument("--measure-timeout", type=_positive, default=300, metavar="S")
    worker.add_argument("--recycle-after", type=_positive, default=256, metavar="N")
    worker.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                        help="where this machine has the engines' code, for plans timed on an engine's kernel "
                        "(default: where the plan's machine had it, the installed engine, $TUNER_ENGINE_WHEELS)")
    worker.add_argument("--quiet", action="store_true")
    collect = sub.add_parser("collect", help="write the tables of a run stored in a shared storage",
                             description="Write each engine's tables and the manifest from the finished "
                             "studies of the runs under a study prefix.")
    collect.add_argument("--storage", required=True, metavar="URL")
    collect.add_argument("--study-prefix", default="", metavar="NAME")
    collect.add_argument("--out", required=True, metavar="DIR")
    collect.add_argument("--wait", action="store_true", help="wait until every study has finished")
    inst = sub.add_parser("install", help="put a results folder's tables where an engine reads them",
                          description="Install tuned tables into an engine's package (or a folder for its "
                          "config-directory variable); replaced files are backed up, --restore undoes it.")
    inst.add_argument("results", nargs="?", help="a results folder (with manifest.json)")
    inst.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    inst.add_argument("--site-packages", default=None, metavar="DIR",
                      help="the site-packages of the environment that runs the engine (default: this Python's)")
    inst.add_argument("--moe-config-dir", default=None, metavar="DIR",
                      help="put MoE tables in DIR for VLLM_TUNED_CONFIG_FOLDER / SGLANG_MOE_CONFIG_DIR instead")
    inst.add_argument("--gpu", default=None, help="the GPU the engine runs on (default: this machine's, if any)")
    inst.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    inst.add_argument("--force", action="store_true",
                      help="install tables measured on another device or Triton, or not numerically checked")
    inst.add_argument("--restore", action="store_true", help="undo the last install for --engine")
    rep = sub.add_parser("report", help="tables and plots of a results folder",
                         description="Print a results folder's tuned times and speedups, and write a Markdown "
                         "report with plots (RUN/report/report.md).")
    rep.add_argument("run", help="a results folder (with manifest.json)")
    rep.add_argument("--out", default=None, metavar="FILE", help="where the Markdown goes")
    dif = sub.add_parser("diff", help="compare two results folders",
                         description="Per problem and M: old time, new time, change, and whether it is "
                         "beyond noise; writes a Markdown report with plots.")
    dif.add_argument("old")
    dif.add_argument("new")
    dif.add_argument("--out", default=None, metavar="DIR", help="where diff.md and plots go (default NEW/diff)")
    dif.add_argument("--noise", type=_fraction, default=0.02, help="smallest change that counts (default 0.02 = 2%%)")
    dif.add_argument("--force", action="store_true",
                     help="compare runs that share no problem, or replace a diff.md of another comparison")
    drift = sub.add_parser("drift", help="does a table still beat the default config here?",
                           description="Time each table's configs against the engines' default config on "
                           "this GPU and software (or a landscape) and say, per M, whether the table still wins.")
    drift.add_argument("tables", nargs="+", help="table files or folders (an engine's configs folder, a results folder)")
    drift.add_argument("--gpu", required=True)
    drift.add_argument("--model", default=None, help="needed for fused-MoE tables (hidden size, top-k)")
    drift.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                       help="fused MoE: how tokens are routed to experts while timing: uniformly at random like "
                       "the engines' tuners (default, as the tables were tuned), or Zipf-skewed like real traffic")
    drift.add_argument("--replay", default=None, metavar="FILE", help="time from a landscape instead of the GPU")
    drift.add_argument("--noise", type=_fraction, default=0.02,
                       help="a difference smaller than this fraction (or the measured spread, if larger) is a tie, "
                       "`same` (default 0.02 = 2%%)")
    drift.add_argument("--kernel-source", choices=("engine", "ours"), default=None,
                       help="engine (default): each engine's table on that engine's own kernel; ours: on ours "
                       "(with --replay: the landscape's)")
    drift.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                       help="the engines' wheels or extracted folders (default: installed, then $TUNER_ENGINE_WHEELS)")
    drift.add_argument("--out", default=None, metavar="FILE", help="also write the rows as JSON")
    night = sub.add_parser("nightly", help="check drift and retune the jobs of a YAML file",
                           description="One night of the retune loop over configs/nightly.yaml's jobs; exit 0 "
                           "fine, 3 a table regressed, 1 a job failed.")
    night.add_argument("config", help="the jobs YAML (see configs/nightly.yaml)")
    night.add_argument("--night", default=None, metavar="DATE", help="the night's folder name (default today)")
    land = sub.add_parser("landscape", help="make a SYNTHETIC landscape, or show what one covers",
                          description="`synth`: write a landscape timed by a SYNTHETIC cost model (not a GPU), to "
                          "try --replay without a GPU; `info FILE`: what a landscape covers.")
    land_sub = land.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    synth = land_sub.add_parser("synth", help="write a SYNTHETIC landscape (a cost model; nothing is measured)")
    synth.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    synth.add_argument("--model", required=True)
    synth.add_argument("--gpu", required=True)
    synth.add_argument("--tp", type=_parallel, default=1)
    synth.add_argument("--ep", type=_parallel, default=1)
    synth.add_argument("--dtype", default=None)
    synth.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    synth.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    synth.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None)
    synth.add_argument("--contexts", type=_context, nargs="+", metavar="TOKENS", default=None)
    synth.add_argument("--page-size", type=_page, default=64)
    synth.add_argument("--kernel-source", choices=("ours", *ENGINE_NAMES), default="ours",
                       help="whose kernel's configs (space, keys) it covers (default ours)")
    synth.add_argument("--out", required=True, metavar="FILE", help="the landscape (.jsonl or .jsonl.gz)")
    info = land_sub.add_parser("info", help="show what a landscape covers")
    info.add_argument("file")
    bench = sub.add_parser("bench", help="time every contender per batch size against the roofline",
                           description="Per problem and M: the engine's default config, each shipped table "
                           "(--baseline), our tuned table (--tuned), a landscape's best, and a reference outside "
                           "Triton where one exists, timed together, with their spread and their fraction of the "
                           "roofline. Writes bench-<device>-<date>.json, a Markdown report and a plot per problem.")
    bench.add_argument("--model", required=True)
    bench.add_argument("--gpu", required=True)
    bench.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    bench.add_argument("--tp", type=_parallel, default=1)
    bench.add_argument("--ep", type=_parallel, default=1)
    bench.add_argument("--dtype", default=None, help="gemm, moe: fp8_w8a8 (default); moe: bf16")
    bench.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    bench.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None,
                       help="default: the engines' grid (mla: 32 64 128)")
    bench.add_argument("--contexts", type=_context, nargs="+", metavar="TOKENS", default=None,
                       help="mla: context buckets (default 4096 8192 32768)")
    bench.add_argument("--page-size", type=_page, default=64, help="mla: KV cache page size")
    bench.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    bench.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                       help="bench only the problems whose key holds one of these texts")
    bench.add_argument("--tuned", default=None, metavar="RUN_DIR", help="one of our results folders")
    bench.add_argument("--baseline", nargs="+", default=None, metavar="DIR",
                       help="folders of shipped tables, e.g. ../shared/baselines/vllm-0.33.0")
    bench.add_argument("--replay", default=None, metavar="FILE", help="time from a landscape (no GPU)")
    bench.add_argument("--kernel-source", nargs="+", choices=("engine", "ours"), default=["engine"],
                       help="whose kernels time the configs; several side by side (default: engine)")
    bench.add_argument("--engine-source", nargs="+", metavar="PATH", default=None)
    bench.add_argument("--ceilings", default=None, metavar="FILE",
                       help="measured ceilings (default bench/ceilings/<gpu>.json, else datasheet figures)")
    bench.add_argument("--compile-workers", type=_workers, default=min(16, os.cpu_count() or 1))
    bench.add_argument("--out", required=True, metavar="DIR")
    bench.add_argument("--quiet", action="store_true")
    proof = sub.add_parser("proof", help="the whole GPU proof in one unattended call (scripts/gpu_proof.sh)",
                           description="Environment and ceilings, kernels against the reference, landscapes, the "
                           "DeepSeek-V3 TP8 MoE tune, benches and the sampler study, each step time-boxed and "
                           "written before the next; summary.md at the end. --fake runs the same flow on a CPU "
                           "over SYNTHETIC landscapes (for tests).")
    proof.add_argument("--gpu", default="H100", help="the GPU of the machine (default H100)")
    proof.add_argument("--minutes", type=float, default=25.0, help="the whole budget (default 25)")
    proof.add_argument("--out", default=None, metavar="DIR",
                       help="default bench/results/<gpu>-<date>/ (with --fake: runs/proof-fake-<date>/)")
    proof.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                       help="the engines' code (default: the folders in .engine-src/, else the installed engines, "
                       "else $TUNER_ENGINE_WHEELS)")
    proof.add_argument("--baselines", default=None, metavar="DIR",
                       help="the engines' shipped tables (default .baselines/, else ../shared/baselines)")
    proof.add_argument("--fake", action="store_true", help="no GPU: SYNTHETIC landscapes and a small model")
    proof.add_argument("--steps", nargs="+", default=None, choices=("environment", "validate", "landscapes", "tune",
                                                                   "bench", "sampler"),
                       help="run only these steps (a proof split over several calls into one folder; the summary "
                       "keeps the other steps' earlier results)")
    ceil = sub.add_parser("ceilings", help="measure this GPU's copy bandwidth and matmul rates",
                          description="Measure device-to-device copy bandwidth (bytes read plus written), FP8 "
                          "and BF16 dense matmul rates at 8192^3, L2 size and SM count; bench, drift and the "
                          "plan read them for rooflines. Needs the GPU.")
    ceil.add_argument("--gpu", required=True)
    ceil.add_argument("--out", default=None, metavar="FILE", help="default bench/ceilings/<gpu>.json")
    chk = sub.add_parser("check", help="run a table's configs against the reference on a chosen kernel",
                         description="Run every config of a table (the engine's own format; every M in it, or "
                         "those given) on a kernel against the float64 reference; one line per config, exit 1 "
                         "if any fails. On a GPU the compiled kernel runs; without one, Triton's interpreter.")
    chk.add_argument("--model", required=True, help="as for tuner gemm/moe/mla (a small HF config.json keeps a "
                     "CPU check fast)")
    chk.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    chk.add_argument("--table", required=True, metavar="FILE", help="the table to check")
    chk.add_argument("--kernel-source", default="engine", choices=("engine", "ours", *ENGINE_NAMES),
                     help="engine (default): the kernel of the engine the table is for; ours; or vllm/sglang")
    chk.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                     help="the engines' wheels or extracted folders (default: installed, then $TUNER_ENGINE_WHEELS)")
    chk.add_argument("--tp", type=_parallel, default=1)
    chk.add_argument("--ep", type=_parallel, default=1)
    chk.add_argument("--dtype", default="fp8_w8a8", choices=("fp8_w8a8", "bf16"))
    chk.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    chk.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None,
                     help="check these batch sizes (the entry the engine would use for each) instead of every M")
    chk.add_argument("--seed", type=int, default=None, help="input seed (default: fresh random inputs)")
    src = sub.add_parser("engine-source", help="copy the engine files the launchers need out of a wheel",
                         description="Extract, from an engine's wheel (or the installed engine), the few source "
                         "files whose kernels tuner times, into a folder small enough to carry to a GPU machine "
                         "without network; give that folder as --engine-source.")
    src_sub = src.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    ext = src_sub.add_parser("extract", help="extract the kernel files of an engine")
    ext.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    ext.add_argument("--from", dest="source", default=None, metavar="PATH",
                     help="the engine's wheel or a folder holding it (default: the installed engine, then "
                     "$TUNER_ENGINE_WHEELS)")
    ext.add_argument("--out", required=True, metavar="DIR")
    moe = sub.add_parser("moe", parents=[common], help="tune the fused MoE layer",
                         description="Tune the fused MoE layer: vLLM's table (whole layer, one config) and "
                         "SGLang's up and _down tables.")
    moe.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                     help="top-k routing used for timing: uniformly random like the engines' tuners "
                     "(default), or Zipf-skewed like real traffic")
    mla = sub.add_parser("mla", parents=[common], help="tune MLA decode attention",
                         description="Tune the two-stage MLA decode kernel per batch size and context bucket.")
    mla.add_argument("--contexts", type=_context, nargs="+", metavar="TOKENS", default=None,
                     help="context buckets (default 1024 ... 65536, as far as the model reaches)")
    mla.add_argument("--page-size", type=_page, default=64, help="KV cache page size (default 64)")
    return parser


def cmd_worker(args) -> int:
    from tuner.measure import require_gpu
    from tuner.progress import Progress
    from tuner.tune import load_plans, make_measurer, open_checked_storage, tune_all

    storage = open_checked_storage(args.storage)
    for opts in load_plans(storage, args.study_prefix, load_code=not args.replay, engine_source=args.engine_source,
                           replay=args.replay, storage=args.storage,
                           compile_workers=args.compile_workers, measure_timeout=args.measure_timeout,
                           recycle_after=args.recycle_after):
        if not args.replay:
            require_gpu(opts.gpu.cuda_name, "a worker", "--replay FILE measures from a recorded landscape")
        progress = Progress(sum(len(opts.ms_for(p)) for p in opts.problems), enabled=not args.quiet)
        measurer = make_measurer(opts, progress)
        try:
            tune_all(opts, storage, measurer, progress)
        finally:
            measurer.close()
    return 0


def cmd_collect(args) -> int:
    from tuner.tune import collect, load_plans, open_checked_storage, results_table

    out = Path(args.out)
    check_out_dir(out)
    storage = open_checked_storage(args.storage)
    for opts in load_plans(storage, args.study_prefix, out_dir=out, storage=args.storage):
        results = collect(opts, storage, wait=args.wait)
        table = results_table(results, opts.kernel.config_keys)
        if not table.empty:
            print(table.to_string(index=False))
    print(f"tables and manifest in {args.out}/")
    return 0


def cmd_install(args) -> int:
    from tuner import api
    from tuner import install as inst

    if args.restore:
        for line in inst.restore(args.engine):
            print(line)
        return 0
    if not args.results:
        raise TunerError("give a results folder to install (or --restore)")
    api.install_results(args.results, args.engine, args.site_packages, args.moe_config_dir, args.gpu, args.force,
                        args.dry_run)
    return 0


def cmd_drift(args) -> int:
    from tuner.drift import Measurers, find_tables, measure_drift
    from tuner.failures import count_by_kind, summary
    from tuner.gpus import get_gpu
    from tuner.models import load_model
    from tuner.paths import atomic_write_json

    gpu = get_gpu(args.gpu)
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    tables = find_tables(args.tables, load_model(args.model) if args.model else None, args.routing)
    measurers = Measurers(gpu, args.replay, kernel_source=args.kernel_source, engine_source=args.engine_source)
    try:
        df = measure_drift(tables, measurers, args.noise)
    finally:
        measurers.close()
    from tuner.provenance import banner
    print(banner(measurers.environment(), "replay" if args.replay else "gpu"))
    print(drift_table(df).to_string(index=False))
    losing = df[df["verdict"].isin(["loses", "fails"])]
    print(f"{len(losing)} of {len(df)} entries no longer beat the default" if len(losing)
          else f"all {len(df)} entries still win or tie")
    failed = count_by_kind(df["failure"])
    if failed:
        print(f"tables' configs that failed, by kind: {summary(failed)}")
    if args.out:
        atomic_write_json(Path(args.out), df.to_dict(orient="records"))
    return 0


def drift_table(df):
    """Drift rows for a terminal: times to two decimals, a failed time as '-' with its reason."""
    def num(v):
        return f"{v:.2f}" if isinstance(v, float) and v == v else "-"
    out = df[["engine", "kernel_source", "problem", "M"]].copy()
    out["table_us"] = [num(v) for v in df["table_us"]]
    out["default_us"] = [num(v) for v in df["default_us"]]
    out["speedup"] = [num(v) for v in df["speedup"]]
    out["verdict"] = df["verdict"]
    out["note"] = [(f"table: {e}" if isinstance(e, str) else "") + ("; " if isinstance(e, str) and isinstance(d, str)
                   else "") + (f"default: {d}" if isinstance(d, str) else "")
                   for e, d in zip(df["error"], df["default_error"])]
    return out


def cmd_nightly(args) -> int:
    from tuner.nightly import run_night
    return run_night(Path(args.config), args.night, log=lambda line: print(line, flush=True))


def cmd_report(args) -> int:
    from tuner.report import run_source, write_report
    df, path = write_report(Path(args.run), Path(args.out) if args.out else None)
    source = run_source(Path(args.run))
    print(source)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    from tuner.report import _geomean
    g = _geomean(df["speedup"])
    if g:
        print(f"Geometric-mean speedup over the engines' default config"
              f"{' (SYNTHETIC: not a measurement)' if 'SYNTHETIC' in source else ''}: {g:.2f}x")
    print(f"report: {path}")
    return 0


def cmd_diff(args) -> int:
    from tuner.report import write_diff
    out = Path(args.out) if args.out else Path(args.new) / "diff"
    df, path = write_diff(Path(args.old), Path(args.new), out, args.noise, args.force)
    from tuner.report import run_source
    sources = run_source(Path(args.old)), run_source(Path(args.new))
    print(f"old: {sources[0]}")
    print(f"new: {sources[1]}")
    if sources[0] != sources[1]:
        print("warning: the two runs' times come from different sources: a change may be the source's, not the tables'")
    cols = ["problem", "M", "time_us_old", "time_us_new", "change_pct", "verdict"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    counts = df["verdict"].value_counts().to_dict()
    print(f"{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower, {counts.get('same', 0)} same; "
          f"report: {path}")
    return 0


def _problem_builder(args, command: str):
    """(kernel name, model -> problems) of a kernel command, as tuning builds them."""
    from tuner.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    if command == "gemm":
        return "fp8_gemm", lambda model: gemm_problems(model, args.tp, args.ep)
    if command == "moe":
        return "fused_moe", lambda model: moe_problems(model, args.tp, args.ep, args.dtype, args.routing, args.engines)
    return "mla_decode", lambda model: mla_problems(model, args.tp, args.contexts or DEFAULT_CONTEXTS,
                                                    args.page_size)[0]


def cmd_bench(args) -> int:
    import copy

    from tuner import bench as bench_mod
    from tuner import ceilings as ceilings_mod
    from tuner.gpus import get_gpu
    from tuner.models import load_model

    args.dtype = args.dtype or DTYPES[args.kernel][0]
    if args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported by `tuner bench --kernel {args.kernel}`")
    if args.kernel == "mla":
        args.contexts = args.contexts or [4096, 8192, 32768]
    batch_sizes = sorted(set(args.batch_sizes or ([32, 64, 128] if args.kernel == "mla" else DEFAULT_BATCH_SIZES)))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    for folder in args.baseline or []:
        if not Path(folder).is_dir():
            raise TunerError(f"--baseline {folder} is not a folder")
    tuned = Path(args.tuned) if args.tuned else None
    if tuned is not None and not (tuned / "manifest.json").is_file():
        raise TunerError(f"--tuned {tuned} holds no manifest.json: not one of our results folders")
    gpu = get_gpu(args.gpu)
    model = load_model(args.model)
    ceilings = ceilings_mod.load(gpu, args.ceilings)
    kernel_name, make_problems = _problem_builder(args, args.kernel)
    problems = only_problems(make_problems(model), args.only)
    baselines = [(Path(d).name, d) for d in args.baseline or []]
    if not args.replay:
        from tuner.measure import require_gpu
        require_gpu(gpu.cuda_name, "a bench", "--replay FILE benches a recorded landscape")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    rows: list = []
    measurers: list = []
    notes: list[str] = []
    try:
        modes = list(dict.fromkeys(args.kernel_source))
        if args.replay:
            from tuner.kernel_sources import source_mode
            recorded = source_mode(None, args.replay)
            if len(modes) > 1:
                say(f"note: a landscape holds one kernel's timings: benching {recorded}'s only")
            modes = [recorded if m == "engine" else m for m in modes[:1]]
        for mode in modes:
            ns = copy.copy(args)
            ns.kernel_source, ns.dry_run = mode, False
            for kernel, probs in kernel_runs(ns, kernel_name, problems, notes):
                measurer = _bench_measurer(args, kernel, gpu)
                measurers.append(measurer)
                landscape = getattr(measurer, "landscape", None)
                ms = {}
                for p in probs:
                    covered = [m for m in batch_sizes if landscape is None or landscape.lookup(p.params, m)]
                    if len(covered) < len(batch_sizes):
                        say(f"note: {p.key}: the landscape lacks M={','.join(str(m) for m in batch_sizes if m not in covered)}")
                    ms[p.key] = covered
                rows += bench_mod.bench_kernel(kernel, probs, ms, gpu, ceilings, measurer, baselines, tuned,
                                               landscape, progress=say)
        header = bench_mod.bench_header(measurers, gpu, ceilings, {"model": model.name, "tp": args.tp, "ep": args.ep,
                                                                    "kernel": kernel_name}, out)
        json_path, md_path = bench_mod.write_outputs(rows, out, header)
    finally:
        for m in measurers:
            m.close()
    if not rows:
        raise TunerError("nothing was benched: no problem and batch size is covered")
    print(header["banner"])
    import pandas as pd
    df = pd.DataFrame([r.as_dict() for r in rows])
    df["time_us"] = [f"{t:.3g}" if t == t and t is not None else "-" for t in df["time_us"]]
    df["of_roofline"] = [f"{f:.0%}" if f == f and f is not None else "-" for f in df["roofline_fraction"]]
    df["note"] = [e[:60] if isinstance(e, str) else "" for e in df["error"]]
    show = df[["kernel_source", "problem", "M", "contender", "time_us", "of_roofline", "note"]]
    print(show.to_string(index=False))
    print(f"roofline: {ceilings.source}; results: {json_path} and {md_path}")
    return 0


def _bench_measurer(args, kernel, gpu):
    if args.replay:
        from tuner.measure import ReplayMeasurer
        return ReplayMeasurer.from_file(args.replay, kernel, gpu.cuda_name)
    from tuner.isolation import isolated_gpu_measurer
    return isolated_gpu_measurer(kernel, gpu.key, args.compile_workers)


def cmd_landscape(args) -> int:
    from tuner.landscape import describe, read_header, read_landscape
    if args.action == "info":
        from kernels import KERNEL_MODULES, get_kernel
        header = read_header(args.file)
        if not isinstance(header, dict) or header.get("kernel") not in KERNEL_MODULES:
            raise TunerError(f"{args.file} is not a landscape of a known kernel (header: {str(header)[:80]})")
        source = header.get("kernel_source", "ours")
        kernel = get_kernel(header["kernel"], source, load_code=False) if source != "ours" else get_kernel(header["kernel"])
        for line in describe(read_landscape(args.file, kernel)):
            print(line)
        return 0
    if args.action != "synth":
        raise TunerError("say what to do: `tuner landscape synth ...` or `tuner landscape info FILE`")
    from kernels import get_kernel
    from tuner.gpus import get_gpu
    from tuner.models import load_model
    from tuner.space import load_space
    from tuner.synthetic import write_synthetic_landscape

    args.dtype = args.dtype or DTYPES[args.kernel][0]
    if args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported for --kernel {args.kernel}")
    out = Path(args.out)
    if out.exists():
        raise TunerError(f"{out} exists; remove it or give another --out")
    gpu = get_gpu(args.gpu)
    kernel_name, make = _problem_builder(args, args.kernel)
    kernel = get_kernel(kernel_name, args.kernel_source, load_code=False) if args.kernel_source != "ours" \
        else get_kernel(kernel_name)
    problems = make(load_model(args.model))
    if args.kernel_source != "ours":
        problems = [p for p in problems if args.kernel_source in p.engines]
        if not problems:
            raise TunerError(f"{args.kernel_source} reads none of this model's {kernel_name} tables")
    ms = sorted(set(args.batch_sizes or ([1, 2, 4, 8, 16, 32, 64, 128, 256] if args.kernel == "mla"
                                         else DEFAULT_BATCH_SIZES)))
    n = write_synthetic_landscape(out, kernel, load_space(kernel), gpu, [p.params for p in problems], ms)
    print(f"wrote {n} SYNTHETIC points ({len(problems)} problems x {len(ms)} batch sizes) to {out}: a cost model, "
          "not a GPU; replay it with --replay to try the tool, never to choose configs")
    return 0


def cmd_proof(args) -> int:
    from tuner import proof as proof_mod
    from tuner.gpus import get_gpu
    gpu = get_gpu(args.gpu)
    if not 0 < args.minutes <= 24 * 60:            # NaN fails this too
        raise TunerError(f"--minutes must be more than 0 and at most a day, not {args.minutes}")
    if not args.fake:
        from tuner.measure import require_gpu
        require_gpu(gpu.cuda_name, "the GPU proof", "--fake runs its flow over SYNTHETIC landscapes")
    out = Path(args.out) if args.out else proof_mod.default_out(gpu, args.fake)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    baselines = Path(args.baselines) if args.baselines else proof_mod.default_baselines()
    if args.baselines and not Path(args.baselines).is_dir():
        raise TunerError(f"--baselines {baselines} is not a folder")
    run = proof_mod.Proof(out, gpu, args.minutes, args.fake, args.engine_source or proof_mod.default_engine_source(),
                          baselines)
    return run.execute(log=lambda line: print(line, flush=True), only=args.steps)


def cmd_ceilings(args) -> int:
    from tuner import ceilings as ceilings_mod
    from tuner.gpus import get_gpu
    gpu = get_gpu(args.gpu)
    path = Path(args.out) if args.out else ceilings_mod.default_path(gpu)
    if path.exists() and path.is_dir():
        raise TunerError(f"--out {path} is a folder; give a file name")
    data = ceilings_mod.measure(gpu)
    ceilings_mod.write(data, path)
    for line in ceilings_mod.summary_lines(data):
        print(line)
    print(f"ceilings: {path}")
    return 0


def cmd_check(args) -> int:
    from tuner.check import run_check
    from tuner.models import gemm_problems, load_model, moe_problems

    table = Path(args.table)
    if not table.is_file():
        raise TunerError(f"table {table} not found")
    kernel_name, make_problems = {
        "gemm": ("fp8_gemm", lambda model, engine: gemm_problems(model, args.tp, args.ep)),
        "moe": ("fused_moe", lambda model, engine: moe_problems(model, args.tp, args.ep, args.dtype,
                                                                  args.routing, [engine])),
        "mla": ("mla_decode", None),            # our own format: the table holds its problems
    }[args.kernel]
    rows = run_check(kernel_name, table, load_model(args.model), make_problems, args.routing, args.kernel_source,
                     args.engine_source, args.batch_sizes, args.seed, log=lambda line: print(line, flush=True))
    failed = sum(r.status != "pass" for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_engine_source(args) -> int:
    from tuner.kernel_sources import extract
    if args.action != "extract":
        raise TunerError("say what to do: `tuner engine-source extract --engine vllm --out DIR`")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file")
    folder = extract(args.engine, args.source, out)
    files = sorted(p for p in folder.rglob("*.py"))
    size = sum(p.stat().st_size for p in files)
    print(f"{len(files)} {args.engine} files ({size / 1024:.0f} KiB) in {folder}/; use it as --engine-source {folder}")
    return 0


def cmd_tune(args) -> int:
    """tuner gemm, moe and mla."""
    from tuner import api
    api.tune(api.TuneRequest.from_args(args))
    return 0


class _StderrLines(logging.Handler):
    """The 'tuner' logger's diagnostics as 'tuner: ...' lines on stderr (the stream of the
    moment, so that a caller that swaps sys.stderr gets them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"tuner: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never take the run down
            self.handleError(record)


COMMANDS = {"proof": cmd_proof, "landscape": cmd_landscape, "bench": cmd_bench, "ceilings": cmd_ceilings,
            "check": cmd_check, "engine-source": cmd_engine_source, "nightly": cmd_nightly, "drift": cmd_drift,
            "install": cmd_install, "report": cmd_report, "diff": cmd_diff, "gemm": cmd_tune, "moe": cmd_tune,
            "mla": cmd_tune, "worker": cmd_worker, "collect": cmd_collect}


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping us, kill): handled like Ctrl-C, so atomic writes clean
    up and the storage is left resumable."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _innermost_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)parser of the command line's subcommand (`tuner landscape synth`'s, say)."""
    for dest in ("command", "action"):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not subs or name not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def _setup_logging() -> None:
    """Warnings and worse by default; TUNER_LOG=info or debug shows more (how stale trials
    were cleared, storage retries)."""
    logger = logging.getLogger("tuner")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines())
    level = os.environ.get("TUNER_LOG", "warning").upper()
    logger.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "WARNING")
    # SQLAlchemy logs a traceback ("Error closing cursor") when Ctrl-C or SIGTERM lands inside
    # a query; the interruption is reported in one line of ours, and a real storage error
    # still raises. TUNER_LOG=debug shows them.
    sa = logging.getLogger("sqlalchemy")
    if level != "DEBUG" and not any(isinstance(h, logging.NullHandler) for h in sa.handlers):
        sa.addHandler(logging.NullHandler())
        sa.propagate = False


def main(argv: list[str] | None = None) -> int:
    import signal
    _setup_logging()
    parser = build_parser()
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
        pass                       # not the main thread (tests calling main in a thread)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:           # said by the subcommand's parser, so that the hint names its --help
            _innermost_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        if not args.command:
            parser.print_help()
            return 2
        return COMMANDS[args.command](args)
    except TunerError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, _Terminated) else "interrupted"
        print(f"tuner: {what}; what was finished is kept (finished trials in the storage, whole files only): "
              "run the same command to resume", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except BrokenPipeError:
        # the reader went away (`tuner diff ... | head`): nothing left to say to anyone
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as e:  # noqa: BLE001 - never a traceback unless asked for
        if os.environ.get("TUNER_DEBUG"):
            raise
        from tuner.paths import is_disk_full
        if is_disk_full(e):
            where = getattr(e, "filename", None)
            print(f"tuner: error: no space left on the device{f' writing {where}' if where else ''}; free some "
                  "and run the same command again (finished work is kept)", file=sys.stderr)
            return 2
        if isinstance(e, PermissionError):
            print(f"tuner: error: permission denied: {e.filename or e}", file=sys.stderr)
            return 2
        print(f"tuner: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set TUNER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
