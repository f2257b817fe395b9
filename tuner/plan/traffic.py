"""Traffic profiles: the batch sizes M a server really runs, and what follows from them.

A profile is a distribution of M, the tokens one forward pass runs on one GPU (a decode
batch, or a chunked-prefill chunk; for MoE and GEMM that is the kernel's M), as the kernel
sees it: padded to the engine's CUDA-graph sizes where the engine pads. It comes from

  - a dump of a running server's /metrics (Prometheus text format): vLLM's per-step token
    histogram, or SGLang's running-batch gauge and forward-pass counters (the metric names
    and padding rules are in tuner/plan/engines.py, SERVING_METRICS, read from each engine's
    source); or
  - a CSV (`M,weight` per line) or JSON ({"M": weight}, or [[M, weight], ...]) of the M the
    kernel sees, taken as given (no padding).

Inside a histogram bucket the M are taken as evenly spread over its integers, then padded.
From a profile follow: which keys a table should hold (choose_keys), how a trial budget is
split over them (split_budget), and traffic-weighted times (weighted_*, step_estimate). A
weight is a share of forward passes; a weighted speedup is the ratio of the total kernel
time over those passes (sum of share x time), each served M timed at the table entry the
engine would use for it (nearest key, ties to the earlier key).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.plan.engines import DEFAULT_BATCH_SIZES, SERVING_METRICS, ServingMetrics

FORMAT = "tuner-traffic/1"
MAX_BYTES = 64 << 20          # a profile file, a dump of many scrapes included
MAX_LINE = 64 << 10           # one line of it
MAX_ROWS = 100_000            # rows of a CSV/JSON profile
MAX_M = 1 << 20               # as the command line's batch sizes
NEAR = 1.25                   # a served M is served well by a key within this factor of it
GUARD = 2.0                   # an M no traffic reaches is left no farther than this from a key
NOISE_FLOOR = 0.02            # a tuned config must beat the default by more than this (or its spread)
MIN_FLOOR = 4                 # the fewest trials a key gets (the seeds)


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


def _looks_like_metrics(text: str) -> bool:
    prefixes = tuple(m.prefix for m in SERVING_METRICS.values())
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("# HELP ", "# TYPE ")) or s.startswith(prefixes):
            return True
    return False


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


def _csv_rows(text: str, path: Path) -> list[tuple[int, float]]:
    rows: list[tuple[int, float]] = []
    for n, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields or not "".join(fields).strip() or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) != 2:
            raise TunerError(f"traffic profile {path}:{n}: expected `M,weight`, got {','.join(fields)[:60]!r}")
        if not rows and re.fullmatch(r"[A-Za-z_ ]+", fields[0].strip()):
            continue                               # a header line (M,weight)
        rows.append(_row(fields[0], fields[1], f"traffic profile {path}:{n}"))
        if len(rows) > MAX_ROWS:
            raise TunerError(f"traffic profile {path} has more than {MAX_ROWS} rows")
    if not rows:
        raise TunerError(f"traffic profile {path} holds no `M,weight` rows")
    return rows


def _json_rows(text: str, path: Path) -> list[tuple[int, float]]:
    from tuner.reading import parse_json
    data = parse_json(text, f"traffic profile {path}")
    where = f"traffic profile {path}"
    if isinstance(data, dict):
        pairs = list(data.items())
    elif isinstance(data, list) and all(isinstance(x, dict) for x in data):
        try:
            pairs = [(x["M"], x["weight"]) for x in data]
        except KeyError:
            raise TunerError(f"{where}: each object needs \"M\" and \"weight\"") from None
    elif isinstance(data, list) and all(isinstance(x, list) and len(x) == 2 for x in data):
        pairs = [tuple(x) for x in data]
    else:
        raise TunerError(f"{where}: expected {{\"M\": weight, ...}}, [[M, weight], ...] or "
                         "[{\"M\": .., \"weight\": ..}, ...]")
    if not pairs:
        raise TunerError(f"{where} holds no rows")
    if len(pairs) > MAX_ROWS:
        raise TunerError(f"{where} has more than {MAX_ROWS} rows")
    for m, w in pairs:
        if isinstance(m, bool) or isinstance(w, bool) or not isinstance(w, (int, float, str)):
            raise TunerError(f"{where}: row {m!r}: {w!r} is not a weight")
    return [_row(str(m), str(w), f"{where}: row {m!r}") for m, w in pairs]


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


# -- Prometheus text format -----------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _labels(text: str, where: str) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise TunerError(f"{where}: cannot read the labels {text[pos:pos + 60]!r}")
        out[m.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
        pos = m.end()
    return out


def parse_exposition(text: str, prefixes: tuple[str, ...], path: Path) -> list[tuple[str, dict, float]]:
    """The samples (name, labels, value) of the metrics whose names start with one of
    `prefixes`, in file order (a dump of several scrapes holds each series several times)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or not s.startswith(prefixes):
            continue
        m = _SAMPLE.match(s)
        where = f"traffic profile {path}:{n}"
        if not m:
            raise TunerError(f"{where}: not a Prometheus sample: {s[:80]!r}")
        try:
            value = float(m.group(3))
        except ValueError:
            raise TunerError(f"{where}: value {m.group(3)!r} is not a number") from None
        if not math.isfinite(value):
            raise TunerError(f"{where}: value {m.group(3)} is not a finite count (a counter, gauge or bucket of "
                             "forward passes or requests never is)")
        out.append((m.group(1), _labels(m.group(2) or "", where), value))
    return out


