"""`tuner audit`: which table and which row an engine will really use, and whether it is right.

For a deployment (model, TP/EP, GPU, dtype, engine version, Triton, override folders) every
kernel the model runs is resolved to the file that engine version's loader reads (the rules
in tuner/plan/engines.py, mirrored from the loaders and checked against them), then every batch
size M to the entry the nearest-key rule picks and to what the kernel really gets after the
engine's rewrites. `--all` looks at every table an installation or wheel ships instead.
Findings carry a severity (error: wrong results or a crash; warning: slower or not what the
table says; info) and a one-line reason; `--numerics` runs the rows in use on the engine's
own kernel against the float64 reference (tuner/commands/check.py). The rules that judge one
table: tuner/emit/audit_rules.py; --all: audit_all.py; --numerics: audit_numerics.py;
rendering: audit_report.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.emit.audit_rules import (
    KINDS,
    SEVERITIES,
    Batches,
    Finding,
    _combined,
    key_findings,
    pair_findings,
    row_findings,
)
from tuner.emit.engine_tables import (
    FolderFiles,
    Installation,
    TableFiles,
    loader_changes,
    loader_source_readable,
)
from tuner.errors import TunerError
from tuner.plan.engine_rules.schema import precision_rule
from tuner.plan.engines import (
    TABLE_FAMILIES,
    TableFamily,
    backend_reads_table,
    load_table,
    loader_release,
    release_reads,
    table_family,
)
from tuner.plan.problems import Problem
from tuner.plan.table_lookup import (
    FAR_KEY_FACTOR,
    Resolved,
    gpu_family,
    resolve_table,
    table_names,
)


def read_table(files: TableFiles, rel: str, family: TableFamily) -> tuple[bytes, dict | None, str | None]:
    """(its bytes, the table as the loader returns it or None, why the loader fails on it).
    Read within the bounds of tuner/reading.py: a FIFO, a device, a file or wheel member
    larger than any table is a finding (the loader would wait on it, read without end or
    take the memory), never a read that hangs or fills the memory here."""
    try:
        raw = files.read(rel)
    except TunerError as e:
        return b"", None, f"{e}: the loader's open() and json.load would wait, run out of memory or raise"
    except (OSError, KeyError) as e:
        return b"", None, f"cannot be read ({e}): the loader raises"
    table, crash = load_table(family, raw)
    return raw, table, crash


# -- a deployment ---------------------------------------------------------------------------------
@dataclass
class KernelAudit:
    """One table lookup of a deployment: what is asked for, read, used per M, and found."""
    kind: str                         # "fused_moe" or "fp8_gemm"
    part: str                         # "op" (vLLM's whole MoE layer), "up", "down" (SGLang), "gemm"
    problem: Problem
    family: TableFamily
    resolved: Resolved
    reads: bool = True
    reads_why: str = ""
    table: dict | None = None
    rows: list[dict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    numerics: list[dict] = field(default_factory=list)
    traffic: list[dict] = field(default_factory=list)      # per key under --traffic (KeyCoverage)

    @property
    def where(self) -> str:
        r = self.resolved
        return r.files.display(r.rel) if r.found and r.files is not None else f"(none) {r.name}"

    @property
    def short(self) -> str:
        """The file read, under the folder the loader reads (the header names the package)."""
        r = self.resolved
        if not r.found or r.rel is None:
            return r.name
        if r.how == "override folder":
            return f"${self.family.env_var}/{r.rel}"
        if self.family.env_replaces_root and not r.rel.startswith(self.family.folder):
            return f"${self.family.env_var}/{r.rel}"
        return r.rel[len(self.family.folder) + 1:] if r.rel.startswith(self.family.folder + "/") else r.rel

    @property
    def title(self) -> str:
        params = self.problem.params
        shape = ",".join(f"{k}={params[k]}" for k in ("E", "N", "K") if k in params)
        return f"{self.kind} {self.part} {shape} ({', '.join(self.problem.layers)})"

    def as_dict(self) -> dict:
        r = self.resolved
        return {"kind": self.kind, "part": self.part, "problem": self.problem.params,
                "layers": list(self.problem.layers), "lookup": r.name,
                "file": self.where if r.found else None, "how": r.how, "triton_folder": r.triton_folder,
                "tried": r.tried, "crash": r.crash, "read_by_default": self.reads, "read_why": self.reads_why,
                "rows": self.rows, "findings": [f.as_dict() for f in self.findings], "numerics": self.numerics,
                "traffic": self.traffic}


@dataclass
class AuditReport:
    mode: str                         # "deployment" or "all"
    header: dict
    kernels: list[KernelAudit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)      # every finding (kernels' included)
    stats: dict = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def by_kind(self) -> list[tuple[str, str, list[Finding]]]:
        """[(kind, its worst severity, findings)] in report order."""
        groups: dict[str, list[Finding]] = {}
        for f in self.findings:
            groups.setdefault(f.kind, []).append(f)
        out = []
        for kind in sorted(groups, key=lambda k: (min(SEVERITIES.index(f.severity) for f in groups[k]),
                                                  list(KINDS).index(k) if k in KINDS else 99)):
            fs = groups[kind]
            out.append((kind, SEVERITIES[min(SEVERITIES.index(f.severity) for f in fs)], fs))
        return out

    def as_dict(self) -> dict:
        groups = {kind: {"severity": sev, "heading": KINDS.get(kind, kind), "tables": len({f.table for f in fs}),
                         "count": sum(f.count for f in fs), "findings": [f.as_dict() for f in fs]}
                  for kind, sev, fs in self.by_kind()}
        return {"format": "tuner-audit/1", "mode": self.mode, **self.header,
                "counts": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
                "exit_status": self.exit_code, "kernels": [k.as_dict() for k in self.kernels],
                "by_kind": groups, "stats": self.stats}


def _loader_findings(inst: Installation, families: list[TableFamily]) -> tuple[list[Finding], str]:
    release, changed = loader_changes(inst)
    out = []
    if changed:
        out.append(Finding("warning", "loader_changed",
                           f"{inst.label}'s {', '.join(k.rsplit(':', 1)[1] for k in changed)} differ from {inst.engine} "
                           f"{release}'s, whose rules this audit applies: resolution may differ", inst.origin))
    elif inst.files is not None and not any(loader_source_readable(inst, f) for f in families):
        out.append(Finding("info", "loader_changed", f"the loader source is not in {inst.origin}: its functions "
                                                     f"could not be compared with {inst.engine} {release}'s",
                           inst.origin))
    return out, release


def _folds_h200(engine: str) -> bool:
    """Whether one of the engine's loaders folds every H200 variant onto one device name."""
    return any(f.fold_h200 for (e, _), f in TABLE_FAMILIES.items() if e == engine)


