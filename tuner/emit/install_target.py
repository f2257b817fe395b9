"""Where `tuner install` writes: the engine's package in a site-packages, or, for an engine that
is not here (a container image built elsewhere), a config folder for a named engine version.

The layout of a config folder is ours to know (tuner/plan/engines.py holds each engine's loader
rules), so writing one needs no engine: `tuner install RESULTS --engine sglang --engine-version
0.5.23 --moe-config-dir DIR` writes DIR as that version reads it from SGLANG_MOE_CONFIG_DIR, and
`--dry-run` shows what an install would write. What does need the engine's files (SGLang's
shipped MoE tables, which its variable hides and install therefore copies in; the lines the
loader logs, quoted after an install by `engine_log_lines`) is read from the package, else from
the same version's wheel where one is at hand ($TUNER_ENGINE_WHEELS, or `tuner engine-source
fetch`), and said otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.engines import ENGINES


@dataclass(frozen=True)
class Target:
    """The environment an install is for."""
    engine: str
    site: Path                  # its site-packages; for an absent engine, a stand-in no file is ever read from
    present: bool               # the engine's package is here
    version: str | None         # the engine's version (installed, or --engine-version)

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}" if self.version else self.engine

    def show(self, path: Path) -> str:
        """A path as printed: under an absent engine's stand-in site-packages (whose place is not
        known here), as `.../site-packages/<its path in the package>`, never the stand-in itself."""
        return shown(path, self.site, self.present)


def shown(path: Path | str, site: Path, present: bool) -> str:
    """`path` as printed (Target.show)."""
    if present or not Path(path).is_relative_to(site):
        return str(path)
    return str(Path(ABSENT_SITE) / Path(path).relative_to(site))


ABSENT_SITE = ".../site-packages"         # how an absent engine's site-packages is printed


def install_target(engine: str, site_packages: str | None, moe_config_dir: str | None, dry_run: bool,
                   engine_version: str | None) -> Target:
    """The engine's installation; without one (and without --site-packages), a config folder
    (--moe-config-dir) or a dry run for `engine_version`. One line when neither applies."""
    from tuner.emit.engine_tables import find_site_packages, installed_version
    from tuner.plan.engines import supported_releases
    try:
        site = find_site_packages(engine, site_packages)
    except TunerError as e:
        if site_packages or not (moe_config_dir or dry_run):
            raise TunerError(f"{e} (or, for an engine that is not here, write its config folder: --moe-config-dir "
                             "DIR --engine-version V, or see what would be written: --dry-run --engine-version V)")\
                from None
        if not engine_version:
            raise TunerError(f"{engine} is not installed in this Python: name the version that will read the "
                             f"tables with --engine-version V (one of {', '.join(supported_releases(engine))}): its "
                             "loader rules decide the layout") from None
        from tuner.plan.engines import check_known_release
        check_known_release(engine, engine_version)
        return Target(engine, Path(f"<{engine} site-packages>"), False, engine_version)
    version = installed_version(site, engine)
    if engine_version and version and engine_version != version:
        raise TunerError(f"--engine-version {engine_version}, but {site} holds {engine} {version}")
    return Target(engine, site, True, version or engine_version)


def restore_roots(engine: str, site_packages: str | None, moe_config_dir: str | None) -> list[Path] | None:
    """The folders `install --restore` undoes the last install into: those an install with the
    same --site-packages and --moe-config-dir writes (None, neither given: the engine's last
    install, wherever it went)."""
    from tuner.emit.engine_tables import find_site_packages
    from tuner.emit.install import config_roots
    if not site_packages and not moe_config_dir:
        return None
    config_dir = Path(moe_config_dir) if moe_config_dir else None
    try:
        site = find_site_packages(engine, site_packages)
    except TunerError:
        if site_packages:
            raise
        return [config_roots(Path("/nonexistent"), engine, config_dir)["fused_moe"]]
    return list(config_roots(site, engine, config_dir).values())


def shipped_copies(target: Target, config_dir: Path, notes: list[str]) -> list:
    """The engine's shipped MoE tables, copied into a config folder whose variable hides the
    package's own (SGLang's): from the package, else from the same version's wheel; none (and a
    note) when neither is here."""
    from tuner.emit.install import Copy, config_roots, shipped_moe_tables
    from tuner.plan.engines import table_family
    engine = target.engine
    family = table_family(engine, "fused_moe")
    if not family.env_replaces_root:
        return []
    root = config_roots(target.site, engine, config_dir)["fused_moe"]
    if target.present:
        return [Copy(p, root / rel, "shipped", root) for p, rel in shipped_moe_tables(target.site, engine)]
    from tuner.emit.engine_reads import engine_wheel
    wheel = engine_wheel(engine, target.version)
    if wheel is None:
        notes.append(f"{family.env_var} hides {target.label}'s shipped MoE tables, and no {target.label} wheel is "
                     f"at hand to copy them from: shapes without a table of ours will run {engine}'s default config; "
                     f"`tuner engine-source fetch {engine}=={target.version}` fetches it, then install again")
        return []
    from tuner.paths import inside
    from tuner.reading import open_zip, zip_member
    folder = ENGINES[engine].moe_folder + "/"
    copies = []
    # bounded (a FIFO or a link to /dev/zero named like the wheel is refused, never waited on or
    # read without end), and every member's name checked before any file is written
    with open_zip(wheel, f"{target.label}'s wheel ") as z:
        for name in sorted(n for n in z.namelist() if n.startswith(folder) and n.endswith(".json")):
            rel = name[len(folder):]
            if any(p in ("", ".", "..") for p in rel.split("/")) or "\\" in rel or not inside(root / rel, root):
                raise TunerError(f"{wheel}: member {name[:120]!r} is not a plain path under {folder}: refusing the "
                                 "wheel (nothing was installed)")
            try:
                text = zip_member(z, name, f"wheel {wheel}").decode()
            except UnicodeDecodeError:
                raise TunerError(f"{wheel}: shipped table {name} is not UTF-8 text (nothing was installed)") from None
            copies.append(Copy(wheel, root / rel, "shipped", root, text=text))
    return copies


def config_folder_lines(engine: str, kind: str, folder: Path) -> list[str]:
    """What a results folder's <engine>/<kind>/ is to the engine: the folder its config-folder
    variable can name as it is (and what that hides)."""
    from tuner.plan.engines import table_family
    family = table_family(engine, kind)
    if not family.env_var or not folder.is_dir():
        return []
    line = f"{family.env_var}={folder.resolve()} makes {engine} read these {kind} tables from here as they are"
    if family.env_replaces_root:
        line += (f" (it then reads no shipped {kind} table: `tuner install {folder.parent.parent} --engine {engine} "
                 "--moe-config-dir DIR` writes a folder with both)")
    return [line]


def engine_log_lines(copies: list, engine: str, site: Path, moe_config_dir: Path | None,
                     engine_version: str | None = None, present: bool = True) -> list[str]:
    """For each table installed, the line the engine logs when it loads it and the one it logs
    when it finds no table there, quoted from the engine's loader source (the target's own
    package, else the same version's wheel in $TUNER_ENGINE_WHEELS or among the wheels fetched;
    `present` False: the engine is not here, `site` a stand-in printed as .../site-packages)."""
    import os

    from tuner.emit.engine_tables import (
        FolderFiles,
        Installation,
        WheelFiles,
        installed_version,
        loader_source_readable,
        log_lines,
    )
    from tuner.plan.engines import table_family
    version = installed_version(site, engine) or engine_version or ""
    inst = Installation(engine, version, FolderFiles(site), f"installed in {site}", "", "")
    kinds = sorted({c.kind for c in copies if c.kind})
    if kinds and not loader_source_readable(inst, table_family(engine, kinds[0])):
        from tuner.plan.kernel_sources import wheel_folders
        match = sorted(w for folder in wheel_folders() for w in folder.glob(f"{engine}-{version}-*.whl")) \
            if version else []
        if not match:
            where = f"is not in {site}" if present else "is not here"
            return [f"(the lines {engine} logs for these tables cannot be quoted: its loader source {where}, "
                    f"and no {engine} {version} wheel is at hand: `tuner engine-source fetch {engine}=={version}`)"
                    if version else f"(the lines {engine} logs for these tables cannot be quoted: its loader source "
                    f"{where})"]
        inst = Installation(engine, version, WheelFiles(match[0]), f"wheel {match[0]}", "", "")
    out = []
    for c in copies:
        if not c.kind:
            continue
        family = table_family(engine, c.kind)
        if c.kind == "fused_moe" and moe_config_dir is not None:
            path = str(Path(moe_config_dir).resolve() / c.dest.relative_to(c.root)) if not family.env_replaces_root \
                else str(Path(moe_config_dir).resolve() / "configs" / c.dest.relative_to(c.root))
        else:
            path = os.path.join(os.path.realpath(c.dest.parent), c.dest.name) if present else shown(c.dest, site, False)
        tried = [path]
        if c.kind == "fused_moe" and family.env_var and not family.env_replaces_root and moe_config_dir is not None:
            tried.append(os.path.join(os.path.realpath(site / family.folder), c.dest.name) if present else
                         shown(site / family.folder / c.dest.name, site, False))
        lines = log_lines(inst, family, {"config_file_path": path, "config_file_paths": tried})
        label = f"{engine} {version}".strip()
        if "loaded" in lines:
            out.append(f"{label} logs when it loads {c.dest.name}: {lines['loaded']}")
        if "not loaded" in lines and not c.dest.name.endswith("_down.json"):
            out.append(f"  and when it finds no table there: {lines['not loaded']}")
    return out
