"""Tables an audit finds that were chosen on times no GPU took.

`tuner install` refuses a SYNTHETIC or CPU-device run's tables unless forced, and records what
it installed (its backup record's `timed_on`); a results folder's manifest says the same of its
own tables. A table read from either that was never measured on a GPU is an error finding,
`not_measured`: an error where tuner installed it (forced into a deployment: an audit gating the
deployment fails on it, where it passed, exit 0, with one line at the end saying SYNTHETIC, found
by a new user), a warning where it lies in a results folder audited as it is (the try without a
GPU audits its own synthetic run so)."""

from __future__ import annotations

from pathlib import Path

from tuner.emit.audit_rules import Finding


def not_measured_mark(table: Path, engine: str, backup_root: Path) -> tuple[str, bool] | None:
    """('SYNTHETIC' or 'CPU DEVICE', installed) where `table`'s rows were chosen on such times, by the
    newest install record of it whose sha256 is the file's now (a record of other bytes, forged or
    outdated by an edit, says nothing of it), else by the manifest of the results folder it lies in
    (reached through a link too); None where measured or unknown."""
    from tuner.emit.backups import sha256_of
    from tuner.emit.merge_rule import installed_entry
    from tuner.emit.table_origin import manifest_entry_of
    from tuner.errors import TunerError
    from tuner.measure.provenance import CPU_DEVICE, is_synthetic, not_a_gpu
    from tuner.reading import read_bytes
    try:
        digest = sha256_of(read_bytes(table, "table "))
    except (OSError, TunerError):
        return None           # unreadable: the audit's own findings say so
    entry = installed_entry(table, engine, backup_root,
                            lambda e: isinstance(e.get("timed_on"), dict) and e.get("sha256") == digest)
    if entry is not None:
        mark = entry["timed_on"].get("not_a_gpu")
        if not mark:
            return None
        return (mark if mark in ("SYNTHETIC", CPU_DEVICE) else "non-GPU"), True
    found = manifest_entry_of(table, engine)
    env = found.get("environment") if found else None
    if isinstance(env, dict) and not_a_gpu(env):
        return ("SYNTHETIC" if is_synthetic(env) else CPU_DEVICE), False
    return None


def not_measured_findings(kernels: list, engine: str, backup_root: Path) -> list[Finding]:
    """One finding per table read whose rows no GPU timed (added to its kernel's findings too)."""
    out: list[Finding] = []
    for ka in kernels:
        if not ka.resolved.found or any(f.table == ka.where for f in out):     # a _down reading the up table: once
            continue
        got = not_measured_mark(Path(ka.where), engine, backup_root)
        if got:
            mark, installed = got
            f = Finding("error" if installed else "warning", "not_measured",
                        f"its rows were chosen on {mark} times, never measured on a GPU: no server should run them "
                        + ("(tune on the GPU and install that run's tables)" if installed else
                           "(tuner install refuses them)"), ka.where)
            ka.findings.append(f)
            out.append(f)
    return out
