"""Command line: `tuner gemm ...` (and the other kernel commands built on the same options).

Bad input ends with one line on stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tuner import __version__
from tuner.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES
from tuner.errors import TunerError

DEFAULT_TRIALS = {"gemm": 48, "moe": 32, "mla": 32}
DTYPES = {"gemm": ("fp8_w8a8",), "moe": ("fp8_w8a8", "bf16"), "mla": ("bf16",)}   # first: the default
MLA_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise TunerError(f"{message} (see `{self.prog} --help`)")


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {v}")
    return v


def _common_options() -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("what to tune")
    g.add_argument("--model", required=True, help="name in configs/models/ (deepseek-v3, ...) or a path to "
                   "a Hugging Face config.json or one of our YAML files")
    g.add_argument("--gpu", required=True, help="H100, H200, H100-PCIe, H100-NVL, H200-NVL, H800, H20")
    g.add_argument("--dtype", default=None, help="precision (gemm, moe: fp8_w8a8 (default); moe: bf16; "
                   "mla: bf16 KV cache)")
    g.add_argument("--tp", type=_positive, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--ep", type=_positive, default=1, help="expert-parallel size (default 1)")
    g.add_argument("--batch-sizes", type=_positive, nargs="+", metavar="M", default=None,
                   help="batch sizes to tune (default: the engines' grid, 1 to 4096; mla: 1 to 256)")
    g.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES),
                   help="whose tables to write (default both)")
    s = p.add_argument_group("search")
    s.add_argument("--trials", type=_positive, default=None,
                   help="measured configs per batch size (default 48 for gemm, 32 for moe)")
    s.add_argument("--patience", type=_positive, default=None,
                   help="stop a study after this many trials without a 0.5%% gain (default trials/3)")
    s.add_argument("--sampler", default="tpe", choices=("tpe", "random", "cmaes"))
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
    o.add_argument("--compile-workers", type=int, default=min(16, os.cpu_count() or 1),
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
    worker.add_argument("--compile-workers", type=int, default=min(16, os.cpu_count() or 1))
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
    dif.add_argument("--noise", type=float, default=0.02, help="smallest change that counts (default 0.02 = 2%%)")
    dif.add_argument("--force", action="store_true", help="compare runs with no (problem, M) in common, or "
                     "overwrite a diff.md that compares another pair of runs")
    drift = sub.add_parser("drift", help="does a table still beat the default config here?",
                           description="Time each table's configs against the engines' default config on "
                           "this GPU and software (or a landscape) and say, per M, whether the table still wins.")
    drift.add_argument("tables", nargs="+", help="table files or folders (an engine's configs folder, a results folder)")
    drift.add_argument("--gpu", required=True, help="the GPU the tables are for and timed on (H100, H200, ...)")
    drift.add_argument("--model", default=None, help="needed for fused-MoE tables (hidden size, top-k)")
    drift.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                       help="fused MoE: how tokens are routed to experts while timing: uniformly at random like "
                       "the engines' tuners (default), or Zipf-skewed like real traffic")
    drift.add_argument("--replay", default=None, metavar="FILE",
                       help="time from a landscape instead of the GPU (the way to run drift without a GPU)")
    drift.add_argument("--noise", type=float, default=0.02,
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
    chk.add_argument("--tp", type=_positive, default=1)
    chk.add_argument("--ep", type=_positive, default=1)
    chk.add_argument("--dtype", default="fp8_w8a8", choices=("fp8_w8a8", "bf16"))
    chk.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    chk.add_argument("--batch-sizes", type=_positive, nargs="+", metavar="M", default=None,
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
    land = sub.add_parser("landscape", help="make a synthetic landscape, or show what a landscape covers",
                          description="Landscapes hold timings of every config of a pruned grid (--record on a "
                          "GPU, --replay anywhere). `synth` writes a SYNTHETIC one from a made-up cost model, "
                          "labelled as such, to try replay, report, diff and drift without a GPU; `info` shows "
                          "what one covers.")
    land_sub = land.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    synth = land_sub.add_parser("synth", help="write a SYNTHETIC landscape (made-up times, clearly labelled)",
                                description="Write a landscape whose times come from a made-up cost model "
                                "(header \"synthetic\": true) for the problems a tuning command would tune; "
                                "every command that shows its times says they are synthetic.")
    synth.add_argument("--kernel", required=True, choices=("gemm", "moe", "mla"), help="which tuning command's problems")
    synth.add_argument("--model", required=True, help="as for tuner gemm/moe/mla")
    synth.add_argument("--gpu", required=True, help="the GPU the landscape is labelled for (--replay checks it)")
    synth.add_argument("--tp", type=_positive, default=1, help="tensor-parallel size (default 1)")
    synth.add_argument("--ep", type=_positive, default=1, help="expert-parallel size (default 1)")
    synth.add_argument("--dtype", default=None, help="as for the tuning command (default its first)")
    synth.add_argument("--batch-sizes", type=_positive, nargs="+", metavar="M", default=None,
                       help="batch sizes (default the tuning command's)")
    synth.add_argument("--routing", choices=("uniform", "zipf"), default="uniform", help="moe: routing of the problems")
    synth.add_argument("--contexts", type=_positive, nargs="+", metavar="TOKENS", default=None, help="mla: contexts")
    synth.add_argument("--page-size", type=_positive, default=64, help="mla: KV cache page size (default 64)")
    synth.add_argument("--kernel-source", choices=("ours", *ENGINE_NAMES), default="ours",
                       help="whose kernel the landscape is labelled for (default ours; an engine's: its own "
                       "config keys and defaults, and only its tables replay from it)")
    synth.add_argument("--out", required=True, metavar="FILE", help="the landscape to write (.jsonl or .jsonl.gz)")
    info = land_sub.add_parser("info", help="what a landscape covers", description="Print a landscape's kernel, "
                               "device, software, whether it is synthetic, and per problem its batch sizes, points "
                               "and failures.")
    info.add_argument("file", help="a landscape (.jsonl or .jsonl.gz)")
    moe = sub.add_parser("moe", parents=[common], help="tune the fused MoE layer",
                         description="Tune the fused MoE layer: vLLM's table (whole layer, one config) and "
                         "SGLang's up and _down tables.")
    moe.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                     help="top-k routing used for timing: uniformly random like the engines' tuners "
                     "(default), or Zipf-skewed like real traffic")
    mla = sub.add_parser("mla", parents=[common], help="tune MLA decode attention",
                         description="Tune the two-stage MLA decode kernel per batch size and context bucket.")
    mla.add_argument("--contexts", type=_positive, nargs="+", metavar="TOKENS", default=None,
                     help="context buckets (default 1024 ... 65536, as far as the model reaches)")
    mla.add_argument("--page-size", type=_positive, default=64, help="KV cache page size (default 64)")
    return parser


def _load_common(args, kernel_name: str, command: str):
    """Everything the kernel commands share: model, GPU, search settings."""
    from tuner.gpus import get_gpu
    from tuner.models import load_model
    from tuner.search import SearchSettings

    args.dtype = args.dtype or DTYPES[command][0]
    if args.batch_sizes is None:
        args.batch_sizes = MLA_BATCH_SIZES if command == "mla" else DEFAULT_BATCH_SIZES
    if args.dtype not in DTYPES[command]:
        raise TunerError(f"--dtype {args.dtype} is not supported by `tuner {command}`; "
                         f"choose from {', '.join(DTYPES[command])}")
    if args.replay and args.record:
        raise TunerError("--replay and --record cannot be combined: one replays timings, the other takes them")
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    if args.baseline and not Path(args.baseline).is_dir():
        raise TunerError(f"--baseline {args.baseline} is not a folder")
    gpu = get_gpu(args.gpu)
    model = load_model(args.model)
    trials = args.trials or DEFAULT_TRIALS[command]
    settings = SearchSettings(budget=trials, patience=args.patience or max(8, trials // 3),
                              sampler=args.sampler, seed=args.seed)
    return model, gpu, settings


def kernel_runs(args, kernel_name: str, problems: list, notes: list) -> list:
    """[(kernel, its problems)]: the problems each kernel times. With engine kernels a
    problem several engines read (a GEMM shape) becomes one problem per engine, each timed
    on that engine's kernel and written to that engine's table only."""
    import dataclasses
    from tuner.kernel_sources import as_recorded, kernel_for, source_mode

    mode = source_mode(args.kernel_source, args.replay)
    runs: dict = {}
    for p in problems:
        engines = [e for e in p.engines if e in args.engines] or list(p.engines)
        for engine in engines:
            try:
                kernel = kernel_for(kernel_name, engine, mode, args.engine_source, load_code=not args.replay)
            except TunerError as e:
                if not args.dry_run:
                    raise
                notes.append(str(e))
                kernel = kernel_for(kernel_name, engine, mode, args.engine_source, load_code=False)
            kernel = as_recorded(kernel, args.replay)
            if kernel.source == "ours":
                # one problem for every engine whose table ours times
                runs.setdefault(("ours", kernel.name), (kernel, []))
                if p not in runs[("ours", kernel.name)][1]:
                    runs[("ours", kernel.name)][1].append(p)
            else:
                runs.setdefault((kernel.source, kernel.name), (kernel, []))[1].append(
                    dataclasses.replace(p, engines=(engine,)))
    if args.replay and mode != "ours" and not runs:
        raise TunerError(f"landscape {args.replay} was recorded on {mode}'s kernel, which times none of "
                         f"the tables asked for (--engines {' '.join(args.engines)})")
    return list(runs.values())


def _out_dir(args, command: str, model_name: str, gpu_key: str) -> Path:
    if args.out:
        return Path(args.out)
    name = f"{command}-{model_name}-{gpu_key}-tp{args.tp}" + (f"-ep{args.ep}" if args.ep > 1 else "")
    return Path("runs") / name


def _record_path(record: str | None, kernel, several: bool) -> str | None:
    """One landscape per kernel: with several (each engine's own), the source goes into the
    name (land.jsonl.gz -> land.vllm.jsonl.gz)."""
    if not record or not several or kernel.source == "ours":
        return record
    path = Path(record)
    stem, dot, ext = path.name.partition(".")
    return str(path.with_name(f"{stem}.{kernel.source}{dot}{ext}"))


def _run_command(args, command: str, kernel_name: str, make_problems) -> int:
    """What every kernel command does once it knows how to turn a model into problems: one
    tuning run per kernel that times some of the tables (each engine's own, or ours)."""
    from tuner.space import load_space
    from tuner.tune import RunOptions, plan_text, results_table, run_tuning

    model, gpu, settings = _load_common(args, kernel_name, command)
    notes: list[str] = []
    runs = kernel_runs(args, kernel_name, make_problems(model), notes)
    all_opts = []
    for kernel, problems in runs:
        all_opts.append(RunOptions(
            kernel=kernel, space=load_space(kernel, args.space), gpu=gpu, problems=problems,
            batch_sizes=sorted(set(args.batch_sizes)), settings=settings,
            out_dir=_out_dir(args, command, model.name, gpu.key), storage=args.storage,
            engines=args.engines, replay=args.replay, record=_record_path(args.record, kernel, len(runs) > 1),
            baseline=args.baseline, compile_workers=args.compile_workers, measure_timeout=args.measure_timeout,
            recycle_after=args.recycle_after, prefix=args.study_prefix, gpus=_gpu_list(args.gpus),
            run_info={"model": model.name, "model_source": model.source, "tp": args.tp, "ep": args.ep,
                      "dtype": args.dtype},
            quiet=args.quiet,
        ))
    if args.dry_run:
        for line in dict.fromkeys(notes):
            print(f"note: {line}")
        print("\n\n".join(plan_text(opts) for opts in all_opts))
        return 0
    if not args.replay:
        from tuner.measure import require_gpu
        require_gpu(gpu.cuda_name)
    from tuner.provenance import for_run
    for opts in all_opts:
        kernel = opts.kernel
        results = run_tuning(opts)
        table = results_table(results, kernel.config_keys)
        source = for_run(args.replay, gpu.cuda_name)
        if not table.empty:
            for line in source.banner():
                print(line)
            print(f"{kernel.description} [{kernel.source_label}]; config = " + " ".join(kernel.config_keys))
            print(table.to_string(index=False))
        if kernel.engine_hints:
            by_key = {p.key: p for p in opts.problems}
            for line in kernel.engine_hints([(by_key[k], rs) for k, rs in results.items()]):
                print(line)
    return 0


def _gpu_list(text: str | None) -> list[int]:
    if text is None:
        try:
            import torch
            return list(range(torch.cuda.device_count()))
        except Exception:  # noqa: BLE001
            return []
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TunerError(f"--gpus takes GPU indexes like 0,1,2,3, not {text!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise TunerError(f"--gpus takes distinct GPU indexes like 0,1,2,3, not {text!r}")
    return gpus


def cmd_worker(args) -> int:
    from tuner.measure import require_gpu
    from tuner.progress import Progress
    from tuner.tune import load_plans, make_measurer, open_storage, tune_all

    storage = open_storage(args.storage)
    for opts in load_plans(storage, args.study_prefix, load_code=not args.replay, engine_source=args.engine_source,
                           replay=args.replay, storage=args.storage,
                           compile_workers=args.compile_workers, measure_timeout=args.measure_timeout,
                           recycle_after=args.recycle_after):
        if not args.replay:
            require_gpu(opts.gpu.cuda_name, "a worker measures on one; --replay FILE measures from a landscape")
        progress = Progress(sum(len(opts.ms_for(p)) for p in opts.problems), enabled=not args.quiet)
        measurer = make_measurer(opts, progress)
        try:
            tune_all(opts, storage, measurer, progress)
        finally:
            measurer.close()
    return 0


def cmd_collect(args) -> int:
    from tuner.provenance import from_manifest
    from tuner.results import read_manifest
    from tuner.tune import collect, load_plans, open_storage, results_table

    storage = open_storage(args.storage)
    for opts in load_plans(storage, args.study_prefix, out_dir=Path(args.out), storage=args.storage):
        results = collect(opts, storage, wait=args.wait)
        table = results_table(results, opts.kernel.config_keys)
        if not table.empty:
            for line in from_manifest(read_manifest(Path(args.out))).banner():
                print(line)
            print(table.to_string(index=False))
    print(f"tables and manifest in {args.out}/")
    return 0


def cmd_install(args) -> int:
    from tuner import install as inst

    if args.restore:
        for line in inst.restore(args.engine):
            print(line)
        return 0
    if not args.results:
        raise TunerError("give a results folder to install (or --restore)")
    results = Path(args.results)
    if not results.is_dir():
        raise TunerError(f"results folder {results} not found")
    site = inst.find_site_packages(args.engine, args.site_packages)
    config_dir = Path(args.moe_config_dir) if args.moe_config_dir else None
    from tuner.gpus import get_gpu
    target = get_gpu(args.gpu).cuda_name if args.gpu else None
    copies, notes = inst.plan_install(results, args.engine, site, args.force, config_dir, target)
    extra = inst.plan_config_dir(site, args.engine, config_dir) if config_dir else []
    for note in notes:
        print(f"tuner: {note}", file=sys.stderr)
    if extra:
        print(f"{'would copy' if args.dry_run else 'copying'} {len(extra)} shipped {args.engine} MoE tables "
              f"into {config_dir} (the variable hides the package's own)")
    for c in copies:
        print(f"{'would install' if args.dry_run else 'install'} {c.dest}")
    if args.dry_run:
        return 0
    backup = inst.install(copies, args.engine, extra)
    print(f"{len(copies)} tables installed; backup in {backup} (`tuner install --restore --engine {args.engine}`)")
    if config_dir:
        print(f"export {inst.ENV_VARS[args.engine]}={config_dir.resolve()}")
    return 0


def cmd_drift(args) -> int:
    from tuner.drift import Measurers, find_tables, measure_drift
    from tuner.gpus import get_gpu
    from tuner.models import load_model
    from tuner.paths import atomic_write_json

    gpu = get_gpu(args.gpu)
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    tables = find_tables(args.tables, load_model(args.model) if args.model else None, args.routing)
    measurers = Measurers(gpu, args.replay, kernel_source=args.kernel_source, engine_source=args.engine_source)
    from tuner.formatting import speedup_cell, time_cell
    from tuner.provenance import for_run
    try:
        df = measure_drift(tables, measurers, args.noise)
    finally:
        measurers.close()
    source = for_run(args.replay, gpu.cuda_name)
    shown = df.drop(columns=["table", "error", "default_error"])
    shown["table_us"] = [time_cell(t, e) for t, e in zip(df["table_us"], df["error"])]
    shown["default_us"] = [time_cell(t, e) for t, e in zip(df["default_us"], df["default_error"])]
    shown["speedup"] = [speedup_cell(v) for v in df["speedup"]]
    for line in source.banner():
        print(line)
    print(shown.to_string(index=False))
    df["times"] = source.line()
    losing = df[df["verdict"].isin(["loses", "fails"])]
    print(f"{len(losing)} of {len(df)} entries no longer beat the default" if len(losing)
          else f"all {len(df)} entries still win or tie")
    if args.out:
        import json
        # through pandas' JSON writer: a missing time is null there, not NaN (invalid JSON)
        atomic_write_json(Path(args.out), json.loads(df.to_json(orient="records")))
    return 0


def cmd_nightly(args) -> int:
    from tuner.nightly import run_night
    return run_night(Path(args.config), args.night, log=lambda line: print(line, flush=True))


def cmd_report(args) -> int:
    from tuner.report import headline, printable, run_source, write_report
    df, path = write_report(Path(args.run), Path(args.out) if args.out else None)
    source = run_source(Path(args.run))
    for line in source.banner():
        print(line)
    print(printable(df).to_string(index=False))
    if headline(df, source):
        print(headline(df, source))
    print(f"report: {path}")
    return 0


def cmd_diff(args) -> int:
    from tuner.report import diff_sources, write_diff
    out = Path(args.out) if args.out else Path(args.new) / "diff"
    df, path = write_diff(Path(args.old), Path(args.new), out, args.noise, args.force)
    for line in diff_sources(Path(args.old), Path(args.new)):
        print(line)
    cols = ["problem", "M", "time_us_old", "time_us_new", "change_pct", "verdict"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    counts = df["verdict"].value_counts().to_dict()
    print(f"{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower, {counts.get('same', 0)} same; "
          f"report: {path}")
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


def cmd_landscape(args) -> int:
    if args.action == "info":
        from tuner.landscape import info_lines, landscape_kernel, read_landscape
        if not Path(args.file).is_file():
            raise TunerError(f"landscape {args.file} not found")
        for line in info_lines(read_landscape(args.file, landscape_kernel(args.file))):
            print(line)
        return 0
    if args.action != "synth":
        raise TunerError("say what to do: `tuner landscape synth ...` or `tuner landscape info FILE`")
    from tuner.gpus import get_gpu
    from tuner.kernel_sources import kernel_for
    from tuner.models import load_model
    from tuner.provenance import from_header
    from tuner.space import load_space
    from tuner.synthetic import synthesize, synthetic_header

    kernel_name = {"gemm": "fp8_gemm", "moe": "fused_moe", "mla": "mla_decode"}[args.kernel]
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")
    for path in (out, partial):
        if path.exists():
            raise TunerError(f"--out {path} exists; remove it or write the landscape elsewhere")
    args.dtype = args.dtype or DTYPES[args.kernel][0]
    if args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported by `tuner {args.kernel}`; "
                         f"choose from {', '.join(DTYPES[args.kernel])}")
    batch_sizes = sorted(set(args.batch_sizes or (MLA_BATCH_SIZES if args.kernel == "mla" else DEFAULT_BATCH_SIZES)))
    gpu, model = get_gpu(args.gpu), load_model(args.model)
    mode = args.kernel_source
    if mode == "ours":
        from kernels import get_kernel
        kernel = get_kernel(kernel_name)
    else:
        try:
            kernel = kernel_for(kernel_name, mode, mode)           # its version goes into the header
        except TunerError:       # no engine code here: its keys and defaults are enough
            kernel = kernel_for(kernel_name, mode, mode, load_code=False)
    engines = list(ENGINE_NAMES) if mode == "ours" else [mode]
    problems = _problems_of(args.kernel, args, model, engines)
    if not problems:
        raise TunerError(f"{model.name} has no {args.kernel} problems for {mode}'s kernel at --tp {args.tp} --ep {args.ep}")
    counts = synthesize(out, kernel, load_space(kernel), gpu, [p.params for p in problems], batch_sizes)
    for line in from_header(synthetic_header(kernel, gpu.cuda_name), str(out)).banner():
        print(line)
    whose = "our kernel" if kernel.source == "ours" else f"{kernel.source_label}'s kernel"
    print(f"wrote {out}: {kernel.name} ({whose}) labelled for {gpu.cuda_name}, "
          f"{len(problems)} problems x {len(batch_sizes)} batch sizes, {counts['points']} points "
          f"({counts['failures']} made-up failures)")
    replay = [args.kernel, "--model", args.model, "--gpu", args.gpu, "--tp", str(args.tp)]
    replay += ["--ep", str(args.ep)] if args.ep > 1 else []
    print(f"replay it: tuner {' '.join(replay)} --replay {out}")
    return 0


def _problems_of(command: str, args, model, engines: list[str]) -> list:
    """The problems `tuner <command>` would tune for a model (gemm, moe, mla)."""
    from tuner.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    if command == "gemm":
        return [p for p in gemm_problems(model, args.tp, args.ep) if set(p.engines) & set(engines)]
    if command == "moe":
        return moe_problems(model, args.tp, args.ep, args.dtype, args.routing, engines)
    return mla_problems(model, args.tp, args.contexts or DEFAULT_CONTEXTS, args.page_size)[0]


def cmd_gemm(args) -> int:
    from tuner.models import gemm_problems
    return _run_command(args, "gemm", "fp8_gemm", lambda model: gemm_problems(model, args.tp, args.ep))


def cmd_moe(args) -> int:
    from tuner.models import moe_problems
    return _run_command(args, "moe", "fused_moe", lambda model: moe_problems(
        model, args.tp, args.ep, args.dtype, args.routing, args.engines))


def cmd_mla(args) -> int:
    from tuner.models import DEFAULT_CONTEXTS, mla_problems

    def make(model):
        problems, skipped = mla_problems(model, args.tp, args.contexts or DEFAULT_CONTEXTS, args.page_size)
        if skipped and args.contexts:
            print(f"tuner: skipping contexts beyond {model.name}'s positions: {skipped}", file=sys.stderr)
        return problems
    return _run_command(args, "mla", "mla_decode", make)


COMMANDS = {"landscape": cmd_landscape, "check": cmd_check, "engine-source": cmd_engine_source, "nightly": cmd_nightly, "drift": cmd_drift, "install": cmd_install, "report": cmd_report, "diff": cmd_diff, "gemm": cmd_gemm, "moe": cmd_moe, "mla": cmd_mla, "worker": cmd_worker, "collect": cmd_collect}


def _innermost_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)parser of the command line's subcommand (`tuner landscape synth`'s, say)."""
    for dest in ("command", "action"):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not subs or name not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
    except KeyboardInterrupt:
        print("tuner: interrupted; finished trials are in the storage, run the same command to resume",
              file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback unless asked for
        if os.environ.get("TUNER_DEBUG"):
            raise
        print(f"tuner: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set TUNER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