def _siblings(family: TableFamily, resolved: Resolved, cuda_name: str, package, override,
              triton_version: str) -> list[str]:
    """Files in the folders the loader searches that are named like the lookup but for
    another variant of the same GPU (NVIDIA_H200 while it looks up NVIDIA_H200_NVL)."""
    dev = family.device_file_name(cuda_name)
    head, _, tail = resolved.name.partition(f"device_name={dev}")
    pattern = re.compile(rf"^{re.escape(head)}device_name=(?P<device>[^,]+?){re.escape(tail)}$")
    folders: list[tuple[TableFiles, str]] = []
    if family.per_triton:
        files, configs = (override, "configs") if override is not None else (package, family.folder)
        if files is not None:
            for d in files.listdir(configs) or []:
                if d.startswith("triton_"):
                    folders.append((files, f"{configs}/{d}"))
    else:
        if override is not None and family.env_var and not family.env_replaces_root:
            folders.append((override, ""))
        if package is not None:
            folders.append((package, family.folder))
    out = []
    for files, folder in folders:
        for name in files.listdir(folder) or []:
            m = pattern.match(name) if name.startswith(head) else None
            if m and m.group("device") != dev and gpu_family(m.group("device")) == gpu_family(dev):
                sub = folder[len(family.folder) + 1:] if folder.startswith(family.folder + "/") else ""
                out.append(f"{sub}/{name}" if sub else name)
    return out


