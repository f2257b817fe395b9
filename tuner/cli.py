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
from tuner.api import (  # noqa: F401
    DEFAULT_TRIALS,
    DTYPES,
    MLA_BATCH_SIZES,
    SAMPLERS,
    check_out_dir,
    command_dtype,
    kernel_runs,
    only_problems,
)
from tuner.errors import TunerError
from tuner.plan.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES


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
    g.add_argument("--dtype", default=None, help="precision (moe: fp8_w8a8 or bf16, default the checkpoint's own "
                   "(its quantization_config; bf16 when it has none); gemm: fp8_w8a8; mla: bf16 KV cache)")
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
    s.add_argument("--traffic", default=None, metavar="FILE",
                   help="gemm, moe: a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): "
                   "the table's keys, the trial budget and kept defaults follow the batch sizes served")
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
                   "`tuner engine-source extract` (default: the installed engines, then $TUNER_ENGINE_WHEELS)")
    _trust_option(k)
    o = p.add_argument_group("measuring and output")
    o.add_argument("--out", default=None, metavar="DIR", help="results folder (default runs/<kernel>-<model>-<gpu>-tp<N>)")
    o.add_argument("--replay", default=None, metavar="FILE", help="time by replaying a recorded landscape (no GPU)")
    o.add_argument("--record", default=None, metavar="FILE", help="time the whole pruned grid on the GPU into a landscape")
    o.add_argument("--gpus", default=None, metavar="LIST",
                   help="GPUs to use, e.g. 0,1,2,3 (default: every visible GPU); more than one runs a "
                   "worker process per GPU on shared studies")
    o.add_argument("--compile-workers", type=_workers, default=min(16, os.cpu_count() or 1),
                   help="parallel compile processes on a GPU run (default: CPU count, at most 16)")
    o.add_argument("--measure-timeout", type=_positive, default=120, metavar="S",
                   help="seconds one config may take (compile included) before it counts as hung (default 120; "
                   "compile workers are waited for at most half of it)")
    _device_option(o)
    o.add_argument("--recycle-after", type=_positive, default=256, metavar="N",
                   help="configs a measuring worker serves before it is replaced (default 256)")
    o.add_argument("--dry-run", action="store_true", help="print the plan and stop (no GPU needed)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    return p


DEVICE_HELP = ("what measures: cuda (default), the GPU; cpu, the CPU device: the GPU's whole code path (measuring "
               "child, compile workers compiling for sm_90, timeouts, numerics, tables) run on a CPU in Triton's "
               "interpreter, for CI and rehearsals; its times are labelled CPU DEVICE and mean nothing about a GPU")


def _device_option(group, default: str | None = "cuda", extra: str = "") -> None:
    group.add_argument("--device", choices=("cuda", "cpu"), default=default, help=DEVICE_HELP + extra)


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
    worker.add_argument("--measure-timeout", type=_positive, default=120, metavar="S")
    worker.add_argument("--recycle-after", type=_positive, default=256, metavar="N")
    _device_option(worker)
    worker.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                        help="where this machine has the engines' code, for plans timed on an engine's kernel "
                        "(default: where the plan's machine had it, the installed engine, $TUNER_ENGINE_WHEELS)")
    _trust_option(worker)
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
    inst.add_argument("--merge", action="store_true",
                      help="where a table would replace one covering batch sizes it lacks, keep the old entries for "
                      "those (recorded in the backup record); without it (or --force) such an install is refused")
    inst.add_argument("--restore", action="store_true", help="undo the last install for --engine")
    rep = sub.add_parser("report", help="tables and plots of a results folder",
                         description="Print a results folder's tuned times and speedups, and write a Markdown "
                         "report with plots (RUN/report/report.md).")
    rep.add_argument("run", help="a results folder (with manifest.json)")
    rep.add_argument("--out", default=None, metavar="FILE", help="where the Markdown goes")
    rep.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight) to judge the "
                     "tables by (default: the one the run was tuned for, if any)")
    rep.add_argument("--model", default=None,
                     help="the model whose layer counts give the per-pass estimate (default: the run's)")
    dif = sub.add_parser("diff", help="compare two results folders",
                         description="Per problem and M: old time, new time, change, and whether it is "
                         "beyond noise; writes a Markdown report with plots.")
    dif.add_argument("old")
    dif.add_argument("new")
    dif.add_argument("--out", default=None, metavar="DIR", help="where diff.md and plots go (default NEW/diff)")
    dif.add_argument("--noise", type=_fraction, default=0.02, help="smallest change that counts (default 0.02 = 2%%)")
    dif.add_argument("--force", action="store_true",
                     help="compare runs that share no problem, or replace a diff.md of another comparison")
    dif.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile to judge the change by (default: the one NEW, else OLD, was tuned for)")
    dif.add_argument("--model", default=None,
                     help="the model whose layer counts give the per-pass estimate (default: the runs')")
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
    _trust_option(drift)
    drift.add_argument("--out", default=None, metavar="FILE", help="also write the rows as JSON")
    drift.add_argument("--tp", type=_parallel, default=None,
                       help="with --traffic and --model: the TP the GEMM tables are for, for their layer counts "
                       "(default: the first TP at which the model runs the shape)")
    drift.add_argument("--traffic", default=None, metavar="FILE",
                       help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): also print "
                       "the traffic-weighted speedup and, with --model, the per-pass estimate")
    _device_option(drift)
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
    bench.add_argument("--dtype", default=None, help="moe: fp8_w8a8 or bf16 (default: the checkpoint's own); "
                       "gemm: fp8_w8a8")
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
    _trust_option(bench)
    bench.add_argument("--ceilings", default=None, metavar="FILE",
                       help="measured ceilings (default bench/ceilings/<gpu>.json, else datasheet figures)")
    bench.add_argument("--compile-workers", type=_workers, default=min(16, os.cpu_count() or 1))
    bench.add_argument("--measure-timeout", type=_positive, default=120, metavar="S",
                       help="seconds one config may take before it counts as hung (default 120)")
    _device_option(bench)
    bench.add_argument("--out", required=True, metavar="DIR")
    bench.add_argument("--traffic", default=None, metavar="FILE",
                       help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): bench at the "
                       "keys it chooses (unless --batch-sizes) and print the traffic-weighted speedups")
    bench.add_argument("--quiet", action="store_true")
    proof = sub.add_parser("proof", help="the GPU proof, most valuable first, in two device calls (scripts/gpu_proof.sh)",
                           description="Call 1: environment and ceilings, a MoE smoke test (stops the call when "
                           "nothing is timed), kernel validation, the vLLM MoE tune; call 2: the SGLang MoE tune, "
                           "the MoE and GEMM benches, a landscape with the time left; local (no GPU): report and "
                           "sampler study. Each step is time-boxed and written before the next (and bundled into "
                           "--bundle). --device cpu rehearses it on the CPU device with a tiny model (for CI).")
    proof.add_argument("--gpu", default="H100", help="the GPU of the machine (default H100)")
    proof.add_argument("--minutes", type=float, default=8.0, help="this call's budget (default 8)")
    proof.add_argument("--out", default=None, metavar="DIR",
                       help="default bench/results/<gpu>-<date>/ (with --device cpu: runs/proof-cpu-device-...)")
    proof.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                       help="the engines' code (default: the folders in .engine-src/, else the installed engines, "
                       "else $TUNER_ENGINE_WHEELS)")
    _trust_option(proof)
    proof.add_argument("--baselines", default=None, metavar="DIR",
                       help="the engines' shipped tables (default .baselines/, else ../shared/baselines)")
    proof.add_argument("--call", choices=("1", "2", "local"), default=None,
                       help="which part: 1 and 2 need the GPU (one device call each), local runs here after")
    proof.add_argument("--steps", nargs="+", default=None, metavar="STEP",
                       help="run only these steps (of: environment smoke validate tune-vllm tune-sglang bench-moe "
                       "bench-gemm landscapes report sampler); the summary keeps earlier calls' steps")
    proof.add_argument("--bundle", default=None, metavar="DIR",
                       help="after every step, write the folder as one tarball (top folder bench/results/<name>) "
                       "and summary.md into DIR (the device tool's $OUT)")
    _device_option(proof)
    ceil = sub.add_parser("ceilings", help="measure this GPU's copy bandwidth and matmul rates",
                          description="Measure device-to-device copy bandwidth (bytes read plus written), FP8 "
                          "and BF16 dense matmul rates at 8192^3, L2 size and SM count; bench, drift and the "
                          "plan read them for rooflines. Needs the GPU.")
    ceil.add_argument("--gpu", required=True)
    ceil.add_argument("--out", default=None, metavar="FILE",
                      help="default bench/ceilings/<gpu>.json (with --device cpu: runs/ceilings-<gpu>-cpu-device.json)")
    _device_option(ceil)
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
    _trust_option(chk)
    chk.add_argument("--tp", type=_parallel, default=1)
    chk.add_argument("--ep", type=_parallel, default=1)
    chk.add_argument("--dtype", default=None, choices=("fp8_w8a8", "bf16"),
                     help="moe: the tables' precision (default: the checkpoint's own, bf16 when it is not quantized)")
    chk.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    chk.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None,
                     help="check these batch sizes (the entry the engine would use for each) instead of every M")
    chk.add_argument("--seed", type=int, default=None, help="input seed (default: fresh random inputs)")
    _device_option(chk, None, "; default: cuda where a GPU is visible, else cpu")
    chk.add_argument("--gpu", default=None, help="the GPU it runs on (default: the one present; the CPU device "
                     "stands in for an H100)")
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
    _add_audit_parser(sub)
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


