"""`tuner bench`: its options into a BenchRequest, run by tuner.api.bench
(tuner/jobs/bench.py: every contender per (problem, M), against the roofline)."""

from __future__ import annotations

import os

from tuner.commands.options import (
    batch,
    context,
    device_option,
    page,
    parallel_options,
    positive,
    trust_option,
    workers,
)
from tuner.plan.engines import ENGINE_NAMES


def add_parser(sub, common) -> None:
    """`tuner bench` and its options."""
    bench = sub.add_parser("bench", help="time every contender per batch size against the roofline",
                           description="Per problem and M: the engine's default config, the row each engine reads today, "
                           "each shipped table "
                           "(--baseline), our tuned table (--tuned), a landscape's best, and a reference outside "
                           "Triton where one exists, timed together, with their spread and their fraction of the "
                           "roofline. Writes bench-<device>-<date>.json, a Markdown report and a plot per problem.")
    bench.add_argument("--model", required=True)
    bench.add_argument("--gpu", required=True)
    bench.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    parallel_options(bench)
    bench.add_argument("--dtype", default=None, help="moe: fp8_w8a8 or bf16 (default: the checkpoint's own); "
                       "gemm: fp8_w8a8")
    bench.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    bench.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None,
                       help="default: the engines' grid (mla: 32 64 128)")
    bench.add_argument("--contexts", type=context, nargs="+", metavar="TOKENS", default=None,
                       help="mla: context buckets (default 4096 8192 32768)")
    bench.add_argument("--page-size", type=page, default=64, help="mla: KV cache page size")
    bench.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    bench.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                       help="bench only the problems whose key holds one of these texts")
    bench.add_argument("--tuned", default=None, metavar="RUN_DIR", help="one of our results folders")
    bench.add_argument("--baseline", nargs="+", default=None, metavar="DIR",
                       help="folders of shipped tables, e.g. ../shared/baselines/vllm-0.33.0")
    bench.add_argument("--replay", default=None, metavar="FILE", help="time from a landscape (no GPU)")
    bench.add_argument("--kernel-source", nargs="+", choices=("engine", "ours"), default=["engine"],
                       help="whose kernels time the configs; several side by side (default: engine)")
    bench.add_argument("--engine-source", nargs="+", metavar="PATH", default=None)
    trust_option(bench)
    bench.add_argument("--ceilings", default=None, metavar="FILE",
                       help="measured ceilings (default bench/ceilings/<gpu>.json, else datasheet figures)")
    bench.add_argument("--compile-workers", type=workers, default=min(16, os.cpu_count() or 1))
    bench.add_argument("--measure-timeout", type=positive, default=120, metavar="S",
                       help="seconds one config may take before it counts as hung (default 120)")
    device_option(bench)
    bench.add_argument("--out", required=True, metavar="DIR")
    bench.add_argument("--traffic", default=None, metavar="FILE",
                       help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): bench at the "
                       "keys it chooses (unless --batch-sizes) and print the traffic-weighted speedups")
    bench.add_argument("--quiet", action="store_true")


def run(args) -> int:
    from tuner import api
    from tuner.jobs.requests import BenchRequest, request_of
    return api.bench(request_of(BenchRequest, args))
