"""The incumbent of a run's rows: the table each engine reads today for a problem on the run's
GPU, resolved as `tuner audit` resolves it (tuner/plan/table_lookup.py: the override folder
its variable names, the package, SGLang's triton_* folders with its fallback to another
Triton's folder, a `_down` name read from the up table when no `_down` file is found), so that
a tuned row replaces what the engine really runs, not a table it never opens. Independent of
the warm start: --no-warm-start changes the seeds, never what a row must beat."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem

log = logging.getLogger("tuner")


@dataclass(frozen=True)
class EngineTable:
    """The table one engine reads for one problem: its rows ({"M": config}) and where from."""
    engine: str
    label: str        # "sglang 0.5.23"
    rows: dict
    where: str        # "sglang 0.5.23 .../configs/triton_3_5_1/E=...json (Triton fallback, Triton 3.6.0)"

    def as_dict(self) -> dict:
        return {"engine": self.engine, "file": self.where}


def engine_tables(kernel: KernelSpec, problem: Problem, gpu: GpuSpec, engines: list[str],
                  engine_source: list[str] | None = None, installations: dict | None = None) -> list[EngineTable]:
    """The tables `engines` (those of the problem's that read `kernel`'s tables) read for
    `problem` on `gpu`, in the problem's engine order; an engine not found (no package, no
    wheel) or reading no file contributes none: its default config is the incumbent.
    `installations`: {engine: Installation or None}, filled as they are located (one lookup
    per engine for a run's problems)."""
    from tuner.emit.audit import read_table
    from tuner.emit.engine_tables import FolderFiles, locate_installation
    from tuner.plan.engines import TABLE_FAMILIES, table_family
    from tuner.plan.table_lookup import resolve_table, table_names
    cache = installations if installations is not None else {}
    out = []
    for engine in [e for e in problem.engines if e in engines]:
        if (engine, kernel.table_kind) not in TABLE_FAMILIES:
            continue
        if engine not in cache:
            try:
                cache[engine] = locate_installation(engine, engine_source=engine_source)
            except TunerError as e:
                log.debug("no %s installation for the incumbent: %s", engine, e)
                cache[engine] = None
        inst = cache[engine]
        if inst is None:
            continue
        family = table_family(engine, kernel.table_kind)
        override = os.environ.get(family.env_var or "") if family.env_var else None
        override_files = FolderFiles(Path(override)) if override and os.path.isdir(override) else None
        name, up_name = table_names(family, problem, gpu.cuda_name)
        resolved = resolve_table(family, name, inst.files, override_files, inst.triton, down_of=up_name)
        if not resolved.found or resolved.files is None:
            continue
        _, table, crash = read_table(resolved.files, resolved.rel or "", family)
        if table is None:
            log.warning("%s: %s reads it but cannot load it (%s): the default config is the incumbent",
                        resolved.files.display(resolved.rel or ""), inst.label, crash)
            continue
        rows = {str(m): cfg for m, cfg in table.items() if isinstance(cfg, dict)}
        if rows:
            where = (f"{inst.label} {resolved.files.display(resolved.rel or '')} ({resolved.how}, "
                     f"Triton {inst.triton})")
            out.append(EngineTable(engine, inst.label, rows, where))
    return out
