#!/usr/bin/env python3
"""The search model's own cost per trial (tuner/search/surrogate.py), on replayed landscapes.

    python scripts/sampler_cost.py [--landscapes DIR] [--only NAME ...] [--trials 100] [--seeds 2]

Runs the default search (no early stop) over each landscape and times the sampler's every
proposal: wall clock and this process's CPU time, with numpy's BLAS limited to one thread while
the model is fitted and scored (the default), and with it left as numpy sets it up
(--blas-threads as-is). Nothing is measured on a GPU: the landscapes' times only steer the
search; the figures are this machine's CPU cost of choosing configs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.measure.landscape import read_header, read_landscape  # noqa: E402
from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", default=str(Path(__file__).resolve().parents[1] / "real-landscapes"))
    ap.add_argument("--only", nargs="*", default=["xgemm-rtx2080ti-6p", "convolution-a100", "xgemm-rtx2080ti"])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--blas-threads", choices=("one", "as-is"), default="one")
    args = ap.parse_args()
    import tuner.search.surrogate as sg
    from tuner.search.offline import benchmark_traces
    from tuner.search.runner import default_settings
    if args.blas_threads == "as-is":
        if hasattr(sg, "_BLAS"):
            sg._BLAS[:] = [None]                 # the model's BLAS calls on numpy's own thread count
    stats = {"wall": 0.0, "cpu": 0.0, "n": 0}
    real = sg.CandidateGPSampler.sample_relative

    def timed(self, *a, **kw):
        w, c = time.perf_counter(), time.process_time()
        out = real(self, *a, **kw)
        stats["wall"] += time.perf_counter() - w
        stats["cpu"] += time.process_time() - c
        stats["n"] += 1
        return out
    sg.CandidateGPSampler.sample_relative = timed
    print("| landscape | configs | trials | BLAS threads | sampler wall ms/trial | sampler CPU ms/trial |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.only:
        path = Path(args.landscapes) / f"{name}.jsonl.gz"
        header = read_header(path)
        kernel = landscape_kernel(header)
        land = read_landscape(path, kernel)
        stats.update(wall=0.0, cpu=0.0, n=0)
        benchmark_traces(land, landscape_space(kernel, header), landscape_gpu(header), "ours:cost", range(args.seeds),
                         args.trials, lambda b, s: (default_settings(b, seed=s, patience=10 ** 9), True))
        grid = sum(len(p) for p in land.points.values())
        print(f"| {name} | {grid} | {args.trials} | {args.blas_threads} ({os.cpu_count()} cores) | "
              f"{1000 * stats['wall'] / stats['n']:.1f} | {1000 * stats['cpu'] / stats['n']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
