"""How configs are chosen.

In: a problem, an M, a space and a measurer. Out: a finished Optuna study per (problem, M)
and its winner (`StudyRunner`), with its storage, claims between workers, stopping rules and
samplers.
"""
