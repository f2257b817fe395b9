#!/usr/bin/env python3
"""On a GPU: every kernel against its float64 reference at DeepSeek-V3 TP8 shapes, with the
engine's default launch, and that launch's time. The first thing to run when a GPU is lent.

    PYTHONPATH=$PWD python3 scripts/validate_kernels.py --gpu H200 [--kernel-source ours vllm sglang]
        [--engine-source DIR ...] [--out results.json]

Per kernel source: ours (kernels/), or an engine's own kernels (read from --engine-source,
the installed engine or $TUNER_ENGINE_WHEELS), on the problems of that engine's tables.
Prints one line per case and exits 1 if any case fails its tolerance (or NaN), 2 without a GPU.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402
from tuner.gpus import get_gpu  # noqa: E402
from tuner.kernel_sources import kernel_for  # noqa: E402
from tuner.models import gemm_problems, load_model, mla_problems, moe_problems  # noqa: E402


def cases(source: str):
    """(problem, engine, batch sizes) whose tables `source` times."""
    model = load_model("deepseek-v3")
    for p in gemm_problems(model, 8):
        for engine in (p.engines if source == "ours" else [e for e in p.engines if e == source]):
            yield p, engine, [1, 64, 1024]
            if source == "ours":
                break                      # one shared table: one case
    for p in moe_problems(model, 8, 1, "fp8_w8a8"):
        if source in ("ours", p.engines[0]):
            yield p, p.engines[0], [1, 64, 512]
    if source == "ours":
        for p in mla_problems(model, 8, [4096, 32768], 64)[0]:
            yield p, "tuner", [1, 32]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--kernel-source", nargs="+", default=["ours"], choices=("ours", "vllm", "sglang"))
    ap.add_argument("--engine-source", nargs="+", default=None, metavar="PATH")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows, failed, env = [], 0, {}
    try:
        from tuner.measure_gpu import GpuMeasurer
        gpu = get_gpu(args.gpu)
        for source in args.kernel_source:
            measurers = {}
            for problem, engine, ms in cases(source):
                kernel = kernel_for(problem.kernel, engine, source, args.engine_source)
                if kernel.name not in measurers:
                    measurers[kernel.name] = GpuMeasurer(kernel, gpu, compile_workers=0)
                m = measurers[kernel.name]
                for M in ms:
                    cfg = kernel.default_config(problem.params, M)
                    check = m.check_numerics(problem, M, cfg)
                    timing = m.measure(problem, M, [cfg])[0]
                    row = {"kernel": kernel.name, "kernel_source": kernel.source_label, "problem": problem.key,
                           "M": M, "config": cfg, "numerics": check.as_dict(), "time_us": timing.time_us,
                           "spread": timing.spread, "error": timing.error, "time_source": "measured on the GPU"}
                    rows.append(row)
                    failed += check.failed
                    t = f"{timing.time_us:9.2f} us (GPU)" if timing.time_us else f"error {timing.error}"
                    rel = check.rel_error if check.rel_error is not None else float("nan")
                    print(f"{check.status:7s} rel {rel:.2e}  {t}  [{kernel.source_label}] {kernel.name} "
                          f"{problem.key} M={M}", flush=True)
            env = env or next(iter(measurers.values())).environment() if measurers else env
            for m in measurers.values():
                m.close()
    except TunerError as e:
        print(f"validate_kernels: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "cases": rows}, indent=2))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
