"""The search's evidence that a study has converged: for each config it has not measured, the
chance that it beats the table's row by more than the gain that would change the table (issue 48).

A study stops on evidence, not on a share of its budget (tuner/search/stopping.py asks this
model each round once the seeds are measured). The model is a Gaussian process over the
study's candidates and over what the batch sizes of the same problem done in this run measured:

    log(time) = b_M + c_M * log(cost-model estimate) + g(config, log M) + noise

- b_M, one level per batch size: a table's times grow with M; only differences at the
  study's own M matter;
- c_M, where the kernel describes its work (tuner/search/prior.py): the Hopper cost model's
  estimate, weighted per batch size by what that batch size's own times say of it;
- g, a Matern 5/2 process over the configs' features (each key by its kind, as the sampler's,
  tuner/search/surrogate.py) and log M in octaves: what the NEAREST batch sizes done (at most
  FARTHEST octaves away) measured tells it about configs not yet timed here, as far as their
  M is near (a length scale, fitted, at most OCTAVES[-1]);
- noise, fitted: a GPU's run-to-run spread is not mistaken for a difference between configs.

Times are taken on a log scale and capped at CAP times the best of their batch size (a config
50x slower than the best says no more about the stop than one 2x slower). Length scales and
the noise are fitted by maximum likelihood under the sampler's log-normal prior, the levels
and weights by generalized least squares, whose uncertainty the predictions carry. Then the
model is checked on the study's own trials, each left out and all left out at once (is it right
between the configs measured here, and does what the neighbours measured carry over to this
M?): where it predicts worse than its variance claims, the variance grows by as much. The
chance of a candidate is that its time, as the model predicts it, lies below the incumbent's by
more than the gain: the incumbent is the measured config the model believes fastest.

Where the kernel gives no work and no batch size was done (a landscape of another project, the
first batch size), the study's own trials are all the evidence: such a study stops on the plateau rule
(tuner/search/stopping.py plateau_rule), where this model was confident too soon.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from tuner.search.surrogate import LS_PRIOR, _erf, _features, one_blas_thread

LENGTH_SCALES = (0.08, 0.15, 0.3, 0.6, 1.2, 3.0, 10.0, 30.0)   # per key, in its [0, 1] range (30: irrelevant)
# log M's, in octaves: a table's landscape changes with M by steps (a tile's padding, a wave), so a
# batch size far away says little of a config here
OCTAVES = (0.25, 0.5, 1.0, 2.0)
FARTHEST = 2.0                       # octaves: a batch size done farther away is not read
NEAREST = 4                          # batch sizes done that the model reads (the nearest in log M)
CAP = math.log(2.0)                  # log-times above their M's best by more are taken as this
NUGGETS = (1e-4, 1e-3, 1e-2, 0.05, 0.2)   # the noise's share of the process's variance, fitted among these
# the study's own successful trials before the model's answer counts: with no batch size done that it
# reads, a process fitted to fewer points fits their noise, and says so with confidence
ALONE = 8
WITH_NEIGHBOURS = 5
REFIT_EVERY = 3                      # the study's own trials between fits
LIKELIEST = 64                       # candidates kept, likeliest first, for the search to measure next


class StopModel:
    """The evidence of one study: its candidates at M (config tuples over `keys`), the configs
    measured at the batch sizes done ({M: {config: time, None if failed}}; the nearest are read),
    and the cost model's estimates ({(M, config): microseconds}; empty where the kernel describes
    no work)."""

    def __init__(self, keys: Sequence[str], candidates, M: int,
                 neighbours: Mapping[int, Mapping[tuple, float | None]] | None = None,
                 estimates: Mapping[tuple[int, tuple], float] | None = None,
                 kinds: Mapping[str, str] | None = None):
        from tuner.plan.key_kinds import resolved_kinds
        self.keys = tuple(keys)
        self.M = int(M)
        self.candidates = sorted(candidates)
        done = neighbours or {}
        self.neighbours = {m: dict(done[m]) for m in self.nearest(self.M, done)}
        configs = sorted(set(self.candidates) | {t for d in self.neighbours.values() for t in d})
        self.index = {t: i for i, t in enumerate(configs)}
        choices = {k: sorted({t[j] for t in configs}) for j, k in enumerate(self.keys)}
        kinds = {**resolved_kinds(choices), **{k: v for k, v in (kinds or {}).items() if k in choices}}
        arr = np.array(configs, dtype=np.int64).reshape(-1, len(self.keys))
        self.x, self.groups = _features(arr, [choices[k] for k in self.keys], [kinds[k] for k in self.keys])
        self.estimates = {k: math.log(v) for k, v in (estimates or {}).items() if v is not None and v > 0}
        self.ls = np.full(len(self.groups) + 1, 0.6)     # per key's group of columns, then log M
        self.nugget = 1e-2
        self._fitted_at = -1
        # the unmeasured candidates likeliest to change the table, likeliest first (the last answer's):
        # what the search measures next to settle the question
        self.likeliest: list[tuple] = []

    def alone(self) -> bool:
        """No evidence but the study's own trials: no batch size done to read, no cost model's estimates."""
        return not self.neighbours and not self.estimates

    @staticmethod
    def nearest(M: int, done: Mapping[int, object]) -> list[int]:
        """The NEAREST batch sizes of `done` to M within FARTHEST octaves (in log M; the smaller first on a tie)."""
        near = [m for m in done if m != M and abs(math.log2(max(m, 1) / max(M, 1))) <= FARTHEST]
        return sorted(near, key=lambda m: (abs(math.log2(max(m, 1) / max(M, 1))), m))[:NEAREST]

    # -- the data -----------------------------------------------------------------------
    def _rows(self, own: Mapping[tuple, float | None]):
        """(inputs, log-times capped, batch sizes, estimates or None) over the successful
        measurements of the study and of the batch sizes read."""
        obs = [(self.M, t, v) for t, v in own.items() if v is not None and v > 0 and t in self.index]
        obs += [(m, t, v) for m, d in self.neighbours.items() for t, v in d.items() if v is not None and v > 0]
        y = np.log([v for _, _, v in obs])
        ms = np.array([m for m, _, _ in obs])
        for m in set(ms.tolist()):
            sel = ms == m
            y[sel] = np.minimum(y[sel], y[sel].min() + CAP)
        return self._inputs([t for _, t, _ in obs], ms), y, ms, self._estimate_column([(m, t) for m, t, _ in obs])

    def _inputs(self, configs: Sequence[tuple], ms: np.ndarray) -> np.ndarray:
        octaves = np.log2(np.maximum(ms, 1)) - math.log2(self.M)
        return np.hstack([self.x[[self.index[t] for t in configs]], octaves[:, None]])

    def _estimate_column(self, points: Sequence[tuple[int, tuple]]) -> np.ndarray | None:
        """log(estimate) of each (M, config), centred; where the model gave none, the median."""
        if not self.estimates:
            return None
        vals = [self.estimates.get(p) for p in points]
        known = [v for v in vals if v is not None]
        if not known:
            return None
        fill = float(np.median(known))
        return np.array([fill if v is None else v for v in vals]) - fill

    @staticmethod
    def _design(ms: np.ndarray, est: np.ndarray | None, levels: Sequence[int]) -> np.ndarray:
        """The mean's columns: a level per batch size, and the estimate's weight per batch size."""
        cols = [(ms == m).astype(float) for m in levels]
        if est is not None:
            cols += [(ms == m) * est for m in levels]
        return np.stack(cols, axis=1)

    # -- the process ----------------------------------------------------------------------
    def _groups(self) -> list[np.ndarray]:
        return [*self.groups, np.array([self.x.shape[1]])]

    def _squares(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Squared distances between the rows of a and b per group of columns: (groups, len(a), len(b))."""
        return np.stack([((a[:, None, cols] - b[None, :, cols]) ** 2).sum(-1) for cols in self._groups()])

    @staticmethod
    def _kernel(squares: np.ndarray, ls_groups: np.ndarray) -> np.ndarray:
        d = np.sqrt(np.tensordot(1.0 / ls_groups ** 2, squares, axes=1)) * math.sqrt(5)
        return (1 + d + d * d / 3) * np.exp(-d)

    def _solved(self, squares, y, f, ls_groups, nugget):
        """(inverse Cholesky factor, GLS coefficients, residuals, process variance, log det / 2, F'R^-1F)."""
        n = len(y)
        try:
            inv = np.linalg.inv(np.linalg.cholesky(self._kernel(squares, ls_groups) + nugget * np.eye(n)))
        except np.linalg.LinAlgError:
            return None
        wy, wf = inv @ y, inv @ f
        a = wf.T @ wf + 1e-8 * np.eye(f.shape[1])
        try:
            beta = np.linalg.solve(a, wf.T @ wy)
        except np.linalg.LinAlgError:
            return None
        resid = y - f @ beta
        wr = inv @ resid
        s2 = max(float(wr @ wr) / n, 1e-12)
        return inv, beta, resid, s2, -float(np.log(np.diag(inv)).sum()), a

    def _likelihood(self, squares, y, f, ls_groups, nugget) -> float:
        got = self._solved(squares, y, f, ls_groups, nugget)
        if got is None:
            return -math.inf
        prior = -0.5 * float(((np.log(ls_groups / LS_PRIOR[0]) / LS_PRIOR[1]) ** 2).sum())
        return -0.5 * len(y) * math.log(got[3]) - got[4] + prior

    def _fit(self, x, y, f) -> None:
        """Two passes of coordinate search over each group's length scale and the noise, from the
        same start each time: the fit is a function of the data, whichever round asks."""
        squares = self._squares(x, x)
        self.ls, self.nugget = np.full(len(self.ls), 0.6), 1e-2
        self.ls[-1] = 1.0
        best = self._likelihood(squares, y, f, self.ls, self.nugget)
        for _ in range(2):
            for g in range(len(self.ls)):
                for v in OCTAVES if g == len(self.ls) - 1 else LENGTH_SCALES:
                    trial = self.ls.copy()
                    trial[g] = v
                    ll = self._likelihood(squares, y, f, trial, self.nugget)
                    if ll > best:
                        best, self.ls = ll, trial
            for nug in NUGGETS:
                ll = self._likelihood(squares, y, f, self.ls, nug)
                if ll > best:
                    best, self.nugget = ll, nug

    # -- the answer -----------------------------------------------------------------------
    def chance(self, own: Mapping[tuple, float | None], gain: float, skip: Sequence[tuple] = ()) -> float:
        """The largest chance, over the candidates nobody measured at this M (nor in `skip`), that
        one runs faster than the incumbent by more than `gain` (a fraction; tuner.search.evidence
        table_gain): 1.0 while the model has too little to go on, 0.0 when nothing is left."""
        self.likeliest = []
        skipped = set(skip)
        free = [t for t in self.candidates if t not in own and t not in skipped]
        timed = [t for t, v in own.items() if v is not None and v > 0 and t in self.index]
        if not free:
            return 0.0
        if len(timed) < (WITH_NEIGHBOURS if self.neighbours else ALONE):
            return 1.0
        x, y, ms, est = self._rows(own)
        levels = sorted(set(ms.tolist()))
        f = self._design(ms, est, levels)
        with one_blas_thread():
            if len(timed) // REFIT_EVERY != self._fitted_at:
                self._fit(x, y, f)
                self._fitted_at = len(timed) // REFIT_EVERY
            p = self._chances(x, y, f, levels, timed, free, gain, ms == self.M)
        if p is None:
            return 1.0
        order = np.argsort(-p, kind="stable")
        self.likeliest = [free[i] for i in order[:LIKELIEST]]
        return float(p.max())

    def _chances(self, x, y, f, levels, timed, free, gain, own_rows) -> np.ndarray | None:
        got = self._solved(self._squares(x, x), y, f, self.ls, self.nugget)
        if got is None:
            return None
        inv, beta, resid, s2, _, a = got
        scale = _calibration(inv, f, a, resid, s2, own_rows)
        if not math.isfinite(scale):
            return None                                 # too few of the study's own trials to check the model on
        s2 *= scale
        pts = timed + free
        at_m = np.full(len(pts), self.M)
        est = self._estimate_column([(self.M, t) for t in pts]) if f.shape[1] > len(levels) else None
        fs = self._design(at_m, est, levels)
        v = inv @ self._kernel(self._squares(x, self._inputs(pts, at_m)), self.ls)    # observations x points
        mean = fs @ beta + v.T @ (inv @ resid)
        u = fs.T - (inv @ f).T @ v                      # what the levels' and weights' uncertainty adds
        a_inv = np.linalg.inv(a)
        inc = int(np.argmin(mean[: len(timed)]))        # the incumbent: the measured config believed fastest
        cand = np.arange(len(timed), len(pts))
        xs = self._inputs(pts, at_m)
        k_inc = self._kernel(self._squares(xs[cand], xs[[inc]]), self.ls)[:, 0]
        cross = k_inc - v[:, cand].T @ v[:, inc] + u[:, cand].T @ a_inv @ u[:, inc]
        var_c = 1.0 - (v[:, cand] ** 2).sum(0) + np.einsum("ij,ik,kj->j", u[:, cand], a_inv, u[:, cand])
        var_i = 1.0 - float(v[:, inc] @ v[:, inc]) + float(u[:, inc] @ a_inv @ u[:, inc])
        diff_sd = np.sqrt(np.maximum(s2 * (var_c + var_i - 2 * cross), 1e-12))
        delta = -math.log(1.0 - gain) if gain < 1 else math.inf
        return 0.5 * (1 + _erf((-delta - (mean[cand] - mean[inc])) / diff_sd / math.sqrt(2)))