def _add_audit_parser(sub) -> None:
    aud = sub.add_parser(
        "audit", help="which table and row an engine really uses, and whether it is right",
        description="For a deployment (--model, --gpu, --tp, --ep, --dtype): resolve every table the engine version's "
        "loader reads, say per batch size which entry runs and what the kernel gets after the engine's rewrites, and "
        "list findings (error / warning / info). --all: every table an installation or wheel ships. Exit 1 when an "
        "error finding is present, 0 otherwise, 2 for bad input.")
    aud.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    aud.add_argument("--all", action="store_true", help="audit every table the engine ships instead of a deployment")
    aud.add_argument("--model", default=None, help="name in configs/models/ or a Hugging Face config.json")
    aud.add_argument("--gpu", default=None, help="H100, H200, H100-PCIe, H100-NVL, H200-NVL, H800, H20")
    aud.add_argument("--tp", type=_parallel, default=1)
    aud.add_argument("--ep", type=_parallel, default=1)
    aud.add_argument("--dtype", default=None, choices=("fp8_w8a8", "bf16"),
                     help="default: the checkpoint's (fp8_w8a8 when its quantization_config is fp8, else bf16)")
    aud.add_argument("--engine-version", default=None, metavar="V",
                     help="the engine's version (checked against the package's; alone: audit override folders only)")
    aud.add_argument("--triton", default=None, metavar="V",
                     help="the Triton version the engine runs (default: the site-packages', else this Python's)")
    aud.add_argument("--site-packages", default=None, metavar="DIR", help="the environment that runs the engine")
    aud.add_argument("--engine-source", nargs="+", default=None, metavar="PATH",
                     help="the engine's wheel, or folders holding wheels (default: the installed engine, then "
                     "$TUNER_ENGINE_WHEELS)")
    aud.add_argument("--moe-config-dir", default=None, metavar="DIR",
                     help="the MoE override folder (default: $VLLM_TUNED_CONFIG_FOLDER / $SGLANG_MOE_CONFIG_DIR; "
                     "'' for none)")
    aud.add_argument("--max-batch", type=_batch, default=4096, help="audit M = 1 .. this (default 4096)")
    aud.add_argument("--batch-sizes", type=_batch, nargs="+", metavar="M", default=None,
                     help="audit these batch sizes only (instead of 1 .. --max-batch)")
    aud.add_argument("--numerics", action="store_true",
                     help="run every row in use on the engine's own kernel against the float64 reference")
    aud.add_argument("--numerics-model", default=None, metavar="MODEL",
                     help="without a GPU, the (small) model whose shapes the rows run on in Triton's interpreter "
                     "(default configs/examples/small-moe.json); on a GPU the deployment's own shapes")
    aud.add_argument("--seed", type=int, default=None, help="--numerics input seed (default: fresh random inputs)")
    aud.add_argument("--out", default=None, metavar="DIR", help="also write audit.json and audit.md there")
    aud.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile (an engine's /metrics dump, or CSV/JSON of M,weight): weigh each table's "
                          "keys by the forward passes they serve")


