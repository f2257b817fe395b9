"""A traffic profile as data: its buckets of M (runs of passes spread over M) with their
weights, recorded and reloaded with its source's digest, and what every input format shares
(a number, an `M,weight` row, exact M gathered into buckets). The formats are read in
tuner/plan/traffic_points.py (CSV, JSON) and traffic_metrics.py (a server's /metrics);
tuner/plan/traffic.py loads a file and chooses keys and budgets from a profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuner.errors import TunerError

FORMAT = "tuner-traffic/1"
MAX_ROWS = 100_000            # rows of a CSV/JSON profile
MAX_M = 1 << 20               # as the command line's batch sizes
NEAR = 1.25                   # a served M is served well by a key within this factor of it


@dataclass(frozen=True)
class Run:
    """A share of the passes, spread evenly over the M first..last (the kernel's M)."""
    first: int
    last: int
    weight: float


@dataclass
class Bucket:
    """What the source resolves: a histogram bucket, or neighbouring M of a CSV."""
    label: str
    runs: list[Run]

    @property
    def lo(self) -> int:
        return min(r.first for r in self.runs)

    @property
    def hi(self) -> int:
        return max(r.last for r in self.runs)

    @property
    def weight(self) -> float:
        return sum(r.weight for r in self.runs)


@dataclass
class TrafficProfile:
    source: str                   # the file it was read from
    sha256: str
    form: str                     # what the file was: "vLLM 0.33.0 /metrics", "CSV M,weight", ...
    buckets: list[Bucket]
    notes: list[str] = field(default_factory=list)
    _arrays: tuple | None = field(default=None, repr=False, compare=False)

    def served(self) -> dict[int, float]:
        """Share of the forward passes per M (the kernel's M), summing to 1."""
        ms, ws = self.arrays()
        return dict(zip(ms.tolist(), ws.tolist()))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(served M ascending, their shares): each run's weight spread evenly over its M.
        Every run lies in 1..MAX_M (the readers bound it so), so this takes at most a few
        MiB whatever the profile's labels said."""
        if self._arrays is None:
            runs = [r for b in self.buckets for r in b.runs]
            lo, hi = min(r.first for r in runs), max(r.last for r in runs)
            if lo < 1 or hi > MAX_M:
                raise TunerError(f"traffic profile {self.source}: M {lo} to {hi} is outside 1 to {MAX_M}")
            dense = np.zeros(hi - lo + 1)
            for r in runs:
                dense[r.first - lo:r.last - lo + 1] += r.weight / (r.last - r.first + 1)
            at = np.nonzero(dense > 0)[0]
            ws = dense[at]
            self._arrays = (at.astype(np.int64) + lo, ws / ws.sum())
        return self._arrays

    def short(self) -> str:
        return f"{Path(self.source).name} (sha256 {self.sha256[:12]})"

    def as_manifest(self) -> dict:
        return {"format": FORMAT, "source": self.source, "sha256": self.sha256, "form": self.form,
                "notes": list(self.notes),
                "buckets": [{"label": b.label, "runs": [[r.first, r.last, r.weight] for r in b.runs]}
                            for b in self.buckets]}

    @classmethod
    def from_manifest(cls, record, where: str = "the manifest") -> "TrafficProfile":
        """The profile a manifest recorded; one line when the record is not one."""
        try:
            if not isinstance(record, dict) or record.get("format") != FORMAT:
                raise ValueError("no tuner-traffic/1 record")
            buckets = []
            for b in record["buckets"]:
                runs = [Run(int(f), int(last), float(w)) for f, last, w in b["runs"]]
                if not runs or any(r.first < 1 or r.last < r.first or r.last > MAX_M or not math.isfinite(r.weight)
                                   or r.weight < 0 for r in runs):
                    raise ValueError(f"bucket {b.get('label')!r} has a bad run")
                buckets.append(Bucket(str(b["label"]), runs))
            if not buckets or sum(b.weight for b in buckets) <= 0:
                raise ValueError("no traffic in it")
            return cls(str(record["source"]), str(record["sha256"]), str(record.get("form", "")), buckets,
                       [str(n) for n in record.get("notes", [])])
        except (KeyError, TypeError, ValueError) as e:
            raise TunerError(f"{where} records a traffic profile that is not readable ({e}); give --traffic FILE "
                             "instead") from None

    def describe(self) -> list[str]:
        """What the profile holds, in a few lines (plans and reports)."""
        ms, ws = self.arrays()
        mean = float((ms * ws).sum())
        lines = [f"traffic {self.short()}: {self.form}; {len(self.buckets)} buckets, M {ms[0]} to {ms[-1]}, "
                 f"mean {mean:.0f} tokens per forward pass"]
        return lines + [f"  {n}" for n in self.notes]



def _number(text: str, what: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TunerError(f"{where}: {what} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise TunerError(f"{where}: {what} {text!r} is not finite")
    return v


def _row(m_text: str, w_text: str, where: str) -> tuple[int, float]:
    m = _number(str(m_text).strip(), "M", where)
    if m != int(m) or not 1 <= m <= MAX_M:
        raise TunerError(f"{where}: M must be a whole number from 1 to {MAX_M}, not {m_text!r}")
    w = _number(str(w_text).strip(), "weight", where)
    if w < 0:
        raise TunerError(f"{where}: weight {w_text!r} is negative")
    return int(m), w



def _points(rows: list[tuple[int, float]], path: Path, label: str = "M") -> tuple[list[Bucket], list[str]]:
    """Exact M (CSV, JSON, sampled gauges) as buckets: neighbours within NEAR of each other
    form one bucket, so that one key can serve them."""
    merged: dict[int, float] = {}
    for m, w in rows:
        merged[m] = merged.get(m, 0.0) + w
    ms = [m for m in sorted(merged) if merged[m] > 0]
    groups: list[list[int]] = []
    for m in ms:
        if groups and m <= groups[-1][-1] * NEAR:
            groups[-1].append(m)
        else:
            groups.append([m])
    buckets = [Bucket(f"{label}={g[0]}" if len(g) == 1 else f"{label}={g[0]}..{g[-1]}",
                      [Run(m, m, merged[m]) for m in g]) for g in groups]
    return buckets, []
