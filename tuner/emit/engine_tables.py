"""An engine installation's table folders and loader code, wherever they are.

`tuner audit` and `tuner install` look at tables where an engine reads them: an installed
package (a site-packages folder), a released wheel (read as a zip, never installed), or an
override folder (VLLM_TUNED_CONFIG_FOLDER, SGLANG_MOE_CONFIG_DIR). All three are seen
through one small interface (`exists`, `listdir`, `read`), so that the resolution rules in
tuner/plan/engines.py run the same on each. The same files give the engine's loader functions:
their hashes (compared with the releases the rules were read from) and their log lines,
quoted from the source, never from memory.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.engines import LOADER_FUNCTIONS, TableFamily, loader_release


class TableFiles:
    """Files under one root, by POSIX path relative to it."""
    kind = ""

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def listdir(self, rel: str) -> list[str] | None:
        """Names directly under folder `rel` (None: no such folder)."""
        raise NotImplementedError

    def read(self, rel: str) -> bytes:
        """The file's bytes, read within the bounds of tuner/reading.py: one `TunerError`
        line for a file over them or one that is no regular file (a FIFO, a device, a
        zip member that inflates past them); KeyError or OSError when it is not there."""
        raise NotImplementedError

    def display(self, rel: str) -> str:
        raise NotImplementedError

    def walk(self, rel: str) -> list[str]:
        """Every file under folder `rel`, as paths relative to the root."""
        raise NotImplementedError


class FolderFiles(TableFiles):
    kind = "folder"

    def __init__(self, root: Path):
        self.root = Path(root)

    def _p(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def exists(self, rel: str) -> bool:
        return self._p(rel).exists()

    def listdir(self, rel: str) -> list[str] | None:
        p = self._p(rel)
        return sorted(x.name for x in p.iterdir()) if p.is_dir() else None

    def read(self, rel: str) -> bytes:
        from tuner.reading import read_bytes
        return read_bytes(self._p(rel))

    def display(self, rel: str) -> str:
        return str(self._p(rel))

    def walk(self, rel: str) -> list[str]:
        base = self._p(rel)
        if not base.is_dir():
            return []
        # everything but folders: a FIFO or a device named like a table is a finding, not skipped
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if not p.is_dir())


SMALL_FILE = 64 << 10         # a wheel's files up to this size are kept once read (its tables)...
SMALL_FILES = 4096           # ... this many of them at most


class WheelFiles(TableFiles):
    kind = "wheel"

    @staticmethod
    def of(wheel: Path) -> "WheelFiles":
        """The wheel's files, its zip directory read once per process and version of the file
        (`tuner coverage` looks at each engine version's wheel for hundreds of deployments)."""
        st = Path(wheel).stat()
        return _wheel_files(str(Path(wheel).resolve()), st.st_size, st.st_mtime_ns)

    def __init__(self, wheel: Path):
        self.wheel = Path(wheel)
        from tuner.reading import open_zip
        self._zip = open_zip(self.wheel)
        self._names = set(self._zip.namelist())
        self._small: dict[str, bytes] = {}
        self._dirs: set[str] = set()
        # each folder's entries, indexed once: an audit lists the same folders for every lookup
        # (thousands of members each time would make `tuner coverage`'s thousand lookups slow)
        self._children: dict[str, set[str]] = {}
        for n in self._names:
            parts = n.split("/")
            folder = parts[0]
            for part in parts[1:]:
                self._dirs.add(folder)
                if part:
                    self._children.setdefault(folder, set()).add(part)
                folder = f"{folder}/{part}"

    def exists(self, rel: str) -> bool:
        return rel in self._names or rel in self._dirs

    def listdir(self, rel: str) -> list[str] | None:
        if rel not in self._dirs:
            return None
        return sorted(self._children.get(rel, ()))

    def read(self, rel: str) -> bytes:
        if rel in self._small:
            return self._small[rel]
        from tuner.reading import zip_member
        data = zip_member(self._zip, rel, str(self.wheel))
        if len(data) <= SMALL_FILE and len(self._small) < SMALL_FILES:     # a table: read again by the next lookup
            self._small[rel] = data
        return data

    def display(self, rel: str) -> str:
        return f"{self.wheel.name}:{rel}"

    def walk(self, rel: str) -> list[str]:
        prefix = rel + "/"
        return sorted(n for n in self._names if n.startswith(prefix) and not n.endswith("/"))


# room for every release of both engines (10 today): `tuner coverage` and its rows' audits go through
# them in turn, and with fewer (8) each wheel's directory was read again on every audit
@functools.lru_cache(maxsize=32)
def _wheel_files(wheel: str, size: int, mtime_ns: int) -> WheelFiles:
    return WheelFiles(Path(wheel))


@dataclass
class Installation:
    """One engine's package (installed or a wheel) at one version, with the Triton it runs."""
    engine: str
    version: str                       # "" when nothing says
    files: TableFiles | None           # None: no package (only override folders are looked at)
    origin: str                        # what was read, in words
    triton: str
    triton_origin: str                 # where the Triton version came from, in words
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version or '(version unknown)'}"


