"""Turning study results into each engine's tables and one provenance manifest."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tuner import __version__
from tuner.emit import partial
from tuner.errors import TunerError
from tuner.measure.environment import now_iso
from tuner.paths import atomic_write_json, atomic_write_text, read_json
from tuner.plan.engines import ENGINES
from tuner.plan.kernel_api import KernelSpec, table_entry
from tuner.plan.problems import Problem
from tuner.search.runner import StudyResult

MANIFEST = "manifest.json"


def table_json(table: dict[int, dict]) -> str:
    """A table as the engines' tuners write it: string keys in ascending M, indented."""
    return json.dumps({str(m): table[m] for m in sorted(table)}, indent=4) + "\n"


def write_tables(out_dir: Path, kernel: KernelSpec, problem: Problem, results: list[StudyResult],
                 cuda_name: str, triton_version: str, engines: list[str]) -> dict[str, str]:
    """Write one table per engine that runs this problem; returns {engine: relative path}.
    M values without a validated config are left out (the engine then uses the nearest)."""
    table = {r.M: table_entry(kernel, r.config, problem.params) for r in results if r.config is not None}
    files: dict[str, str] = {}
    if not table:
        return files
    text = table_json(table)
    for name, rel in _table_files(kernel, problem, cuda_name, triton_version, engines):
        atomic_write_text(out_dir / rel, text, root=out_dir)
        files[name] = rel
    return files


def _table_files(kernel: KernelSpec, problem: Problem, cuda_name: str, triton_version: str,
                 engines: list[str]) -> list[tuple[str, str]]:
    """(engine, path relative to the results folder) of each table file of `problem`, for each
    of `engines` that runs it, named and placed as that engine reads it."""
    return [(name, ENGINES[name].table_relpath(kernel.table_kind, problem.params, cuda_name, triton_version))
            for name in engines if name in problem.engines]


def remove_tables(out_dir: Path, kernel: KernelSpec, problem: Problem, cuda_name: str, triton_version: str,
                  engines: list[str]) -> list[str]:
    """Remove the files of a table this run does not write (a tied table that came out the same
    as its partner) where an earlier run into this folder left them: the manifest no longer
    lists them, and an engine would still read them beside the new table. Returns them."""
    removed = []
    for _, rel in _table_files(kernel, problem, cuda_name, triton_version, engines):
        if (out_dir / rel).is_file():
            (out_dir / rel).unlink()
            removed.append(rel)
    return removed


def update_manifest(out_dir: Path, run_info: dict, entries: list[dict]) -> Path:
    """Merge this run's entries into OUT/manifest.json (one per kernel, problem and table file), atomically."""
    path = out_dir / MANIFEST
    old = {}
    if path.exists():
        try:
            old = read_json(path)
        except TunerError:
            old = {}
        if manifest_problem(old):
            raise TunerError(f"{path} is not a tuner manifest ({manifest_problem(old)}); this --out holds "
                             "something else: give another --out")
    tables = list(old.get("tables", []))
    for e in entries:
        tables = _merged(tables, e)
    manifest = {
        "format": "tuner-manifest/1",
        "tool": f"tuner {__version__}",
        "written": now_iso(),
        **run_info,
        "tables": tables,
    }
    atomic_write_json(path, manifest, indent=2, root=out_dir)
    return path


