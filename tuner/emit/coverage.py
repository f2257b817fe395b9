"""`tuner coverage`: for the deployments people run, which table every engine version reads for
every layer, and what that is: a table shipped for this GPU, a fallback (another Triton
version's folder, another GPU's table, the up table for SGLang's `_down`, keys far from the
batch sizes served), one of ours (tuned/, or installed by tuner), or none (the engine's default
config). Each row is what `tuner audit` says of that deployment (tuner/emit/audit.py resolves
it, the same code), with the command that tunes the table and, where a committed GPU run
measured it, the gains (tuner/emit/coverage_sources.py). Rendering: coverage_report.py.

The deployments: tuner/plan/deployment.py served_deployments (the TP of one node, TP16 over
two nodes, EP with data-parallel attention), at the precisions the checkpoint is served at
(tuner/plan/precision.py served_dtypes); a precision no kernel takes yet is said, not mapped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tuner.emit.audit import KernelAudit, audit_deployment
from tuner.emit.audit_rules import Batches
from tuner.emit.coverage_sources import Gain
from tuner.emit.engine_tables import FolderFiles, Installation
from tuner.errors import TunerError
from tuner.paths import REPO_ROOT
from tuner.plan.deployment import Served, fit_hint
from tuner.plan.models import Model
from tuner.plan.precision import checkpoint_dtype

STATUSES = ("default", "fallback", "shipped", "tuned")          # what the engine runs, least tuned first
FAR_KINDS = ("far_keys", "truncated")                          # a table whose keys leave batch sizes far


@dataclass
class Row:
    """One table one engine version reads for one layer of one deployment."""
    model: str
    model_arg: str                 # what names the model on a command line (a name, or the path given)
    gpu: str
    served: Served
    dtype: str
    engine: str
    engine_version: str
    triton: str
    kernel: str                    # "fused_moe" or "fp8_gemm"
    part: str                      # "op" (vLLM's MoE layer), "up", "down" (SGLang), "gemm"
    problem: dict
    problem_key: str
    layers: tuple[str, ...]
    K: int                         # the K the layer multiplies by (for a MoE table, the hidden size)
    file: str                      # the file name the engine's loader asks for
    read: str | None               # what it reads (None: nothing, the default config runs)
    status: str
    why: str
    short: str                     # `why` in a few words, for the table
    read_by_default: bool
    reads_why: str
    audit: str                     # the `tuner audit` command that shows this row
    command: str = ""              # the tuner command that tunes the table
    ours: str = ""                 # a table of ours for it that is not what the engine reads, and why not
    k_shared_with: list[str] = field(default_factory=list)
    gain: Gain | None = None

    @property
    def k_shared(self) -> bool:
        return bool(self.k_shared_with)

    def as_dict(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "tp": self.served.tp, "ep": self.served.ep,
                "dp_attention": self.served.dp_attention, "deployment": self.served.label, "dtype": self.dtype,
                "engine": self.engine, "engine_version": self.engine_version, "triton": self.triton,
                "kernel": self.kernel, "part": self.part, "problem": self.problem, "layers": list(self.layers),
                "K": self.K, "file": self.file, "read": self.read, "status": self.status, "why": self.why,
                "read_by_default": self.read_by_default, "k_shared": self.k_shared,
                "k_shared_with": self.k_shared_with, "ours": self.ours or None, "command": self.command,
                "audit": self.audit,
                "gain_vs_default": round(self.gain.default, 4) if self.gain and self.gain.default else None,
                "gain_vs_shipped": round(self.gain.shipped, 4) if self.gain and self.gain.shipped else None,
                "measured_in": self.gain.run if self.gain else None}


@dataclass
class CoverageMap:
    rows: list[Row]
    notes: list[str]
    installations: list[Installation]


def _own_device(family, cuda_name: str) -> str:
    """The device_name= part a loader would build for this GPU without folding variants."""
    return re.sub(family.device_pattern, "_", cuda_name)


def engine_status(ka: KernelAudit, inst: Installation, cuda_name: str) -> tuple[str, str, str]:
    """(status, why, the same in a few words) of what the engine reads for one lookup (see the
    module docstring)."""
    r, fam = ka.resolved, ka.family
    if not r.found:
        return ("default", f"the loader raises: {r.crash}", "loader raises") if r.crash else \
            ("default", "no table: the engine's default config at every M", "no table")
    name = Path(r.rel or "").name
    why, short = [], []
    other_triton = r.triton_folder and r.triton_folder != fam.triton_folder(inst.triton)
    if r.how == "Triton fallback":
        why.append(f"{r.triton_folder}'s copy (no {fam.triton_folder(inst.triton)}/)")
        short.append(f"{r.triton_folder} copy")
    if r.how == "the up table":
        why.append("no _down table: the up table's configs" + (f" ({r.triton_folder})" if other_triton else ""))
        short.append("up table" + (f" ({r.triton_folder})" if other_triton else ""))
    m = fam.name_pattern().match(name)
    device = m.group("device") if m else None
    if device and device != _own_device(fam, cuda_name):
        why.append(f"{device}'s table (the loader folds this GPU onto it)")
        short.append(f"{device}'s")
    far = [f for f in ka.findings if f.kind in FAR_KINDS]
    if far:
        why.append("keys far from M: " + far[0].reason.split(";")[0])
        short.append("far keys")
    if why:
        return "fallback", "; ".join(why), ", ".join(short)
    return "shipped", f"shipped for {device or cuda_name}", ""


def _ours_here(ka: KernelAudit, root: Path, inst: Installation, cuda_name: str, K: int) -> tuple[bool, str]:
    """(whether the table our results folder `root` holds for this lookup is the one to read here,
    why not): read exactly (this Triton's folder, not a fallback), tuned on this engine version's
    own kernel, on this GPU, for this K, at the engines' whole batch-size grid."""
    from tuner.emit import partial
    from tuner.emit.table_origin import k_mismatch, ours
    r = ka.resolved
    if not r.found or not isinstance(r.files, FolderFiles) or r.rel is None:
        return False, ""
    path = Path(r.files.display(r.rel))
    if root.resolve() not in path.resolve().parents:
        return False, ""
    mine = ours(path, inst.engine)
    where = _shown(path)
    if mine is None:
        return False, f"{where}: not in its manifest"
    source = mine.entry.get("kernel_source") or {}
    device = (mine.entry.get("environment") or {}).get("device")
    if r.how == "Triton fallback" or (r.how == "the up table" and r.triton_folder != ka.family.triton_folder(inst.triton)):
        return False, f"{where}: tuned under another Triton ({r.triton_folder})"
    if source.get("source") != inst.engine or str(source.get("version")) != inst.version.split("+")[0]:
        return False, f"{where}: tuned on {source.get('source')} {source.get('version')}'s kernel"
    if device and device != cuda_name:
        return False, f"{where}: tuned on {device}"
    if (why := k_mismatch(mine.K, K, mine.model)) is not None:
        return False, f"{where}: {why.split(', the file name')[0]}"
    if (p := partial.of_entry(mine.entry)) is not None:
        return False, f"{where}: partial, {len(p['tuned'])} of {len(p['planned'])} batch sizes tuned"
    return True, where


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _installed_ours(ka: KernelAudit, inst: Installation, K: int) -> tuple[bool, str]:
    """A table `tuner install` put in the engine's folder (its backup record): ours, if for this K."""
    r = ka.resolved
    if not isinstance(inst.files, FolderFiles) or not r.found or r.rel is None or r.files is not inst.files:
        return False, ""
    from tuner.emit.table_origin import backup_root, k_mismatch, ours
    path = Path(r.files.display(r.rel))
    mine = ours(path, inst.engine, backup_root())
    if mine is None:
        return False, ""
    why = k_mismatch(mine.K, K, mine.model)
    return (False, f"installed by tuner, {why.split(', the file name')[0]}") if why else (True, "installed by tuner")


def _audits(inst: Installation, model, gpu, served: Served, dtype: str, batches: Batches,
            override: Path | None) -> list[tuple[KernelAudit, int, int]]:
    """[(kernel audit, the audit's tp, its ep)] of every table the deployment reads: the experts
    at (tp, ep); under data-parallel attention the other linear layers at the attention's TP."""
    report = audit_deployment(inst, model, gpu, served.tp, served.ep, dtype, batches, override, {}, detail=False)
    out = [(ka, served.tp, served.ep) for ka in report.kernels
           if ka.kind == "fused_moe" or served.attention_tp == served.tp]
    if served.attention_tp != served.tp and override is None:
        try:
            per_rank = audit_deployment(inst, model, gpu, served.attention_tp, 1, dtype, batches, None, {}, detail=False)
        except TunerError:
            per_rank = None
        out += [(ka, served.attention_tp, 1) for ka in (per_rank.kernels if per_rank else []) if ka.kind != "fused_moe"]
    return out


def deployment_rows(inst: Installation, model, model_arg: str, gpu, served: Served, dtype: str,
                    roots: list[Path], gains: dict, batches: Batches, newest: bool) -> list[Row]:
    """The rows of one deployment at one engine version (see the module docstring)."""
    from tuner.plan.engines import table_family
    audits = _audits(inst, model, gpu, served, dtype, batches, None)
    overlays: list[tuple[Path, dict]] = []
    for root in roots:
        folder = root / inst.engine / "fused_moe"
        if folder.is_dir() and any(f"device_name={table_family(inst.engine, 'fused_moe').device_file_name(gpu.cuda_name)}"
                                   in p.name for p in folder.rglob("*.json")):
            ours = _audits(inst, model, gpu, served, dtype, batches, folder)
            overlays.append((root, {ka.problem.key: ka for ka, _, _ in ours}))
    rows = []
    for ka, tp, ep in audits:
        params = ka.problem.params
        K = params["K"]
        status, why, short = engine_status(ka, inst, gpu.cuda_name)
        read = ka.short if ka.resolved.found else None
        notes, audit_extra = [], ""
        mine, said = _installed_ours(ka, inst, K)
        if mine:
            status, why, short = "tuned", said, "installed by tuner"
        elif said:
            notes.append(said)
        for root, theirs in overlays if ka.kind == "fused_moe" else []:
            other = theirs.get(ka.problem.key)
            here, said = _ours_here(other, root, inst, gpu.cuda_name, K) if other is not None else (False, "")
            if here:
                status, why, short, read = "tuned", f"ours: {said}", f"ours ({_shown(root)})", said
                audit_extra = f" --moe-config-dir {_shown(root / inst.engine / 'fused_moe')}"
            elif said:
                notes.append(said)
        if ka.kind == "fp8_gemm":
            for root in roots:
                table = root / inst.engine / "fp8_gemm" / ka.resolved.name
                if table.is_file():
                    here, said = _gemm_ours(table, inst, gpu.cuda_name)
                    if here:
                        status, why, read = "tuned", f"ours: {said} (tuner install {_shown(root)} puts it there)", said
                        short = f"ours ({_shown(root)})"
                    elif said:
                        notes.append(said)
        row = Row(model.name, model_arg, gpu.key, served, dtype, inst.engine, inst.version, inst.triton, ka.kind,
                  ka.part, params, ka.problem.key, ka.problem.layers, K, ka.resolved.name, read, status, why, short,
                  ka.reads, ka.reads_why, "", ours="; ".join(notes),
                  gain=gains.get((inst.engine, inst.version, gpu.cuda_name, ka.problem.key)))
        # the commands size a deployment by the checkpoint's weights: one the served precision
        # makes fit (a BF16 checkpoint quantized to FP8) is one rank's shapes, sized here
        per_rank = ep == 1 and fit_hint(model, gpu, tp, checkpoint_dtype(model)) is not None
        row.audit = audit_command(row, tp, ep, inst, per_rank) + audit_extra
        row.command = tune_command(row, tp, ep, inst, newest, per_rank)
        rows.append(row)
    return rows


def _gemm_ours(table: Path, inst: Installation, cuda_name: str) -> tuple[bool, str]:
    from tuner.emit.table_origin import ours
    mine = ours(table, inst.engine)
    if mine is None:
        return False, ""
    source = mine.entry.get("kernel_source") or {}
    if source.get("source") != inst.engine or str(source.get("version")) != inst.version.split("+")[0]:
        return False, f"{_shown(table)}: tuned on {source.get('source')} {source.get('version')}'s kernel"
    if (mine.entry.get("environment") or {}).get("device") not in (None, cuda_name):
        return False, f"{_shown(table)}: tuned on another GPU"
    return True, _shown(table)


def audit_command(row: Row, tp: int, ep: int, inst: Installation, per_rank: bool) -> str:
    """The `tuner audit` command that shows the row (tp, ep: its layer's; per_rank: sized here)."""
    per_rank_arg = " --per-rank" if per_rank else ""
    return (f"tuner audit --engine {row.engine} --engine-version {row.engine_version} --model {row.model_arg} "
            f"--gpu {row.gpu} --tp {tp}{f' --ep {ep}' if ep > 1 else ''}{per_rank_arg} --dtype {row.dtype} "
            f"--triton {inst.triton}")


def tune_command(row: Row, tp: int, ep: int, inst: Installation, newest: bool, per_rank: bool) -> str:
    """The tuning command for the row's table, on the engine version's own kernel (its wheel
    named where it is not the one a tuning command finds by itself: the newest)."""
    source = ""
    if not newest and inst.origin.startswith("wheel "):
        source = f" --engine-source {inst.origin.removeprefix('wheel ')}"
    parallel = f"--tp {tp}" + (f" --ep {ep}" if ep > 1 else "") + (" --per-rank" if per_rank else "")
    if row.kernel == "fused_moe":
        return (f"tuner moe --model {row.model_arg} --gpu {row.gpu} {parallel} --dtype {row.dtype} "
                f"--engines {row.engine}{source}")
    only = ",".join(f"{k}={row.problem[k]}" for k in ("N", "K")) + ","
    return f"tuner {row.kernel.split('_')[-1]} --model {row.model_arg} --gpu {row.gpu} {parallel} --only {only} " \
           f"--engines {row.engine}{source}"


def k_sharing(rows: list[Row]) -> None:
    """Mark the rows whose file name other models of another K read too (by engine version,
    GPU and file: the name has no K)."""
    readers: dict[tuple, dict[int, set[str]]] = {}
    for r in rows:
        if r.kernel == "fused_moe":
            readers.setdefault((r.engine, r.engine_version, r.gpu, r.file), {}).setdefault(r.K, set()).add(r.model)
    for r in rows:
        ks = readers.get((r.engine, r.engine_version, r.gpu, r.file), {})
        r.k_shared_with = [f"{m} (K={k})" for k in sorted(ks) if k != r.K for m in sorted(ks[k])]


def coverage_map(models: list[tuple[str, Model]], gpus: list, installs: list[Installation], roots: list[Path],
                 gains: dict, kernels: tuple[str, ...] = ("fused_moe", "fp8_gemm"),
                 batches: Batches | None = None, progress=None) -> CoverageMap:
    """Every row (see the module docstring) of `models` ((command-line name, Model)) on `gpus`
    at the engine versions `installs`; the rows of one model and GPU in deployment order."""
    from tuner.plan.deployment import served_deployments
    from tuner.plan.precision import served_dtypes
    batches = batches or Batches(4096)
    newest: dict[str, str] = {}
    for inst in installs:
        from tuner.plan.kernel_sources import version_key
        if inst.engine not in newest or version_key(inst.version) > version_key(newest[inst.engine]):
            newest[inst.engine] = inst.version
    rows: list[Row] = []
    notes: list[str] = []
    for arg, model in models:
        for gpu in gpus:
            for dtype in served_dtypes(model):
                deployments, left = served_deployments(model, gpu, dtype)
                notes += [f"{model.name} on {gpu.key} at {dtype}: {line}" for line in left]
                for served in deployments:
                    for inst in installs:
                        try:
                            found = deployment_rows(inst, model, arg, gpu, served, dtype, roots, gains, batches,
                                                    inst.version == newest[inst.engine])
                        except TunerError as e:          # said once, with the engine where it names it
                            who = f", {inst.engine}" if inst.engine in str(e) else ""
                            notes.append(f"{model.name} {served.label} {dtype} on {gpu.key}{who}: {e}")
                            continue
                        rows += [r for r in found if r.kernel in kernels]
                if progress:
                    progress(f"{model.name} on {gpu.key} at {dtype}: {len(rows)} rows")
    k_sharing(rows)
    return CoverageMap(rows, list(dict.fromkeys(notes)), installs)
