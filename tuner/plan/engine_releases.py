"""The engine releases tuner launches and audits, read from data (configs/engines/<engine>.yaml,
and the same-named file in each folder TUNER_CONFIG_DIRS names) and checked when first used, so
that a release is added by a file, not by code. Per release: for each kernel the engine's
launcher runs, the hash of every wrapper function it mirrors, of each jit kernel's parameter
list and the few launch differences of that release (or why tuner does not launch it there);
and the hash of every loader function the loader rules were read from. A test checks every
release against its wheel (tests/test_engine_versions.py, tests/test_loader_rules.py).

An entry may be `like` an earlier one: it has that entry's data, with what it gives replacing
it key by key (a function hash of null: this release has no such loader function).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import config_dirs

ENGINES_FOLDER = "engines"
_RELEASE_FIELDS = ("version", "like", "kernels", "loader")
_KERNEL_FIELDS = ("mirrored", "signatures", "launch", "refused")
_HASH = re.compile(r"[0-9a-f]{16}")
_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
_FUNCTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,200}\.py:[A-Za-z_][A-Za-z0-9_]{0,100}(\.[A-Za-z_][A-Za-z0-9_]{0,100})?")


@dataclass(frozen=True)
class Release:
    """One released engine version, as a launcher launches one of its kernels: the hashes of
    the wrapper functions the launcher mirrors, the hash of each jit kernel's parameter list
    (`signature_hash`), and the few launch differences of that version (small data, keyed by
    name, read by the one launcher of the engine)."""
    version: str
    mirrored: dict[str, str]
    signatures: dict[str, str]
    launch: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EngineRelease:
    """One release of an engine as the data says it: its kernels' launch data, the kernels
    tuner does not launch there (and why), and its loader functions' hashes."""
    engine: str
    version: str
    kernels: dict[str, Release]
    refused: dict[str, str]
    loader: dict[str, str]
    path: Path                    # the file it was read from


def version_key(version: str) -> tuple:
    from tuner.plan.kernel_sources import version_key as key
    return key(version)


def _engines() -> dict[str, set[str]]:
    """{engine: the kernels (table families) its rules know}."""
    from tuner.plan.engine_rules import RULES
    return {r.ENGINE.name: set(r.TABLE_FAMILIES) for r in RULES}


def _shown(value) -> str:
    return repr(str(value)[:50])


def _functions(value, where: str, what: str, engine: str, base: dict | None, nulls: bool) -> dict:
    """A mapping of 'file:function' to a hash, checked; merged over `base` when given (whose
    keys it may only replace; a null drops one where `nulls`)."""
    if not isinstance(value, dict):
        raise TunerError(f"{where}: {what} must be a mapping of 'file.py:function' to a hash")
    out = dict(base or {})
    for key, digest in value.items():
        if not isinstance(key, str) or not _FUNCTION.fullmatch(key) or not key.startswith(f"{engine}/"):
            raise TunerError(f"{where}: {what} names {_shown(key)}, not a function as '{engine}/....py:name'")
        if base is not None and key not in base:
            raise TunerError(f"{where}: {what} names {key}, which the release it is like has not (give the "
                             "whole entry, without like, to add a function)")
        if digest is None and nulls:
            out.pop(key, None)
            continue
        if not isinstance(digest, str) or not _HASH.fullmatch(digest):
            raise TunerError(f"{where}: {what} {key} must be a hash of 16 hexadecimal digits (quoted), "
                             f"not {_shown(digest)}")
        out[key] = digest
    return out


def _launch(value, where: str, base: dict | None) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) and re.fullmatch(r"[a-z_]{1,40}", k) for k in value):
        raise TunerError(f"{where}: launch must be a mapping of names (lower case) to values")
    for k, v in value.items():
        if not isinstance(v, (str, int, bool)) or (isinstance(v, str) and not re.fullmatch(r"[a-z_0-9]{1,40}", v)):
            raise TunerError(f"{where}: launch {k} must be a number, true/false or a word, not {_shown(v)}")
        if base is not None and k not in base:
            raise TunerError(f"{where}: launch names {k}, which the release it is like has not")
    return {**(base or {}), **value}