def read_manifest(folder: Path) -> dict:
    """A results folder's manifest, its shape checked; one clear line when it is not one."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        what = (f"holds no {MANIFEST}" if Path(folder).is_dir() else
                "is not a folder" if Path(folder).exists() else "does not exist")
        raise TunerError(f"{folder} {what}: not a tuner results folder")
    manifest = read_json(path)
    problem = manifest_problem(manifest)
    if problem:
        raise TunerError(f"{path} is not a tuner manifest: {problem}")
    return manifest


MAX_M = 1 << 20                  # as the command line's batch sizes
_NUMBERS = ("time_us", "spread", "default_time_us", "speedup")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _config_problem(cfg) -> str | None:
    if not isinstance(cfg, dict):
        return "is not an object"
    for k, v in cfg.items():
        if not isinstance(v, (int, bool)) or (not isinstance(v, bool) and not 0 <= v <= 1 << 16):
            return f"holds {k}={v!r}, not a whole number of a launch config"
    return None


def _entry_problem(i: int, m, e: dict) -> str | None:
    from tuner.plan.batch_keys import batch_key
    if batch_key(m, MAX_M) is None:
        return f"table {i}: entry key {m!r} is not a batch size (1 to {MAX_M})"
    for key in ("config", "default_config"):
        if e.get(key) is not None and (why := _config_problem(e[key])):
            return f"table {i}: the {key.replace('_', ' ')} of M={m} {why}"
    for key in _NUMBERS:
        if e.get(key) is not None and not _is_number(e[key]):
            return f"table {i}: {key} of M={m} is not a number ({e[key]!r})"
    if e.get("trials") is not None and (not isinstance(e["trials"], int) or isinstance(e["trials"], bool)):
        return f"table {i}: trials of M={m} is not a whole number ({e['trials']!r})"
    for key in ("numerics", "failures", "kept_default", "tied", "search"):
        if e.get(key) is not None and not isinstance(e[key], dict):
            return f"table {i}: {key} of M={m} is not an object"
    if e.get("failures") and not all(isinstance(v, int) and not isinstance(v, bool) for v in e["failures"].values()):
        return f"table {i}: failures of M={m} must count configs by kind"
    return None


def manifest_problem(manifest) -> str | None:
    """What is wrong with a manifest's shape (every field a command reads, of its type), or
    None: a hand-edited or foreign manifest is one clear line, never a crash further on."""
    if not isinstance(manifest, dict) or not str(manifest.get("format", "")).startswith("tuner-manifest/"):
        return "it lacks \"format\": \"tuner-manifest/1\""
    tables = manifest.get("tables")
    if not isinstance(tables, list):
        return "'tables' is not a list"
    for key in ("traffic", "search", "environment", "measurement", "warm_start"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            return f"'{key}' is not an object"
    for key in ("model", "model_source", "gpu", "measured_by"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            return f"'{key}' is not a string"
    for i, t in enumerate(tables, 1):
        if not isinstance(t, dict):
            return f"table {i} is not an object"
        if not isinstance(t.get("kernel"), str) or not isinstance(t.get("problem"), dict):
            return f"table {i} lacks its kernel or problem"
        files, entries = t.get("files", {}), t.get("entries", {})
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return f"table {i}: 'files' must map engines to paths"
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            return f"table {i}: 'entries' must map batch sizes to entries"
        for key in ("kernel_source", "environment", "identity", "measurement"):
            if t.get(key) is not None and not isinstance(t[key], dict):
                return f"table {i}: '{key}' is not an object"
        source = t.get("kernel_source") or {}
        for key in ("source", "version", "origin", "code_version", "launched_as"):
            if source.get(key) is not None and not isinstance(source[key], str):
                return f"table {i}: kernel_source.{key} is not a string"
        if t.get("tied_to") is not None and not isinstance(t["tied_to"], str):
            return f"table {i}: 'tied_to' is not a problem key"
        for key in ("layers",):
            if t.get(key) is not None and not (isinstance(t[key], list) and all(isinstance(x, str) for x in t[key])):
                return f"table {i}: '{key}' is not a list of names"
        for key in ("measured", "how"):
            if t.get(key) is not None and not isinstance(t[key], str):
                return f"table {i}: '{key}' is not a string"
        if (why := partial.problem(t.get(partial.KEY))) is not None:
            return f"table {i}: {why}"
        for m, e in entries.items():
            if (why := _entry_problem(i, m, e)) is not None:
                return why
    return None


def table_key(entry: dict) -> str:
    """A manifest entry's problem: kernel, whose code timed it, problem. The same GEMM shape
    timed on vLLM's and on SGLang's kernel is two entries; timed on one kernel (ours) for both
    engines' files by two runs, it is two entries too (update_manifest keeps one per file)."""
    return json.dumps([entry.get("kernel"), (entry.get("kernel_source") or {}).get("source", "ours"),
                       entry.get("problem")], sort_keys=True)


def table_file_key(entry: dict) -> str:
    """A manifest entry's problem (table_key) and the engines whose files it holds: one per
    entry of a manifest (update_manifest keeps one entry per file), so what compares two runs'
    tables entry by entry (tuner nightly) compares each engine's table of a problem."""
    return json.dumps([table_key(entry), sorted(map(str, entry.get("files") or {}))])


def _merged(tables: list[dict], new: dict) -> list[dict]:
    """`tables` with `new` in: an entry of the same kernel, source and problem gives up the
    files `new` rewrote (and goes when none is left: `new` takes its place, else comes last).
    The other engines' files of that problem keep their entries."""
    engines = set(new.get("files") or {})
    out, placed = [], False
    for t in tables:
        if table_key(t) == table_key(new):
            files = {k: v for k, v in (t.get("files") or {}).items() if k not in engines}
            if not engines or not files:
                if not placed:
                    out.append(new)
                    placed = True
                continue
            t = {**t, "files": files}
        out.append(t)
    return out if placed else [*out, new]