def cmd_audit(args) -> int:
    from tuner.emit.audit import Batches, audit_all, audit_deployment, run_numerics, traffic_audit
    from tuner.emit.audit_report import terminal_lines, wrap, write_outputs
    from tuner.emit.engine_tables import locate_installation
    from tuner.plan.engines import table_family

    if args.all:
        extra = [o for o, v in (("--model", args.model), ("--gpu", args.gpu), ("--numerics", args.numerics),
                                ("--dtype", args.dtype)) if v]
        if extra:
            raise TunerError(f"--all audits every table the engine ships; {', '.join(extra)} "
                             f"{'describes' if len(extra) == 1 else 'describe'} one deployment (drop --all, or drop "
                             f"{'it' if len(extra) == 1 else 'them'})")
    elif not args.model or not args.gpu:
        raise TunerError("give --model and --gpu (the deployment to audit), or --all (every table the engine ships)")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    if args.numerics:
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports Triton's jit
    env_var = table_family(args.engine, "fused_moe").env_var or ""
    override = args.moe_config_dir if args.moe_config_dir is not None else os.environ.get(env_var)
    override_dir = Path(override) if override else None
    batches = Batches(args.max_batch, tuple(sorted(set(args.batch_sizes))) if args.batch_sizes else None)
    profile = None
    if args.traffic:
        from tuner.plan.traffic import load_profile
        profile = load_profile(args.traffic, args.tp)
    inst = locate_installation(args.engine, args.site_packages, args.engine_source, args.engine_version, args.triton)
    if args.all:
        report = audit_all(inst, batches, override_dir)
    else:
        from tuner.plan.gpus import get_gpu
        from tuner.plan.models import check_parallel, load_model, resolve_dtype
        gpu = get_gpu(args.gpu)
        model = load_model(args.model)
        check_parallel(model, args.tp, args.ep)
        dtype = resolve_dtype(model, args.dtype, ("fp8_w8a8", "bf16"), "audit")
        numerics_model = load_model(args.numerics_model or "configs/examples/small-moe.json") if args.numerics else None
        report = audit_deployment(inst, model, gpu, args.tp, args.ep, dtype, batches, override_dir, dict(os.environ))
        if args.numerics:
            seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
            run_numerics(report, inst, numerics_model, seed, log=lambda line: print(line, flush=True))
    if profile is not None:
        traffic_audit(report, profile)
    for line in terminal_lines(report):
        print(line)
    if out is not None:
        json_path, md_path = write_outputs(report, out)
        for line in wrap(f"written: {json_path} and {md_path}"):
            print(line)
    return report.exit_code