def _series(samples, name: str, drop: tuple[str, ...] = ()) -> dict[tuple, list[float]]:
    """Values of one metric per series (labels less `drop`), in file order."""
    out: dict[tuple, list[float]] = {}
    for n, labels, v in samples:
        if n == name:
            key = tuple(sorted((k, val) for k, val in labels.items() if k not in drop))
            out.setdefault(key, []).append(v)
    return out


def _window(values: list[float]) -> tuple[float, bool]:
    """A cumulative series over the dump: last - first when several scrapes hold it (the
    traffic between them), else its value since the server started. (value, windowed)."""
    if len(values) > 1 and values[-1] >= values[0]:
        return values[-1] - values[0], True
    return values[-1], False


def _from_metrics(text: str, path: Path, tp: int | None) -> tuple[str, list[Bucket], list[str]]:
    engines = [e for e in SERVING_METRICS.values()
               if any(line.lstrip().startswith(e.prefix) for line in text.splitlines())]
    if not engines:
        known = ", ".join(f"{m.tokens_histogram or m.batch_gauge} ({m.facts_for})" for m in SERVING_METRICS.values())
        raise TunerError(f"traffic profile {path} is a Prometheus dump without any engine's metrics; expected "
                         f"{known}")
    if len(engines) > 1:
        raise TunerError(f"traffic profile {path} mixes the metrics of {' and '.join(e.engine for e in engines)}; "
                         "give one server's dump")
    metrics = engines[0]
    samples = parse_exposition(text, (metrics.prefix,), path)
    if metrics.tokens_histogram and any(n == metrics.tokens_histogram + "_bucket" for n, _, _ in samples):
        buckets, notes = _histogram_profile(samples, metrics, path, tp)
    elif metrics.batch_gauge or metrics.passes_counter:
        buckets, notes = _sampled_profile(samples, metrics, path, tp)
    else:
        buckets, notes = [], []
    if not buckets:
        what = metrics.tokens_histogram or f"{metrics.batch_gauge} or {metrics.passes_counter}"
        raise TunerError(f"traffic profile {path}: no forward passes in {what} ({metrics.facts_for} metrics; is the "
                         "server's traffic in it, and its metrics enabled?)")
    return f"{metrics.facts_for} /metrics dump", buckets, notes + [metrics.padding_note]


def _pad_runs(first: int, last: int, weight: float, sizes: list[int]) -> list[Run]:
    """Passes of first..last tokens (evenly spread) as the kernel sees them: each padded to
    the smallest captured size at or above it; above the largest, unpadded."""
    n = last - first + 1
    runs, lo = [], first
    for size in sorted(sizes):
        if size < lo:
            continue
        if lo > last:
            break
        hi = min(size, last)
        runs.append(Run(size, size, weight * (hi - lo + 1) / n))
        lo = hi + 1
    if lo <= last:
        runs.append(Run(lo, last, weight * (last - lo + 1) / n))
    return runs


