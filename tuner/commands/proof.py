"""`tuner proof`: the GPU run's options into a ProofRequest, run by tuner.api.proof
(tuner/jobs/proof.py: one device command, time-boxed steps, then a window of tuning)."""

from __future__ import annotations

from tuner.commands.options import device_option, trust_option
from tuner.jobs.proof_plan import CALLS, STEPS


def add_parser(sub, common) -> None:
    """`tuner proof` and its options."""
    proof = sub.add_parser("proof", help="the GPU run: one device command (scripts/gpu_proof.sh), then a local part",
                           description="The device command (--call gpu): environment and ceilings, a MoE smoke test "
                           "(stops the call when nothing is timed), the full kernel validation, then one window of "
                           "tuning for the time left, continuing tuned/<device>/ (both engines' MoE tables, their "
                           "GEMM tables, MLA decode, a landscape); local (no GPU): report and sampler study. Each "
                           "step's box comes from the H200 run's measured times; each step is written before the "
                           "next (and bundled into --bundle). --device cpu rehearses it with a tiny model (for CI).")
    proof.add_argument("--gpu", default="H100", help="the GPU of the machine (default H100)")
    proof.add_argument("--minutes", type=float, default=9.0,
                       help="this call's budget for its steps (default 9: a 10-minute device command)")
    proof.add_argument("--out", default=None, metavar="DIR",
                       help="default bench/results/<gpu>-<date>/ (with --device cpu: runs/proof-cpu-device-...)")
    proof.add_argument("--engine-source", nargs="+", metavar="PATH", default=None,
                       help="the engines' code (default: the folders in .engine-src/, else the installed engines, "
                       "else $TUNER_ENGINE_WHEELS)")
    trust_option(proof)
    proof.add_argument("--baselines", default=None, metavar="DIR",
                       help="the engines' shipped tables (default .baselines/, else ../shared/baselines)")
    proof.add_argument("--call", choices=tuple(CALLS), default=None,
                       help="which part: gpu (the one device command), local (here, after)")
    proof.add_argument("--steps", nargs="+", default=None, metavar="STEP",
                       help=f"run only these steps (of: {' '.join(STEPS)}); the summary keeps earlier calls' steps")
    proof.add_argument("--plan", action="store_true",
                       help="print the steps' time boxes within --minutes (from the H200 run's measured times) and "
                       "how much of the DeepSeek-V3 H200 work the window finishes, and stop (no GPU needed)")
    proof.add_argument("--bundle", default=None, metavar="DIR",
                       help="after every step, write the folder as one tarball (top folder bench/results/<name>) "
                       "and summary.md into DIR (the device tool's $OUT)")
    device_option(proof)


def run(args) -> int:
    from tuner import api
    from tuner.jobs.requests import ProofRequest, request_of
    return api.proof(request_of(ProofRequest, args))
