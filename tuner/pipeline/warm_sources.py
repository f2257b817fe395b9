"""Where a run's warm-start seeds come from (tuner/search/warm_start.py ranks and caps them).

  - `--warm-start PATH...`: a results folder of ours (its studies' best measured configs, read
    from a copy of its journal so that nothing is written there; its manifest's chosen configs
    where it has no journal), a table file, or a folder of tables (any engine's config folder);
  - by default (unless --no-warm-start), each engine's own shipped tables of this kernel on the
    Hopper GPUs, from the engine's installed package or wheel, found as `tuner audit` finds it
    (--engine-source, the installed engine, $TUNER_ENGINE_WHEELS): of the nearest shapes only.
Every source is named in the plan and the manifest with how many configs it offered; each
study's manifest entry says how many seeds it took from each.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.batch_keys import batch_key
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem
from tuner.search.warm_start import PER_SOURCE_M, Known, WarmPool, gpu_tier, shape_distance

log = logging.getLogger("tuner")
NEAREST_SHAPES = 4          # shipped tables of at most this many nearest shapes per planned problem


def build_pool(kernel: KernelSpec, problems: list[Problem], gpu, paths: list[str] | None, shipped: bool,
               engines: list[str], engine_source: list[str] | None, model=None) -> WarmPool:
    """Every known config of `kernel` a run may seed from."""
    pool = WarmPool()
    for path in paths or []:
        p = Path(path)
        if not p.exists():
            raise TunerError(f"--warm-start {path} not found (a results folder, a table file or a folder of tables)")
        if (p / "manifest.json").is_file():
            kind, known = "results folder", results_folder(p, kernel)
        else:
            kind, known = "tables", tables_at(p, kernel, model, problems)
        if not known:
            raise TunerError(f"--warm-start {path} holds no {kernel.name} configs (no results of ours, no engine "
                             "table of this kernel)")
        pool.add(str(p), kind, known)
    if shipped:
        for engine in engines:
            found = shipped_tables(engine, kernel, model, problems, gpu, engine_source)
            if found:
                pool.add(*found)
    return pool


def results_folder(folder: Path, kernel: KernelSpec) -> list[Known]:
    """A results folder's best configs per (problem, M): its studies' best PER_SOURCE_M measured
    configs, or, without a journal, each table's chosen config."""
    from tuner.emit.results import read_manifest
    from tuner.plan.gpus import get_gpu
    manifest = read_manifest(folder)
    try:
        gpu = get_gpu(manifest.get("gpu") or "").cuda_name
    except TunerError:
        gpu = str(manifest.get("gpu") or "")
    known = studies(folder / "studies.journal", kernel, gpu, str(folder)) if (folder / "studies.journal").is_file() else []
    if known:
        return known
    for t in manifest.get("tables", []):
        if t.get("kernel") != kernel.name:
            continue
        for m, e in (t.get("entries") or {}).items():
            if e.get("config"):
                known.append(Known(e["config"], kernel.name, t["problem"], int(m), gpu, str(folder), 0, e.get("time_us")))
    return known


def studies(journal: Path, kernel: KernelSpec, gpu: str, source: str) -> list[Known]:
    """The best measured configs of each study in a journal, read from a copy of it (opening
    a journal takes a lock beside it: the folder read from is left as it was)."""
    import optuna

    from tuner.pipeline.stored_plans import PLAN_FORMAT
    from tuner.search.journal_lines import is_journal
    from tuner.search.storage import open_journal
    try:
        ours = is_journal(journal)
    except OSError as e:
        raise TunerError(f"--warm-start: cannot read {journal} ({e.strerror})") from None
    if not ours:        # said once, of the file given, not of the copy read (issue 42, item 8)
        raise TunerError(f"--warm-start: {journal} is not a journal of Optuna operations (a damaged tail? "
                         f"`tuner repair-journal {journal}` keeps its whole operations)")
    with tempfile.TemporaryDirectory(prefix="tuner-warm-") as tmp:
        copy = Path(tmp) / "studies.journal"
        shutil.copyfile(journal, copy)
        store = open_journal(copy)
        names = optuna.get_all_study_names(store)
        problems: dict[str, dict] = {}
        for name in names:
            if ":tuner-plan:" in f":{name}" or name.split(":")[0].endswith("tuner-plan"):
                plan = optuna.load_study(study_name=name, storage=store).user_attrs.get("plan") or {}
                if plan.get("format") == PLAN_FORMAT and plan.get("kernel") == kernel.name:
                    for d in plan.get("problems", []):
                        problems[Problem(kernel.name, d["params"]).key] = d["params"]
        out = []
        for name in names:
            head, _, m = name.rpartition(":M=")
            key = head.split(":", 1)[1] if ":" in head else ""
            if batch_key(m) is None or key not in problems:
                continue
            trials = optuna.load_study(study_name=name, storage=store).get_trials(deepcopy=False)
            timed = sorted(((tr.value, tr.user_attrs["config"]) for tr in trials
                            if tr.value is not None and tr.user_attrs.get("config") and "repeat" not in tr.user_attrs),
                           key=lambda vc: vc[0])
            out += [Known(cfg, kernel.name, problems[key], int(m), gpu, source, i, t)
                    for i, (t, cfg) in enumerate(timed[:PER_SOURCE_M])]
        return out