def _kernel(value, where: str, engine: str, version: str, base: Release | None) -> Release | str:
    """A kernel's data (a Release), or the line saying why tuner does not launch it."""
    if not isinstance(value, dict) or not value:
        raise TunerError(f"{where}: each kernel is a mapping of {', '.join(_KERNEL_FIELDS)}")
    unknown = sorted(set(map(str, value)) - set(_KERNEL_FIELDS))
    if unknown:
        raise TunerError(f"{where}: unknown field {unknown[0]!r} (the fields: {', '.join(_KERNEL_FIELDS)})")
    if "refused" in value:
        why = value["refused"]
        if len(value) > 1 or not isinstance(why, str) or not 0 < len(why) <= 300 or not why.isprintable():
            raise TunerError(f"{where}: refused must stand alone and say why, in one line of at most 300 characters")
        return why
    if base is None:
        missing = [k for k in ("mirrored", "signatures") if k not in value]
        if missing:
            raise TunerError(f"{where}: no {missing[0]!r}")
    mirrored = _functions(value.get("mirrored", {}), where, "mirrored", engine, base.mirrored if base else None, False)
    signatures = _functions(value.get("signatures", {}), where, "signatures", engine,
                            base.signatures if base else None, False)
    if not signatures:
        raise TunerError(f"{where}: signatures must name the kernel's jit functions")
    launch = _launch(value.get("launch", {}), where, base.launch if base else None)
    return Release(version, mirrored, signatures, launch)


def _release(entry, where: str, engine: str, kernels: set[str], known: dict[str, EngineRelease],
             path: Path) -> EngineRelease:
    if not isinstance(entry, dict):
        raise TunerError(f"{where}: each release is a mapping of {', '.join(_RELEASE_FIELDS)}")
    unknown = sorted(set(map(str, entry)) - set(_RELEASE_FIELDS))
    if unknown:
        raise TunerError(f"{where}: unknown field {unknown[0]!r} (the fields: {', '.join(_RELEASE_FIELDS)})")
    version = entry.get("version")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise TunerError(f"{where}: version must be a release number as '0.31.0' (quoted), not {_shown(version)}")
    where = f"{where} ({engine} {version})"
    if version in known:
        raise TunerError(f"{where}: {engine} {version} is given twice (first in {known[version].path})")
    like = entry.get("like")
    if like is not None and (not isinstance(like, str) or like not in known):
        raise TunerError(f"{where}: like must name a release given before it "
                         f"({', '.join(known) or 'none yet'}), not {_shown(like)}")
    base = known[like] if like is not None else None
    if base is None:
        missing = [k for k in ("kernels", "loader") if k not in entry]
        if missing:
            raise TunerError(f"{where}: no {missing[0]!r}")
    given = entry.get("kernels", {})
    if not isinstance(given, dict):
        raise TunerError(f"{where}: kernels must be a mapping of kernel names ({', '.join(sorted(kernels))})")
    out: dict[str, Release] = {k: Release(version, r.mirrored, r.signatures, r.launch)
                               for k, r in (base.kernels.items() if base else ())}
    refused = dict(base.refused) if base else {}
    for name, value in given.items():
        if name not in kernels:
            raise TunerError(f"{where}: no kernel {_shown(name)} ({engine}'s: {', '.join(sorted(kernels))})")
        got = _kernel(value, f"{where}, {name}", engine, version, out.get(name))
        if isinstance(got, str):
            out.pop(name, None)
            refused[name] = got
        else:
            refused.pop(name, None)
            out[name] = got
    loader = _functions(entry.get("loader", {}), f"{where}, loader", "loader", engine,
                        base.loader if base else None, True)
    if not out:
        raise TunerError(f"{where}: tuner launches none of its kernels: give one")
    return EngineRelease(engine, version, out, refused, loader, path)


