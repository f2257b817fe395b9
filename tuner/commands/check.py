"""`tuner check`: its options, and the check of a table's configs against the float64
reference on a chosen kernel (tuner/jobs/check.py) run and summed up."""

from __future__ import annotations

from pathlib import Path

from tuner.commands.options import batch, device_option, parallel, seed, trust_option
from tuner.errors import TunerError
from tuner.pipeline.planning import command_dtype
from tuner.plan.engines import ENGINE_NAMES
from tuner.plan.precision import MOE_DTYPES


def add_parser(sub, common) -> None:
    """`tuner check` and its options."""
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
    trust_option(chk)
    chk.add_argument("--tp", type=parallel, default=1)
    chk.add_argument("--ep", type=parallel, default=1)
    chk.add_argument("--dtype", default=None, choices=MOE_DTYPES,
                     help="moe: the tables' precision (default: the checkpoint's own, bf16 when it is not quantized)")
    chk.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    chk.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None,
                     help="check these batch sizes (the entry the engine would use for each) instead of every M")
    chk.add_argument("--seed", type=seed, default=None, help="input seed, 0 to 2^32-1 (default: fresh random inputs)")
    device_option(chk, None, "; default: cuda where a GPU is visible, else cpu")
    chk.add_argument("--gpu", default=None, help="the GPU it runs on (default: the one present; the CPU device "
                     "stands in for an H100)")


def run(args) -> int:
    from tuner.jobs.check import run_check
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