def cmd_worker(args) -> int:
    from tuner.commands.tune import load_plans, make_measurer, open_checked_storage, tune_all
    from tuner.measure.device import require
    from tuner.progress import Progress

    storage = open_checked_storage(args.storage, existing=True)
    if not args.replay and args.device == "cuda":
        # the storage's plans first (a storage without one is said as such), then the GPU,
        # before the engines' code is looked for
        load_plans(storage, args.study_prefix, load_code=False, storage=args.storage)
        import torch
        if not torch.cuda.is_available():
            from tuner.measure.device import require_gpu
            require_gpu("", "a worker", "--replay FILE measures from a recorded landscape")
    for opts in load_plans(storage, args.study_prefix, load_code=not args.replay, engine_source=args.engine_source,
                           replay=args.replay, storage=args.storage,
                           compile_workers=args.compile_workers, measure_timeout=args.measure_timeout,
                           recycle_after=args.recycle_after, device=args.device):
        if not args.replay:
            require(args.device, opts.gpu, "a worker", "--replay FILE measures from a recorded landscape")
        from tuner.commands.tune import time_unit
        progress = Progress(sum(len(opts.ms_for(p)) for p in opts.problems), enabled=not args.quiet,
                            unit=time_unit(opts))
        measurer = make_measurer(opts, progress)
        try:
            tune_all(opts, storage, measurer, progress)
        finally:
            measurer.close()
    return 0


