"""Where an engine's own kernel code comes from, and how it is loaded without the engine.

A table written for vLLM must be timed on vLLM's kernel, at the version the table is for.
The code is read at run time, never copied into this repository, from (first match):
  1. `--engine-source PATH`: the engine's released wheel, a folder holding such wheels, or a
     folder of files extracted from one (`tuner engine-source extract`, small enough to
     carry to a GPU machine that has no network);
  2. the engine installed in this Python (its files are read, the package not imported);
  3. `$TUNER_ENGINE_WHEELS`: a folder of wheels or extracted folders;
  4. the wheels `tuner engine-source fetch` downloaded (~/.cache/tuner/engine-wheels).
Nothing here knows a particular engine: what to read, and how to launch it, is declared
by each engine's launcher module (kernels/engines/<engine>.py).

Loading: the `@triton.jit` functions a launcher needs are cut out of the engine's file with
`ast` (with the module-level jit functions and constants they refer to, verbatim) and written
to a module in the cache (~/.cache/tuner/engine-kernels, `$TUNER_CACHE_DIR`): Triton reads a
kernel's source from its file.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError
from tuner.paths import atomic_write_json, atomic_write_text

EXTRACT_MANIFEST = "tuner-engine-source.json"
ENGINE_FILE_BYTES = 8 << 20          # the largest engine file read is about 100 KiB
ENV_WHEELS = "TUNER_ENGINE_WHEELS"


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE_DIR", Path.home() / ".cache" / "tuner")) / "engine-kernels"


def fetched_wheels_dir() -> Path:
    """Where `tuner engine-source fetch` puts the engines' wheels (per user), and where the
    tool looks for them by itself."""
    return Path(os.environ.get("TUNER_CACHE_DIR", Path.home() / ".cache" / "tuner")) / "engine-wheels"


def wheel_folders() -> list[Path]:
    """The folders searched for an engine's wheel when no --engine-source is given and the
    engine is not installed: $TUNER_ENGINE_WHEELS, then the wheels fetched."""
    env = os.environ.get(ENV_WHEELS)
    folders = [Path(env)] if env and Path(env).is_dir() else []
    fetched = fetched_wheels_dir()
    return folders + ([fetched] if fetched.is_dir() and fetched not in folders else [])


def newest_known(engine: str) -> str | None:
    """The newest release of `engine` whose files tuner knows (kernels/engines/release_files.json)."""
    versions = sorted(known_release_files().get(engine, {}), key=version_key)
    return versions[-1] if versions else None


def fetch_hint(engine: str) -> str:
    """How to get an engine's wheel, for the lines that say it is missing."""
    version = newest_known(engine)
    return f"`tuner engine-source fetch {engine}" + (f"=={version}`" if version else "`")


def version_key(version: str) -> tuple:
    """'0.5.23' -> (0, 5, 23): versions compared as numbers, not as text (0.5.3 < 0.5.23)."""
    from tuner.plan.batch_keys import whole_number
    return tuple(whole_number(x, -1) for x in re.findall(r"[0-9]+|[a-z]+", version))


def _wheel_version(path: Path, dist: str) -> str | None:
    m = re.match(rf"{re.escape(dist)}-([^-]+)-.*\.whl$", path.name)
    return m.group(1) if m else None


@dataclass
class EngineCode:
    """One engine's source files at one version, wherever they are."""
    engine: str
    version: str
    origin: str                      # the wheel, folder or package directory read from
    kind: str                        # "wheel", "folder", "installed"
    _zip: zipfile.ZipFile | None = field(default=None, repr=False)
    _root: Path | None = field(default=None, repr=False)
    _texts: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def where(self) -> str:
        return f"{self.kind} {self.origin}"

    def read(self, relpath: str) -> str:
        """A file of the engine's package tree, by its path in the wheel ('vllm/...'): read
        with a bound (a zip bomb stops at it), never through a link leading out of an
        extracted folder, and only if it is Python source (one line otherwise)."""
        if relpath in self._texts:
            return self._texts[relpath]
        from tuner.reading import read_bytes, zip_member
        try:
            if self._zip is not None:
                data = zip_member(self._zip, relpath, f"{self.engine} {self.version} ({self.where})", ENGINE_FILE_BYTES)
            else:
                if self._root is None:
                    raise OSError("no files")
                path = self._root / relpath
                if self.kind == "folder" and self._root.resolve() not in path.resolve().parents:
                    raise TunerError(f"{self.where}: {relpath} is a link leading out of the folder; refusing to "
                                     "read it")
                if not path.is_file():
                    raise OSError("not a file")
                data = read_bytes(path, f"{self.engine} file ", ENGINE_FILE_BYTES)
        except (KeyError, OSError):
            raise TunerError(f"{self.engine} {self.version} ({self.where}) has no {relpath}: "
                             "this version lays its kernels out differently than the launcher expects") from None
        try:
            text = data.decode()
            if "\x00" in text:
                raise ValueError("a NUL byte")
            parse_source(text)
        except (UnicodeDecodeError, ValueError, SyntaxError, RecursionError, MemoryError) as e:
            raise TunerError(f"{self.engine} {self.version} ({self.where}): {relpath} is not Python source "
                             f"({type(e).__name__}); not a file of a released {self.engine}") from None
        self._texts[relpath] = text
        return text