def _version_key(v: str) -> tuple:
    from tuner.plan.batch_keys import whole_number
    return tuple(whole_number(x, 0) for x in re.split(r"[.+-]", v))


def _wheel_version(path: Path, engine: str) -> str | None:
    m = re.match(rf"{re.escape(engine)}-([^-]+)-.*\.whl$", path.name)
    return m.group(1) if m else None


def _dist_version(site: Path, dist: str) -> str | None:
    return installed_version(site, dist)


def _this_triton() -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def _extracted_version(folder: Path, engine: str) -> str | None:
    """The version of `engine` a folder from `tuner engine-source extract` holds, where it kept
    the engine's tables (its manifest says how many); None otherwise."""
    from tuner.plan.kernel_sources import EXTRACT_MANIFEST
    from tuner.reading import read_json_file
    if not (folder / EXTRACT_MANIFEST).is_file():
        return None
    try:
        info = read_json_file(folder / EXTRACT_MANIFEST, "extraction manifest ")
    except TunerError:
        return None
    if not isinstance(info, dict) or info.get("engine") != engine or not info.get("tables"):
        return None
    return str(info.get("version") or "") or None


def _wheel_in(folder: Path, engine: str, version: str | None) -> Path | None:
    wheels = [w for w in folder.glob(f"{engine}-*.whl") if _wheel_version(w, engine)]
    if version:
        wheels = [w for w in wheels if _wheel_version(w, engine) == version]
    return max(wheels, key=lambda w: _version_key(_wheel_version(w, engine) or "0"), default=None)