def cmd_collect(args) -> int:
    from tuner.commands.tune import collect, load_plans, open_checked_storage, results_table

    out = Path(args.out)
    check_out_dir(out)
    storage = open_checked_storage(args.storage, existing=True)
    for opts in load_plans(storage, args.study_prefix, out_dir=out, storage=args.storage):
        results = collect(opts, storage, wait=args.wait)
        table = results_table(results, opts.kernel.config_keys)
        if not table.empty:
            from tuner.commands.report import run_source
            print(run_source(out))            # where the times came from (a GPU, the CPU device, ...)
            print(table.to_string(index=False))
    print(f"tables and manifest in {args.out}/")
    return 0


def cmd_install(args) -> int:
    from tuner import api
    from tuner.emit import install as inst

    if args.restore:
        for line in inst.restore(args.engine):
            print(line)
        return 0
    if not args.results:
        raise TunerError("give a results folder to install (or --restore)")
    api.install_results(args.results, args.engine, args.site_packages, args.moe_config_dir, args.gpu, args.force,
                        args.dry_run, merge=args.merge)
    return 0


def cmd_drift(args) -> int:
    from tuner.commands.drift import Measurers, find_tables, measure_drift
    from tuner.measure.failures import count_by_kind, summary
    from tuner.paths import atomic_write_json
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model

    gpu = get_gpu(args.gpu)
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    model = load_model(args.model) if args.model else None
    profile = None
    if args.traffic:
        from tuner.plan.traffic import load_profile
        profile = load_profile(args.traffic, args.tp)
    tables = find_tables(args.tables, model, args.routing)
    measurers = Measurers(gpu, args.replay, kernel_source=args.kernel_source, engine_source=args.engine_source,
                          device=args.device)
    try:
        df = measure_drift(tables, measurers, args.noise)
    finally:
        measurers.close()
    from tuner.measure.provenance import banner
    print(banner(measurers.environment(), "replay" if args.replay else measurers.label))
    print(drift_table(df).to_string(index=False))
    losing = df[df["verdict"].isin(["loses", "fails"])]
    print(f"{len(losing)} of {len(df)} entries no longer beat the default" if len(losing)
          else f"all {len(df)} entries still win or tie")
    failed = count_by_kind(df["failure"])
    if failed:
        print(f"tables' configs that failed, by kind: {summary(failed)}")
    if profile is not None:
        from tuner.commands.drift import traffic_lines
        from tuner.measure.provenance import time_source
        for line in traffic_lines(df, tables, profile, model,
                                  time_source(measurers.environment(), "replay" if args.replay else "gpu"), args.tp):
            print(line)
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
    from tuner.commands.nightly import run_night
    return run_night(Path(args.config), args.night, log=lambda line: print(line, flush=True))


def cmd_report(args) -> int:
    from tuner.commands.report import run_model, run_source, run_traffic, table_sections, traffic_report_lines, write_report
    run = Path(args.run)
    from tuner.emit.results import read_manifest
    read_manifest(run)                      # not a results folder: one line, before the profile's
    profile = run_traffic([run], args.traffic)
    traffic = traffic_report_lines(run, profile, run_model([run], args.model)) if profile else None
    df, path = write_report(run, Path(args.out) if args.out else None, traffic)
    source = run_source(Path(args.run))
    print(source)
    for line in table_sections(df, ["M", "config", "time_us", "default_us", "speedup", "trials", "numerics",
                                    "failures"]):
        print(line)
    from tuner.commands.report import _geomean
    g = _geomean(df["speedup"])
    if g:
        print(f"Geometric-mean speedup over the engines' default config"
              f"{' (SYNTHETIC: not a measurement)' if 'SYNTHETIC' in source else ''}"
              f"{' (CPU DEVICE: not a GPU time)' if 'CPU DEVICE' in source else ''}: {g:.2f}x")
    for line in traffic or []:
        print(line)
    print(f"report: {path}")
    return 0


