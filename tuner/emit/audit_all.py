"""`tuner audit --all`: every table file an installation or wheel ships (and the MoE override
folder), judged by the audit's rules: where no loader looks, names none asks for, what
crashes the loader, each loadable table's rows, keys and `_down` pairs, and (SGLang) which
file each name resolves to under the target Triton.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tuner.emit.audit import AuditReport, _loader_findings, read_table
from tuner.emit.audit_rules import Batches, Finding, named_table_findings, pair_findings
from tuner.emit.engine_tables import (
    FolderFiles,
    Installation,
    TableFiles,
)
from tuner.plan.engines import (
    TableFamily,
    table_family,
)
from tuner.plan.table_lookup import (
    resolve_table,
)


# -- --all: every table an installation ships ---------------------------------------------------------
def audit_all(inst: Installation, batches: Batches, override_dir: Path | None, kinds=("fused_moe", "fp8_gemm")) -> AuditReport:
    """Every table file in the engine's table folders (and the MoE override folder when
    given): where no loader looks, names none asks for, what crashes the loader, and each
    loadable table's rows, keys, `_down` pairs and (SGLang) which file each name resolves
    to under the target Triton."""
    engine = inst.engine
    families = [table_family(engine, k) for k in kinds]
    report = AuditReport("all", {"engine": engine, "version": inst.version, "source": inst.origin,
                                 "triton": inst.triton, "triton_from": inst.triton_origin,
                                 "batch_sizes": batches.label(), "notes": list(inst.notes)})
    loader, release = _loader_findings(inst, families)
    report.header["rules_of"] = f"{engine} {release}"
    report.findings += loader
    stats = {"files": 0, "tables": 0, "other_loaders": 0, "rows": 0}
    places: list[tuple[TableFamily, TableFiles, str]] = []
    for fam in families:
        if inst.files is not None:
            places.append((fam, inst.files, fam.folder))
        if override_dir is not None and fam.env_var:
            report.header["override"] = f"{fam.env_var}={override_dir}"
            places.append((fam, FolderFiles(override_dir), "configs" if fam.env_replaces_root else ""))
            if fam.per_triton and fam.env_replaces_root:
                # a folder without configs/: the loader's fallback lists it and raises (say what to do)
                crash = resolve_table(fam, "", None, FolderFiles(override_dir), inst.triton or "0.0.0").crash
                if crash:
                    report.findings.append(Finding("error", "crashes_loader", crash, str(override_dir)))
    for fam, files, folder in places:
        _audit_folder(report, stats, fam, files, folder, inst, batches)
    report.stats = stats
    return report


def _audit_folder(report: AuditReport, stats: dict, fam: TableFamily, files: TableFiles, folder: str,
                  inst: Installation, batches: Batches) -> None:
    base = f"{folder}/" if folder else ""
    pattern = fam.name_pattern()
    loadable: dict[str, tuple[str, dict]] = {}          # rel -> (name, groups)
    bad_folders: set[str] = set()
    if fam.per_triton:        # the fallback lists every triton_* entry, files and empty folders too
        bad_folders = {d for d in files.listdir(folder) or [] if d.startswith("triton_")
                       and not all(x.isdigit() for x in d.removeprefix("triton_").split("_"))}
    for rel in files.walk(folder):
        if not rel.endswith(".json"):
            continue
        stats["files"] += 1
        sub, name = rel[len(base):].rpartition("/")[::2]
        where = files.display(rel)
        if any(re.search(pat, name) for _, pat in fam.other_loaders):
            stats["other_loaders"] += 1
            continue
        if fam.per_triton:
            if not sub.startswith("triton_") or "/" in sub:
                report.findings.append(Finding("warning", "unloadable",
                                               f"{'at the configs/ root' if not sub else f'in {sub}/'}: {inst.engine} "
                                               "reads configs/triton_X_Y_Z/<name> only", where))
                continue
            if not all(x.isdigit() for x in sub.removeprefix("triton_").split("_")):
                bad_folders.add(sub)
                continue
        elif sub:
            report.findings.append(Finding("warning", "unloadable", f"in {sub}/: {inst.engine} reads <folder>/<name> "
                                                                    "only", where))
            continue
        m = pattern.match(name)
        if not m:
            report.findings.append(Finding("warning", "unloadable", _why_unloadable(fam, name), where))
            continue
        g = m.groupdict()
        if fam.fold_h200 and "H200" in g["device"].split("_") and g["device"] != "NVIDIA_H200":
            report.findings.append(Finding("warning", "device_name",
                                           f"device_name={g['device']} is never looked up: {inst.engine} asks for "
                                           "NVIDIA_H200 on every H200 variant (MoE tables only)", where))
            continue
        loadable[rel] = (name, g)
    for sub in sorted(bad_folders):
        report.findings.append(Finding("error", "crashes_loader",
                                       f"{sub} is not a version folder: the loader's Triton fallback sorts the "
                                       "triton_* names as integers and raises ValueError whenever a table is not in "
                                       "the running Triton's folder; rename it triton_X_Y_Z (digits only) or move it "
                                       "out", files.display(base + sub)))
    tables: dict[str, dict] = {}
    for rel, (name, g) in loadable.items():
        where = files.display(rel)
        raw, table, crash = read_table(files, rel, fam)
        if table is None:
            report.findings.append(Finding("error", "crashes_loader", crash or "unreadable", where))
            continue
        stats["tables"] += 1
        stats["rows"] += len(table)
        tables[rel] = table
        report.findings += named_table_findings(fam, name, table, where, batches)
        obj = json.loads(raw)
        if isinstance(obj, dict) and "triton_version" in obj and "triton_version" in fam.dropped_keys:
            report.findings.append(Finding("info", "ignored_key", f"triton_version {obj['triton_version']}: "
                                           f"{inst.engine} drops it and never compares it with the running Triton",
                                           where))
    if fam.has_down:
        for rel, table in tables.items():
            if rel.endswith("_down.json"):
                up = rel[: -len("_down.json")] + ".json"
                if up in tables:
                    report.findings += pair_findings(tables[up], table, files.display(rel), batches, fam)
    if fam.per_triton and not bad_folders:
        target = fam.triton_folder(inst.triton)
        by_name: dict[str, list[str]] = {}
        for rel, (name, _) in loadable.items():
            if rel in tables:
                by_name.setdefault(name, []).append(rel[len(base):].split("/")[0])
        for name, subs in sorted(by_name.items()):
            if target in subs:
                continue
            newest = max(subs, key=lambda s: tuple(int(x) for x in s.removeprefix("triton_").split("_")))
            report.findings.append(Finding("warning", "triton_fallback",
                                           f"no {target}/ copy: under Triton {inst.triton} SGLang runs this one, tuned "
                                           f"under {newest.removeprefix('triton_').replace('_', '.')}",
                                           files.display(f"{base}{newest}/{name}")))


def _why_unloadable(fam: TableFamily, name: str) -> str:
    m = re.search(r",dtype=([^,.]+?)(?:,|_down\.json$|\.json$)", name)
    if m and m.group(1) not in fam.dtypes:
        asked = ", ".join(d for d in fam.dtypes if d) + (" or none" if None in fam.dtypes else "")
        return f"dtype={m.group(1)} is never asked for ({fam.engine}'s {fam.kind} loader asks for {asked})"
    return f"not a name {fam.engine}'s {fam.kind} loader builds (E=..,N=..,device_name=..[,dtype=..][,block_shape=..])" \
        if fam.kind == "fused_moe" else f"not a name {fam.engine}'s {fam.kind} loader builds " \
                                        "(N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[..])"
