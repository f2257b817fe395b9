"""What `tuner coverage` reads besides the models: every supported engine version's tables (the
installed engine, or its wheel, found as `tuner audit` finds them), the results folders of our
tuned tables (tuned/), and the gains the committed GPU runs measured per table (tuned vs the
engine's default config, tuned vs the table it ships) from their bench files
(bench/results/<run>/**/bench-*.json)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tuner.emit.engine_tables import Installation, locate_installation
from tuner.errors import TunerError
from tuner.paths import REPO_ROOT

TUNED_ROOT = REPO_ROOT / "tuned"
RUNS_ROOT = REPO_ROOT / "bench" / "results"


def installations(engines: list[str], site_packages: str | None = None, engine_source: list[str] | None = None,
                  triton: str | None = None) -> tuple[list[Installation], list[str]]:
    """(every supported release of each engine that is at hand, oldest first, and a line for
    each that is not): the installed engine where its version is the release, else the
    release's wheel (--engine-source, then $TUNER_ENGINE_WHEELS), as `tuner audit` finds them.
    An installed version the rules do not know is taken too (audited with the newest rules)."""
    from tuner.plan.engines import supported_releases
    from tuner.plan.kernel_sources import fetch_hint
    found: list[Installation] = []
    notes: list[str] = []
    for engine in engines:
        versions = supported_releases(engine)
        try:                                                  # what is installed (or given), whatever its version
            here = locate_installation(engine, site_packages, engine_source, None, triton)
            if here.files is not None and here.version and here.version.split("+")[0] not in versions:
                versions.append(here.version)
        except TunerError:
            pass
        missing = []
        for version in versions:
            try:
                inst = locate_installation(engine, site_packages, engine_source, version, triton)
            except TunerError:
                inst = None
            if inst is None or inst.files is None:
                missing.append(version)
            else:
                found.append(inst)
        if missing:
            notes.append(f"{engine} {', '.join(missing)}: no install and no wheel at hand, left out (fetch a wheel "
                         f"with {fetch_hint(engine).replace('`', '')}, or give --engine-source)")
    return found, notes


def tuned_roots(root: Path = TUNED_ROOT) -> list[Path]:
    """The results folders of our tuned tables (tuned/<device>/, each with its manifest.json)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "manifest.json").is_file())


# -- what the committed GPU runs measured ------------------------------------------------------------
@dataclass(frozen=True)
class Gain:
    """A table's measured gains, per batch size benched: tuned vs the engine's default config and
    vs the table the engine shipped (what it read in that run), on the engine's own kernel."""
    vs_default: tuple[float, ...]
    vs_shipped: tuple[float, ...]
    run: str                               # the run folder, relative to the repository

    @staticmethod
    def geomean(ratios) -> float | None:
        ratios = [r for r in ratios if r > 0]
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None

    @property
    def default(self) -> float | None:
        return self.geomean(self.vs_default)

    @property
    def shipped(self) -> float | None:
        return self.geomean(self.vs_shipped)


def measured_gains(root: Path = RUNS_ROOT) -> dict[tuple[str, str, str, str], Gain]:
    """{(engine, version, device, problem key): Gain} from every bench file of a GPU run under
    `root` that timed a tuned table beside the default and the shipped one (the copies a
    recomputation kept as they were measured, *.as-measured.json, are the same times)."""
    from tuner.reading import read_json_file
    out: dict[tuple[str, str, str, str], Gain] = {}
    for path in sorted(root.glob("*/**/bench-*.json")) if root.is_dir() else []:
        if path.name.endswith(".as-measured.json"):
            continue
        try:
            data = read_json_file(path, "bench file ")
        except TunerError:
            continue
        if not isinstance(data, dict) or data.get("synthetic") or data.get("cpu_device") \
                or not isinstance(data.get("rows"), list):
            continue
        device = str(data.get("device") or "")
        times: dict[tuple[str, str, object], dict[str, float]] = {}
        for r in data["rows"]:
            if isinstance(r, dict) and isinstance(r.get("time_us"), (int, float)) and r["time_us"] > 0:
                times.setdefault((str(r.get("kernel_source")), str(r.get("problem")), r.get("M")), {})[
                    str(r.get("contender"))] = float(r["time_us"])
        cells: dict[tuple[str, str, str, str], tuple[list[float], list[float]]] = {}
        for (source, problem, _), t in sorted(times.items(), key=lambda kv: str(kv[0])):
            engine, _, version = source.partition(" ")
            shipped = t.get(f"shipped {engine}-{version}")
            if "tuned" not in t or "default" not in t:
                continue
            d, s = cells.setdefault((engine, version, device, problem), ([], []))
            d.append(t["default"] / t["tuned"])
            if shipped:
                s.append(shipped / t["tuned"])
        run = path.relative_to(root).parts[0]
        where = str((root / run).relative_to(REPO_ROOT)) if (root / run).is_relative_to(REPO_ROOT) else str(root / run)
        for key, (d, s) in cells.items():
            out[key] = Gain(tuple(d), tuple(s), where)
    return out
