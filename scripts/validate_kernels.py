#!/usr/bin/env python3
"""On a GPU: every kernel against its float64 reference at DeepSeek-V3 TP8 shapes, with the
engine's default launch, and that launch's time. The first thing to run when a GPU is lent.

    PYTHONPATH=$PWD python3 scripts/validate_kernels.py --gpu H200 [--kernel-source ours vllm sglang]
        [--engine-source DIR ...] [--only TEXT ...] [--batch-sizes 1 64 512] [--out results.json]
        [--model deepseek-v3 --tp 8] [--device cuda|cpu] [--compile-workers N] [--tables FILE ...]

Per kernel source, in the order given: ours (kernels/), or an engine's own kernels (read from
--engine-source, the installed engine or $TUNER_ENGINE_WHEELS), on the problems of that
engine's tables, with the default launch; and with `--tables FILE ...` (an engine's shipped
tables, the engine's own format) each table's entries at --batch-sizes (the entry the engine
would use for each) on that engine's kernel, right after its default cases and in the same
measuring child. Every case runs in an isolated measuring child (tuner/measure/isolation.py)
whose compile workers build all of a kernel's cases first: a case that crashes the child, hangs
or poisons its CUDA context fails its own line and the next runs in a fresh child. `--device
cpu` runs the same code on the CPU device (Triton's interpreter; give a small --model). Prints
one line per case, writes --out after every case, and exits 1 if any case fails its tolerance
(or NaN) or could not be timed (its error said), 2 on bad input or without a GPU.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402
from tuner.plan.gpus import get_gpu  # noqa: E402
from tuner.plan.kernel_registry import kernel_for  # noqa: E402
from tuner.plan.models import gemm_problems, load_model, mla_problems, moe_problems  # noqa: E402


def cases(source: str, model, tp: int, only: list[str] | None, batch_sizes: list[int] | None):
    """(problem, engine, batch sizes) whose tables `source` times."""
    def wanted(p) -> bool:
        return not only or any(text in p.key for text in only)
    for p in gemm_problems(model, tp):
        if not wanted(p):
            continue
        for engine in (p.engines if source == "ours" else [e for e in p.engines if e == source]):
            yield p, engine, batch_sizes or [1, 64, 1024]
            if source == "ours":
                break                      # one shared table: one case
    for p in moe_problems(model, tp, 1, "fp8_w8a8"):
        if source in ("ours", p.engines[0]) and wanted(p):
            yield p, p.engines[0], batch_sizes or [1, 64, 512]
    if source != "ours":        # issue 52: one case of each integer precision on the engine's kernel
        from tuner.commands.proof_steps import precision_case_problems
        for p in precision_case_problems(model, tp, source):
            if wanted(p):
                yield p, source, (batch_sizes or [64])[-1:]
    if source == "ours" and model.is_mla:
        for p in mla_problems(model, tp, [4096, 32768], 64)[0]:
            if wanted(p):
                yield p, "tuner", batch_sizes or [1, 32]


def table_cases(paths: list[str], model, tp: int, batch_sizes: list[int] | None):
    """(engine, problem, M, config, label) of each shipped table's entries at `batch_sizes`
    (default 1, 256), on the model's shapes (`tuner check`'s reading of a table)."""
    from tuner.commands.check import pick_batch_sizes, read_table, table_problems
    from tuner.plan.kernel_api import checked_config
    from tuner.plan.kernel_registry import get_kernel
    for path in map(Path, paths):
        if not path.is_file():
            raise TunerError(f"table {path} not found")
        table = read_table(path)
        engine, work, _ = table_problems("fused_moe", path, table, model,
                                         lambda m, e: moe_problems(m, tp, 1, "fp8_w8a8", "uniform", [e]),
                                         "uniform", None)
        spec = get_kernel("fused_moe", engine, load_code=False)
        for problem, entries in work:
            for M, entry in pick_batch_sizes(entries, batch_sizes or [1, 256]).items():
                yield engine, problem, M, checked_config(spec, entry, f"{path}: the entry for M={M}"), \
                    f"shipped {path.name}"


def write(path: str | None, env: dict, rows: list) -> None:
    if path:
        from tuner.paths import atomic_write_json
        atomic_write_json(Path(path), {"environment": env, "cases": rows}, indent=2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--kernel-source", nargs="+", default=["ours"], choices=("ours", "vllm", "sglang"))
    ap.add_argument("--engine-source", nargs="+", default=None, metavar="PATH")
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                    help="only the problems whose key holds one of these texts")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=None, metavar="M")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--compile-workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--measure-timeout", type=float, default=120.0)
    ap.add_argument("--tables", nargs="+", default=None, metavar="FILE",
                    help="engines' shipped MoE tables: their entries at --batch-sizes on the engine's kernel")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: list = []
    failed = untimed = 0
    env: dict = {}
    try:
        from tuner.measure.device import require
        from tuner.measure.isolation import isolated_gpu_measurer
        from tuner.measure.provenance import short_label, time_source
        gpu = get_gpu(args.gpu)
        require(args.device, gpu, "validating kernels", "--device cpu runs them on the CPU device")
        model = load_model(args.model)
        shipped = list(table_cases(args.tables or [], model, args.tp, args.batch_sizes))
        for engine in sorted({e for e, *_ in shipped} - set(args.kernel_source)):
            print(f"note: the {engine} tables are not checked: --kernel-source has no {engine}", flush=True)
        groups = []
        for source in args.kernel_source:
            by_kernel: dict = {}
            for problem, engine, ms in cases(source, model, args.tp, args.only, args.batch_sizes):
                kernel = kernel_for(problem.kernel, engine, source, args.engine_source)
                by_kernel.setdefault(kernel.name, (kernel, []))[1].extend(
                    (problem, M, kernel.default_config(problem.params, M), "default") for M in ms)
            for engine, problem, M, cfg, label in shipped:
                if engine == source:
                    kernel = kernel_for("fused_moe", engine, source, args.engine_source)
                    by_kernel.setdefault(kernel.name, (kernel, []))[1].append((problem, M, cfg, label))
            groups += [(source, kernel, work) for kernel, work in by_kernel.values()]
        # the engines' kernels before ours, the MoE layer (what the proof tunes) before the GEMMs:
        # a validation cut by its time box loses the least valuable cases
        groups.sort(key=lambda g: (g[0] == "ours", g[1].name != "fused_moe"))
        for _, kernel, work in groups:
            measurer = isolated_gpu_measurer(kernel, gpu.key, args.compile_workers, args.measure_timeout,
                                             device=args.device)
            try:
                measurer.precompile([(p, M, c) for p, M, c, _ in work])   # every case at once, in the workers
                for problem, M, cfg, label in work:
                    check = measurer.check_numerics(problem, M, cfg)
                    timing = measurer.measure(problem, M, [cfg])[0]
                    env = measurer.environment()
                    row = {"kernel": kernel.name, "kernel_source": kernel.source_label, "problem": problem.key,
                           "M": M, "case": label, "config": cfg, "numerics": check.as_dict(),
                           "time_us": timing.time_us, "spread": timing.spread, "error": timing.error,
                           "time_source": time_source(env, measurer.label)}
                    rows.append(row)
                    failed += check.failed or timing.time_us is None
                    untimed += timing.time_us is None
                    t = f"{timing.time_us:9.2f} us ({short_label(env)})" if timing.time_us \
                        else f"not timed: {timing.error}"
                    rel = check.rel_error if check.rel_error is not None else float("nan")
                    status = check.status if timing.time_us else "failed"
                    print(f"{status:7s} rel {rel:.2e}  {t}  [{kernel.source_label}] {kernel.name} "
                          f"{problem.key} M={M} ({label})" + (f"  ({check.detail})" if check.failed else ""),
                          flush=True)
                    write(args.out, env, rows)       # after every case: a cut call keeps them
            finally:
                measurer.close()
    except TunerError as e:
        print(f"validate_kernels: error: {e}", file=sys.stderr)
        return 2
    write(args.out, env, rows)
    print(f"{len(rows) - failed} passed, {failed} failed" + (f" ({untimed} not timed)" if untimed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