def locate_installation(engine: str, site_packages: str | None = None, engine_source: list[str] | None = None,
                        version: str | None = None, triton: str | None = None) -> Installation:
    """The engine to audit (first match): --site-packages; --engine-source (a wheel, or a
    folder holding wheels: the one of --engine-version, else the newest); the engine
    installed in this Python (found without importing it); $TUNER_ENGINE_WHEELS. The
    Triton version: --triton, else the site-packages' Triton, else this Python's."""
    import importlib.util
    if triton is not None:                     # X.Y.Z, as SGLang's folders name it (the CLI checked it already)
        from tuner.plan.engine_rules.schema import checked_triton
        triton = checked_triton(triton)
    files: TableFiles | None = None
    found_version: str | None = None
    origin = ""
    triton_found: tuple[str | None, str] = (None, "")
    if site_packages and engine_source:
        raise TunerError("give --site-packages or --engine-source, not both: they name two installations")
    if site_packages:
        site = find_site_packages(engine, site_packages)
        files, origin = FolderFiles(site), f"installed in {site}"
        found_version = _dist_version(site, engine)
        triton_found = (_dist_version(site, "triton"), f"installed in {site}")
    elif engine_source:
        for src in engine_source:
            p = Path(src)
            if p.is_file():
                if _wheel_version(p, engine) is None:
                    continue
                files, origin, found_version = WheelFiles.of(p), f"wheel {p}", _wheel_version(p, engine)
                break
            if p.is_dir():
                wheel = _wheel_in(p, engine, version)
                if wheel is not None:
                    files, origin, found_version = WheelFiles.of(wheel), f"wheel {wheel}", _wheel_version(wheel, engine)
                    break
                extracted = _extracted_version(p, engine)
                if extracted is not None and (not version or extracted == version):
                    files, origin, found_version = FolderFiles(p), f"extracted in {p}", extracted
                    break
                if (p / engine / "__init__.py").is_file():         # a site-packages folder
                    files, origin = FolderFiles(p), f"installed in {p}"
                    found_version = _dist_version(p, engine)
                    triton_found = (_dist_version(p, "triton"), f"installed in {p}")
                    break
        else:
            for src in engine_source:
                if not Path(src).exists():
                    raise TunerError(f"--engine-source {src} not found")
            raise TunerError(f"none of --engine-source {' '.join(engine_source)} holds a {engine} wheel"
                             + (f" of version {version}" if version else "") + " or site-packages with its package "
                             "(a folder from `tuner engine-source extract` holds its tables when extracted by this "
                             "tuner: extract it again)")
    else:
        spec = None
        try:
            spec = importlib.util.find_spec(engine)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            site = Path(list(spec.submodule_search_locations)[0]).parent
            if version is None or _dist_version(site, engine) == version:
                files, origin, found_version = FolderFiles(site), f"installed in {site}", _dist_version(site, engine)
                triton_found = (_dist_version(site, "triton"), f"installed in {site}")
        from tuner.plan.kernel_sources import wheel_folders
        for folder in wheel_folders() if files is None else []:      # $TUNER_ENGINE_WHEELS, the wheels fetched
            wheel = _wheel_in(folder, engine, version)
            if wheel is not None:
                files, origin, found_version = WheelFiles.of(wheel), f"wheel {wheel}", _wheel_version(wheel, engine)
                break
    notes: list[str] = []
    if version and found_version and version != found_version:
        raise TunerError(f"--engine-version {version}, but {origin} is {engine} {found_version}")
    if files is None:
        if not version:
            from tuner.plan.kernel_sources import fetch_hint
            raise TunerError(f"{engine} is not installed in this Python and no wheel was given: fetch one with "
                             f"{fetch_hint(engine)}, or give --site-packages DIR or --engine-source WHEEL, or "
                             "--engine-version to audit override folders only")
        from tuner.plan.engines import check_known_release
        check_known_release(engine, version)          # as `tuner install` refuses it: no rules to apply
        notes.append(f"no {engine} package was found: only override folders are looked at, with the loader rules "
                     f"of {engine} {version}")
        origin = "no package"
    the_version = version or found_version or ""
    if triton:
        triton_version, triton_origin = triton, "given"
    elif triton_found[0]:
        triton_version, triton_origin = triton_found[0], triton_found[1]
    else:
        mine = _this_triton()
        if not mine:
            raise TunerError("cannot tell which Triton the engine runs: give --triton VERSION")
        triton_version, triton_origin = mine, "this Python's; --triton VERSION to audit for another"
    return Installation(engine, the_version, files, origin, triton_version, triton_origin, notes)


# -- the engine's loader functions: hashes and log lines -------------------------------------
def _function_source(text: str, name: str) -> str | None:
    from tuner.plan.kernel_sources import function_source
    try:
        return function_source(text, name)
    except (KeyError, SyntaxError):
        return None


_LOADER_CHANGES: dict[tuple[str, str, str], list[str]] = {}    # per wheel file: its loader parsed once