def _needed_keys(family: TableFamily, params: dict, table: dict, where: str) -> list[Finding]:
    """Rows without a key the precision's launch passes to its kernel from the row as it is
    (vLLM's group-wise MoE: SPLIT_K)."""
    rule = precision_rule(family.precisions, params) if family.kind == "fused_moe" else None
    if rule is None or not rule.row_needs:
        return []
    lacking = sorted(M for M, e in table.items() if isinstance(e, dict) and any(k not in e for k in rule.row_needs))
    if not lacking:
        return []
    return [Finding("error", "bad_row", f"entries lack {', '.join(rule.row_needs)}: {rule.kernel}'s launch passes the "
                                        "row as the kernel's arguments and raises TypeError without it", where,
                    lacking)]


def _unfused(family: TableFamily, problem, cuda_name: str, inst: Installation, override) -> str | None:
    """For a fused-MoE table with the shared expert folded in (E = routed + 1) that the loader
    does not find: the file it would read for the routed experts alone, if there is one."""
    params = problem.params
    if not params.get("shared_experts"):
        return None
    alone = {k: v for k, v in params.items() if k != "shared_experts"} | {"E": params["E"] - params["shared_experts"]}
    name, up_name = table_names(family, Problem(problem.kernel, alone), cuda_name)
    res = resolve_table(family, name, inst.files, override, inst.triton, down_of=up_name)
    if not res.found or not res.rel:
        return None
    return res.rel[len(family.folder) + 1:] if res.rel.startswith(family.folder + "/") else res.rel


def deployment_problems(model, tp: int, ep: int, dtype: str, engine: str, fuse_shared: bool = True) -> list:
    """The kernel problems one GPU runs that read an engine table: the fused MoE (vLLM's
    layer, SGLang's up and down) and, for block-FP8 checkpoints, every GEMM shape."""
    from tuner.plan.models import gemm_problems, moe_problems
    problems = []
    if model.is_moe:
        problems += moe_problems(model, tp, ep, dtype, engines=[engine], fuse_shared=fuse_shared)
    if dtype == "fp8_w8a8" and model.weight_block_size:
        problems += [p for p in gemm_problems(model, tp, ep) if engine in p.engines]
    if not problems:
        raise TunerError(f"{model.name} runs no kernel that reads a {engine} table at --dtype {dtype} (no experts, "
                         "and no block-FP8 linear layers)")
    return problems


def audit_deployment(inst: Installation, model, gpu, tp: int, ep: int, dtype: str, batches: Batches,
                     override_dir: Path | None, env: dict, fuse_shared: bool = True,
                     detail: bool = True) -> AuditReport:
    """Resolve and check every table the deployment reads (see the module docstring);
    `fuse_shared=False`: as SGLang runs with --disable-shared-experts-fusion.
    detail=False: which file is read and the findings about that (no table, fallbacks, keys,
    K, backend), without the loader's functions compared, each row's checks and per-M rows
    (`tuner coverage`, hundreds of deployments, compares the loader once per installation)."""
    engine = inst.engine
    override = FolderFiles(override_dir) if override_dir is not None else None
    problems = deployment_problems(model, tp, ep, dtype, engine, fuse_shared)
    families = [table_family(engine, kind) for kind in ("fused_moe", "fp8_gemm")]
    report = AuditReport("deployment", {
        "engine": engine, "version": inst.version, "source": inst.origin, "triton": inst.triton,
        "triton_from": inst.triton_origin, "model": model.name, "gpu": gpu.cuda_name, "tp": tp, "ep": ep,
        "dtype": dtype, "batch_sizes": batches.label(), "notes": list(inst.notes)})
    loader, release = _loader_findings(inst, families) if detail else ([], loader_release(engine, inst.version))
    report.header["rules_of"] = f"{engine} {release}"
    report.findings += loader
    unknown = sorted({p.kernel for p in problems if not release_reads(engine, release, p.kernel)})
    if unknown:
        report.header["notes"].append(f"{', '.join(unknown)} tables not audited: the loader rules of {engine} {release} "
                                      "know no loader for them (configs/engines/)")
        problems = [p for p in problems if p.kernel not in unknown]
    if override_dir is not None:
        fam = table_family(engine, "fused_moe")
        report.header["override"] = f"{fam.env_var}={override_dir}"
        if not Path(override_dir).is_dir():
            report.header["notes"].append(f"the override folder {override_dir} does not exist")
    ups: dict[str, KernelAudit] = {}
    for problem in problems:
        ka = _audit_problem(inst, problem, gpu, dtype, batches, override, env, ep, ups, detail)
        report.kernels.append(ka)
        report.findings += ka.findings
    if override_dir is not None and Path(override_dir).is_dir():
        from tuner.emit.audit_override import override_unused
        report.findings += override_unused(engine, Path(override_dir), report.kernels, inst.files is not None)
    return report


