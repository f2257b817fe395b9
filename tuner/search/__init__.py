"""How configs are chosen.

In: a problem, an M, a space and a measurer. Out: a finished Optuna study per (problem, M)
and its winner (`StudyRunner`), with its storage, claims between workers, stopping rules and
samplers.
"""

from pathlib import Path as _Path


def __getattr__(name: str) -> object:
    """The names of the old module tuner.search (before 0.2; the study runner, now tuner.search.runner)
    still import from here: `from tuner.search import ...` in old scripts keeps working."""
    if name.startswith("_") or (_Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module 'tuner.search' has no attribute {name!r}")
    from tuner.search import runner
    try:
        return getattr(runner, name)
    except AttributeError:
        raise AttributeError(f"module 'tuner.search' has no attribute {name!r}") from None
