"""How configs are chosen.

In: a problem, an M, a space and a measurer. Out: a finished Optuna study per (problem, M)
and its winner (`StudyRunner`), with its storage, claims between workers, stopping rules and
samplers.
"""

from tuner.moved import forward_old_names

# the names of the old module tuner.search (before 0.2), now in tuner.search.runner, still import from here
__getattr__ = forward_old_names(__name__, "tuner.search.runner", __file__)
