"""`tuner landscape synth` (a SYNTHETIC landscape from a cost model, never a measurement) and
`tuner landscape info` (what a recorded landscape covers)."""

from __future__ import annotations

from pathlib import Path

from tuner.commands.options import Parser, batch, context, page, parallel_options
from tuner.errors import TunerError
from tuner.pipeline.command_problems import problem_builder, resolve_tp
from tuner.pipeline.planning import command_dtype
from tuner.pipeline.request import DTYPES
from tuner.plan.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES


def add_parser(sub, common) -> None:
    """`tuner landscape` and its two actions."""
    land = sub.add_parser("landscape", help="make a SYNTHETIC landscape, or show what one covers",
                          description="`synth`: write a landscape timed by a SYNTHETIC cost model (not a GPU), to "
                          "try --replay without a GPU; `info FILE`: what a landscape covers.")
    land_sub = land.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    synth = land_sub.add_parser("synth", help="write a SYNTHETIC landscape (a cost model; nothing is measured)")
    synth.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    synth.add_argument("--model", required=True)
    synth.add_argument("--gpu", required=True)
    parallel_options(synth)
    synth.add_argument("--dtype", default=None)
    synth.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    synth.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    synth.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None)
    synth.add_argument("--contexts", type=context, nargs="+", metavar="TOKENS", default=None)
    synth.add_argument("--page-size", type=page, default=64)
    synth.add_argument("--kernel-source", choices=("ours", *ENGINE_NAMES), default="ours",
                       help="whose kernel's configs (space, keys) it covers (default ours)")
    synth.add_argument("--out", required=True, metavar="FILE", help="the landscape (.jsonl or .jsonl.gz)")
    info = land_sub.add_parser("info", help="show what a landscape covers")
    info.add_argument("file")


def run(args) -> int:
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
        variant = str(header.get("kernel_variant") or "")
        kernel = (get_kernel(header["kernel"], source, load_code=False, variant=variant) if source != "ours"
                  else get_kernel(header["kernel"]))
        for line in describe(read_landscape(args.file, kernel)):
            print(line)
        return 0
    if args.action != "synth":
        raise TunerError("say what to do: `tuner landscape synth ...` or `tuner landscape info FILE`")
    from tuner.measure.synthetic import write_synthetic_landscape
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import engine_variant, get_kernel
    from tuner.plan.models import load_model
    from tuner.plan.space import load_space

    if args.dtype is not None and args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported for --kernel {args.kernel}")
    out = Path(args.out)
    from tuner.measure.synthetic import check_replaceable
    replacing = check_replaceable(out)         # an earlier synth's file is replaced; anything else refused
    from tuner.paths import check_writable, remove_stale_temporaries_of
    check_writable(out, "--out", folder=False)
    gpu = get_gpu(args.gpu)
    kernel_name, make = problem_builder(args, args.kernel)
    model = load_model(args.model)
    resolve_tp(args, model, gpu)
    args.dtype = command_dtype(args.kernel, model, args.dtype)
    problems = make(model)
    if args.kernel_source != "ours":
        problems = [p for p in problems if args.kernel_source in p.engines]
        if not problems:
            raise TunerError(f"{args.kernel_source} reads none of this model's {kernel_name} tables")
    kernel = get_kernel(kernel_name, args.kernel_source, load_code=False,
                        variant=engine_variant(kernel_name, args.kernel_source, problems[0].params)) \
        if args.kernel_source != "ours" else get_kernel(kernel_name)
    ms = sorted(set(args.batch_sizes or kernel.batch_sizes or DEFAULT_BATCH_SIZES))     # the kernel's grid
    remove_stale_temporaries_of(out)          # what a killed synth of this file left (never continued)
    n = write_synthetic_landscape(out, kernel, load_space(kernel, problems=problems), gpu, [p.params for p in problems],
                                  ms)
    again = f"replaced {out} (an earlier SYNTHETIC landscape): " if replacing else ""
    print(f"{again}wrote {n} SYNTHETIC points ({len(problems)} problems x {len(ms)} batch sizes) to {out}: "
          "a cost model, not a GPU; replay it with --replay to try the tool, never to choose configs")
    return 0