def _merge_runs(runs: list[Run]) -> list[Run]:
    out: dict[tuple[int, int], float] = {}
    for r in runs:
        out[(r.first, r.last)] = out.get((r.first, r.last), 0.0) + r.weight
    return [Run(f, last, w) for (f, last), w in sorted(out.items()) if w > 0]


def _histogram_profile(samples, metrics: ServingMetrics, path: Path, tp: int | None):
    name = metrics.tokens_histogram or ""
    series = _series(samples, name + "_bucket")
    models = {str(v) for v in (dict(k).get("model_name") for k in series) if v is not None}
    if len(models) > 1:
        raise TunerError(f"traffic profile {path}: {name} of {len(models)} models ({', '.join(sorted(models))}); "
                         "keep the lines of one model")
    cumulative: dict[float, float] = {}
    windowed = False
    for key, values in series.items():
        labels = dict(key)
        if "le" not in labels:
            raise TunerError(f"traffic profile {path}: a {name}_bucket sample without its le label")
        le = math.inf if labels["le"] in ("+Inf", "Inf", "inf") else _number(labels["le"], "le", str(path))
        value, w = _window(values)
        windowed |= w
        cumulative[le] = cumulative.get(le, 0.0) + value
    bounds = sorted(cumulative)
    if not bounds or bounds[-1] != math.inf:
        raise TunerError(f"traffic profile {path}: {name} has no le=\"+Inf\" bucket: not a whole histogram")
    sizes = metrics.graph_sizes(tp) if metrics.graph_sizes else []
    if not metrics.pads_every_pass:
        sizes = []
    buckets, notes, prev_le, prev_count = [], [], 0.0, 0.0
    finite = [b for b in bounds if b != math.inf]
    for le in bounds:
        count = cumulative[le] - prev_count
        if count < -1e-9:
            raise TunerError(f"traffic profile {path}: {name} is not cumulative at le={le:g}")
        upper = le if le != math.inf else 2 * (finite[-1] if finite else 1)
        first, last = int(math.floor(prev_le)) + 1, int(math.floor(upper))
        if count > 0:
            if last < first:
                raise TunerError(f"traffic profile {path}: {name} counts passes in a bucket holding no whole M "
                                 f"({prev_le:g}, {le:g}]")
            if first > MAX_M:
                notes.append(f"{count:.0f} passes in ({prev_le:g}, {le:g}] tokens are beyond M={MAX_M}, the largest "
                             "batch size a table is tuned for: left out")
                prev_le, prev_count = le, cumulative[le]
                continue
            if last > MAX_M:
                # A bucket's label bounds its passes, it does not say they reach it: no step runs
                # more tokens than a table can be tuned for, so they are spread up to MAX_M.
                notes.append(f"{count:.0f} passes in ({prev_le:g}, {le:g}] tokens are taken as {first} to {MAX_M}, "
                             "the largest batch size a table is tuned for")
                last = MAX_M
            elif le == math.inf:
                notes.append(f"{count:.0f} passes above {finite[-1] if finite else 0:g} tokens (the +Inf bucket) "
                             f"are taken as {first} to {last}")
            label = f"le={le:g}" if le != math.inf else "le=+Inf"
            buckets.append(Bucket(f"{name} {label}", _merge_runs(_pad_runs(first, last, count, sizes))))
        prev_le, prev_count = le, cumulative[le]
    total = sum(b.weight for b in buckets)
    ranks = len({tuple(kv for kv in k if kv[0] != "le") for k in series})
    notes.insert(0, f"{total:.0f} forward passes from {name} ({ranks} series"
                 f"{'; the window between the first and last scrape' if windowed else '; since the server started'}"
                 "): M = prompt plus generation tokens of one engine step (under TP every GPU runs them all; "
                 "with data parallelism each engine label is one rank)")
    return _merge_overlaps(buckets), notes


