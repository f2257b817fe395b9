"""`tuner report` and `tuner diff` judged by traffic (--traffic, or the profile a run records):
per table the traffic-weighted speedup next to the plain geomean, and per engine the estimated
kernel time per forward pass (tuner/plan/traffic.py); and the manifest helpers both reports
share (a table's label, a time read as a number, the geomean)."""

from __future__ import annotations

import math
from pathlib import Path

from tuner.emit.run_table import run_source
from tuner.errors import TunerError
from tuner.plan.problems import Problem


def read_manifest(run: Path) -> dict:
    """tuner.emit.results' reader, imported on first use (it brings Optuna; `tuner --help` does not need it)."""
    from tuner.emit.results import read_manifest as read
    return read(run)


def label(entry: dict) -> str:
    return f"{entry.get('kernel')} " + Problem(entry.get("kernel", ""), entry.get("problem") or {}).key


# What a manifest's time (us), spread or speedup can be: outside it a figure is no measurement (a
# hand-edited 1e300 printed 300 digits in every table and overflowed the plots); shown as '-'.
PLAUSIBLE = (1e-6, 1e9)


def number(v):
    return v if (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 and PLAUSIBLE[0] <= v <= PLAUSIBLE[1]) else None


def geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0 and not math.isnan(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None



def run_traffic(runs: list[Path], given: str | None, tp: int | None = None):
    """--traffic FILE, else the profile the first of `runs` whose manifest records one, else None."""
    from tuner.plan.traffic import TrafficProfile, load_profile
    if given:
        return load_profile(given, tp)
    for run in runs:
        record = read_manifest(run).get("traffic")
        if record:
            return TrafficProfile.from_manifest(record, f"{run}/manifest.json")
    return None


def run_model(runs: list[Path], given: str | None):
    """The model whose layer counts turn per-layer times into a per-pass estimate: --model,
    else the one the first run's manifest names (None when neither is readable)."""
    from tuner.plan.models import load_model
    if given:
        return load_model(given)
    for run in runs:
        manifest = read_manifest(run)
        for name in (manifest.get("model_source"), manifest.get("model")):
            if name:
                try:
                    return load_model(str(name))
                except TunerError:
                    continue
    return None


def table_times(entry: dict) -> tuple[list[int], dict[int, float | None], dict[int, float | None]]:
    """(keys in file order, {key: default time}, {key: the table's time}) of a manifest table."""
    entries = entry.get("entries") or {}
    keys = sorted(int(m) for m, e in entries.items() if e.get("config"))
    return (keys, {k: number(entries[str(k)].get("default_time_us")) for k in keys},
            {k: number(entries[str(k)].get("time_us")) for k in keys})


def _engines_of(entry: dict) -> list[str]:
    return sorted(entry.get("files") or {})


def traffic_report_lines(run: Path, profile, model) -> list[str]:
    """A run's tables judged by traffic: per table the traffic-weighted speedup over the
    default next to the plain geomean, and per engine the estimated kernel time per pass."""
    from tuner.measure.noise import for_environment
    from tuner.plan.layers import layers_per_pass
    from tuner.plan.traffic import step_estimate, step_text, weighted
    manifest = read_manifest(run)
    source = run_source(run)
    noise = for_environment(manifest.get("environment"))
    lines = [*profile.describe()]
    tables = [t for t in manifest.get("tables", []) if t.get("files")]
    for t in sorted(tables, key=label):
        keys, default, tuned = table_times(t)
        w = weighted(profile, (keys, default), (keys, tuned))
        plain = geomean([d / t for d, t in ((default[k], tuned[k]) for k in keys) if d and t])
        lines.append(f"{label(t)} [{', '.join(_engines_of(t))}]: " + _speedups(w, "the default", plain, len(keys), noise))
    lines += _step_lines(tables, lambda t: (table_times(t)[:2], (table_times(t)[0], table_times(t)[2])), profile,
                         model, source, "default", "table", layers_per_pass, step_estimate, step_text)
    return lines


def traffic_diff_lines(old: Path, new: Path, profile, model) -> list[str]:
    """Two runs judged by traffic: per problem the traffic-weighted speedup of NEW over OLD
    (each served M timed at the entry each table would use), and the per-pass estimate."""
    from tuner.measure.noise import for_environment
    from tuner.plan.layers import layers_per_pass
    from tuner.plan.traffic import step_estimate, step_text, weighted
    # two runs are two processes: their ratio is noise within the device's between-process spread
    noise = for_environment(read_manifest(new).get("environment"))
    old_tables = {label(t): t for t in read_manifest(old).get("tables", []) if t.get("files")}
    new_tables = [t for t in read_manifest(new).get("tables", []) if t.get("files") and label(t) in old_tables]
    source = f"old {run_source(old)}; new {run_source(new)}"
    lines = [*profile.describe()]

    def pair(t):
        a, b = table_times(old_tables[label(t)]), table_times(t)
        return (a[0], a[2]), (b[0], b[2])

    for t in sorted(new_tables, key=label):
        (ka, ta), (kb, tb) = pair(t)
        w = weighted(profile, (ka, ta), (kb, tb))
        common = [k for k in kb if k in ta and ta[k] and tb[k]]
        plain = geomean([ta[k] / tb[k] for k in common])
        lines.append(f"{label(t)} [{', '.join(_engines_of(t))}]: new " + _speedups(w, "old", plain, len(common), noise))
    lines += _step_lines(new_tables, pair, profile, model, source, "old", "new", layers_per_pass, step_estimate,
                         step_text)
    return lines


def _speedups(w, against: str, plain: float | None, n: int, noise=None) -> str:
    """The traffic-weighted and plain speedups, each said to be noise when within the device's
    between-process spread (tuner/measure/noise.py)."""
    from tuner.measure.noise import speedup, within
    from tuner.plan.traffic import speedup_text
    return (speedup_text(w, against)
            + (f" (within the {noise.describe()}: not a speed-up)"
               if noise is not None and within(w.speedup, noise) else "")
            + (f" (plain geomean {speedup(plain, noise)} over {n} batch sizes)" if plain else " (plain geomean: -)"))


def _step_lines(tables, pair, profile, model, source, base, new, layers_per_pass, step_estimate, step_text):
    if model is None:
        return ["estimated time per forward pass: give --model for the layer counts"]
    lines = []
    for engine in sorted({e for t in tables for e in _engines_of(t)}):
        rows = []
        for t in tables:
            if engine in _engines_of(t):
                a, b = pair(t)
                rows.append((layers_per_pass(model, t.get("layers") or []), a, b))
        lines.append(f"{engine}, {model.name}: " + step_text(step_estimate(profile, rows), source, base, new))
    return lines