def loader_changes(inst: Installation) -> tuple[str, list[str]]:
    """(the release whose rules apply, the loader functions of this installation that differ
    from that release's, as 'file:function'); [] also when the source cannot be read (said
    by `loader_source_readable`)."""
    release = loader_release(inst.engine, inst.version)
    if inst.files is None:
        return release, []
    if not isinstance(inst.files, WheelFiles):        # a folder may change between two audits: read again
        return release, _changed_functions(inst, release)
    st = inst.files.wheel.stat()
    key = (f"{inst.files.wheel.resolve()}:{st.st_size}:{st.st_mtime_ns}", inst.engine, release)
    if key not in _LOADER_CHANGES:
        _LOADER_CHANGES[key] = _changed_functions(inst, release)
    return release, list(_LOADER_CHANGES[key])


def _changed_functions(inst: Installation, release: str) -> list[str]:
    from tuner.plan.kernel_sources import source_hash
    assert inst.files is not None
    changed = []
    texts: dict[str, str | None] = {}
    for key, expected in LOADER_FUNCTIONS[inst.engine][release].items():
        rel, name = key.rsplit(":", 1)
        if rel not in texts:
            try:
                texts[rel] = inst.files.read(rel).decode()
            except (KeyError, OSError, UnicodeDecodeError, TunerError):
                texts[rel] = None
        text = texts[rel]
        if text is None:
            continue
        src = _function_source(text, name)
        if src is None or source_hash(src) != expected:
            changed.append(key)
    return changed


def loader_source_readable(inst: Installation, family: TableFamily) -> bool:
    rel = family.loader.rsplit(":", 1)[0]
    return inst.files is not None and inst.files.exists(rel)


_LOG_METHODS = re.compile(r"^(info|warning|debug|error)(_once)?$")


def _log_calls(function_src: str) -> list[tuple[str, ast.expr, list[ast.expr]]]:
    """(level, message expression, its %-arguments) of every log call in a function, in
    source order: `logger.<level>[_once](msg, *args)` and `log_info_on_rank0(logger, msg)`."""
    calls = []
    for node in ast.walk(ast.parse(function_src)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "logger" \
                and _LOG_METHODS.match(f.attr) and node.args:
            calls.append((f.attr.split("_")[0], node.args[0], list(node.args[1:]), node.lineno, node.col_offset))
        elif isinstance(f, ast.Name) and f.id.startswith("log_info") and len(node.args) >= 2:
            calls.append(("info", node.args[1], list(node.args[2:]), node.lineno, node.col_offset))
    calls.sort(key=lambda c: (c[3], c[4]))
    return [(level, msg, args) for level, msg, args, _, _ in calls]


_LOG_CALLS: dict[tuple[str, str], list | None] = {}     # parsed once per loader file


def log_lines(inst: Installation, family: TableFamily, values: dict) -> dict[str, str]:
    """The engine's own log lines for this table family, rendered with `values` (the loader's
    local variables: config_file_path, config_file_paths, try_triton_version, ...): {"loaded":
    ..., "not loaded": ..., ["fell back": ...]}; {} when the loader's source is not at hand."""
    if inst.files is None:
        return {}
    rel, name = family.loader.rsplit(":", 1)
    key = (inst.files.display(rel), name)
    if key not in _LOG_CALLS:
        try:
            src = _function_source(inst.files.read(rel).decode(), name)
        except (KeyError, OSError, UnicodeDecodeError, TunerError):
            src = None
        _LOG_CALLS[key] = _log_calls(src) if src is not None else None
    calls = _LOG_CALLS[key]
    if calls is None:
        return {}
    out = {}
    for what, level, name, index in family.log_calls:
        picked = [c for c in calls if c[0] == level and any(
            isinstance(n, ast.Name) and n.id == name for part in [c[1], *c[2]] for n in ast.walk(part))]
        try:
            _, msg, args = picked[index]
        except IndexError:
            continue
        try:
            text = eval(compile(ast.Expression(msg), rel, "eval"), {"__builtins__": {}}, dict(values))  # noqa: S307
            if args:
                text = text % tuple(eval(compile(ast.Expression(a), rel, "eval"), {"__builtins__": {}},   # noqa: S307
                                         dict(values)) for a in args)
        except Exception:  # noqa: BLE001 - a message built from names we do not know: not quoted
            continue
        out[what] = " ".join(str(text).split())
    return out


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