def kernel_source_info(kernel: KernelSpec) -> dict:
    """Whose kernel code timed a table, as the manifest records it (tuner install compares
    the version with the target engine's)."""
    info = {"source": kernel.source, "version": kernel.source_version, "origin": kernel.origin,
            "code_version": kernel.code_version}
    for key in ("launcher_supports", "launched_as", "launcher_matches_engine"):
        if key in kernel.notes:
            info[key] = kernel.notes[key]
    return info


def manifest_entry(kernel: KernelSpec, problem: Problem, results: list[StudyResult], files: dict,
                   run_info: dict) -> dict:
    return {
        "kernel": kernel.name,
        "kernel_source": kernel_source_info(kernel),
        "problem": problem.params,
        "layers": list(problem.layers),
        "tied_to": problem.tied_to,         # tables that must change together (SGLang's up and _down)
        "files": files,
        "measured": run_info.get("measured_by"),
        "how": kernel.measurement_note(problem.params),
        "environment": run_info.get("environment"),
        # what the studies were timed on: device, kernel code, space, Triton (search.identity)
        "identity": run_info.get("identity"),
        # how every time of it was taken: graph or eager, L2 cold or warm, routing, clocks (tuner/measure/policy.py)
        "measurement": run_info.get("measurement"),
        # an explicit default (traffic profiles) is what the engine runs anyway: it does not fail this
        "numerics_passed": all(r.numerics.get("status") in ("passed", "default") for r in results if r.config),
        "entries": {str(r.M): r.as_dict() for r in sorted(results, key=lambda r: r.M)},
    }


# -- with a traffic profile: the default where the tuned config does not beat it -------------------
NOISE_FLOOR = 0.02        # the smallest gain that counts, unless the measured spread is larger


def within_noise(r: StudyResult, noise: float = NOISE_FLOOR) -> bool:
    """The tuned config does not beat the default by more than the noise band (the larger
    of `noise` and the tuned config's measured spread)."""
    if r.config is None or not r.time_us or not r.default_time_us:
        return False                       # nothing tuned, or no default time to compare with
    return r.time_us >= r.default_time_us * (1 - max(noise, r.spread or 0.0))


def prefer_defaults(kernel: KernelSpec, group: list[Problem], group_results: list[list[StudyResult]],
                    noise: float = NOISE_FLOOR) -> list[list[StudyResult]]:
    """Tables tuned for a traffic profile: at each M where no table of the group (one table,
    or SGLang's up table and the `_down` table tied to it) beats its default beyond noise,
    write the default config explicitly, so that the served M near that key run what the
    engine would run without a table rather than a config tuned for another size. The first
    problem of a group is the one the others are tied to: a tied table's default is the
    first table's config (tune.table_default), so it follows the first table's default."""
    from tuner.plan.kernel_api import config_from_entry
    by_m = [{r.M: r for r in rs} for rs in group_results]
    revert = {M for M in by_m[0] if all(M in d and within_noise(d[M], noise) for d in by_m)}
    out: list[list[StudyResult]] = []
    for i, rs in enumerate(group_results):
        kept = []
        for r in rs:
            if r.M not in revert:
                kept.append(r)
                continue
            first_default = by_m[0][r.M].default_config
            config = r.default_config if i == 0 else config_from_entry(kernel, first_default)
            timed = config == r.default_config
            band = max(noise, r.spread or 0.0)
            gain = (r.default_time_us or 0.0) / (r.time_us or 1.0) - 1      # both set: within_noise
            why = (f"tuned {gain:+.1%} against the default, within the noise band "
                   f"({band:.0%})" + ("" if len(group) == 1 else " in every table tied at this M"))
            kept.append(dataclasses.replace(
                r, config=config, time_us=r.default_time_us if timed else None, spread=None,
                default_config=config, default_time_us=r.default_time_us if timed else None,
                numerics={"status": "default", "detail": "the engine's default config, written explicitly"},
                kept_default={"config": r.config, "time_us": r.time_us, "default_time_us": r.default_time_us,
                              "why": why + ("" if timed else "; this default was not timed")}))
        out.append(kept)
    return out


def copied_tied_tables(kernel: KernelSpec, group: list[Problem], group_results: list[list[StudyResult]]) -> dict:
    """{problem key: why} of the tied tables (SGLang's `_down`) that came out the same as the
    table they are tied to at every M: not written, since the engine then reuses that table
    anyway, and `tuner audit` flags such a file as a copy that was never tuned."""
    from tuner.plan.kernel_api import table_entry
    tables = {p.key: {r.M: table_entry(kernel, r.config, p.params) for r in rs if r.config is not None}
              for p, rs in zip(group, group_results)}
    return {p.key: f"the same configs as {p.tied_to} at every M: the engine reuses that table for it without a file"
            for p in group if p.tied_to and tables.get(p.key) and tables[p.key] == tables.get(p.tied_to)}
