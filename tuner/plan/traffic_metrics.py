"""A traffic profile read from a dump of a running server's /metrics (Prometheus text format):
vLLM's per-step token histogram, or SGLang's running-batch gauge and forward-pass counters,
padded to the engine's CUDA-graph sizes where it pads. What each engine exports and how it pads
is its SERVING_METRICS (tuner/plan/engine_rules/, read from its source); nothing here asks
which engine it is.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.engines import SERVING_METRICS, ServingMetrics
from tuner.plan.traffic_profile import MAX_M, Bucket, Run, _number, _points


def _looks_like_metrics(text: str) -> bool:
    prefixes = tuple(m.prefix for m in SERVING_METRICS.values())
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("# HELP ", "# TYPE ")) or s.startswith(prefixes):
            return True
    return False



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
