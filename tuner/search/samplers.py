"""The samplers a study can use (--sampler), and the one place that builds them.

A light module on purpose: the command line lists SAMPLERS without importing Optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import TunerError

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

    from tuner.search.runner import SearchSettings

# gp (ours, tuner/search/surrogate.py) first, the default; then Optuna's
SAMPLERS = ("gp", "tpe", "random", "cmaes")


def make_sampler(settings: SearchSettings, keys: tuple[str, ...] = (), choices: dict | None = None,
                 candidates=()) -> BaseSampler:
    """The study's sampler. `gp` scores the study's own candidates (tuner/search/surrogate.py); the
    others propose within the parameters' values. A constant liar only where trials run
    in parallel (a batch of more than one)."""
    import optuna

    s = settings
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=max(4, min(10, s.budget // 4)), multivariate=True,
            constant_liar=s.batch > 1)
    if s.sampler == "gp":
        from tuner.search.surrogate import CandidateGPSampler
        return CandidateGPSampler(keys, choices or {}, candidates, seed=s.seed,
                                  n_startup=max(4, min(8, s.budget // 6)))
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "cmaes":
        try:
            import cmaes  # noqa: F401 - Optuna's CMA-ES sampler imports it only when it first samples
        except ImportError:
            raise TunerError("--sampler cmaes needs the cmaes package (pip install cmaes); "
                             "tpe and random need nothing more") from None
        return optuna.samplers.CmaEsSampler(seed=s.seed, warn_independent_sampling=False)
    raise TunerError(f"unknown sampler {s.sampler!r}; choose from {', '.join(SAMPLERS)}")