def _audit_problem(inst: Installation, problem, gpu, dtype: str, batches: Batches, override, env: dict, ep: int,
                   ups: dict, detail: bool = True) -> KernelAudit:
    kind = problem.kernel
    family = table_family(inst.engine, kind)
    params = problem.params
    block = params.get("block_shape")
    part = params.get("part", "gemm") if kind == "fused_moe" else "gemm"
    name, up_name = table_names(family, problem, gpu.cuda_name)
    K = params["N"] if part == "down" else params["K"]
    override_here = override if family.env_var else None
    resolved = resolve_table(family, name, inst.files, override_here, inst.triton, down_of=up_name)
    ka = KernelAudit(kind, part, problem, family, resolved)
    ka.reads, ka.reads_why = backend_reads_table(inst.engine, kind, ep, env, params)
    if not ka.reads:
        ka.findings.append(Finding("warning", "not_read", ka.reads_why, ka.where))
    where = ka.where
    if resolved.crash:
        ka.findings.append(Finding("error", "crashes_loader", resolved.crash, where))
    up = ups.get(up_name) if up_name else None
    if not resolved.found:
        if not resolved.crash:
            places = {0: "nothing to look in: no package", 1: "looked in its package", 2: "looked in the override "
                      "folder and its package"}.get(len(resolved.tried), "looked in every triton_* folder")
            if family.per_triton and resolved.tried:
                places = "looked in every triton_* folder"
            ka.findings.append(Finding("warning", "no_table", f"{inst.label} finds no such file ({places}): its default "
                                       "config runs at every M", name))
        unfused = _unfused(family, problem, gpu.cuda_name, inst, override_here)
        if unfused:
            ka.findings.append(Finding("warning", "unfused_table", f"{unfused} is for the {params['E'] - 1} routed "
                                       f"experts alone: {inst.engine} reads it only with --disable-shared-experts-"
                                       f"fusion (it folds the shared expert in as expert {params['E'] - 1})", name))
        for sib in _siblings(family, resolved, gpu.cuda_name, inst.files, override_here, inst.triton) if detail else []:
            ka.findings.append(Finding("warning", "device_name",
                                       f"{sib} is for another variant of this GPU: {inst.engine} looks up "
                                       f"device_name={family.device_file_name(gpu.cuda_name)} on {gpu.cuda_name}"
                                       + (" (it folds H200 variants for MoE tables only)" if _folds_h200(inst.engine)
                                          else ""), name))
        ka.rows = [{"first": batches.lo, "last": batches.top, "key": None, "entry": None,
                    "runs_as": "the engine's default config", "changes": []}]
        if part == "up":
            ups[name] = ka
        return ka
    ka.findings += _k_findings(inst.engine, resolved, params["K"], where)
    if resolved.how == "Triton fallback":
        ka.findings.append(Finding("warning", "triton_fallback",
                                   f"no {family.triton_folder(inst.triton)}/ copy for Triton {inst.triton}: SGLang runs "
                                   f"the one tuned under {resolved.triton_folder}", where))
    if resolved.how == "the up table":
        ka.findings.append(Finding("info", "down_reuses_up", "no _down table: SGLang runs the down GEMM with the up "
                                                             "table's configs (its USE_TMA included)", where))
    raw, table, crash = read_table(resolved.files, resolved.rel or "", family)
    if table is None:
        ka.findings.append(Finding("error", "crashes_loader", crash or "unreadable", where))
        return ka
    ka.table = table
    if not table:        # "{}": the loader hands the launch no row (`if configs:` fails): its default, or for a
        # _down table the up table's config, as where there is no _down table
        runs = "the up table's configs run the down GEMM" if part == "down" else "its default config runs"
        ka.findings.append(Finding("warning", "no_table", f"{inst.label} reads no row from this empty table: {runs} "
                                   "at every M", where))
        ka.rows = [{"first": batches.lo, "last": batches.top, "key": None, "entry": None,
                    "runs_as": "the up table's configs" if part == "down" else "the engine's default config",
                    "changes": []}]
        if part == "up":
            ups[name] = ka
        return ka
    if isinstance(obj := json.loads(raw), dict) and "triton_version" in obj and "triton_version" in family.dropped_keys:
        tuned = str(obj["triton_version"])
        same = tuned.split("+")[0] == inst.triton.split("+")[0]
        ka.findings.append(Finding("info" if same else "warning", "ignored_key",
                                   f"triton_version {tuned}: {inst.engine} drops the key and runs the table under "
                                   f"Triton {inst.triton} all the same", where))
    device = family.device_file_name(gpu.cuda_name)
    if resolved.how != "the up table":
        ka.findings += row_findings(family, table, where, block, K, device) if detail else []
        ka.findings += key_findings(list(table), where, batches)
        ka.findings += _needed_keys(family, params, table, where)
    up_table = (up.table or None) if (up is not None and part == "down" and resolved.how != "the up table") else None
    if up_table is not None and up is not None and detail:
        ka.findings += pair_findings(up_table, table, where, batches, family)
    if detail:
        _fill_rows(ka, table, batches, block, up_table)
    if part == "up":
        ups[name] = ka
    return ka


