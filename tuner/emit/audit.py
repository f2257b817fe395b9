"""`tuner audit`: which table and which row an engine will really use, and whether it is right.

For a deployment (model, TP/EP, GPU, dtype, engine version, Triton, override folders) every
kernel the model runs is resolved to the file that engine version's loader reads (the rules
in tuner/plan/engines.py, mirrored from the loaders and checked against them), then every batch
size M to the entry the nearest-key rule picks and to what the kernel really gets after the
engine's rewrites. `--all` looks at every table an installation or wheel ships instead.
Findings carry a severity (error: wrong results or a crash; warning: slower or not what the
table says; info) and a one-line reason; `--numerics` runs the rows in use on the engine's
own kernel against the float64 reference (tuner/commands/check.py). Rendering: tuner/emit/audit_report.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.emit.engine_tables import (
    FolderFiles,
    Installation,
    TableFiles,
    WheelFiles,
    loader_changes,
    loader_source_readable,
)
from tuner.errors import TunerError
from tuner.plan.engines import (
    DEFAULT_BATCH_SIZES,
    TABLE_FAMILIES,
    TRITON_CUDA_OPTIONS,
    TableFamily,
    backend_reads_table,
    load_table,
    table_family,
)
from tuner.plan.problems import Problem
from tuner.plan.table_lookup import (
    FAR_KEY_FACTOR,
    TRUNCATED_BELOW,
    Resolved,
    far_ranges,
    gpu_family,
    nearest_key,
    resolve_table,
    snap_ranges,
    truncated_slice,
)

SEVERITIES = ("error", "warning", "info")
# Finding kinds, in the order reports list them, with their heading.
KINDS = {
    "crashes_loader": "tables or folders the loader raises on (the engine does not start)",
    "bad_row": "rows the launch fails on",
    "numerics": "rows that compute wrong results (--numerics)",
    "block_k_above_block": "rows with BLOCK_SIZE_K above the weight block",
    "no_table": "no table: the engine's default config runs",
    "triton_fallback": "tables of another Triton version (SGLang's fallback)",
    "truncated": "truncated tables (a contiguous slice of the engines' grid)",
    "far_keys": f"batch sizes whose nearest key is more than {FAR_KEY_FACTOR}x away",
    "traffic_far": f"keys that serve a share of the traffic more than {FAR_KEY_FACTOR}x from their M",
    "down_block_m": "down BLOCK_SIZE_M the engine replaces with the up table's",
    "down_copy": "_down tables that are copies of the up table",
    "down_reuses_up": "no _down table: the up table's configs run the down GEMM",
    "unloadable": "files no loader asks for",
    "device_name": "device-name mismatches",
    "ignored_key": "keys the engine ignores or overrides",
    "not_read": "tables the engine's backend choice does not read",
    "loader_changed": "loader functions other than those the rules were read from",
    "other_loader": "tables of other kernels' loaders in the same folder (not audited)",
}
REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")


@dataclass
class Finding:
    severity: str
    kind: str
    reason: str                       # one line
    table: str = ""                   # the file (display path) or the name looked up
    rows: list[int] = field(default_factory=list)     # the table keys concerned (row findings)

    @property
    def count(self) -> int:
        return len(self.rows) or 1

    def as_dict(self) -> dict:
        return {"severity": self.severity, "kind": self.kind, "reason": self.reason, "table": self.table,
                "rows": self.rows}


@dataclass(frozen=True)
class Batches:
    """The batch sizes audited: 1..hi, or an explicit list."""
    hi: int
    explicit: tuple[int, ...] | None = None

    @property
    def lo(self) -> int:
        return self.explicit[0] if self.explicit else 1

    @property
    def top(self) -> int:
        return self.explicit[-1] if self.explicit else self.hi

    def label(self) -> str:
        return ", ".join(map(str, self.explicit)) if self.explicit else f"1-{self.hi}"

    def runs(self, keys: list[int]) -> list[tuple[int, int, int]]:
        """[(key, first M, last M)]: the key the nearest-key rule takes, as runs of M."""
        if self.explicit is None:
            return snap_ranges(keys, 1, self.hi)
        return _group([(M, nearest_key(keys, M)) for M in self.explicit])

    def far(self, keys: list[int]) -> list[tuple[int, int, int, float]]:
        if self.explicit is None:
            return far_ranges(snap_ranges(keys, 1, self.hi))
        far = [(M, k) for M in self.explicit for k in [nearest_key(keys, M)]
               if k < 1 or k > FAR_KEY_FACTOR * M or M > FAR_KEY_FACTOR * k]
        return [(k, a, b, max(k / a, b / k, a / k, k / b) if k >= 1 else math.inf) for k, a, b in _group(far)]


def _group(pairs: list) -> list:
    """[(value, first, last)] of consecutive (M, value) pairs with the same value."""
    out: list = []
    for M, v in pairs:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1], M)
        else:
            out.append((v, M, M))
    return out


def m_range(first: int, last: int) -> str:
    return f"M={first}" if first == last else f"M={first}-{last}"


def _cfg_text(cfg: dict) -> str:
    short = {"BLOCK_SIZE_M": "BM", "BLOCK_SIZE_N": "BN", "BLOCK_SIZE_K": "BK", "GROUP_SIZE_M": "G", "num_warps": "w",
             "num_stages": "s"}
    return " ".join(f"{short.get(k, k)}{'=' if k not in short else ''}{json.dumps(v) if isinstance(v, bool) else v}"
                    for k, v in cfg.items()) if isinstance(cfg, dict) else repr(cfg)


# -- checks on one table, wherever it is ------------------------------------------------------
def _cuda_options() -> set[str]:
    names = set(TRITON_CUDA_OPTIONS)
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        names |= set(CUDAOptions.__dataclass_fields__)
    except Exception:  # noqa: BLE001 - an older or CPU-only Triton: the fixed list
        pass
    return names


def row_findings(family: TableFamily, table: dict, where: str, block_shape, K: int | None,
                 device: str | None) -> list[Finding]:
    """Rows the launch fails on, rows whose BLOCK_SIZE_K steps over weight blocks, and keys
    the engine ignores or overrides. `K`: the GEMM's inner size when known (None: the up
    GEMM of a MoE table, whose K is the model's hidden size); `device`: the table's device
    name (keys Triton's CUDA launcher refuses are errors on NVIDIA devices only)."""
    out: list[Finding] = []
    missing: list[int] = []
    not_pow2: list[int] = []
    wide: list[int] = []
    refused: dict[str, list[int]] = {}
    forced: dict[str, list[int]] = {}
    nvidia = bool(device) and str(device).startswith("NVIDIA")
    options = _cuda_options() if nvidia else set()
    for M, entry in table.items():
        if not isinstance(entry, dict):
            missing.append(M)
            continue
        if any(k not in entry for k in REQUIRED_KEYS):
            missing.append(M)
            continue
        for key in entry:
            if nvidia and key not in family.accepted_keys and key not in options:
                refused.setdefault(key, []).append(M)
        if any(k.startswith("BLOCK_SIZE_") and isinstance(v, int) and (v < 1 or v & (v - 1))
               for k, v in entry.items()):
            not_pow2.append(M)
        bk = entry.get("BLOCK_SIZE_K")
        if block_shape and isinstance(bk, int) and bk > block_shape[1]:
            wide.append(M)
        for key, value in family.forced:
            if key in entry and entry[key] != value:
                forced.setdefault(key, []).append(M)
    if missing:
        out.append(Finding("error", "bad_row", f"entries lack one of {', '.join(REQUIRED_KEYS)} (or are not "
                                               "objects): the launch raises KeyError", where, sorted(missing)))
    for key, ms in refused.items():
        out.append(Finding("error", "bad_row", f"key {key!r} is neither a kernel argument nor a Triton CUDA launch "
                                               "option: Triton's launcher raises KeyError on an NVIDIA GPU",
                           where, sorted(ms)))
    if not_pow2:
        out.append(Finding("error", "bad_row", "a BLOCK_SIZE_* that is not a power of two: Triton refuses it",
                           where, sorted(not_pow2)))
    if wide:
        bk = max(table[M]["BLOCK_SIZE_K"] for M in wide)
        if family.clamp_block_k:
            out.append(Finding("warning", "block_k_above_block",
                               f"BLOCK_SIZE_K {bk} over {block_shape[1]}-wide weight blocks: {family.engine} clamps it "
                               f"and runs {min(block_shape)}, not what the table says", where, sorted(wide)))
        elif family.block_k_runs_wrong(block_shape, K):
            out.append(Finding("error", "block_k_above_block",
                               f"BLOCK_SIZE_K {bk} over {block_shape[1]}-wide weight blocks: {family.engine} has no "
                               "clamp and its kernel reads one scale per K step, so two scale groups share one "
                               "(wrong results)", where, sorted(wide)))
    for key, ms in forced.items():
        value = dict(family.forced)[key]
        out.append(Finding("warning", "ignored_key", f"{key} other than {value}: {family.engine} launches {key}={value}",
                           where, sorted(ms)))
    return out


def key_findings(keys: list[int], where: str, batches: Batches) -> list[Finding]:
    """Truncated key sets and the batch sizes whose nearest key is far."""
    out = []
    if truncated_slice(keys):
        ks = sorted(keys)
        out.append(Finding("warning", "truncated",
                           f"{len(ks)} of the engines' {len(DEFAULT_BATCH_SIZES)} batch sizes ({ks[0]}..{ks[-1]}), a "
                           f"contiguous slice under {TRUNCATED_BELOW} keys (tuned at a few batch sizes only, or "
                           "the part of a multi-GPU tuning run that overwrote the rest)", where))
    far = batches.far(keys)
    if far:
        parts = [f"{m_range(a, b)} run the entry for {k} " + ("(a key that is no batch size)" if math.isinf(ratio)
                                                            else f"(up to {ratio:.0f}x away)") for k, a, b, ratio in far]
        out.append(Finding("warning", "far_keys", "; ".join(parts), where, sorted({k for k, *_ in far})))
    return out


def pair_findings(up: dict, down: dict, where: str, batches: Batches, family: TableFamily) -> list[Finding]:
    """A `_down` table against its up table: a copy, and the batch sizes where the engine
    replaces the down BLOCK_SIZE_M (and the other tied keys) with the up table's."""
    out = []
    if up == down:
        out.append(Finding("warning", "down_copy", "the _down table is a copy of the up table: the down GEMM was not "
                                                   "tuned (without the file SGLang reuses the up table anyway)", where))
        return out
    ukeys, dkeys = list(up), list(down)
    bad = []
    for (uk, dk), a, b in _combined(batches, ukeys, dkeys):
        u, d = up.get(uk), down.get(dk)
        if isinstance(u, dict) and isinstance(d, dict) and any(
                key in u and key in d and u[key] != d[key] for key in family.tied_down_keys):
            bad.append((a, b, dk, uk))
    if bad:
        parts = [f"{m_range(a, b)} (down {dk}, up {uk})" for a, b, dk, uk in bad[:4]] + (["..."] if len(bad) > 4 else [])
        out.append(Finding("warning", "down_block_m",
                           f"{'/'.join(family.tied_down_keys)} differs from the up table's at {', '.join(parts)}: "
                           "SGLang runs the up table's", where, sorted({dk for _, _, dk, _ in bad})))
    return out


def _combined(batches: Batches, ukeys: list[int], dkeys: list[int]) -> list:
    """[((up key, down key), first M, last M)] over the audited batch sizes."""
    if batches.explicit is not None:
        return _group([(M, (nearest_key(ukeys, M), nearest_key(dkeys, M))) for M in batches.explicit])
    cuts = sorted({a for _, a, _ in batches.runs(ukeys)} | {a for _, a, _ in batches.runs(dkeys)})
    ends = cuts[1:] + [batches.hi + 1]
    return _group_segments([((nearest_key(ukeys, a), nearest_key(dkeys, a)), a, e - 1) for a, e in zip(cuts, ends)])


def _group_segments(segs: list) -> list:
    out: list = []
    for v, a, b in segs:
        if out and out[-1][0] == v and out[-1][2] + 1 == a:
            out[-1] = (v, out[-1][1], b)
        else:
            out.append((v, a, b))
    return out


def named_table_findings(family: TableFamily, name: str, table: dict, where: str, batches: Batches) -> list[Finding]:
    """Row and key findings of one loadable table, its weight blocks, K and device read from
    its file name (as --all does for every table, and tuner install for what it writes)."""
    m = family.name_pattern().match(name)
    g = m.groupdict() if m else {}
    block = [int(g["bn"]), int(g["bk"])] if g.get("bn") else None
    K = int(g["K"]) if g.get("K") else (int(g["N"]) if g.get("down") else None)
    return row_findings(family, table, where, block, K, g.get("device")) + key_findings(list(table), where, batches)


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
            m = pattern.match(name)
            if m and m.group("device") != dev and gpu_family(m.group("device")) == gpu_family(dev):
                sub = folder[len(family.folder) + 1:] if folder.startswith(family.folder + "/") else ""
                out.append(f"{sub}/{name}" if sub else name)
    return out


def deployment_problems(model, tp: int, ep: int, dtype: str, engine: str) -> list:
    """The kernel problems one GPU runs that read an engine table: the fused MoE (vLLM's
    layer, SGLang's up and down) and, for block-FP8 checkpoints, every GEMM shape."""
    from tuner.plan.models import gemm_problems, moe_problems
    problems = []
    if model.is_moe:
        problems += moe_problems(model, tp, ep, dtype, engines=[engine])
    if dtype == "fp8_w8a8" and model.weight_block_size:
        problems += [p for p in gemm_problems(model, tp, ep) if engine in p.engines]
    if not problems:
        raise TunerError(f"{model.name} runs no kernel that reads a {engine} table at --dtype {dtype} (no experts, "
                         "and no block-FP8 linear layers)")
    return problems


def audit_deployment(inst: Installation, model, gpu, tp: int, ep: int, dtype: str, batches: Batches,
                     override_dir: Path | None, env: dict) -> AuditReport:
    """Resolve and check every table the deployment reads (see the module docstring)."""
    engine = inst.engine
    override = FolderFiles(override_dir) if override_dir is not None else None
    problems = deployment_problems(model, tp, ep, dtype, engine)
    families = [table_family(engine, kind) for kind in ("fused_moe", "fp8_gemm")]
    report = AuditReport("deployment", {
        "engine": engine, "version": inst.version, "source": inst.origin, "triton": inst.triton,
        "triton_from": inst.triton_origin, "model": model.name, "gpu": gpu.cuda_name, "tp": tp, "ep": ep,
        "dtype": dtype, "batch_sizes": batches.label(), "notes": list(inst.notes)})
    loader, release = _loader_findings(inst, families)
    report.header["rules_of"] = f"{engine} {release}"
    report.findings += loader
    if override_dir is not None:
        fam = table_family(engine, "fused_moe")
        report.header["override"] = f"{fam.env_var}={override_dir}"
        if not Path(override_dir).is_dir():
            report.header["notes"].append(f"the override folder {override_dir} does not exist")
    ups: dict[str, KernelAudit] = {}
    for problem in problems:
        ka = _audit_problem(inst, problem, gpu, dtype, batches, override, env, ep, ups)
        report.kernels.append(ka)
        report.findings += ka.findings
    return report


def _audit_problem(inst: Installation, problem, gpu, dtype: str, batches: Batches, override, env: dict, ep: int,
                   ups: dict) -> KernelAudit:
    kind = problem.kernel
    family = table_family(inst.engine, kind)
    params = problem.params
    block = params.get("block_shape")
    part = params.get("part", "gemm") if kind == "fused_moe" else "gemm"
    if kind == "fused_moe":
        ask = dict(E=params["E"], N=params["N"], dtype=None if params["dtype"] in ("bf16", "fp16") else params["dtype"],
                   block_shape=block)
        name = family.lookup_name(gpu.cuda_name, **ask, down=part == "down")
        up_name = family.lookup_name(gpu.cuda_name, **ask) if part == "down" else None
        K = params["N"] if part == "down" else params["K"]
    else:
        name = family.lookup_name(gpu.cuda_name, N=params["N"], K=params["K"], block_shape=block)
        up_name, K = None, params["K"]
    override_here = override if family.env_var else None
    resolved = resolve_table(family, name, inst.files, override_here, inst.triton, down_of=up_name)
    ka = KernelAudit(kind, part, problem, family, resolved)
    ka.reads, ka.reads_why = backend_reads_table(inst.engine, kind, ep, env)
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
        for sib in _siblings(family, resolved, gpu.cuda_name, inst.files, override_here, inst.triton):
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
    if isinstance(obj := json.loads(raw), dict) and "triton_version" in obj and "triton_version" in family.dropped_keys:
        tuned = str(obj["triton_version"])
        same = tuned.split("+")[0] == inst.triton.split("+")[0]
        ka.findings.append(Finding("info" if same else "warning", "ignored_key",
                                   f"triton_version {tuned}: {inst.engine} drops the key and runs the table under "
                                   f"Triton {inst.triton} all the same", where))
    device = family.device_file_name(gpu.cuda_name)
    if resolved.how != "the up table":
        ka.findings += row_findings(family, table, where, block, K, device)
        ka.findings += key_findings(list(table), where, batches)
    up_table = up.table if (up is not None and part == "down" and resolved.how != "the up table") else None
    if up_table is not None and up is not None:
        ka.findings += pair_findings(up_table, table, where, batches, family)
    _fill_rows(ka, table, batches, block, up_table)
    if part == "up":
        ups[name] = ka
    return ka


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


# -- --numerics: the rows in use on the engine's own kernel -------------------------------------------
def run_numerics(report: AuditReport, inst: Installation, numerics_model, seed: int, log=print) -> None:
    """Every distinct row in use (as the loader hands it over) on the engine's own kernel
    against the float64 reference, through tuner check's machinery. Without a GPU, in
    Triton's interpreter on `numerics_model`'s shapes (a small model); on a GPU, at the
    deployment's real shapes. Without a GPU, TRITON_INTERPRET=1 must be set before anything
    imports Triton's jit (the command line does)."""
    import os

    import torch

    from tuner.measure.device import device_name
    from tuner.measure.isolation import isolated_gpu_measurer
    from tuner.plan.gpus import resolve_gpu
    from tuner.plan.kernel_api import config_from_entry
    from tuner.plan.kernel_registry import kernel_for
    from tuner.plan.models import gemm_problems, moe_problems

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = "cuda" if on_gpu else "cpu"
    spec = resolve_gpu(None, device)
    origin = _code_origin(inst)
    report.header["numerics"] = (f"compiled on {device_name(device, spec)} at the deployment's shapes" if on_gpu
                                 else f"Triton's interpreter on the CPU device, on {numerics_model.name}'s shapes "
                                      "(no GPU here)")
    # Each kernel's rows run in an isolated measuring child (tuner/measure/isolation.py), as `tuner
    # check` runs them: a row that crashes it or poisons its CUDA context fails alone.
    measurers: dict[str, Any] = {}
    try:
        for i, ka in enumerate(report.kernels):
            if ka.table is None or not ka.rows:
                continue
            if ka.kind not in measurers:
                kernel = kernel_for(ka.kind, inst.engine, inst.engine, [origin])
                measurers[ka.kind] = isolated_gpu_measurer(kernel, spec.key, compile_workers=0, device=device)
            measurer = measurers[ka.kind]
            kernel = measurer.kernel
            problem = ka.problem if on_gpu else _small_problem(ka, numerics_model, moe_problems, gemm_problems)
            done: dict[tuple, dict] = {}
            for row in ka.rows:
                if row.get("loaded") is None:
                    continue
                config = config_from_entry(kernel, row["loaded"])
                ident = (row["key"], tuple(sorted(config.items())))
                if ident in done:
                    continue
                M = row["key"] if row["first"] <= row["key"] <= row["last"] else row["first"]
                case_seed = seed + len(done) + 100 * i
                check = measurer.check_numerics(problem, M, config, case_seed)
                status = "pass" if check.status == "passed" else "fail"
                entry = {"key": row["key"], "M": M, "status": status, "rel_error": check.rel_error,
                         "detail": check.detail or f"seed {case_seed}", "config": config, "problem": problem.key,
                         "kernel": kernel.source_label}
                done[ident] = entry
                ka.numerics.append(entry)
                rel = f"{check.rel_error:.2e}" if check.rel_error is not None else "-"
                log(f"numerics {status.upper():4s} rel {rel:>8s}  {ka.kind} {ka.part} key {row['key']} at M={M} "
                    f"on {problem.key}")
                if status != "pass":
                    what = f"rel. error {check.rel_error:.2e}" if check.rel_error is not None else "no result"
                    f = Finding("error", "numerics", f"key {row['key']} at M={M}: {what} ({entry['detail']}) on "
                                f"{kernel.source_label}'s kernel, {problem.key}", ka.where, [row["key"]])
                    ka.findings.append(f)
                    report.findings.append(f)
    finally:
        for m in measurers.values():
            m.close()


def _code_origin(inst: Installation) -> str:
    files = inst.files
    if files is None:
        raise TunerError(f"--numerics needs {inst.engine}'s kernel code: give --site-packages or --engine-source")
    if isinstance(files, WheelFiles):
        return str(files.wheel)
    assert isinstance(files, FolderFiles)
    return str(files.root / inst.engine)


def _small_problem(ka: KernelAudit, model, moe_problems, gemm_problems):
    """The small model's problem standing in for this table's: the same part of its MoE, or
    its GEMM shape with the largest K (so that K spans several weight blocks)."""
    params = ka.problem.params
    if ka.kind == "fused_moe":
        dtype = params["dtype"]
        candidates = [p for p in moe_problems(model, 1, 1, dtype, engines=[ka.family.engine])
                      if p.params.get("part") == params.get("part")]
    else:
        candidates = sorted(gemm_problems(model, 1, 1), key=lambda p: -p.params["K"])
    if not candidates:
        raise TunerError(f"--numerics-model {model.name} has no {ka.kind} problem to run {ka.title}'s rows on")
    return candidates[0]


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

