"""tuner's Python API: each command's request as a typed object, and the one function that runs it.

`tune(TuneRequest(...))` runs what `tuner gemm|moe|mla` runs (the request is checked as it is
made, tuner/pipeline/request.py; the run is the pipeline's, tuner/pipeline/), and
`install_results` what `tuner install` does (tuner/jobs/install.py; `tuner nightly` installs
through it too). The long jobs (tuner/jobs/): `proof(ProofRequest(...))` the GPU run,
`nightly(NightlyRequest(...))`, `drift(DriftRequest(...))`, `bench(BenchRequest(...))`,
`report(ReportRequest(...))` and `diff(DiffRequest(...))`, each what its command runs, printing
what the command prints and returning its exit status (bad input raises TunerError).
"""

from __future__ import annotations

from tuner.jobs.install import install_results
from tuner.jobs.requests import (
    BenchRequest,
    DiffRequest,
    DriftRequest,
    NightlyRequest,
    ProofRequest,
    ReportRequest,
)
from tuner.pipeline.request import TuneRequest
from tuner.pipeline.tune import tune

__all__ = ["TuneRequest", "tune", "install_results", "ProofRequest", "proof", "NightlyRequest", "nightly",
           "DriftRequest", "drift", "BenchRequest", "bench", "ReportRequest", "report", "DiffRequest", "diff"]


def proof(request: ProofRequest) -> int:
    """`tuner proof`: the GPU run's steps, or with `plan` their time boxes (tuner/jobs/proof.py)."""
    from tuner.jobs.proof import run_proof
    return run_proof(request)


def nightly(request: NightlyRequest) -> int:
    """`tuner nightly`: one night of drift checks and retunes; 0 fine, 3 a table regressed, 1 a job failed."""
    from tuner.jobs.nightly import run_nightly
    return run_nightly(request)


def drift(request: DriftRequest) -> int:
    """`tuner drift`: whether each table still beats the engine's default config (tuner/jobs/drift.py)."""
    from tuner.jobs.drift import run_drift
    return run_drift(request)


def bench(request: BenchRequest) -> int:
    """`tuner bench`: every contender per (problem, M) against the roofline (tuner/jobs/bench.py)."""
    from tuner.jobs.bench import run_bench
    return run_bench(request)


def report(request: ReportRequest) -> int:
    """`tuner report`: a results folder's tables and plots, or a bench file's verdict (tuner/jobs/report.py)."""
    from tuner.jobs.report import run_report
    return run_report(request)


def diff(request: DiffRequest) -> int:
    """`tuner diff`: two results folders compared (tuner/jobs/report.py)."""
    from tuner.jobs.report import run_diff
    return run_diff(request)
