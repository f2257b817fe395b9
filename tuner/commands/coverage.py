"""`tuner coverage`: which table every supported engine version reads for every layer of the
deployments people run, and whether it is shipped for the GPU, a fallback, ours, or none (the
engine's default config); where tuning pays (tuner/emit/coverage.py builds the map,
coverage_report.py renders it)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuner.commands.options import triton_version
from tuner.errors import TunerError
from tuner.plan.engines import ENGINE_NAMES

KERNELS = ("fused_moe", "fp8_gemm")
# the names the other commands give the two families (tuner moe, tuner gemm, check --kernel), taken too
SHORT = {"moe": "fused_moe", "gemm": "fp8_gemm"}


def add_parser(sub, common) -> None:
    """`tuner coverage` and its options."""
    cov = sub.add_parser(
        "coverage", help="which table each engine reads for the deployments people run, and where tuning pays",
        description="For the models in configs/models/ (and --model), the Hopper GPUs, the deployments each is served "
        "with (the TP that fits one node, TP16 over two nodes, EP with data-parallel attention) at the precisions the "
        "checkpoint is served at, and every supported engine version at hand (installed, or its wheel): the table each "
        "engine reads for every layer, as `tuner audit` resolves it, and its status: shipped (for this GPU), fallback "
        "(another Triton folder, another GPU's table, the up table for a _down, keys far from M), tuned (ours: tuned/ "
        "or installed by tuner) or default (no table: the engine's default config). Per row the command that tunes it "
        "and the gains a committed GPU run measured. No GPU needed.")
    cov.add_argument("--model", nargs="+", default=[], metavar="MODEL",
                     help="also these models (a name in configs/models/, a config.json or a folder holding one)")
    cov.add_argument("--only-given", action="store_true", help="the --model models only, not configs/models/'s")
    cov.add_argument("--gpu", nargs="+", default=None, metavar="GPU", help="these GPUs only (default: every Hopper GPU)")
    cov.add_argument("--engine", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    cov.add_argument("--kernel", nargs="+", choices=(*SHORT, *KERNELS), default=list(KERNELS),
                     help="these table families only: moe, gemm (or fused_moe, fp8_gemm; default both)")
    cov.add_argument("--engine-source", nargs="+", default=None, metavar="PATH",
                     help="the engines' wheels, or folders holding them (default: the installed engine, then "
                          "$TUNER_ENGINE_WHEELS)")
    cov.add_argument("--site-packages", default=None, metavar="DIR", help="the environment that runs the engines")
    cov.add_argument("--triton", type=triton_version, default=None, metavar="V",
                     help="the Triton version the engines run (default: the site-packages', else this Python's)")
    cov.add_argument("--json", action="store_true", help="print the map as JSON, one object per row")
    cov.add_argument("--plot", default=None, metavar="FILE.png",
                     help="also draw models x deployments coloured by status, one panel per engine (newest version)")


def _plot_target(text: str) -> Path:
    """--plot's file: a new .png, or a plot tuner drew there already (a PNG with the text
    'Software: tuner': docs/file-formats.md), never another kind of file nor a PNG of the user's."""
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise TunerError(f"--plot {text}: give a file name ending in .png")
    if path.is_dir():
        raise TunerError(f"--plot {text} is a folder: give the path of a .png file")
    if path.exists() or path.is_symlink():
        from tuner.reading import read_head
        head = read_head(path, 8, "--plot ")       # a FIFO or a device is refused, not waited on
        if head != b"\x89PNG\r\n\x1a\n":
            raise TunerError(f"--plot {text} exists and is not a PNG image: refusing to replace it (give another path)")
        from tuner.file_kinds import PLOT
        if not PLOT.ours(path):
            raise TunerError(f"--plot {text} exists and is a PNG image tuner did not draw (no 'Software: tuner' text): "
                             "refusing to replace it (give another path)")
    if not path.parent.is_dir():
        raise TunerError(f"--plot {text}: the folder {path.parent} does not exist")
    return path


def run(args) -> int:
    import json

    from tuner.emit.coverage import coverage_map
    from tuner.emit.coverage_report import as_json, head_lines, pays_lines, plot, summary_lines, table_lines
    from tuner.emit.coverage_sources import installations, measured_gains, tuned_roots
    from tuner.plan.gpus import GPUS, get_gpu
    from tuner.plan.models import known_models, load_model
    plot_path = _plot_target(args.plot) if args.plot else None
    if args.only_given and not args.model:
        raise TunerError("--only-given maps the --model models only: give --model")
    args.kernel = list(dict.fromkeys(SHORT.get(k, k) for k in args.kernel))
    names = [*([] if args.only_given else known_models()), *args.model]
    models = [(name, load_model(name)) for name in dict.fromkeys(names)]
    gpus = [get_gpu(g) for g in args.gpu] if args.gpu else list(GPUS.values())
    installs, notes = installations(args.engine, args.site_packages, args.engine_source, args.triton)
    if not installs:
        raise TunerError("no engine version is at hand: " + "; ".join(notes))

    def progress(line: str) -> None:
        if sys.stderr.isatty():
            print(f"\r\033[K[coverage] {line[:100]}", end="", file=sys.stderr, flush=True)
    cmap = coverage_map(models, gpus, installs, tuned_roots(), measured_gains(), tuple(args.kernel), progress=progress)
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    cmap.notes = notes + cmap.notes
    if args.json:
        from tuner.textwidth import print_whole
        print_whole(json.dumps(as_json(cmap), indent=1))      # a program reads it: never fitted
    else:
        from tuner.textwidth import fit_line
        for line in head_lines(cmap, len(models), len(gpus)):
            print("\n".join(fit_line(line, 120)))
        for line in table_lines(cmap, each_gemm=args.kernel == ["fp8_gemm"]):
            print(line)
        print()
        for line in [*summary_lines(cmap), *pays_lines(cmap), *(f"note: {n}" for n in cmap.notes)]:
            print("\n".join(fit_line(line, 120)))
    if plot_path is not None:
        plot(cmap, plot_path)
        print(f"plot: {plot_path}", file=sys.stderr if args.json else sys.stdout)
    return 0