def _k_findings(engine: str, resolved: Resolved, layer_K: int, where: str) -> list[Finding]:
    """An error when the file read is one of ours (a results folder's, or installed by tuner)
    tuned for another K than this layer's (tuner/emit/table_origin.py: the name has no K)."""
    if not isinstance(resolved.files, FolderFiles) or resolved.rel is None:
        return []
    from tuner.emit.table_origin import backup_root, k_mismatch, ours
    mine = ours(Path(resolved.files.display(resolved.rel)), engine, backup_root())
    why = k_mismatch(mine.K, layer_K, mine.model) if mine is not None else None
    return [Finding("error", "k_mismatch", f"a table of ours {why}", where)] if why else []


def _fill_rows(ka: KernelAudit, table: dict, batches: Batches, block, up_table: dict | None) -> None:
    keys = list(table)
    segs = (_combined(batches, list(up_table), keys) if up_table is not None
            else [((None, k), a, b) for k, a, b in batches.runs(keys)])
    for (uk, k), a, b in segs:
        entry = table[k]
        if not isinstance(entry, dict):
            ka.rows.append({"first": a, "last": b, "key": k, "entry": entry, "runs_as": None, "changes": []})
            continue
        up_entry = up_table[uk] if up_table is not None and isinstance(up_table.get(uk), dict) else None
        runs_as, changes = ka.family.effective(entry, block, up_entry)
        loaded, _ = ka.family.loaded_config(entry, block, up_entry)
        ka.rows.append({"first": a, "last": b, "key": k, "up_key": uk, "entry": entry, "loaded": loaded,
                        "runs_as": runs_as, "changes": changes})


# -- under a traffic profile (--traffic FILE) -------------------------------------------------------
# A key that serves at least this share of the forward passes, some of them more than
# FAR_KEY_FACTOR from it, is a finding: that much traffic runs a config tuned for another M.
TRAFFIC_SHARE = 0.01


def traffic_audit(report: AuditReport, profile: Any) -> None:
    """Weigh every table the audit read by a traffic profile (tuner/plan/traffic.py): per key,
    the M it serves by the nearest-key rule and its share of the passes (into the report), and
    a warning for the keys that serve much traffic far from their own M."""
    import dataclasses

    from tuner.plan.traffic import key_coverage
    report.header.setdefault("notes", []).append(profile.describe()[0])
    for ka in report.kernels:
        if not ka.table:
            continue
        coverage = key_coverage(sorted(int(k) for k in ka.table), profile)
        ka.traffic = [dataclasses.asdict(c) for c in coverage]
        far = [c for c in coverage if c.share >= TRAFFIC_SHARE and c.ratio > FAR_KEY_FACTOR]
        if far:
            finding = Finding("warning", "traffic_far", "under this traffic " + "; ".join(c.text() for c in far),
                              ka.where, [c.key for c in far])
            ka.findings.append(finding)
            report.findings.append(finding)
