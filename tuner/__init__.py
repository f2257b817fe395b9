"""tuner: Triton launch-config autotuning for Hopper GPUs.

Data flows model -> problems -> search space -> one Optuna study per (problem, M)
-> measurer (GPU or replayed landscape) -> table -> each engine's files + manifest.
The packages follow that flow: plan/ (model, problems, space, engines' rules), search/,
measure/, emit/ (tables, manifest, install, audit), pipeline/ (one request, start to files),
commands/; cli.py and api.py are the faces (docs/architecture.md).
"""

__version__ = "0.1.0"