def _sampled_profile(samples, metrics: ServingMetrics, path: Path, tp: int | None):
    """SGLang-like: decode batches sampled from a gauge (one sample per scrape), the split
    of passes between decode and prefill from counters, prefill chunks as their mean."""
    notes: list[str] = []
    decode: list[int] = []
    gauge = _series(samples, metrics.batch_gauge or "")
    for key, values in gauge.items():
        labels = dict(key)
        if labels.get("priority", "") != "":
            continue                              # per-priority parts of the total
        if any(labels.get(k) in vs for k, vs in metrics.skip_gauge_labels.items()):
            continue
        decode += [int(round(v)) for v in values if v >= 0.5]

    def by_mode(counter: str | None, modes: tuple[str, ...]) -> float:
        total = 0.0
        for key, values in _series(samples, counter or "").items():
            if dict(key).get(metrics.mode_label) in modes:
                total += _window(values)[0]
        return total

    decode_passes = by_mode(metrics.passes_counter, metrics.decode_pass_modes)
    prefill_passes = by_mode(metrics.passes_counter, metrics.prefill_pass_modes)
    decode_tokens = by_mode(metrics.tokens_counter, metrics.decode_token_modes)
    prefill_tokens = by_mode(metrics.tokens_counter, metrics.prefill_token_modes)
    passes = decode_passes + prefill_passes
    sizes = metrics.graph_sizes(tp) if metrics.graph_sizes else []
    rows: list[tuple[int, float]] = []
    decode_share = decode_passes / passes if passes > 0 else (1.0 if decode else 0.0)
    if decode and decode_share > 0:
        for m in decode:
            if m > MAX_M:
                raise TunerError(f"traffic profile {path}: {metrics.batch_gauge} {m} is beyond {MAX_M}")
        padded = [next((s for s in sorted(sizes) if s >= m), m) for m in decode]
        for m in padded:
            rows.append((m, decode_share / len(padded)))
        notes.append(f"decode: {len(decode)} samples of {metrics.batch_gauge} (one per scrape; M = running "
                     "requests, one token each without speculative decoding), padded to the CUDA-graph sizes"
                     + (f"; {decode_passes:.0f} of {passes:.0f} passes are decode ({metrics.passes_counter})"
                        if passes > 0 else f"; no {metrics.passes_counter}: every pass taken as decode"))
    elif decode_passes > 0 and decode_tokens > 0:
        mean = max(1, round(decode_tokens / decode_passes))
        rows.append((next((s for s in sorted(sizes) if s >= mean), mean), decode_share))
        notes.append(f"decode: no {metrics.batch_gauge} samples; the mean batch {mean} "
                     f"({metrics.tokens_counter} over {metrics.passes_counter}) stands for every decode pass")
    if prefill_passes > 0 and passes > 0:
        if prefill_tokens > 0:
            chunk = min(MAX_M, max(1, round(prefill_tokens / prefill_passes)))
            rows.append((chunk, prefill_passes / passes))
            notes.append(f"prefill: {prefill_passes:.0f} passes of {chunk} tokens on average ({metrics.tokens_counter}"
                         f" over {metrics.passes_counter}; {metrics.facts_for} exports no per-pass histogram)")
        else:
            notes.append(f"prefill: {prefill_passes:.0f} passes but no {metrics.tokens_counter}: left out")
    rows = [(m, w) for m, w in rows if w > 0]
    if not rows:
        return [], notes
    buckets, _ = _points(rows, path)
    return buckets, notes


def _merge_overlaps(buckets: list[Bucket]) -> list[Bucket]:
    """Buckets whose M overlap once padded (a custom histogram bound inside a padding
    step) become one: a key can only be within one bucket."""
    out: list[Bucket] = []
    for b in sorted(buckets, key=lambda b: b.lo):
        if out and b.lo <= out[-1].hi:
            out[-1] = Bucket(f"{out[-1].label} + {b.label}", _merge_runs(out[-1].runs + b.runs))
        else:
            out.append(b)
    return out


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
    return f"traffic-weighted speedup over {against}: {w.speedup:.2f}x{part}"


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