def table_gain(measured: Mapping[tuple, float | None], row: tuple | None, gain: float) -> float:
    """The gain over the study's best measured time that would change the table: `gain` over the
    row the table holds now. That is the best measured config where it beats the incumbent `row`
    (the row the engine runs today, measured in the study) by more than `gain`; else the incumbent
    is kept, and a config `gain` faster than it would change the table: less than `gain` faster
    than the best."""
    timed = [v for v in measured.values() if v is not None and v > 0]
    if not timed:
        return gain
    best = min(timed)
    base = measured.get(row) if row is not None else None
    if base is None or base <= 0 or best < base * (1 - gain):
        return gain
    return max(0.0, 1 - base * (1 - gain) / best)


def _calibration(inv: np.ndarray, f: np.ndarray, a: np.ndarray, resid: np.ndarray, s2: float,
                 rows: np.ndarray) -> float:
    """How much wider the model's errors are than it says on the study's own trials (`rows`),
    left out (Dubrule's closed forms for a process with a fitted mean), at least 1; inf where
    fewer than 3 can be left out. Two checks, the larger counts: each trial left out alone (is the
    model right between the configs it measured here?), and all of them at once, predicted from
    the batch sizes done alone, up to their level (does what the neighbours measured carry over
    to this M?). A landscape that changes between batch sizes, a cost model whose ranking the
    times do not follow, or a fit to a few points predict worse than their variance claims."""
    r_inv = inv.T @ inv
    w = r_inv @ f
    q = r_inv - w @ np.linalg.inv(a) @ w.T
    err = r_inv @ resid                                  # Q y
    q_diag = np.diag(q)
    pick = (q_diag > 1e-9) & rows
    if pick.sum() < 3:
        return math.inf
    single = float((err[pick] ** 2 / (q_diag[pick] * s2)).mean())
    block = 1.0
    idx = np.flatnonzero(rows)
    if len(idx) < len(rows):
        vals, vecs = np.linalg.eigh(q[np.ix_(idx, idx)])
        keep = vals > 1e-9 * max(float(vals.max()), 1e-300)
        if keep.sum() >= 2:
            proj = vecs[:, keep].T @ err[idx]
            block = float((proj ** 2 / vals[keep]).sum() / s2 / keep.sum())
    return max(1.0, single, block)
