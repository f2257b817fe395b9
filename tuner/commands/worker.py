"""`tuner worker` and `tuner collect`: join a run kept in a shared storage and measure its trials
on this machine, and write the tables of its finished studies (tuner/pipeline/ does the work)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.commands.options import device_option, positive, trust_option, workers
from tuner.pipeline.planning import check_out_dir


def add_worker_parser(sub, common) -> None:
    """`tuner worker`: measure trials of a stored run on this machine."""
    worker = sub.add_parser("worker", help="join a run stored in a shared storage and measure on this GPU",
                            description="Measure trials of the runs stored under a study prefix, on this "
                            "machine's GPU (or a replayed landscape). Start any number, on any hosts.")
    worker.add_argument("--storage", required=True, metavar="URL", help="the run's Optuna storage URL")
    worker.add_argument("--study-prefix", default="", metavar="NAME")
    worker.add_argument("--replay", default=None, metavar="FILE", help="measure by replaying a landscape")
    worker.add_argument("--compile-workers", type=workers, default=min(16, os.cpu_count() or 1))
    worker.add_argument("--measure-timeout", type=positive, default=120, metavar="S")
    worker.add_argument("--recycle-after", type=positive, default=256, metavar="N")
    device_option(worker)
    worker.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                        help="where this machine has the engines' code, for plans timed on an engine's kernel "
                        "(default: where the plan's machine had it, the installed engine, $TUNER_ENGINE_WHEELS)")
    trust_option(worker)
    worker.add_argument("--quiet", action="store_true")


def run_worker(args) -> int:
    from tuner.measure.device import require
    from tuner.pipeline.run import work
    from tuner.pipeline.stored_plans import load_plans
    from tuner.search.storage_checks import open_checked_storage

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
        work(opts, storage, quiet=args.quiet)
    return 0


def add_repair_parser(sub, common) -> None:
    """`tuner repair-journal`: keep a journal's whole operations, move its damaged tail aside."""
    rep = sub.add_parser("repair-journal", help="keep a journal's whole operations, move a damaged tail aside",
                         description="A journal storage whose tail is damaged (NULs, random bytes) after whole "
                         "operations: keep those operations, move the rest to FILE.damaged-tail.")
    rep.add_argument("journal", metavar="FILE")


def run_repair(args) -> int:
    from tuner.search.journal_repair import repair
    for line in repair(Path(args.journal)):
        print(line)
    return 0


def add_collect_parser(sub, common) -> None:
    """`tuner collect`: write a stored run's tables."""
    collect = sub.add_parser("collect", help="write the tables of a run stored in a shared storage",
                             description="Write each engine's tables and the manifest from the finished "
                             "studies of the runs under a study prefix.")
    collect.add_argument("--storage", required=True, metavar="URL")
    collect.add_argument("--study-prefix", default="", metavar="NAME")
    collect.add_argument("--out", required=True, metavar="DIR")
    collect.add_argument("--wait", action="store_true", help="wait until every study has finished")


def run_collect(args) -> int:
    from tuner.emit.run_table import run_table_lines, unwritten_files, written_files
    from tuner.pipeline.emission import collect
    from tuner.pipeline.stored_plans import load_plans
    from tuner.search.storage_checks import open_checked_storage

    out = Path(args.out)
    check_out_dir(out)
    storage = open_checked_storage(args.storage, existing=True)
    for opts in load_plans(storage, args.study_prefix, out_dir=out, storage=args.storage):
        results = collect(opts, storage, wait=args.wait)
        if results:
            from tuner.emit.run_table import run_source
            print(run_source(out))            # where the times came from (a GPU, the CPU device, ...)
            for line in run_table_lines(results, opts.kernel.config_keys, written_files(opts), out,
                                        opts.settings.row_gain, unwritten_files(opts)):
                print(line)
    print(f"tables and manifest in {out}/")          # a Path: `--out tables/` is not said as tables//
    return 0