def cmd_diff(args) -> int:
    from tuner.commands.report import write_diff
    out = Path(args.out) if args.out else Path(args.new) / "diff"
    from tuner.commands.report import run_model, run_traffic, traffic_diff_lines
    from tuner.emit.results import read_manifest
    runs = [Path(args.new), Path(args.old)]
    for run in runs:
        read_manifest(run)                  # not a results folder: one line, before the profile's
    profile = run_traffic(runs, args.traffic)
    traffic = traffic_diff_lines(Path(args.old), Path(args.new), profile, run_model(runs, args.model)) \
        if profile else None
    df, path = write_diff(Path(args.old), Path(args.new), out, args.noise, args.force, traffic)
    from tuner.commands.report import run_source
    sources = run_source(Path(args.old)), run_source(Path(args.new))
    print(f"old: {sources[0]}")
    print(f"new: {sources[1]}")
    if sources[0] != sources[1]:
        print("warning: the two runs' times come from different sources: a change may be the source's, not the tables'")
    from tuner.commands.report import table_sections
    for line in table_sections(df, ["M", "config_old", "config_new", "time_us_old", "time_us_new", "change_pct",
                                    "verdict"]):
        print(line)
    for line in traffic or []:
        print(line)
    counts = df["verdict"].value_counts().to_dict()
    print(f"{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower, {counts.get('same', 0)} same; "
          f"report: {path}")
    return 0


def _problem_builder(args, command: str):
    """(kernel name, model -> problems) of a kernel command, as tuning builds them."""
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    if command == "gemm":
        return "fp8_gemm", lambda model: gemm_problems(model, args.tp, args.ep)
    if command == "moe":
        return "fused_moe", lambda model: moe_problems(model, args.tp, args.ep, args.dtype, args.routing, args.engines)
    return "mla_decode", lambda model: mla_problems(model, args.tp, args.contexts or DEFAULT_CONTEXTS,
                                                    args.page_size)[0]


def cmd_bench(args) -> int:
    import copy

    from tuner.commands import bench as bench_mod
    from tuner.commands import ceilings as ceilings_mod
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model

    if args.dtype is not None and args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported by `tuner bench --kernel {args.kernel}`")
    if args.kernel == "mla":
        args.contexts = args.contexts or [4096, 8192, 32768]
    profile = None
    if args.traffic:
        from tuner.plan.traffic import choose_keys, load_profile
        if args.kernel == "mla":
            raise TunerError("--traffic applies to `tuner bench --kernel gemm|moe` (M = tokens per forward pass)")
        profile = load_profile(args.traffic, args.tp)
        args.batch_sizes = args.batch_sizes or choose_keys(profile).keys
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
    args.dtype = command_dtype(args.kernel, model, args.dtype)
    from tuner.measure.device import device_name
    ceilings = ceilings_mod.load(gpu, args.ceilings, device_name(args.device, gpu) if not args.replay else None)
    kernel_name, make_problems = _problem_builder(args, args.kernel)
    problems = only_problems(make_problems(model), args.only)
    baselines = [(Path(d).name, d) for d in args.baseline or []]
    if not args.replay:
        from tuner.measure.device import require
        require(args.device, gpu, "a bench", "--replay FILE benches a recorded landscape")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    rows: list = []
    measurers: list = []
    notes: list[str] = []
    benched: dict = {}
    try:
        modes = list(dict.fromkeys(args.kernel_source))
        if args.replay:
            from tuner.plan.kernel_registry import source_mode
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
                benched.update({p.key: p for p in probs})
        header = bench_mod.bench_header(measurers, gpu, ceilings, {"model": model.name, "tp": args.tp, "ep": args.ep,
                                                                    "kernel": kernel_name}, out)
        if profile is not None:
            header["traffic"] = profile.as_manifest()
            header["traffic_lines"] = bench_mod.traffic_lines(rows, profile, model, benched, header["time_source"])
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
    for line in header.get("traffic_lines") or []:
        print(line)
    print(f"roofline: {ceilings.source}; results: {json_path} and {md_path}")
    return 0


def _bench_measurer(args, kernel, gpu):
    if args.replay:
        from tuner.measure.device import device_name
        from tuner.measure.measurers import ReplayMeasurer
        return ReplayMeasurer.from_file(args.replay, kernel, device_name(args.device, gpu))
    from tuner.measure.isolation import isolated_gpu_measurer
    return isolated_gpu_measurer(kernel, gpu.key, args.compile_workers, args.measure_timeout, device=args.device)


