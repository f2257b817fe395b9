"""`tuner nightly`: its options into a NightlyRequest, run by tuner.api.nightly
(tuner/jobs/nightly.py: one night of the retune loop over a jobs YAML)."""

from __future__ import annotations


def add_parser(sub, common) -> None:
    """`tuner nightly` and its options."""
    night = sub.add_parser("nightly", help="check drift and retune the jobs of a YAML file",
                           description="One night of the retune loop over configs/nightly.yaml's jobs; exit 0 "
                           "fine, 3 a table regressed, 1 a job failed.")
    night.add_argument("config", help="the jobs YAML (see configs/nightly.yaml)")
    night.add_argument("--night", default=None, metavar="DATE", help="the night's folder name (default today)")
    night.add_argument("--dry-run", action="store_true", help="print every job's plan; nothing measured or written")
    night.add_argument("--synthetic", action="store_true",
                       help="time the jobs without a landscape of their own on SYNTHETIC ones made on the fly (no GPU; "
                            "into RUNS_DIR-synthetic)")
    from tuner.commands.options import minutes
    night.add_argument("--minutes", type=minutes, default=None, metavar="M",
                       help="the night's slot: the jobs' retunes stop after M minutes, their tables written with "
                       "what was tuned, and the next night (or window) with --minutes continues them")


def run(args) -> int:
    from tuner import api
    from tuner.jobs.requests import NightlyRequest, request_of
    return api.nightly(request_of(NightlyRequest, args))
