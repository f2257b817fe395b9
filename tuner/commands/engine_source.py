"""`tuner engine-source fetch` and `extract`: get an engine's code without installing the engine.

`fetch vllm==0.33.0` downloads the engine's released wheel with pip (never installing it) into a
per-user cache (~/.cache/tuner/engine-wheels, `$TUNER_CACHE_DIR`) where every command then finds
it by itself, and checks that the files whose kernels tuner times are the release's. `extract`
copies those few files out of a wheel (or the installed engine), to carry to a GPU machine
without network."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tuner.commands.options import Parser
from tuner.errors import TunerError
from tuner.plan.engines import ENGINE_NAMES


def add_parser(sub, common) -> None:
    """`tuner engine-source` and its actions."""
    src = sub.add_parser("engine-source", help="get an engine's kernel code: fetch its wheel, or extract its files",
                         description="Get the engine code whose kernels tuner times, without installing the engine: "
                         "`fetch` downloads its released wheel with pip into a cache every command then reads; "
                         "`extract` copies the few source files out of a wheel into a folder small enough to carry "
                         "to a GPU machine without network (give it as --engine-source).")
    src_sub = src.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    fetch = src_sub.add_parser(
        "fetch", help="download an engine's wheel into the cache tuner reads by itself",
        description="Download ENGINE==VERSION's released wheel with `pip download --no-deps --only-binary=:all:` "
        "(nothing is installed) into ~/.cache/tuner/engine-wheels ($TUNER_CACHE_DIR/engine-wheels), checked "
        "against the files of the releases tuner knows. Every command that needs the engine's code finds it there "
        "(after --engine-source, the installed engine and $TUNER_ENGINE_WHEELS).",
        epilog="examples:\n  tuner engine-source fetch vllm==0.33.0\n"
               "  tuner engine-source fetch sglang --find-links /mnt/wheels --no-index   # offline, from a folder")
    fetch.add_argument("spec", metavar="ENGINE[==VERSION]",
                       help=f"{' or '.join(ENGINE_NAMES)}, with a version (default: the newest release tuner knows)")
    fetch.add_argument("--find-links", default=None, metavar="DIR|URL", help="pip's --find-links: also look there")
    fetch.add_argument("--index-url", default=None, metavar="URL", help="pip's --index-url (default: pip's own)")
    fetch.add_argument("--no-index", action="store_true", help="pip's --no-index: only --find-links")
    fetch.add_argument("--trust-engine-source", action="store_true",
                       help="fetch a release tuner does not know (refused before pip runs without this flag): its "
                       "kernels then run only with --trust-engine-source")
    ext = src_sub.add_parser("extract", help="extract the kernel files of an engine",
                             epilog="example:\n  tuner engine-source extract --engine vllm --out vllm-kernels")
    ext.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    ext.add_argument("--from", dest="source", default=None, metavar="PATH",
                     help="the engine's wheel or a folder holding it (default: the installed engine, then "
                     "$TUNER_ENGINE_WHEELS and the wheels fetched)")
    ext.add_argument("--out", required=True, metavar="DIR")


def run(args) -> int:
    if args.action == "fetch":
        return run_fetch(args)
    if args.action != "extract":
        raise TunerError("say what to do: `tuner engine-source fetch vllm==0.33.0` or "
                         "`tuner engine-source extract --engine vllm --out DIR`")
    from tuner.plan.kernel_registry import engine_files, refused_kernels
    from tuner.plan.kernel_sources import extract
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file")
    tables = engine_tables(args.engine, args.source)
    version: list[str] = []

    def files(found: str) -> list[str]:      # the release's own: a kernel not launched at it is not copied
        version.append(found)
        return engine_files(args.engine, found)
    folder = extract(args.engine, args.source, out, files, tables)
    for kernel, why in refused_kernels(args.engine, version[0]).items():
        print(f"not extracted: {args.engine} {version[0]}'s {kernel}, which tuner does not launch: {why}")
    files_copied = sorted(p for p in folder.rglob("*.py"))
    size = sum(p.stat().st_size for p in files_copied)
    print(f"{len(files_copied)} {args.engine} files ({size / 1024:.0f} KiB) and {len(tables)} config tables in "
          f"{folder}/; use it as --engine-source {folder}")
    return 0


def engine_tables(engine: str, source: str | None) -> dict[str, str]:
    """The engine's config tables and loader files ({path in the package: text}) from the
    installation `extract` reads (the same wheel or install), so that the folder it makes
    also serves `tuner audit` and `tuner coverage` (the GPU run orders its work by them)."""
    from tuner.emit.engine_tables import locate_installation
    from tuner.plan.engines import LOADER_FUNCTIONS, TABLE_FAMILIES
    try:
        inst = locate_installation(engine, engine_source=[source] if source else None)
    except TunerError:
        return {}
    if inst.files is None:
        return {}
    rels = {f for (e, _), fam in TABLE_FAMILIES.items() if e == engine for f in inst.files.walk(fam.folder)
            if f.endswith(".json")}
    rels |= {key.rsplit(":", 1)[0] for functions in LOADER_FUNCTIONS[engine].values() for key in functions}
    out = {}
    for rel in sorted(rels):
        try:
            out[rel] = inst.files.read(rel).decode()
        except (KeyError, OSError, TunerError, UnicodeDecodeError):
            continue
    return out


SPEC = re.compile(r"(?P<engine>[a-z]+)(==(?P<version>[0-9][0-9A-Za-z.+-]*))?")


def parse_spec(text: str) -> tuple[str, str]:
    """'vllm==0.33.0' -> ('vllm', '0.33.0'); 'vllm' -> the newest release tuner knows."""
    from tuner.plan.kernel_sources import newest_known
    m = SPEC.fullmatch(text.strip())
    if not m or m["engine"] not in ENGINE_NAMES:
        raise TunerError(f"fetch takes ENGINE or ENGINE==VERSION with ENGINE one of {', '.join(ENGINE_NAMES)}, "
                         f"not {text[:60]!r}")
    version = m["version"] or newest_known(m["engine"])
    if not version:
        raise TunerError(f"name the version: `tuner engine-source fetch {m['engine']}==VERSION`")
    return m["engine"], known_spelling(m["engine"], version)


def known_spelling(engine: str, version: str) -> str:
    """A version as the release tuner knows spells it: '0.32' is 0.32.0 (pip takes them as one
    release, and its wheel is named 0.32.0); any other version as given."""
    from tuner.plan.kernel_sources import known_release_files

    def padded(v: str) -> tuple:
        parts = v.split(".")
        return tuple(parts + ["0"] * (3 - len(parts))) if all(p.isdigit() for p in parts) else (v,)
    return next((k for k in known_release_files().get(engine, {}) if padded(k) == padded(version)), version)


def pip_command(engine: str, version: str, dest: Path, find_links: str | None = None, index_url: str | None = None,
                no_index: bool = False) -> list[str]:
    """The pip download of one engine wheel, nothing else (no dependencies, never a source build)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--dest", str(dest), *(["--find-links", find_links] if find_links else []),
            *(["--index-url", index_url] if index_url else []), *(["--no-index"] if no_index else []),
            f"{engine}=={version}"]