def cmd_landscape(args) -> int:
    from tuner.measure.landscape import describe, read_header, read_landscape
    if args.action == "info":
        from tuner.plan.kernel_registry import KERNEL_MODULES, get_kernel
        header = read_header(args.file)
        if not isinstance(header, dict) or not isinstance(header.get("kernel"), str) \
                or header["kernel"] not in KERNEL_MODULES:
            raise TunerError(f"{args.file} is not a landscape of a known kernel (header: {str(header)[:80]})")
        source = header.get("kernel_source", "ours")
        if source not in ("ours", *ENGINE_NAMES):
            raise TunerError(f"{args.file}: its header names kernel source {str(source)[:40]!r}, not ours or "
                             f"one of {', '.join(ENGINE_NAMES)}")
        kernel = get_kernel(header["kernel"], source, load_code=False) if source != "ours" else get_kernel(header["kernel"])
        for line in describe(read_landscape(args.file, kernel)):
            print(line)
        return 0
    if args.action != "synth":
        raise TunerError("say what to do: `tuner landscape synth ...` or `tuner landscape info FILE`")
    from tuner.measure.synthetic import write_synthetic_landscape
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.models import load_model
    from tuner.plan.space import load_space

    if args.dtype is not None and args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported for --kernel {args.kernel}")
    out = Path(args.out)
    if os.path.lexists(out):
        raise TunerError(f"{out} exists; remove it or give another --out")
    from tuner.paths import check_writable, remove_stale_temporaries_of
    check_writable(out, "--out", folder=False)
    gpu = get_gpu(args.gpu)
    kernel_name, make = _problem_builder(args, args.kernel)
    kernel = get_kernel(kernel_name, args.kernel_source, load_code=False) if args.kernel_source != "ours" \
        else get_kernel(kernel_name)
    model = load_model(args.model)
    args.dtype = command_dtype(args.kernel, model, args.dtype)
    problems = make(model)
    if args.kernel_source != "ours":
        problems = [p for p in problems if args.kernel_source in p.engines]
        if not problems:
            raise TunerError(f"{args.kernel_source} reads none of this model's {kernel_name} tables")
    ms = sorted(set(args.batch_sizes or ([1, 2, 4, 8, 16, 32, 64, 128, 256] if args.kernel == "mla"
                                         else DEFAULT_BATCH_SIZES)))
    remove_stale_temporaries_of(out)          # what a killed synth of this file left (never continued)
    n = write_synthetic_landscape(out, kernel, load_space(kernel), gpu, [p.params for p in problems], ms)
    print(f"wrote {n} SYNTHETIC points ({len(problems)} problems x {len(ms)} batch sizes) to {out}: a cost model, "
          "not a GPU; replay it with --replay to try the tool, never to choose configs")
    return 0


def cmd_proof(args) -> int:
    from tuner.commands import proof as proof_mod
    from tuner.measure.device import require
    from tuner.plan.gpus import get_gpu
    gpu = get_gpu(args.gpu)
    if not 0 < args.minutes <= 24 * 60:            # NaN fails this too
        raise TunerError(f"--minutes must be more than 0 and at most a day, not {args.minutes}")
    steps = proof_mod.steps_of(args.call, args.steps)
    unknown = [s for s in steps if s not in proof_mod.STEPS]
    if unknown:
        raise TunerError(f"--steps {' '.join(unknown)}: not a step; the steps are {' '.join(proof_mod.STEPS)}")
    if any(s not in proof_mod.CALLS["local"] for s in steps):
        require(args.device, gpu, "the GPU proof", "--device cpu rehearses it on the CPU device")
    # absolute before anything runs: the steps run from the repository root, where a relative
    # --out would land in the checkout instead of where the user stands
    out = Path(os.path.abspath(args.out)) if args.out else proof_mod.default_out(gpu, args.device)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    if args.bundle and Path(args.bundle).exists() and not Path(args.bundle).is_dir():
        raise TunerError(f"--bundle {args.bundle} is a file, not a folder")
    baselines = Path(args.baselines) if args.baselines else proof_mod.default_baselines()
    if args.baselines and not Path(args.baselines).is_dir():
        raise TunerError(f"--baselines {baselines} is not a folder")
    engine_source = [os.path.abspath(e) for e in args.engine_source] if args.engine_source else None
    run = proof_mod.Proof(out, gpu, args.minutes, args.device, engine_source or proof_mod.default_engine_source(),
                          Path(os.path.abspath(baselines)) if baselines else None,
                          Path(os.path.abspath(args.bundle)) if args.bundle else None)
    return run.execute(steps, log=lambda line: print(line, flush=True))


