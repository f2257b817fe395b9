#!/usr/bin/env python3
"""On a GPU: every kernel against its float64 reference at DeepSeek-V3 TP8 shapes, with the
engines' default launch, and that launch's time. The first thing to run when a GPU is lent.

    PYTHONPATH=$PWD python3 scripts/validate_kernels.py --gpu H200 [--out results.json]

Prints one line per case and exits 1 if any case fails its tolerance (or NaN), 2 without a GPU.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import get_kernel  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.gpus import get_gpu  # noqa: E402
from tuner.models import gemm_problems, load_model, mla_problems, moe_problems  # noqa: E402


def cases():
    model = load_model("deepseek-v3")
    for p in gemm_problems(model, 8):
        yield p, [1, 64, 1024]
    for p in moe_problems(model, 8, 1, "fp8_w8a8"):
        yield p, [1, 64, 512]
    for p in mla_problems(model, 8, [4096, 32768], 64)[0]:
        yield p, [1, 32]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        from tuner.measure_gpu import GpuMeasurer
        gpu = get_gpu(args.gpu)
        measurers = {}
        rows, failed = [], 0
        for problem, ms in cases():
            kernel = get_kernel(problem.kernel)
            if kernel.name not in measurers:
                measurers[kernel.name] = GpuMeasurer(kernel, gpu, compile_workers=0)
            m = measurers[kernel.name]
            for M in ms:
                cfg = kernel.default_config(problem.params, M)
                check = m.check_numerics(problem, M, cfg)
                timing = m.measure(problem, M, [cfg])[0]
                floor = kernel.bytes_moved(problem.params, M) / (gpu.hbm_tb_s * 1e6)
                row = {"kernel": kernel.name, "problem": problem.key, "M": M, "config": cfg,
                       "numerics": check.as_dict(), "time_us": timing.time_us, "spread": timing.spread,
                       "error": timing.error, "datasheet_bytes_floor_us": floor}
                rows.append(row)
                failed += check.failed
                t = f"{timing.time_us:9.2f} us" if timing.time_us else f"error {timing.error}"
                print(f"{check.status:7s} rel {check.rel_error if check.rel_error is not None else float('nan'):.2e}  "
                      f"{t}  {kernel.name} {problem.key} M={M}", flush=True)
        env = next(iter(measurers.values())).environment() if measurers else {}
    except TunerError as e:
        print(f"validate_kernels: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "cases": rows}, indent=2))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