def run_fetch(args) -> int:
    engine, version = parse_spec(args.spec)
    from tuner.plan.kernel_sources import known_release_files, version_key
    known = sorted(known_release_files().get(engine, {}), key=version_key)
    if version not in known and not getattr(args, "trust_engine_source", False):
        raise TunerError(f"{engine} {version} is not a release tuner knows ({', '.join(known)}): fetch one of those, "
                         "or add --trust-engine-source to fetch it anyway (its kernels then run only with "
                         "--trust-engine-source)")
    wheel = fetch(engine, version, args.find_links, args.index_url, args.no_index)
    print(f"{engine} {version}: {wheel} ({wheel.stat().st_size / 1e6:.0f} MB); every command finds it there by "
          f"itself (after --engine-source, an installed {engine} and $TUNER_ENGINE_WHEELS)")
    return 0


def fetch(engine: str, version: str, find_links: str | None = None, index_url: str | None = None,
          no_index: bool = False, runner=subprocess.run) -> Path:
    """The engine's wheel in the cache (tuner/plan/kernel_sources.py fetched_wheels_dir),
    downloaded by pip into a temporary folder there and moved into place only once its files
    are checked: nothing half-downloaded or foreign is ever left where the tool looks."""
    import os
    import shutil

    from tuner.paths import make_folder, new_temporary_folder, remove_dead_temporary_folders
    from tuner.plan.kernel_sources import _wheel_version, fetched_wheels_dir
    cache = fetched_wheels_dir()
    have = [w for w in cache.glob(f"{engine}-{version}-*.whl") if _wheel_version(w, engine) == version] \
        if cache.is_dir() else []
    if have:
        check_wheel(have[0], engine, version)
        return have[0]
    make_folder(cache)
    remove_dead_temporary_folders(cache, ".")           # what a killed fetch left (a download: ~300 MB)
    tmp, held = new_temporary_folder(cache, f".{engine}-{version}.")
    try:
        cmd = pip_command(engine, version, tmp, find_links, index_url, no_index)
        print(f"fetching {engine}=={version} with pip (its wheel only, not installed) ...", file=sys.stderr, flush=True)
        import signal

        from tuner.measure.process_tree import child_of_this_process
        try:
            # pip dies with us, kill -9 included (PR_SET_PDEATHSIG): a killed fetch leaves no
            # download running on, orphaned (its temporary folder is cleared by the next fetch)
            done = runner(cmd, stdin=subprocess.DEVNULL, preexec_fn=child_of_this_process(signal.SIGKILL))
        except OSError as e:
            raise TunerError(f"cannot run pip ({' '.join(cmd[:3])}): {e.strerror}") from None
        if done.returncode != 0:
            raise TunerError(f"pip could not download {engine}=={version} (exit {done.returncode}; its output is "
                             "above): check the version and the network, or give --find-links DIR with the wheel")
        wheels = [w for w in tmp.glob(f"{engine}-*.whl") if _wheel_version(w, engine) == version]
        if len(wheels) != 1:
            raise TunerError(f"pip left no {engine} {version} wheel (it found {sorted(p.name for p in tmp.iterdir())})")
        check_wheel(wheels[0], engine, version)
        final = cache / wheels[0].name
        os.replace(wheels[0], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(held)


def check_wheel(wheel: Path, engine: str, version: str) -> None:
    """The wheel's files whose kernels tuner times are those of the release (when tuner knows
    it): one line naming the first that differs, before it is ever used."""
    from tuner.plan.kernel_sources import file_digest, known_release_files, locate
    code = locate(engine, str(wheel))
    known = known_release_files().get(engine, {}).get(version)
    if not known:
        print(f"tuner: note: {engine} {version} is not a release tuner knows: timing its kernels will need "
              "--trust-engine-source", file=sys.stderr)
        return
    for rel, digest in sorted(known.items()):
        if file_digest(code.read(rel)) != digest:
            raise TunerError(f"{wheel}: its {rel} is not {engine} {version}'s as released (sha256 differs); "
                             "not kept")