def _from_wheel(path: Path, engine: str) -> EngineCode:
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None:
        return _open_wheel(path, engine)
    return _open_wheel_once(str(path.resolve()), engine, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _open_wheel_once(path: str, engine: str, size: int, mtime_ns: int) -> EngineCode:
    """A wheel opened (its zip directory read: thousands of entries) once per process and
    version of the file."""
    return _open_wheel(Path(path), engine)


def _open_wheel(path: Path, engine: str) -> EngineCode:
    version = _wheel_version(path, engine)
    if version is None:
        raise TunerError(f"{path} is not a {engine} wheel (expected {engine}-<version>-....whl)")
    from tuner.reading import open_zip
    zf = open_zip(path)
    return EngineCode(engine, version, str(path.resolve()), "wheel", _zip=zf)


def _from_folder(path: Path, engine: str) -> EngineCode | None:
    """A folder from `tuner engine-source extract`, or any folder holding the engine's wheel
    or such folders. None when it holds nothing of this engine."""
    manifest = path / EXTRACT_MANIFEST
    if manifest.is_file():
        from tuner.reading import read_json_file
        info = read_json_file(manifest)
        if not isinstance(info, dict) or info.get("engine") != engine:
            return None
        return EngineCode(engine, str(info.get("version", "")), str(path.resolve()), "folder", _root=path)
    wheels = sorted(path.glob(f"{engine}-*.whl"), key=lambda w: version_key(_wheel_version(w, engine) or ""))
    if wheels:
        return _from_wheel(wheels[-1], engine)          # the newest version
    for sub in sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []:
        if (sub / EXTRACT_MANIFEST).is_file():
            found = _from_folder(sub, engine)
            if found is not None:
                return found
    return None


def _installed(engine: str, dist: str) -> EngineCode | None:
    try:
        spec = importlib.util.find_spec(engine)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).parent
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return EngineCode(engine, version, str(root / engine), "installed", _root=root)


def locate(engine: str, origin: str | None = None, dist: str | None = None) -> EngineCode:
    """The engine's code: from `origin` when given, else the installed engine, else
    $TUNER_ENGINE_WHEELS. One clear line when none is there."""
    dist = dist or engine
    if origin:
        path = Path(origin)
        if path.is_file():
            return _from_wheel(path, engine)
        if path.is_dir():
            if path.name == engine and (path / "__init__.py").is_file():      # an installed package dir
                return _installed_at(path, engine, dist)
            found = _from_folder(path, engine)
            if found is not None:
                return found
            raise TunerError(f"--engine-source {origin} holds no {engine} wheel and no folder extracted "
                             f"from one (`tuner engine-source extract`)")
        raise TunerError(f"--engine-source {origin} " + ("is neither a wheel nor a folder" if os.path.lexists(origin)
                                                         else "not found"))
    found = _installed(engine, dist)
    if found is not None:
        return found
    for folder in wheel_folders():
        found = _from_folder(folder, engine)
        if found is not None:
            return found
    raise TunerError(f"{engine}'s kernels are needed but {engine} is not installed in this Python: fetch its wheel "
                     f"with {fetch_hint(engine)} (found by itself from then on), or give it with --engine-source "
                     "PATH, or time our own kernels with --kernel-source ours")


def _installed_at(package_dir: Path, engine: str, dist: str) -> EngineCode:
    site = package_dir.parent
    version = "unknown"
    for info in site.glob(f"{dist}-*.dist-info"):
        m = re.match(rf"{re.escape(dist)}-([^-]+)\.dist-info$", info.name)
        if m:
            version = m.group(1)
    return EngineCode(engine, version, str(package_dir), "installed", _root=site)


# -- cutting jit functions out of a file ---------------------------------------------------
def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            defs[node.targets[0].id] = node
    return defs


def _is_jit(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        "jit" in ast.unparse(d) for d in node.decorator_list)


@functools.lru_cache(maxsize=64)
def parse_source(text: str) -> ast.Module:
    """An engine file's syntax tree, parsed once per process (asked for several functions)."""
    return ast.parse(text)


