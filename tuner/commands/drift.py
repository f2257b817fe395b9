"""`tuner drift`: its options into a DriftRequest, run by tuner.api.drift
(tuner/jobs/drift.py: does a table still beat the default config here?)."""

from __future__ import annotations

from tuner.commands.options import device_option, fraction, parallel, trust_option


def add_parser(sub, common) -> None:
    """`tuner drift` and its options."""
    drift = sub.add_parser("drift", help="does a table still beat the default config here?",
                           description="Time each table's configs against the engines' default config on "
                           "this GPU and software (or a landscape) and say, per M, whether the table still wins.")
    drift.add_argument("tables", nargs="+", help="table files or folders (an engine's configs folder, a results folder)")
    drift.add_argument("--gpu", required=True)
    drift.add_argument("--model", default=None, help="needed for fused-MoE tables (hidden size, top-k)")
    drift.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                       help="fused MoE: how tokens are routed to experts while timing: uniformly at random like "
                       "the engines' tuners (default, as the tables were tuned), or Zipf-skewed like real traffic")
    drift.add_argument("--replay", default=None, metavar="FILE", help="time from a landscape instead of the GPU")
    drift.add_argument("--timing", choices=("graph", "eager"), default="graph",
                       help="time CUDA-graph replays (default) or eager launches, as the tables were tuned")
    drift.add_argument("--l2", choices=("cold", "warm"), default="cold", help="L2 flushed before each run, or warm")
    drift.add_argument("--noise", type=fraction, default=0.02,
                       help="a difference smaller than this fraction (or the measured spread, if larger) is a tie, "
                       "`same` (default 0.02 = 2%%)")
    drift.add_argument("--kernel-source", choices=("engine", "ours"), default=None,
                       help="engine (default): each engine's table on that engine's own kernel; ours: on ours "
                       "(with --replay: the landscape's)")
    drift.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                       help="the engines' wheels or extracted folders (default: installed, then $TUNER_ENGINE_WHEELS)")
    trust_option(drift)
    drift.add_argument("--out", default=None, metavar="FILE", help="also write the rows as JSON")
    drift.add_argument("--tp", type=parallel, default=None,
                       help="with --traffic and --model: the TP the GEMM tables are for, for their layer counts "
                       "(default: the first TP at which the model runs the shape)")
    drift.add_argument("--traffic", default=None, metavar="FILE",
                       help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): also print "
                       "the traffic-weighted speedup and, with --model, the per-pass estimate")
    device_option(drift)


def run(args) -> int:
    from tuner import api
    from tuner.jobs.requests import DriftRequest, request_of
    return api.drift(request_of(DriftRequest, args))