def _known_of(table_files, kernel: KernelSpec, source: str) -> list[Known]:
    out = []
    for t in table_files:
        if t.problem.kernel != kernel.name:
            continue
        for m, cfg in t.table.items():
            if isinstance(cfg, dict) and batch_key(m) is not None:
                out.append(Known(cfg, kernel.name, t.problem.params, int(m), t.device, source, 0))
    return out


def tables_at(path: Path, kernel: KernelSpec, model, problems: list[Problem]) -> list[Known]:
    """Table files (one, or a folder's, searched recursively) of this kernel, any GPU."""
    from tuner.plan.table_files import parse_table_file
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
    routing = (problems[0].params.get("routing") if problems else None) or "uniform"
    found = []
    for f in files:
        try:
            found += parse_table_file(f, model, routing)
        except TunerError as e:
            log.warning("--warm-start: skipping %s (%s)", f, e)
    return _known_of(found, kernel, str(path))


def shipped_tables(engine: str, kernel: KernelSpec, model, problems: list[Problem], gpu,
                   engine_source: list[str] | None) -> tuple[str, str, list[Known]] | None:
    """The engine's shipped tables of this kernel on Hopper GPUs, of the nearest shapes to the
    planned problems; None when the engine (or a wheel of it) is not found."""
    from tuner.emit.engine_tables import locate_installation
    from tuner.plan.engines import table_family
    from tuner.plan.table_files import parse_table_file
    try:
        inst = locate_installation(engine, engine_source=engine_source)
        family = table_family(engine, kernel.table_kind)
    except (TunerError, KeyError, ValueError):
        return None
    if inst.files is None:
        return None
    routing = (problems[0].params.get("routing") if problems else None) or "uniform"
    newest: dict[str, str] = {}
    for rel in sorted(inst.files.walk(family.folder), reverse=True):      # SGLang: newest Triton folder first
        name = rel.rsplit("/", 1)[-1]
        if name.endswith(".json") and gpu_tier(_device_part(name), gpu) <= 1:
            newest.setdefault(name, rel)
    tables = []
    with tempfile.TemporaryDirectory(prefix="tuner-shipped-") as tmp:
        for name, rel in newest.items():
            f = Path(tmp) / name
            try:
                f.write_bytes(inst.files.read(rel))
                tables += parse_table_file(f, model, routing)
            except (TunerError, OSError):
                continue
    near = _nearest(tables, kernel, problems)
    label = f"{engine} {inst.version} shipped tables ({inst.origin})"
    return label, "engine's shipped tables", _known_of(near, kernel, f"{engine} {inst.version} shipped")


def _device_part(name: str) -> str:
    part = name.split("device_name=", 1)[-1]
    return part.split(",", 1)[0].removesuffix(".json").removesuffix("_down")


def _nearest(tables: list, kernel: KernelSpec, problems: list[Problem]) -> list:
    """The tables of the NEAREST_SHAPES nearest shapes to each planned problem."""
    mine = [t for t in tables if t.problem.kernel == kernel.name]
    keep: set[int] = set()
    for p in problems:
        shapes = sorted({t.problem.key for t in mine}, key=lambda k: min(
            shape_distance(t.problem.params, p.params) for t in mine if t.problem.key == k))
        near = set(shapes[:NEAREST_SHAPES])
        keep |= {i for i, t in enumerate(mine) if t.problem.key in near}
    return [mine[i] for i in sorted(keep)]
