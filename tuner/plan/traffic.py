"""Traffic profiles: the batch sizes M a server really runs, and what follows from them.

A profile is a distribution of M, the tokens one forward pass runs on one GPU (a decode
batch, or a chunked-prefill chunk; for MoE and GEMM that is the kernel's M), as the kernel
sees it: padded to the engine's CUDA-graph sizes where the engine pads. It comes from

  - a dump of a running server's /metrics (Prometheus text format): vLLM's per-step token
    histogram, or SGLang's running-batch gauge and forward-pass counters (the metric names
    and padding rules are each engine's SERVING_METRICS in tuner/plan/engine_rules/, read from
    its source; tuner/plan/traffic_metrics.py reads them); or
  - a CSV (`M,weight` per line) or JSON ({"M": weight}, or [[M, weight], ...]) of the M the
    kernel sees, taken as given (no padding; tuner/plan/traffic_points.py).

Inside a histogram bucket the M are taken as evenly spread over its integers, then padded.
From a profile follow: which keys a table should hold (choose_keys), how a trial budget is
split over them (split_budget), and traffic-weighted times (weighted_*, step_estimate). A
weight is a share of forward passes; a weighted speedup is the ratio of the total kernel
time over those passes (sum of share x time), each served M timed at the table entry the
engine would use for it (nearest key, ties to the earlier key).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.plan.engines import DEFAULT_BATCH_SIZES
from tuner.plan.traffic_metrics import _from_metrics, _looks_like_metrics
from tuner.plan.traffic_points import _csv_rows, _json_rows
from tuner.plan.traffic_profile import NEAR, TrafficProfile, _points

MAX_BYTES = 64 << 20          # a profile file, a dump of many scrapes included
MAX_LINE = 64 << 10           # one line of it
GUARD = 2.0                   # an M no traffic reaches is left no farther than this from a key
NOISE_FLOOR = 0.02            # a tuned config must beat the default by more than this (or its spread)
MIN_FLOOR = 4                 # the fewest trials a key gets (the seeds)


# -- reading a profile ------------------------------------------------------------------------
def load_profile(path: str | Path, tp: int | None = None) -> TrafficProfile:
    """A traffic profile from a file: a server's /metrics dump, or a CSV/JSON of M,weight.
    `tp`: the server's tensor-parallel size where the engine's CUDA-graph sizes depend on it.
    Bad or empty files: one line (TunerError)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise TunerError(f"traffic profile {path} not found")
    from tuner.reading import read_bytes
    data = read_bytes(path, "traffic profile ", MAX_BYTES)
    if not data:
        raise TunerError(f"traffic profile {path} is empty")
    if b"\0" in data:
        raise TunerError(f"traffic profile {path} is not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TunerError(f"traffic profile {path} is not UTF-8 text") from None
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE:
            raise TunerError(f"traffic profile {path}:{n}: a line of {len(line)} characters (at most {MAX_LINE})")
    sha = hashlib.sha256(data).hexdigest()
    stripped = text.lstrip()
    if not stripped:
        raise TunerError(f"traffic profile {path} is empty")
    if stripped[0] in "{[":
        form, buckets, notes = "JSON of M: weight (the kernel's M, as given)", *_points(_json_rows(text, path), path)
    elif _looks_like_metrics(text):
        form, buckets, notes = _from_metrics(text, path, tp)
    else:
        form, buckets, notes = "CSV of M,weight (the kernel's M, as given)", *_points(_csv_rows(text, path), path)
    total = sum(b.weight for b in buckets)
    if not all(math.isfinite(r.weight) for b in buckets for r in b.runs) or not math.isfinite(total):
        raise TunerError(f"traffic profile {path}: its weights add up beyond what a float holds (about 1.8e308); "
                         "scale them down (only their ratios count)")
    if not buckets or total <= 0:
        raise TunerError(f"traffic profile {path} holds no traffic (every weight is 0)")
    return TrafficProfile(str(path), sha, form, buckets, notes)




# -- which keys serve it -----------------------------------------------------------------------
_FAR = 1 << 62       # keys beyond +-this are clamped to it (no served M comes near; int64 holds the distances)


def serving_keys(keys, ms: np.ndarray) -> np.ndarray:
    """For each M, the index (into `keys`, in the table's order) of the key the engines use:
    the nearest, ties to the earlier key (tuner.plan.engines.lookup_nearest). Keys of any
    size (a table may say 2^70); O(len(ms) log len(keys)) time, O(len(ms)) memory."""
    keys = [int(k) for k in keys]
    big = [k for k in keys if k > _FAR]
    small = [k for k in keys if k < -_FAR]
    # of the keys beyond the clamp only the nearest to every M can serve: one value each side
    usable = [(max(min(k, _FAR), -_FAR), i) for i, k in enumerate(keys)
              if not (k > _FAR and k != min(big)) and not (k < -_FAR and k != max(small))]
    usable.sort()
    values: list[int] = []
    index: list[int] = []
    for v, i in usable:                     # one value once: the earliest key in table order
        if not values or values[-1] != v:
            values.append(v)
            index.append(i)
    kv, ki = np.asarray(values, dtype=np.int64), np.asarray(index, dtype=np.int64)
    m = np.asarray(ms, dtype=np.int64)
    pos = np.searchsorted(kv, m, side="left")          # the first key >= M
    below, above = np.clip(pos - 1, 0, len(kv) - 1), np.clip(pos, 0, len(kv) - 1)
    d_below, d_above = m - kv[below], kv[above] - m
    take_above = (pos == 0) | ((pos < len(kv)) & ((d_above < d_below) | ((d_above == d_below) & (ki[above] < ki[below]))))
    return np.where(take_above, ki[above], ki[below])


def _ratio(a, b):
    """max(a/b, b/a) per pair of M and key; infinite where a key is no batch size (< 1)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.maximum(a / b, b / a)
    return np.where((a >= 1) & (b >= 1), r, np.inf)


@dataclass
class KeyCoverage:
    """What one table key serves under a profile (tuner audit's per-key line)."""
    key: int
    first: int | None             # the smallest served M the engine runs with this key's entry
    last: int | None              # the largest
    share: float                  # of the forward passes
    farthest: int | None          # the served M farthest (by ratio) from the key
    ratio: float                  # farthest/key or key/farthest (1.0: every M it serves is the key)

    def text(self) -> str:
        if self.first is None:
            return f"M={self.key}: serves no traffic"
        span = f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        far = "a key that is no batch size" if math.isinf(self.ratio) else f"{self.ratio:.2f}x"
        return f"M={self.key}: serves M {span} ({self.share:.1%} of passes), farthest {self.farthest} ({far})"


def key_coverage(keys, profile: TrafficProfile) -> list[KeyCoverage]:
    """Per key of a table (in the table's order, as the engine reads it): the served M
    range it gets by the nearest-key rule, its share of the passes, and how far the farthest
    served M is from it. For `tuner audit` and the plan."""
    keys = [int(k) for k in keys]
    ms, ws = profile.arrays()
    idx = serving_keys(keys, ms)
    out = []
    for i, k in enumerate(keys):
        sel = idx == i
        if not sel.any():
            out.append(KeyCoverage(k, None, None, 0.0, None, 1.0))
            continue
        served = ms[sel]
        r = _ratio(served.astype(float), float(k))
        j = int(np.argmax(r))
        out.append(KeyCoverage(k, int(served.min()), int(served.max()), float(ws[sel].sum()), int(served[j]),
                               float(r[j])))
    return out


@dataclass
class KeyPlan:
    keys: list[int]               # ascending
    guards: list[int]             # the keys no traffic reaches (kept so no M is far from a key)
    coverage: list[KeyCoverage]

    def shares(self) -> dict[int, float]:
        return {c.key: c.share for c in self.coverage}


def choose_keys(profile: TrafficProfile, near: float = NEAR, grid: list[int] | None = None,
                guard: float = GUARD) -> KeyPlan:
    """The keys a table should hold for this traffic: in every bucket a key at its smallest
    and largest served M (so that, by the nearest-key rule, every served M maps to a key
    inside its own bucket), then keys at served M until each is within `near` of its key;
    then the grid's M no traffic reaches that would be more than `guard` from any key."""
    keys: set[int] = set()
    all_ms, all_ws = profile.arrays()
    for b in profile.buckets:
        sel = slice(*np.searchsorted(all_ms, [b.lo, b.hi + 1]))
        ms, ws = all_ms[sel], all_ws[sel]
        if not len(ms):
            continue
        mine = {int(ms[0]), int(ms[-1])}
        while True:
            ks = sorted(mine)
            r = _ratio(ms, np.asarray(ks)[serving_keys(ks, ms)])
            worst = r.max()
            if worst <= near:
                break
            tied = np.nonzero(r == worst)[0]              # largest ratio, then heaviest, then smallest M
            mine.add(int(ms[tied[np.lexsort((ms[tied], -ws[tied]))[0]]]))
        keys |= mine
    spans = [(b.lo, b.hi) for b in profile.buckets]
    guards = []
    for g in grid if grid is not None else DEFAULT_BATCH_SIZES:
        if g in keys or any(lo <= g <= hi for lo, hi in spans):
            continue
        ks = sorted(keys)
        k = ks[int(serving_keys(ks, np.array([g]))[0])]
        if max(k / g, g / k) > guard:
            keys.add(g)
            guards.append(g)
    ordered = sorted(keys)
    return KeyPlan(ordered, sorted(guards), key_coverage(ordered, profile))


# -- the trial budget ----------------------------------------------------------------------------
def budget_floor(per_key: int) -> int:
    return min(per_key, max(MIN_FLOOR, per_key // 4))


def split_budget(shares: dict[int, float], per_key: int, floor: int | None = None) -> dict[int, int]:
    """per_key x len(shares) trials over the keys: `floor` each (default a quarter of
    per_key, at least MIN_FLOOR, at most per_key), the rest in proportion to the traffic
    share (largest remainders), so the sum is exactly per_key x len(shares)."""
    if not shares:
        return {}
    floor = budget_floor(per_key) if floor is None else floor
    total = per_key * len(shares)
    if floor * len(shares) > total:
        raise ValueError(f"a floor of {floor} over {len(shares)} keys exceeds {total} trials")
    rest = total - floor * len(shares)
    weight = sum(shares.values())
    ideal = {k: rest * (s / weight if weight > 0 else 1 / len(shares)) for k, s in shares.items()}
    out = {k: floor + int(math.floor(v)) for k, v in ideal.items()}
    left = total - sum(out.values())
    for k in sorted(ideal, key=lambda k: (-(ideal[k] - math.floor(ideal[k])), k))[:left]:
        out[k] += 1
    return out


# -- judging by weight ---------------------------------------------------------------------------
def _served_times(keys, times: dict[int, float | None], ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each served M, the key of the entry the engine runs for it and that entry's time
    (measured at the key; NaN: no time)."""
    keys = [int(k) for k in keys]
    if not keys:
        return np.zeros(len(ms), dtype=object), np.full(len(ms), np.nan)
    vals = np.array([t if isinstance(t, (int, float)) and t and math.isfinite(t) and t > 0 else np.nan
                     for t in (times.get(k) for k in keys)], dtype=float)
    idx = serving_keys(keys, ms)
    return np.asarray(keys, dtype=object)[idx], vals[idx]        # object: a key may exceed int64


def _comparable(base: tuple, new: tuple, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base times, new times, mask) per served M: compared only where both tables time it
    and serve it from the same key, since a time is measured at its key, not at the served
    M (two tables with other keys are compared where they agree; `tuner bench` times both
    at the same M)."""
    ka, a = _served_times(base[0], base[1], ms)
    kb, b = _served_times(new[0], new[1], ms)
    return a, b, ~np.isnan(a) & ~np.isnan(b) & (ka == kb)


@dataclass
class Weighted:
    """A traffic-weighted comparison: base and new kernel time per pass (share-weighted
    sums over the served M both time), their ratio, and the share of passes it covers."""
    base_us: float | None
    new_us: float | None
    covered: float

    @property
    def speedup(self) -> float | None:
        return self.base_us / self.new_us if self.base_us and self.new_us else None


def weighted(profile: TrafficProfile, base: tuple, new: tuple) -> Weighted:
    """base, new: (keys in table order, {key: time}). Each served M counts with the time of
    the entry the engine would use for it, where both tables serve it from the same key."""
    ms, ws = profile.arrays()
    a, b, ok = _comparable(base, new, ms)
    if not ok.any():
        return Weighted(None, None, 0.0)
    return Weighted(float((ws[ok] * a[ok]).sum()), float((ws[ok] * b[ok]).sum()), float(ws[ok].sum()))


def step_estimate(profile: TrafficProfile, rows: list[tuple[int, tuple, tuple]]) -> Weighted:
    """Kernel time per forward pass over the traffic, for two sets of tables: rows of (layers
    per pass, base (keys, {key: time}), new (keys, {key: time})); the sum over rows of layers
    x share-weighted time, over the served M every row times in both."""
    ms, ws = profile.arrays()
    base = np.zeros(len(ms))
    new = np.zeros(len(ms))
    ok = np.ones(len(ms), dtype=bool)
    for layers, base_table, new_table in rows:
        a, b, both = _comparable(base_table, new_table, ms)
        ok &= both
        base += layers * np.nan_to_num(a)
        new += layers * np.nan_to_num(b)
    if not rows or not ok.any():
        return Weighted(None, None, 0.0)
    return Weighted(float((ws[ok] * base[ok]).sum()), float((ws[ok] * new[ok]).sum()), float(ws[ok].sum()))


def speedup_text(w: Weighted, against: str) -> str:
    if w.speedup is None:
        return f"traffic-weighted speedup over {against}: - (no served M has both times)"
    part = "" if w.covered > 0.999 else f"; over the {w.covered:.0%} of passes timed in both, from the same key"
    from tuner.textwidth import factor
    return f"traffic-weighted speedup over {against}: {factor(w.speedup)}{part}"


def step_text(w: Weighted, source: str, base: str = "default", new: str = "table") -> str:
    """The per-pass estimate, labelled as what it is and where its times came from."""
    if w.base_us is None or w.new_us is None:
        return "estimated kernel time per forward pass: - (no served M is timed in every table)"
    change = w.new_us - w.base_us
    part = "" if w.covered > 0.999 else f", over the {w.covered:.0%} of passes timed in both, from the same key"
    return (f"estimated time of these kernels per forward pass over the traffic (x the model's layers{part}): "
            f"{base} {w.base_us:.1f} us -> {new} {w.new_us:.1f} us ({change:+.1f} us, {change / w.base_us:+.1%}); "
            f"an estimate of kernel time, not of end-to-end latency; times: {source}")


def geomean(values) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None
