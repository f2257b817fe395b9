"""A model-based sampler over the study's own candidates (`--sampler gp`).

A study's configs are a finite, known set (the pruned grid, within a landscape's points on
a replay), so instead of proposing points in a box and throwing away those that are pruned
or already measured, this sampler scores every candidate nobody measured or holds and picks
the best: a Gaussian process on log(time) over the configs' features (each key encoded by
its kind, tuner/plan/key_kinds.py: log2 of a power-of-two size, log2 and alignment of another
size, one column per value of a category; scaled to [0, 1]; Matern 5/2 with a length scale per key,
fitted by marginal likelihood with a log-normal prior) on the times' ranks mapped to a normal (a Gaussian copula, not log(time)),
expected improvement as the acquisition. Until `n_startup` configs besides the seeds are
measured it picks at random among the candidates. A failed config counts as the slowest seen (the model then
steers away from its neighbourhood). Configs other workers (or this batch) are measuring
are taken as their predicted time ("kriging believer"), so a batch spreads out.

Why ranks and the prior (issue 32): on Kernel Tuner's convolution landscapes of the A100 and
A4000 (scripts/search_benchmark.py, bench/results/search/convolution-before.md) the model on log(time),
fitted by likelihood alone, reached only 1.43x and 1.19x of the best at 48 trials (20 seeds): a few configs
30-50x slower than the best stretched the standardized times, and with the first ten or twenty
observations the likelihood chose length scales of 0.08 for some keys and 3.0 for others
(read_only, use_padding), which made the model near-noise in some keys and blind in others
(the fits jumped between them from one refit to the next). Ranks and the prior: 1.31x and 1.12x
(convolution.md), without losing the GEMM landscapes. Failed configs still count as the slowest seen: without
that, on the RTX Titan's convolution (22 % of its configs fail) the search went back into the
failing region (1.13x against 1.07x at 48 over 10 seeds). The model runs on one BLAS thread
(`one_blas_thread`), and on a space of more than MAX_SCORED candidates scores only the
neighbours of the best few and a random draw of the rest, so its cost per trial stays bounded.

It reads every trial's config from its "config" user attribute (tuner/search/storage.py),
so it sees exactly what the search measured, whatever the parameters' encoding; it needs
numpy only.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

LENGTH_SCALES = (0.08, 0.15, 0.3, 0.6, 1.2, 3.0)     # per key, in units of the key's [0, 1] range
NOISE = 1e-3                                          # of the rank-normalized times
FAILED_AS_WORST = True                                # a failed config enters the model as the slowest seen
REFIT_EVERY = 4                                       # observations between length-scale fits
FIT_ATTR = "gp_fit"                                    # the last fit, kept in the study (length scales)
RNG_ATTR = "gp_rng"                                    # the random stream's state, kept in the study
# Candidates the acquisition scores at most per trial (bounds the cost on large spaces): the
# configs one key away from the best few measured, then a random draw of the rest.
MAX_SCORED = 4096
LOCAL_FROM = 3
# Length scales are fitted by maximum a posteriori, not likelihood alone: a log-normal prior
# (median 1.0 of a key's range, sigma 1 in log space) keeps a few observations from fitting
# tiny length scales that turn the model into noise (convolution landscapes: see below).
LS_PRIOR = (1.0, 1.0)


_BLAS: list = []


@contextlib.contextmanager
def one_blas_thread():
    """numpy's BLAS on one thread while the model is fitted and scored: its matrices are small
    (observations x observations, candidates x observations), and on two cores numpy's own BLAS
    threads took 2-3.5x the CPU for no gain in wall time (bench/results/search/sampler-cost.md);
    on a GPU host's many cores more, taken from the compile workers."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController
            _BLAS.append(ThreadpoolController())
        except Exception:  # noqa: BLE001 - without threadpoolctl the model runs as numpy is set up
            _BLAS.append(None)
    if _BLAS[0] is None:
        yield
        return
    with _BLAS[0].limit(limits=1, user_api="blas"):
        yield


def _scaled(v: np.ndarray, vals) -> np.ndarray:
    lo, hi = float(min(vals)), float(max(vals))
    return (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)


