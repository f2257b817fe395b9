"""`tuner install`: put a results folder's tables where an engine reads them.

Everything is checked before anything is written: the engine's package is found, the
tables' provenance is compared with the target environment (device, Triton version,
numerics), and every target folder must be writable. Replaced files are backed up outside
the engine's folders first, and `tuner install --restore` puts the last backup back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.engines import ENGINES
from tuner.environment import now_iso
from tuner.errors import TunerError
from tuner.paths import atomic_write_json, atomic_write_text
from tuner.results import read_manifest

BACKUP_ROOT = Path(os.environ.get("TUNER_BACKUP_DIR", Path.home() / ".cache" / "tuner" / "backups"))
ENV_VARS = {"vllm": "VLLM_TUNED_CONFIG_FOLDER", "sglang": "SGLANG_MOE_CONFIG_DIR"}


@dataclass
class Copy:
    source: Path
    dest: Path
    label: str      # what the file is, for the printout


def find_site_packages(engine: str, site_packages: str | None) -> Path:
    """The folder holding the engine's package, found without importing the engine."""
    if site_packages:
        root = Path(site_packages)
        if not (root / engine / "__init__.py").is_file():
            raise TunerError(f"no {engine} package in {root} (looked for {root / engine / '__init__.py'})")
        return root
    spec = importlib.util.find_spec(engine)
    if spec is None or not spec.submodule_search_locations:
        raise TunerError(f"{engine} is not installed in this Python; give --site-packages DIR of the "
                         "environment that runs it")
    return Path(list(spec.submodule_search_locations)[0]).parent


def installed_version(site: Path, dist: str) -> str | None:
    """A distribution's version from its .dist-info folder name, without importing it."""
    for info in site.glob(f"{dist}-*.dist-info"):
        m = re.match(rf"{dist}-([^-]+)\.dist-info$", info.name)
        if m:
            return m.group(1)
    return None