def function_source(text: str, name: str) -> str:
    """The exact source of a top-level function or method ('Class.method'), with decorators."""
    owner, _, method = name.rpartition(".")
    node = _top_level(parse_source(text)).get(owner or name)
    node = next((n for n in getattr(node, "body", []) if isinstance(n, ast.FunctionDef) and n.name == method),
                None) if owner else node
    if not isinstance(node, ast.FunctionDef):
        raise KeyError(name)
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(text.splitlines()[start - 1:node.end_lineno]) + "\n"


def cut_jit_functions(text: str, names: list[str]) -> str:
    """Module source holding the jit functions `names`, every module-level jit function and
    plain constant they use (recursively), each verbatim, after plain triton imports."""
    tree = parse_source(text)
    defs = _top_level(tree)
    wanted, todo = [], list(names)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        node = defs.get(name)
        if node is None:
            raise KeyError(name)
        if isinstance(node, ast.FunctionDef) and not _is_jit(node) and name not in names:
            continue                 # a Python helper: not part of the device code
        wanted.append(name)
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        todo += [u for u in used if u in defs and u not in wanted
                 and (_is_jit(defs[u]) or isinstance(defs[u], ast.Assign))]
    order = [n for n in defs if n in wanted]          # keep the file's order
    parts = ["import triton", "import triton.language as tl", ""]
    lines = text.splitlines()
    for name in order:
        node = defs[name]
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append("\n".join(lines[start - 1:node.end_lineno]))
        parts.append("")
    return "\n".join(parts) + "\n"


def _load_module(path: Path, name: str):
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TunerError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def jit_module(code: EngineCode, relpath: str, names: list[str]):
    """A module holding the engine's jit functions `names` from `relpath`, built once per
    engine version and file content in the cache folder."""
    text = code.read(relpath)
    vet_imported_file(code, relpath, text)          # in every process that imports it
    source = cut_jit_functions(text, names)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    stem = re.sub(r"\W", "_", f"{code.engine}_{code.version}_{Path(relpath).stem}_{digest}")
    path = cache_dir() / f"{stem}.py"
    header = f"# Cut from {code.engine} {code.version} {relpath} ({code.where}) by tuner at run time.\n"
    if not _holds(path, header + source):
        atomic_write_text(path, header + source)
    return _load_module(path, f"tuner_engine_kernels.{stem}")


def _holds(path: Path, text: str) -> bool:
    """Whether the cached file at `path` is exactly `text` (read within bounds, never waited on:
    another text or a huge file there is written over; a FIFO or a device is refused by the
    writer, never replaced: tuner/paths.py)."""
    from tuner.reading import read_bytes
    try:
        return read_bytes(path, limit=len(text.encode()) + 1) == text.encode()
    except TunerError:
        return False


# -- whose code is imported: the engine files checked against its known releases ---------
# Timing an engine's kernel means importing the Triton code cut out of its files: a tampered
# wheel or extracted folder would run whatever it holds. Every such file is hashed and
# compared with the same file of the releases the launchers were written for (facts recorded
# from the released wheels by scripts/engine_release_files.py); one that matches none is
# refused unless the user says they trust it (--trust-engine-source, which sets TRUST_ENV
# for this process and the processes it starts).
RELEASE_FILES = Path(importlib.import_module("kernels").__file__ or "").parent / "engines" / "release_files.json"
TRUST_ENV = "TUNER_TRUST_ENGINE_SOURCE"


