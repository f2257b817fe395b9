"""`tuner engine-source extract`: copy the few engine files the launchers import out of a wheel
(or the installed engine), to carry to a GPU machine without network."""

from __future__ import annotations

from pathlib import Path

from tuner.commands.options import Parser
from tuner.errors import TunerError
from tuner.plan.engines import ENGINE_NAMES


def add_parser(sub, common) -> None:
    """`tuner engine-source` and its action."""
    src = sub.add_parser("engine-source", help="copy the engine files the launchers need out of a wheel",
                         description="Extract, from an engine's wheel (or the installed engine), the few source "
                         "files whose kernels tuner times, into a folder small enough to carry to a GPU machine "
                         "without network; give that folder as --engine-source.")
    src_sub = src.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    ext = src_sub.add_parser("extract", help="extract the kernel files of an engine")
    ext.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    ext.add_argument("--from", dest="source", default=None, metavar="PATH",
                     help="the engine's wheel or a folder holding it (default: the installed engine, then "
                     "$TUNER_ENGINE_WHEELS)")
    ext.add_argument("--out", required=True, metavar="DIR")


def run(args) -> int:
    from tuner.plan.kernel_registry import launcher
    from tuner.plan.kernel_sources import extract
    if args.action != "extract":
        raise TunerError("say what to do: `tuner engine-source extract --engine vllm --out DIR`")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file")
    folder = extract(args.engine, args.source, out, launcher(args.engine).FILES)
    files = sorted(p for p in folder.rglob("*.py"))
    size = sum(p.stat().st_size for p in files)
    print(f"{len(files)} {args.engine} files ({size / 1024:.0f} KiB) in {folder}/; use it as --engine-source {folder}")
    return 0
