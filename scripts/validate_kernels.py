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
or poisons its CUDA context fails its own line and the next runs in a fresh child. With
`--recorded bench/validated.json` a case recorded there as passed under the same identity (GPU
model, Triton, torch, kernel code, case: tuner/jobs/proof_validation.py) is written as
recorded and not run again, but the first of each kernel source. `--device
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
from tuner.plan.models import load_model  # noqa: E402


def on_device(device: str, gpu) -> dict:
    """The device, Triton and torch the cases run on (their identity's part from here)."""
    import torch
    import triton

    from tuner.measure.device import device_name
    return {"device": device_name(device, gpu), "triton": triton.__version__, "torch": torch.__version__}


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
    ap.add_argument("--recorded", default=None, metavar="FILE",
                    help="a record of validated cases (bench/validated.json): a case it holds as passed under the "
                    "same identity (GPU model, Triton, torch, kernel code, case) is not run again; the first case "
                    "of each kernel source always runs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: list = []
    failed = untimed = recorded = 0
    env: dict = {}
    try:
        from tuner.measure.device import require
        from tuner.measure.isolation import isolated_gpu_measurer
        from tuner.measure.provenance import short_label, time_source
        gpu = get_gpu(args.gpu)
        require(args.device, gpu, "validating kernels", "--device cpu runs them on the CPU device")
        model = load_model(args.model)
        from tuner.jobs import proof_validation as pv
        ledger = pv.read_ledger(Path(args.recorded)) if args.recorded else {}
        groups = pv.groups(args.kernel_source, model, args.tp, args.only, args.batch_sizes, args.tables,
                           args.engine_source, log=lambda line: print(line, flush=True))
        on = on_device(args.device, gpu)
        decided = iter(pv.decide([pv.case_identity(k, p, M, c, lb, on) for _, k, work in groups
                                  for p, M, c, lb in work], ledger))
        groups = [(s, k, [(p, M, c, lb, next(decided)) for p, M, c, lb in work]) for s, k, work in groups]
        for _, kernel, work in groups:
            for problem, M, cfg, label, _ in (w for w in work if w[4] == pv.RECORDED):
                ident = pv.case_identity(kernel, problem, M, cfg, label, on)
                run = ledger[pv.key(ident)].get("run", "-")
                rows.append({**ident, "numerics": {"status": "recorded", "detail": f"passed in {run}"},
                             "time_us": None, "error": None, "recorded": run})
                recorded += 1
            work = [w for w in work if w[4] != pv.RECORDED]
            if not work:
                continue
            measurer = isolated_gpu_measurer(kernel, gpu.key, args.compile_workers, args.measure_timeout,
                                             device=args.device)
            try:
                measurer.precompile([(p, M, c) for p, M, c, *_ in work])   # every case at once, in the workers
                for problem, M, cfg, label, why in work:
                    check = measurer.check_numerics(problem, M, cfg)
                    timing = measurer.measure(problem, M, [cfg])[0]
                    env = measurer.environment()
                    row = {**pv.case_identity(kernel, problem, M, cfg, label, on), "numerics": check.as_dict(),
                           "time_us": timing.time_us, "spread": timing.spread, "error": timing.error,
                           "time_source": time_source(env, measurer.label), **({"canary": True} if why == pv.CANARY
                                                                                  and ledger else {})}
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
    print(f"{len(rows) - failed - recorded} passed, {failed} failed" + (f" ({untimed} not timed)" if untimed else "")
          + (f"; {recorded} recorded as passed before (same GPU model, Triton, torch, code): not run again"
             if recorded else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
