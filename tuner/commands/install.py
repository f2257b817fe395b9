"""`tuner install`: put a results folder's tables where an engine reads them, or --restore the
last install (tuner/emit/install.py does the writing)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.commands.options import fraction
from tuner.errors import TunerError
from tuner.plan.engine_releases import versions_text
from tuner.plan.engines import ENGINE_NAMES


def add_parser(sub, common) -> None:
    """`tuner install` and its options."""
    inst = sub.add_parser("install", help="put a results folder's tables where an engine reads them",
                          description="Install tuned tables into an engine's package (or a folder for its "
                          "config-directory variable); replaced files are backed up, --restore undoes it.")
    inst.add_argument("results", nargs="?", help="a results folder (with manifest.json)")
    inst.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    inst.add_argument("--site-packages", default=None, metavar="DIR",
                      help="the site-packages of the environment that runs the engine (default: this Python's)")
    inst.add_argument("--moe-config-dir", default=None, metavar="DIR",
                      help="put MoE tables in DIR for VLLM_TUNED_CONFIG_FOLDER / SGLANG_MOE_CONFIG_DIR instead")
    inst.add_argument("--engine-version", default=None, metavar="V",
                      help="the engine's version; needed where the engine is not installed (a container built "
                      "elsewhere): with --moe-config-dir, writes that version's config folder; with --dry-run, says "
                      f"what an install would write (the releases tuner knows: {versions_text()})")
    inst.add_argument("--gpu", default=None, help="the GPU the engine runs on (default: this machine's, if any)")
    inst.add_argument("--model", default=None,
                      help="the model the engine serves (name in configs/models/ or a config.json): a MoE table tuned "
                      "for another K (hidden size; file names have none) is refused unless --force")
    inst.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    inst.add_argument("--force", action="store_true",
                      help="install tables measured on another device or Triton, or not numerically checked")
    inst.add_argument("--merge", action="store_true",
                      help="where a table would replace one covering batch sizes it lacks, keep the old entries for "
                      "those (recorded in the backup record); without it (or --force) such an install is refused")
    inst.add_argument("--min-gain", type=fraction, default=0.02, metavar="FRACTION",
                      help="with --merge: an installed row stays unless the new one, timed on the same device under "
                      "the same measurement policy, is faster by more than this (default 0.02: 2%%)")
    inst.add_argument("--restore", action="store_true",
                      help="undo the last install for --engine (with --site-packages or --moe-config-dir: the last "
                      "into that environment or folder), finished or interrupted; it says which")


def run(args) -> int:
    from tuner import api
    from tuner.emit import install as inst

    if args.restore:
        from tuner.emit.install_target import restore_roots
        for line in inst.restore(args.engine, roots=restore_roots(args.engine, args.site_packages,
                                                                  args.moe_config_dir)):
            print(line)
        if args.moe_config_dir:
            print(*_emptied_folder_lines(args.engine, Path(args.moe_config_dir)), sep="\n")
        return 0
    if not args.results:
        raise TunerError("give a results folder to install (or --restore)")
    api.install_results(args.results, args.engine, args.site_packages, args.moe_config_dir, args.gpu, args.force,
                        args.dry_run, merge=args.merge, min_gain=args.min_gain, engine_version=args.engine_version,
                        model=args.model)
    return 0


def _emptied_folder_lines(engine: str, folder: Path) -> list[str]:
    """After a restore out of a --moe-config-dir: where the folder holds no table any more, the
    variable the install told the user to export still points the engine at it (a new user's
    finding: nothing said to unset it). Its folders stay: SGLang raises on a missing configs/."""
    from tuner.plan.engines import table_family
    family = table_family(engine, "fused_moe")
    looked = 0
    for _, dirs, files in os.walk(folder):
        looked += len(dirs) + len(files)
        if any(f.endswith(".json") for f in files) or looked > 4096:
            return []
    line = f"{folder} holds no table now: unset {family.env_var} where {engine} runs, if it is set to it"
    if family.env_replaces_root:
        line += f" ({engine} reads that folder alone while it is set: its default configs would run, not its package's tables)"
    return [line]
