"""tuner: Triton launch-config autotuning for Hopper GPUs.

Data flows model -> problems -> search space -> one Optuna study per (problem, M)
-> measurer (GPU or replayed landscape) -> table -> each engine's files + manifest.
"""

__version__ = "0.1.0"