def file_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def known_release_files() -> dict:
    """{engine: {version: {file: sha256}}} of the released files whose code tuner imports."""
    try:
        return json.loads(RELEASE_FILES.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def trusted() -> bool:
    return os.environ.get(TRUST_ENV) == "1"


def vet_imported_file(code: EngineCode, relpath: str, text: str) -> dict:
    """{'sha256', 'releases'} of an engine file whose code is about to be imported: the known
    releases whose file is identical. One line (exit 2) when none is and the user did not
    say --trust-engine-source."""
    digest = file_digest(text)
    known = known_release_files().get(code.engine, {})
    same = sorted((v for v, files in known.items() if files.get(relpath) == digest), key=version_key)
    if not same and not trusted():
        versions = ", ".join(sorted(known, key=version_key)) or "none"
        raise TunerError(f"{code.engine}'s {relpath} from {code.where} (sha256 {digest[:16]}) matches no release "
                         f"tuner knows ({code.engine} {versions}); timing it would run its code here: if you "
                         "trust that source, add --trust-engine-source (or time our own kernels with "
                         "--kernel-source ours)")
    return {"sha256": digest, "releases": same}


def imported_files_text(files: dict) -> str:
    """The engine files a kernel imports code from, in words (for the run's plan)."""
    parts = []
    for rel, f in sorted(files.items()):
        known = f"as released in {', '.join(f['releases'])}" if f.get("releases") else \
            "matching no known release: imported because of --trust-engine-source"
        parts.append(f"{rel} (sha256 {f['sha256'][:16]}, {known})")
    return "imports code from " + "; ".join(parts)


# -- what a launcher mirrors, and whether the engine still matches it ---------------------
def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mirrored_hashes(code: EngineCode, mirrored: dict[str, list[str]]) -> dict[str, str]:
    """{'file:function': hash of its source} for every wrapper function a launcher mirrors."""
    out = {}
    for relpath, names in mirrored.items():
        text = code.read(relpath)
        for name in names:
            try:
                out[f"{relpath}:{name}"] = source_hash(function_source(text, name))
            except KeyError:
                out[f"{relpath}:{name}"] = "missing"
    return out


def extract(engine: str, source: str, out: Path, launcher_files: list[str] | Callable[[str], list[str]],
            tables: dict[str, str] | None = None) -> Path:
    """Copy the engine files its launcher needs (`launcher_files`, or a function of the version
    found giving them) and `tables` ({path: text}: its config tables and loader files, from the
    same source, so that it serves `tuner audit` too) out of `source` (wheel or installed engine)
    into `out`, with a manifest: a folder to carry where there is no wheel. All or nothing: every
    file is read and checked, then written into a temporary folder renamed into place at `out`
    (an earlier extract there replaced whole): a missing file, a full disk or a kill leaves none."""
    import shutil

    from tuner.paths import make_folder, new_temporary_folder, release_temporary_folder, remove_dead_temporary_folders
    # --out first: a folder it must not replace is refused whether or not the engine is at hand
    out = Path(os.path.abspath(out))
    if os.path.lexists(out):
        if out.is_symlink() or not out.is_dir():
            raise TunerError(f"--out {out} is not a folder")
        if any(out.iterdir()) and not (out / EXTRACT_MANIFEST).is_file():
            raise TunerError(f"--out {out} holds other files (no {EXTRACT_MANIFEST}); give a new or empty folder")
        if (out / EXTRACT_MANIFEST).is_file():          # another engine's extraction is not replaced unasked
            from tuner.reading import read_json_file
            try:
                was = read_json_file(out / EXTRACT_MANIFEST, "extraction manifest ")
            except TunerError:
                was = None
            if not isinstance(was, dict) or was.get("engine") != engine:
                what = f"{was.get('engine')}'s extracted source" if isinstance(was, dict) else "an extraction"
                raise TunerError(f"--out {out} holds {what}, not {engine}'s: give another folder (or remove it)")
    code = locate(engine, source)
    wanted = set(launcher_files(code.version) if callable(launcher_files) else launcher_files)
    texts = {rel: code.read(rel) for rel in sorted(wanted)}
    make_folder(out.parent)
    remove_dead_temporary_folders(out.parent, f".{out.name[:200]}.")     # what a killed extract left
    try:
        tmp, held = new_temporary_folder(out.parent, f".{out.name[:200]}.")
    except OSError as e:
        from tuner.errors import os_error_words
        raise TunerError(f"cannot write into {out.parent}: {os_error_words(e)}") from None
    old = None
    try:
        for rel, text in texts.items():
            atomic_write_text(tmp / rel, text, root=tmp)
        for rel, text in (kept := {r: t for r, t in (tables or {}).items() if r not in texts}).items():
            atomic_write_text(tmp / rel, text, root=tmp)
        atomic_write_json(tmp / EXTRACT_MANIFEST, {"engine": engine, "version": code.version, "extracted_from": code.where,
                                                   "files": {rel: source_hash(t) for rel, t in texts.items()},
                                                   **({"tables": len(kept)} if kept else {})}, root=tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        release_temporary_folder(tmp)
        if os.path.lexists(out):                       # an earlier extract (or an empty folder): replaced whole
            old = out.with_name(f".{out.name[:200]}.old.{os.getpid()}.tmp")
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.lexists(out):
            os.replace(old, out)
        raise
    finally:
        os.close(held)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def origin_for(engine: str, origins: list[str] | None) -> str | None:
    """Of the --engine-source paths given, the one that holds `engine` (wheels and folders
    of several engines may be given together); None when none does."""
    for origin in origins or []:
        path = Path(origin)
        if path.is_file() and _wheel_version(path, engine) is not None:
            return origin
        if path.is_dir():
            try:
                if path.name == engine and (path / "__init__.py").is_file():
                    return origin
                if _from_folder(path, engine) is not None:
                    return origin
            except TunerError:
                continue
    for origin in origins or []:
        if not Path(origin).exists():
            raise TunerError(f"--engine-source {origin} not found")
    return None
