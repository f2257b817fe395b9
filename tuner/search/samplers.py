"""The samplers a study can use (--sampler), and the one place that builds them.

A light module on purpose: the command line lists SAMPLERS without importing Optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import TunerError

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

    from tuner.search.runner import SearchSettings

# gp (ours, tuner/search/surrogate.py) first, the default; then Optuna's. CMA-ES is not one:
# every key is a categorical parameter (tuner/search/runner.py), which Optuna's CMA-ES does not
# search (it samples them at random, independently), so `--sampler cmaes` was random search.
SAMPLERS = ("gp", "tpe", "random")
REMOVED = {"cmaes": "--sampler cmaes was removed: Optuna's CMA-ES leaves categorical parameters (every launch-config "
                    "key here) to random sampling, so it searched nothing; use gp (default), tpe or random"}


def make_sampler(settings: SearchSettings, keys: tuple[str, ...] = (), choices: dict | None = None,
                 candidates=(), warm: int = 0, kinds: dict | None = None) -> BaseSampler:
    """The study's sampler. `gp` scores the study's own candidates (tuner/search/surrogate.py); the
    others propose within the parameters' values. A constant liar only where trials run
    in parallel (a batch of more than one). `warm`: the study's warm seeds
    (tuner/search/warm_start.py), which shorten gp's random start; `kinds`: the space's key
    kinds (tuner/plan/key_kinds.py), how gp's model encodes each key. Every sampler is seeded
    with --seed alone, so the same seed gives the same search in any process."""
    import optuna

    from tuner.search.warm_start import startup

    s = settings
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=max(4, min(10, s.budget // 4)), multivariate=True,
            constant_liar=s.batch > 1)
    if s.sampler == "gp":
        from tuner.search.surrogate import CandidateGPSampler
        return CandidateGPSampler(keys, choices or {}, candidates, seed=s.seed,
                                  n_startup=startup(max(4, min(8, s.budget // 6)), warm), kinds=kinds)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler in REMOVED:
        raise TunerError(REMOVED[s.sampler])
    raise TunerError(f"unknown sampler {s.sampler!r}; choose from {', '.join(SAMPLERS)}")
