"""The table an engine reads today where `tuner install` is about to write one: the file there,
else the package's that the engine falls back to or that a config folder hides (vLLM reads
VLLM_TUNED_CONFIG_FOLDER before its package; SGLANG_MOE_CONFIG_DIR replaces the package's folder,
into which install copies the shipped tables), read from the installed package or, for an engine
that is not here, the same version's wheel (engine_wheel).

A --merge keeps that table's rows (tuner/emit/install.py `_coverage`); where neither the package
nor its wheel is at hand, what the engine reads is UNKNOWN, and a merge is refused rather than
claimed (issue 50, item 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tuner.plan.engines import table_family


@dataclass(frozen=True)
class Reads:
    """A table the engine reads today."""
    where: str           # the file, or wheel:member
    data: bytes
    hidden: bool = False     # a package table that the config folder's new file will hide (searched first)


@dataclass(frozen=True)
class Unknown:
    """Neither the engine's package nor its wheel is here: what it reads cannot be known."""
    why: str
    fetch: str           # the command that fetches the wheel


def package_files(site: Path, engine: str, present: bool, version: str | None):
    """The engine's package files: the installed package, else the same version's wheel at hand
    (None: neither)."""
    from tuner.emit.engine_tables import FolderFiles, WheelFiles
    if present:
        return FolderFiles(site)
    wheel = engine_wheel(engine, version)
    return WheelFiles(wheel) if wheel is not None else None


def engine_wheel(engine: str, version: str | None) -> Path | None:
    """The wheel of exactly this version among the wheels at hand ($TUNER_ENGINE_WHEELS, the
    wheels fetched), or None."""
    from tuner.plan.kernel_sources import _wheel_version, wheel_folders
    if not version:
        return None
    for folder in wheel_folders():
        for wheel in sorted(folder.glob(f"{engine}-{version}-*.whl")):
            if _wheel_version(wheel, engine) == version:
                return wheel
    return None


def _where(files, rel: str) -> str:
    """A table read as printed: its path, or in a wheel its name (and Triton folder) and the wheel's."""
    if getattr(files, "kind", "") != "wheel":
        return files.display(rel)
    tail = "/".join(p for p in rel.split("/")[-2:] if p.startswith("triton_") or p.endswith(".json"))
    return f"{tail} in {files.wheel.name}"


def _version(folder: str) -> tuple[int, ...] | None:
    parts = folder.removeprefix("triton_").split("_")
    return tuple(int(x) for x in parts) if folder.startswith("triton_") and all(x.isdigit() for x in parts) else None


def _newest_other(places: list, name: str, exact: str) -> tuple | None:
    """SGLang's fallback: of the triton_* folders under each (files, configs folder) of `places`
    other than `exact`, the newest holding `name`, as (files, path); the first place wins a tie."""
    found = []
    for rank, (files, configs) in enumerate(places):
        for folder in files.listdir(configs) or []:
            v = _version(folder)
            rel = f"{configs}/{folder}/{name}"
            if v is not None and folder != exact and files.exists(rel):
                found.append((v, -rank, files, rel))
    if not found:
        return None
    _, _, files, rel = max(found, key=lambda f: (f[0], f[1]))
    return files, rel


def reads_today(site: Path, engine: str, kind: str, moe_config_dir: Path | None, dest: Path,
                package, version: str | None = None) -> Reads | Unknown | None:
    """The table `engine` (at `version`) reads today for the file an install writes at `dest`
    (None: it reads none there: its default config). `package`: package_files()."""
    from tuner.emit.engine_tables import FolderFiles
    from tuner.reading import read_bytes
    if dest.is_file():
        return Reads(str(dest), read_bytes(dest, "installed table "))
    if os.path.lexists(dest):
        return None          # a folder or a FIFO where the table goes: refused by install's check_destinations
    family = table_family(engine, kind)
    name = dest.name
    in_folder = kind == "fused_moe" and moe_config_dir is not None and family.env_var is not None
    if package is None:
        label = f"{engine} {version}" if version else engine
        return Unknown(f"{label} is not here and no wheel of it is at hand to read the table it reads today",
                       f"tuner engine-source fetch {engine}=={version or 'VERSION'}")
    if not family.per_triton:
        rel = f"{family.folder}/{name}"
        if package.exists(rel):
            return Reads(_where(package, rel), package.read(rel), hidden=in_folder)
        return None
    # SGLang: <configs>/triton_X_Y_Z/<name>, else the newest other triton_* folder
    exact = dest.parent.name
    # (the config folder's own other triton_* folders too: the variable's folder is where it looks)
    places = [(package, family.folder)]
    if in_folder and moe_config_dir is not None and (Path(moe_config_dir) / "configs").is_dir():
        places.append((FolderFiles(Path(moe_config_dir)), "configs"))
    for files, configs in places:
        rel = f"{configs}/{exact}/{name}"
        if files.exists(rel):
            return Reads(_where(files, rel), files.read(rel))
    other = _newest_other(places, name, exact)
    if other:
        return Reads(_where(other[0], other[1]), other[0].read(other[1]))
    if family.has_down and name.endswith("_down.json"):      # no `_down` table: the loader reads the up one for it
        return reads_today(site, engine, kind, moe_config_dir, dest.with_name(name[:-len("_down.json")] + ".json"),
                           package, version)
    return None
