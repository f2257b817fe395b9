"""`tuner install`'s job (tuner.api.install_results): a results folder's tables where an engine
reads them, the audit of what the install leaves first, the engine's load lines after."""

from __future__ import annotations

import contextlib
import logging
import shlex
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError

log = logging.getLogger("tuner")


def install_results(results: str | Path, engine: str, site_packages: str | None = None,
                    moe_config_dir: str | None = None, gpu: str | None = None, force: bool = False,
                    dry_run: bool = False, say: Callable[[str], None] = print, merge: bool = False,
                    min_gain: float = 0.02, engine_version: str | None = None, model: str | None = None) -> Path | None:
    """Install a results folder's tables where `engine` reads them (`tuner install`);
    returns the backup folder (None on a dry run). `say` gets what is (or would be) done:
    the audit of what the install leaves in place (error findings refuse it unless `force`),
    and the lines the engine logs when it loads each table, or finds none. Without the engine
    here, a config folder (`moe_config_dir`) or a dry run for `engine_version`
    (tuner/emit/install_target.py)."""
    from tuner.emit import install as inst
    from tuner.emit.install_target import install_target, shipped_copies

    results = Path(results)
    if not results.is_dir():
        raise TunerError(f"results folder {results} is a file, not a folder (a run's --out folder, with its "
                         "manifest.json)" if results.exists() else f"results folder {results} not found")
    where = install_target(engine, site_packages, moe_config_dir, dry_run, engine_version)
    site = where.site
    config_dir = Path(moe_config_dir) if moe_config_dir else None
    from tuner.plan.gpus import get_gpu
    target = get_gpu(gpu).cuda_name if gpu else None
    served = None
    if model:                        # the model the engine serves: a table tuned for another K is refused
        from tuner.plan.models import load_model
        served = load_model(model)
    if not where.present:
        what = f"a config folder for it, {config_dir}" if config_dir else "what an install into it would write"
        say(f"{where.label} is not installed here: {what}, by its loader rules (tuner/plan/engines.py)")

    def plan() -> tuple[list, list, list, list]:
        copies, notes = inst.plan_install(results, engine, site, force, config_dir, target, merge, where.version,
                                          where.present, min_gain, served)
        extra = shipped_copies(where, config_dir, notes) if config_dir else []
        inst.check_destinations([*extra, *copies])
        findings = inst.audit_install(copies, engine)
        errors = [f for f in findings if f.severity == "error"]
        if errors and not force:
            raise TunerError(f"refusing the install: the audit of what it would leave finds {len(errors)} error(s), "
                             f"first {Path(errors[0].table).name}: {errors[0].reason} (--force installs it anyway)")
        return copies, notes, extra, findings

    # Everything that refuses is checked before anything is written (the lock files included);
    # then the plan is made again under the install lock of every folder it may write, so that
    # what a --merge keeps is the table as it is when this install writes, not as it was
    # before another install finished.
    planned = plan()
    roots = list(inst.config_roots(site, engine, config_dir).values())
    # What the install says (its notes, the audit, each table) is said once it is done: a refused
    # or failed install (a full disk) ends in its one line, not after a page of notes.
    held: list[tuple[bool, str]] = []

    def hold(line: str) -> None:
        held.append((False, line))

    def flush() -> None:
        for is_note, line in held:
            log.warning("%s", line) if is_note else say(line)
        held.clear()

    with contextlib.nullcontext() if dry_run else inst.locked(roots, inst.BACKUP_ROOT):
        copies, notes, extra, findings = planned if dry_run else plan()
        for note in notes:
            held.append((True, note))
        grouped: dict[tuple[str, str, str], list[str]] = {}      # one line per finding, naming its tables
        for f in findings:
            grouped.setdefault((f.severity, f.kind, f.reason), []).append(Path(f.table).name)
        for (severity, kind, reason), names in grouped.items():
            tables = names[0] if len(names) == 1 else f"{len(names)} tables ({names[0]} and {len(names) - 1} more)"
            hold(f"audit: {severity}: {kind}: {tables}: {reason}")
        if not findings:
            hold(f"audit: the {len(copies)} tables pass `tuner audit`'s table checks as they would stand")
        if extra:
            hold(f"{'would copy' if dry_run else 'copying'} {len(extra)} shipped {engine} MoE tables "
                 f"into {config_dir} (the variable hides the package's own)")
        for label in sorted({c.not_a_gpu for c in copies if c.not_a_gpu}):
            count = sum(c.not_a_gpu == label for c in copies)
            hold(f"*** {label}: {count} of these {len(copies)} tables {'were' if count > 1 else 'was'} chosen on times "
                 f"that never came from a GPU{' (a cost model)' if label == 'SYNTHETIC' else ''}: "
                 f"{'installed' if not dry_run else 'installing them'} only because --force says so ***")
        for c in copies:
            hold(f"{'would install' if dry_run else 'install'} {where.show(c.dest)}"
                 + (f" (merged: kept M={','.join(map(str, c.merged['kept']))})" if c.merged else "")
                 + (f"  [{c.not_a_gpu}: never timed on a GPU]" if c.not_a_gpu else ""))
        from tuner.emit.install_target import engine_log_lines
        for line in engine_log_lines(copies, engine, site, config_dir, where.version, where.present):
            hold(line)
        if dry_run:
            flush()
            return None
        backup = inst.install(copies, engine, extra, lock=False)
        flush()
    say(f"{len(copies)} tables installed; backup in {backup} (`tuner install --restore --engine {engine}`)")
    if config_dir:
        from tuner.textwidth import command_lines

        # to be pasted: never cut without its `\` marks
        say("\n".join(command_lines(f"export {inst.ENV_VARS[engine]}={shlex.quote(str(config_dir.resolve()))}")))
    from tuner.plan.engines import install_notes
    in_package = any(config_dir is None or not str(c.dest).startswith(str(config_dir)) for c in copies)
    for line in install_notes(engine, in_package):
        say(line)
    return backup