def _base(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def local_gpu_name() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def plan_install(results: Path, engine: str, site: Path, force: bool = False,
                 moe_config_dir: Path | None = None, target_gpu: str | None = None) -> tuple[list[Copy], list[str]]:
    """(copies to make, notes). Raises TunerError, one line, when the install must not happen."""
    manifest = read_manifest(results)
    tables = [t for t in manifest.get("tables", []) if t.get("files", {}).get(engine)]
    if not tables:
        raise TunerError(f"{results} holds no {engine} tables")
    eng = ENGINES[engine]
    target_triton = installed_version(site, "triton")
    target_engine = installed_version(site, engine)
    timed_on_ours: list[str] = []
    gpu = target_gpu or local_gpu_name()     # the GPU the engine will run on, when known
    copies, notes = [], []
    for t in tables:
        rel = t["files"][engine]
        source = results / rel
        if not source.is_file():
            raise TunerError(f"the manifest lists {rel}, but {source} is missing")
        env = t.get("environment") or {}
        problems = []
        if not t.get("numerics_passed"):
            problems.append("its numerics check did not pass (or was not run: replayed timings)")
        if env.get("triton") and target_triton and _base(env["triton"]) != _base(target_triton):
            problems.append(f"it was measured under Triton {env['triton']}, the target runs {target_triton}")
        if gpu and env.get("device") and env["device"] != gpu:
            problems.append(f"it was measured on {env['device']}, the target GPU is {gpu}")
        timed_by = t.get("kernel_source") or {"source": "ours"}
        if timed_by.get("source") == engine and timed_by.get("version") and target_engine \
                and timed_by["version"] != target_engine:
            problems.append(f"it was timed on {engine} {timed_by['version']}'s kernel, the target runs "
                            f"{engine} {target_engine}")
        elif timed_by.get("source") == "ours":
            timed_on_ours.append(rel)
        if problems:
            if not force:
                raise TunerError(f"refusing {rel}: {'; '.join(problems)} (--force installs it anyway)")
            notes.append(f"forced {rel}: {'; '.join(problems)}")
        _, kind, tail = rel.split("/", 2)
        if kind == "fused_moe" and moe_config_dir is not None:
            # SGLang's variable replaces <package>/.../triton_utils, whose tables sit in configs/.
            dest = moe_config_dir / ("configs/" + tail if eng.moe_folder_per_triton else tail.rsplit("/", 1)[-1])
        else:
            folder = eng.gemm_folder if kind == "fp8_gemm" else eng.moe_folder
            dest = site / folder / tail
        copies.append(Copy(source, dest, f"{kind} {t.get('problem')}"))
    if timed_on_ours:
        notes.append(f"{len(timed_on_ours)} of these tables were timed on our kernels, not {engine}'s own "
                     "(--kernel-source ours): the engine's kernel may rank configs differently")
    for kind in sorted({t["files"][engine].split("/")[1] for t in tables}):
        if kind in (eng.reads_on_hopper or {}):
            notes.append(f"when {eng.facts_for} reads these {kind} tables on Hopper: {eng.reads_on_hopper[kind]}")
    return copies, notes


def _check_writable(paths: list[Path]) -> None:
    for d in sorted({p.parent for p in paths}):
        existing = d
        while not existing.exists():
            existing = existing.parent
        if not os.access(existing, os.W_OK):
            raise TunerError(f"cannot write to {existing}: permission denied (nothing was installed)")


def install(copies: list[Copy], engine: str, extra: list[Copy] = (), backup_root: Path | None = None) -> Path:
    """Back up what would be replaced, then write every table atomically. Returns the backup
    folder (its record.json lists what restore must undo)."""
    everything = list(extra) + list(copies)
    _check_writable([c.dest for c in everything])
    backup = (backup_root or BACKUP_ROOT) / f"{engine}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    entries = []
    for i, c in enumerate(everything):
        saved = None
        if c.dest.exists():
            saved = backup / "files" / f"{i:04d}-{c.dest.name}"
            saved.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(c.dest, saved)
        entries.append({"dest": str(c.dest), "backup": str(saved) if saved else None})
    # The record goes down before the first write, so an interrupted install can be undone.
    atomic_write_json(backup / "record.json", {"engine": engine, "installed": now_iso(), "files": entries})
    for c in everything:
        atomic_write_text(c.dest, c.source.read_text())
    return backup


def latest_backup(engine: str, backup_root: Path | None = None) -> Path:
    backup_root = backup_root or BACKUP_ROOT
    records = sorted(backup_root.glob(f"{engine}-*/record.json"))
    if not records:
        raise TunerError(f"no {engine} install to restore (no backups in {backup_root})")
    return records[-1].parent


def restore(engine: str, backup_root: Path | None = None) -> list[str]:
    """Undo the last install for an engine: put replaced files back, remove added ones."""
    backup = latest_backup(engine, backup_root)
    record = json.loads((backup / "record.json").read_text())
    _check_writable([Path(e["dest"]) for e in record["files"]])
    done = []
    for e in reversed(record["files"]):
        dest = Path(e["dest"])
        if e["backup"]:
            atomic_write_text(dest, Path(e["backup"]).read_text())
            done.append(f"restored {dest}")
        elif dest.exists():
            dest.unlink()
            done.append(f"removed {dest}")
    shutil.rmtree(backup)
    return done


def shipped_moe_tables(site: Path, engine: str) -> list[tuple[Path, str]]:
    """The engine's own MoE tables, as (file, path under its configs folder)."""
    root = site / ENGINES[engine].moe_folder
    return [(p, str(p.relative_to(root))) for p in sorted(root.rglob("*.json"))]


def plan_config_dir(site: Path, engine: str, config_dir: Path) -> list[Copy]:
    """SGLang's variable hides the shipped tables, so they are copied in first."""
    if engine != "sglang":
        return []
    return [Copy(p, config_dir / "configs" / rel, "shipped") for p, rel in shipped_moe_tables(site, engine)]