def _alignment(v: np.ndarray) -> np.ndarray:
    """log2 of the largest power of two dividing each value (0 counts as the best aligned)."""
    iv = v.astype(np.int64)
    low = np.where(iv > 0, iv & -iv, 0)
    out = np.log2(np.maximum(low, 1)).astype(float)
    return np.where(iv > 0, out, out.max(initial=0.0) + 1.0)


def _features(candidates: np.ndarray, choices: Sequence[Sequence[int]],
              kinds: Sequence[str] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """The model's features of each candidate, by each key's kind (tuner/plan/key_kinds.py),
    and the columns that share a length scale: log (log2 of the value), ordered (log2 of the
    value, and apart its alignment: a value 16x slower off powers of two is then learnt
    from the alignment column, not smeared over its neighbours), category (one column per
    value, 1/sqrt(2) apart so that two values are as far as a key's whole range).
    Every column lies in [0, 1]."""
    cols: list[np.ndarray] = []
    groups: list[np.ndarray] = []

    def add(*new: np.ndarray) -> None:
        groups.append(np.arange(len(cols), len(cols) + len(new)))
        cols.extend(new)

    for j, vals in enumerate(choices):
        kind = kinds[j] if kinds else ("log" if min(vals) > 0 else "ordered")
        v = candidates[:, j].astype(float)
        fvals = np.array(sorted(vals), dtype=float)
        if kind == "category" and len(vals) > 2:
            add(*[(v == x).astype(float) / math.sqrt(2) for x in fvals])
        elif kind == "category" or min(vals) <= 0:
            add(_scaled(v, fvals))
        else:
            add(_scaled(np.log2(v), np.log2(fvals)))
            if kind == "ordered":
                al = _alignment(fvals)
                if al.max() > al.min():
                    add(_scaled(_alignment(v), al))
    return np.stack(cols, axis=1), groups


def _matern52(a: np.ndarray, b: np.ndarray, ls: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) / ls) ** 2, 0).sum(-1)) * math.sqrt(5)
    return (1 + d + d * d / 3) * np.exp(-d)


def _log_likelihood(x: np.ndarray, y: np.ndarray, ls: np.ndarray, groups: Sequence[np.ndarray]) -> float:
    k = _matern52(x, x, ls) + NOISE * np.eye(len(x))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return -math.inf
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    per_group = np.array([ls[cols[0]] for cols in groups])       # one prior term per key, whatever its columns
    prior = -0.5 * float(((np.log(per_group / LS_PRIOR[0]) / LS_PRIOR[1]) ** 2).sum())
    return float(-0.5 * y @ alpha - np.log(np.diag(chol)).sum()) + prior


def _fit_length_scales(x: np.ndarray, y: np.ndarray, ls: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """One pass of coordinate search over LENGTH_SCALES, group by group (a key's columns: one,
    or a category's one per value), on the marginal likelihood."""
    ls = ls.copy()
    for cols in groups:
        best, best_v = -math.inf, ls[cols[0]]
        for v in LENGTH_SCALES:
            ls[cols] = v
            ll = _log_likelihood(x, y, ls, groups)
            if ll > best:
                best, best_v = ll, v
        ls[cols] = best_v
    return ls


def _copula(y: np.ndarray) -> np.ndarray:
    """The times' ranks mapped onto a standard normal (ties share a rank): the model sees the
    order of the configs, not how far the slow ones are off (a kernel landscape's times span
    50x, and a few very slow configs would otherwise flatten the differences among good ones)."""
    ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable").astype(float)
    # ties share their mean rank
    _, inv, counts = np.unique(y, return_inverse=True, return_counts=True)
    sums = np.zeros(len(counts))
    np.add.at(sums, inv, ranks)
    ranks = (sums / counts)[inv]
    q = (ranks + 0.5) / len(y)
    return _ndtri(q)


def _ndtri(q: np.ndarray) -> np.ndarray:
    # Acklam's rational approximation of the normal quantile (|error| < 1.2e-9)
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00]
    b = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    q = np.clip(q, 1e-12, 1 - 1e-12)
    out = np.empty_like(q)
    lo, hi = q < 0.02425, q > 1 - 0.02425
    mid = ~(lo | hi)
    r = q[mid] - 0.5
    t = r * r
    out[mid] = ((((((a[0]*t+a[1])*t+a[2])*t+a[3])*t+a[4])*t+a[5])*r /
                (((((b[0]*t+b[1])*t+b[2])*t+b[3])*t+b[4])*t+1))
    for m, sign, qq in ((lo, 1, q[lo]), (hi, -1, 1 - q[hi])):
        t = np.sqrt(-2 * np.log(qq))
        out[m] = sign * ((((((c[0]*t+c[1])*t+c[2])*t+c[3])*t+c[4])*t+c[5]) /
                         ((((d[0]*t+d[1])*t+d[2])*t+d[3])*t+1))
    return out