def cmd_ceilings(args) -> int:
    from tuner.commands import ceilings as ceilings_mod
    from tuner.plan.gpus import get_gpu
    gpu = get_gpu(args.gpu)
    path = Path(args.out) if args.out else ceilings_mod.default_path(gpu, args.device)
    if path.exists() and path.is_dir():
        raise TunerError(f"--out {path} is a folder; give a file name")
    data = ceilings_mod.measure(gpu, device=args.device)
    ceilings_mod.write(data, path)
    for line in ceilings_mod.summary_lines(data):
        print(line)
    print(f"ceilings: {path}")
    return 0


def cmd_check(args) -> int:
    from tuner.commands.check import run_check
    from tuner.plan.models import gemm_problems, load_model, moe_problems

    table = Path(args.table)
    if not table.is_file():
        raise TunerError(f"table {table} not found")
    model = load_model(args.model)
    if args.kernel == "moe":
        args.dtype = command_dtype("moe", model, args.dtype)
    kernel_name, make_problems = {
        "gemm": ("fp8_gemm", lambda model, engine: gemm_problems(model, args.tp, args.ep)),
        "moe": ("fused_moe", lambda model, engine: moe_problems(model, args.tp, args.ep, args.dtype,
                                                                  args.routing, [engine])),
        "mla": ("mla_decode", None),            # our own format: the table holds its problems
    }[args.kernel]
    rows = run_check(kernel_name, table, model, make_problems, args.routing, args.kernel_source,
                     args.engine_source, args.batch_sizes, args.seed, log=lambda line: print(line, flush=True),
                     device=args.device, gpu=args.gpu)
    failed = sum(r.status != "pass" for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_engine_source(args) -> int:
    from tuner.plan.kernel_registry import launcher
    from tuner.plan.kernel_sources import extract
    if args.action != "extract":
        raise TunerError("say what to do: `tuner engine-source extract --engine vllm --out DIR`")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file")
    folder = extract(args.engine, args.source, out, launcher(args.engine).FILES)
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


COMMANDS = {"audit": cmd_audit, "proof": cmd_proof, "landscape": cmd_landscape, "bench": cmd_bench, "ceilings": cmd_ceilings,
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


def _trust_option(p) -> None:
    p.add_argument("--trust-engine-source", action="store_true",
                   help="timing an engine's kernel imports code from the engine's files (--engine-source, the "
                   "installed engine, $TUNER_ENGINE_WHEELS): files that match none of the releases tuner knows "
                   "are refused unless you trust their source and say so with this flag")


def _trust_engine_source(args) -> str | None:
    """--trust-engine-source for this process and the ones it starts (measuring children,
    compile workers, the proof's steps); returns the setting to restore afterwards."""
    from tuner.plan.kernel_sources import TRUST_ENV
    before = os.environ.get(TRUST_ENV)
    if getattr(args, "trust_engine_source", False):
        os.environ[TRUST_ENV] = "1"
    return before


def main(argv: list[str] | None = None) -> int:
    import signal
    _setup_logging()
    parser = build_parser()
    previous = None
    restore_trust, trust_before = False, None
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
        trust_before = _trust_engine_source(args)
        restore_trust = True
        if getattr(args, "device", None) == "cpu":
            from tuner.measure.device import prepare_process
            prepare_process("cpu")          # before any kernel is imported here
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
        from tuner.errors import os_error_line
        line = os_error_line(e)
        if line is not None:         # a read-only folder, a full disk, a name too long, a link loop
            print(f"tuner: error: {line}", file=sys.stderr)
            return 2
        print(f"tuner: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set TUNER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if restore_trust:
            from tuner.plan.kernel_sources import TRUST_ENV
            if trust_before is None:
                os.environ.pop(TRUST_ENV, None)
            else:
                os.environ[TRUST_ENV] = trust_before