def load_releases(folders: list[Path]) -> dict[str, list[EngineRelease]]:
    """Every release of the `engines/<engine>.yaml` files in `folders`, in order, per engine,
    sorted by version; the repository's folder (the first) must hold a file per engine."""
    from tuner.reading import read_yaml_file
    engines = _engines()
    out: dict[str, list[EngineRelease]] = {}
    for engine, kernels in engines.items():
        known: dict[str, EngineRelease] = {}
        for folder in folders:
            path = folder / ENGINES_FOLDER / f"{engine}.yaml"
            if not path.exists() and folder != folders[0]:
                continue
            data = read_yaml_file(path, "the engine release file ")
            if not isinstance(data, dict) or set(data) != {"releases"} or not isinstance(data["releases"], list):
                raise TunerError(f"the engine release file {path} must hold one key, releases: a list of releases")
            for i, entry in enumerate(data["releases"]):
                release = _release(entry, f"the engine release file {path}, release {i + 1}", engine, kernels,
                                   known, path)
                known[release.version] = release
        out[engine] = sorted(known.values(), key=lambda r: version_key(r.version))
    for folder in folders[1:]:
        stray = sorted(p.name for p in (folder / ENGINES_FOLDER).glob("*.yaml") if p.stem not in engines)
        if stray:
            raise TunerError(f"{folder / ENGINES_FOLDER / stray[0]}: no engine {Path(stray[0]).stem!r} "
                             f"(the engines: {', '.join(engines)})")
    return out


_READ: list = []          # [(folders, {engine: [EngineRelease]})]: read once per TUNER_CONFIG_DIRS


def releases(engine: str) -> list[EngineRelease]:
    """The releases of `engine` the data holds, oldest first (one line where it does not check)."""
    folders = tuple(config_dirs())
    if not _READ or _READ[0][0] != folders:
        _READ[:] = [(folders, load_releases(list(folders)))]
    return _READ[0][1][engine]


def supported_versions(engine: str) -> list[str]:
    return [r.version for r in releases(engine)]


def kernel_releases(engine: str, kernel: str, launch_values: Mapping[str, tuple] | None = None) -> list[Release]:
    """The releases whose `kernel` tuner launches, oldest first. `launch_values`: the launch
    data the engine's launcher reads ({name: the values it knows}); every release must give
    each, with one of those values (one line otherwise)."""
    found = []
    for r in releases(engine):
        if kernel not in r.kernels:
            continue
        release = r.kernels[kernel]
        if launch_values is not None:
            where = f"the engine release file {r.path} ({engine} {r.version}), {kernel}"
            unknown = sorted(set(release.launch) - set(launch_values))
            if unknown:
                raise TunerError(f"{where}: launch {unknown[0]} is nothing the launcher reads "
                                 f"({', '.join(launch_values) or 'it reads none'})")
            for name, values in launch_values.items():
                if name not in release.launch:
                    raise TunerError(f"{where}: no launch {name} (one of {', '.join(map(str, values))})")
                value = release.launch[name]
                if value not in values or type(value) is not type(values[0]):
                    raise TunerError(f"{where}: launch {name} must be one of {', '.join(map(str, values))}, "
                                     f"not {_shown(value)}")
        found.append(release)
    return found


def refused_kernel(engine: str, kernel: str, version: str) -> str | None:
    """Why tuner does not launch `kernel` of `engine` `version`, where the data says so."""
    return next((r.refused.get(kernel) for r in releases(engine) if r.version == version), None)


def loader_functions(engine: str) -> dict[str, dict[str, str]]:
    """{release: {'file:function': hash}} of the loader functions the rules were read from."""
    return {r.version: r.loader for r in releases(engine)}


def versions_text() -> str:
    """The releases the data holds, for a help line; where the data cannot be read, where it lives."""
    try:
        return "; ".join(f"{e} {', '.join(supported_versions(e))}" for e in _engines())
    except TunerError:
        return "the releases of configs/engines/"