def _expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    z = (best - mean) / std
    cdf = 0.5 * (1 + _erf(z / math.sqrt(2)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return (best - mean) * cdf + std * pdf


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz-Stegun 7.1.26 (error < 1.5e-7): numpy has no erf, and scipy is not a dependency
    s = np.sign(x)
    x = np.abs(x)
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1 - poly * np.exp(-x * x))


class CandidateGPSampler(BaseSampler):
    """Optuna sampler choosing among `candidates` (config tuples over `keys`)."""

    def __init__(self, keys: Sequence[str], choices: dict[str, list[int]], candidates, seed: int = 0,
                 n_startup: int = 8, kinds: dict[str, str] | None = None):
        from tuner.plan.key_kinds import resolved_kinds
        self.keys = tuple(keys)
        self.choices = {k: list(choices[k]) for k in self.keys}
        # the space's kinds (declared, or implied by the space's values); a key it does not
        # name gets the kind the study's own values imply
        self.kinds = {**resolved_kinds(self.choices), **{k: v for k, v in (kinds or {}).items() if k in self.choices}}
        self.candidates = np.array(sorted(candidates), dtype=np.int64).reshape(-1, len(self.keys))
        self.index = {tuple(int(v) for v in row): i for i, row in enumerate(self.candidates)}
        self.x_all, self.groups = _features(self.candidates, [self.choices[k] for k in self.keys],
                                            [self.kinds[k] for k in self.keys])
        self.rng = np.random.default_rng(seed)
        self._restored = False
        self.n_startup = n_startup
        self.ls = np.full(self.x_all.shape[1], 0.3)
        self._fitted_at = -1
        self._random = RandomSampler(seed=seed)

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {k: CategoricalDistribution(self.choices[k]) for k in self.keys}

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def _observations(self, study: optuna.Study, trial: FrozenTrial):
        done: dict[int, float | None] = {}
        pending: list[int] = []
        explored = 0          # configs measured that were not queued seeds
        for tr in study.get_trials(deepcopy=False):
            cfg = tr.user_attrs.get("config")
            if tr.number == trial.number or not cfg:
                continue
            i = self.index.get(tuple(int(cfg[k]) for k in self.keys))
            if i is None:
                continue
            if tr.state == TrialState.COMPLETE and tr.value is not None:
                done[i] = float(tr.value)
                explored += "seed" not in tr.user_attrs
            elif tr.state == TrialState.FAIL and "error" in tr.user_attrs and tr.user_attrs["error"] != "interrupted":
                done.setdefault(i, None)
                explored += "seed" not in tr.user_attrs
            elif tr.state == TrialState.RUNNING:
                pending.append(i)
        return done, pending, explored

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or len(self.candidates) == 0:
            return {}
        # The random stream and the model's fit are kept in the study: a study continued by
        # another process (the next --minutes window) proposes what one process running on would have.
        if not self._restored:
            self._restored = True
            stored = study.user_attrs.get(RNG_ATTR)
            if stored is not None:
                # a state that does not validate (edited, damaged, another generator's): this one's own stream
                from tuner.search.stored_state import discarded, rng_problem
                why = rng_problem(stored, type(self.rng.bit_generator).__name__)
                if why is None:
                    try:
                        self.rng.bit_generator.state = stored
                    except (TypeError, ValueError, KeyError, OverflowError) as e:
                        why = str(e) or type(e).__name__
                if why is not None:
                    discarded(study.study_name, "random stream of the search's model", why)
        before = self.rng.bit_generator.state
        choice = self._choose(study, trial)
        if choice is None:
            return {}
        if self.rng.bit_generator.state != before:
            study.set_user_attr(RNG_ATTR, self.rng.bit_generator.state)
        return {k: int(v) for k, v in zip(self.keys, self.candidates[choice])}

    def _choose(self, study: optuna.Study, trial: FrozenTrial) -> int | None:
        done, pending, explored = self._observations(study, trial)
        free = np.ones(len(self.candidates), dtype=bool)
        free[list(done) + pending] = False
        if not free.any():
            return None
        timed = {i: v for i, v in done.items() if v is not None and v > 0}
        # Seeds (defaults, shipped tables, the neighbouring M's winner) cluster where configs
        # were good before: the random start is counted without them, so the model sees the
        # whole space before it trusts their neighbourhood.
        if explored < self.n_startup or len(timed) < 2:
            choice = int(self.rng.choice(np.flatnonzero(free)))
        else:
            with one_blas_thread():
                choice = self._acquire(done, timed, pending, free, study)
        return choice

    def _acquire(self, done: dict, timed: dict, pending: list, free: np.ndarray, study=None) -> int:
        worst = math.log(max(timed.values()))
        idx = np.array([i for i in done if FAILED_AS_WORST or i in timed])
        y = np.array([math.log(done[i]) if done[i] is not None and done[i] > 0 else worst for i in idx])
        y = _copula(y)
        x = self.x_all[idx]
        if self._fitted_at < 0 and study is not None:
            stored = study.user_attrs.get(FIT_ATTR)
            if stored is not None:
                from tuner.search.stored_state import discarded, fit_problem
                why = fit_problem(stored, len(self.ls))
                if why is None and stored["at"] <= len(idx):
                    self.ls, self._fitted_at = np.array(stored["ls"], dtype=float), int(stored["at"])
                else:               # refitted now, on the study's trials
                    discarded(study.study_name, "fit of the search's model",
                              why or f"'at' {stored['at']} is past the {len(idx)} observations")
        if self._fitted_at < 0 or len(idx) - self._fitted_at >= REFIT_EVERY:
            self.ls = _fit_length_scales(x, y, self.ls, self.groups)
            self._fitted_at = len(idx)
            if study is not None:
                study.set_user_attr(FIT_ATTR, {"at": self._fitted_at, "ls": [float(v) for v in self.ls]})
        if pending:       # measured elsewhere now: believe the model's mean for them
            xp = self.x_all[pending]
            yp = self._posterior(x, y, xp)[0]
            x, y = np.vstack([x, xp]), np.concatenate([y, yp])
        cand = self._scored(np.flatnonzero(free), [i for _, i in sorted((v, i) for i, v in timed.items())])
        mean, std = self._posterior(x, y, self.x_all[cand])
        ei = _expected_improvement(mean, np.maximum(std, 1e-9), float(y[: len(idx)].min()))
        top = np.flatnonzero(ei >= ei.max() - 1e-12)
        return int(cand[self.rng.choice(top)])

    def _scored(self, cand: np.ndarray, best_first: list[int]) -> np.ndarray:
        """The free candidates to score: all of them in a space of up to MAX_SCORED, else the
        neighbours of the best few measured (one key changed) and a random draw of the others."""
        if len(cand) <= MAX_SCORED:
            return cand
        rows = self.candidates[cand]
        near = np.zeros(len(cand), dtype=bool)
        for i in best_first[:LOCAL_FROM]:
            near |= (rows != self.candidates[i]).sum(axis=1) == 1
        local = cand[near][:MAX_SCORED // 2]
        rest = cand[~near]
        drawn = self.rng.choice(rest, size=min(len(rest), MAX_SCORED - len(local)), replace=False)
        return np.sort(np.concatenate([local, drawn]))

    def _posterior(self, x: np.ndarray, y: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = _matern52(x, x, self.ls) + NOISE * np.eye(len(x))
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
        mean_parts, var_parts = [], []
        for start in range(0, len(xs), 4096):
            ks = _matern52(xs[start:start + 4096], x, self.ls)
            mean_parts.append(ks @ alpha)
            v = np.linalg.solve(chol, ks.T)
            var_parts.append(np.maximum(1.0 - (v * v).sum(0), 1e-12))
        return np.concatenate(mean_parts), np.sqrt(np.concatenate(var_parts))
