"""The long jobs: the GPU run (proof), nightly, drift, bench and report: their plans, steps and
outputs, below the API and the commands (docs/architecture.md). Modules here import no heavy
library at module level (torch, Triton, Optuna, pandas): `tuner --help` builds every parser.
"""
