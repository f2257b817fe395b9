"""What `tuner install` replaces, kept, and undone by `tuner install --restore`.

Installs into one folder are serialized by a lock (a flock on a file beside the backups, so
a killed install never leaves a stale one). Each install gets a backup folder named by a
sequence number taken when the folder is made (`vllm-00000007-20260101T120000-4242`): two
installs in one second, or in one process, never tie, and "the last install" is the highest
number, never the last name in sort order. Its record.json lists every file written, the
copy of what it replaced (or none: a new file) and the SHA-256 of what was written.

An install is a transaction (issue 42): its record (the resolved absolute target folders,
each file it will write, the copy of its prior content) goes down with state "writing" before
the first file is touched, and says "done" once the last is written. A restore undoes an
install whatever point it was killed at: each file is as the install wrote it or still as it
was (not reached yet), and either way ends as it was. An install that finds an interrupted
one into its folders rolls it back first. A file that is neither (another install restored
out of order, an engine upgrade, a hand edit) is not a copy that exists anywhere else, so
the restore is refused, in one line, with nothing changed, rather than lost. So the last copy
of what an engine shipped is never deleted: a backup folder is removed (renamed out of the
installs' order first, so a kill mid-removal leaves no half record) only once all it held is
back in place. A record is a JSON object others may add keys to; readers ignore keys they do
not know.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import (
    atomic_write_bytes,
    atomic_write_json,
    inside,
    make_folder,
    open_for_append,
    remove_stale_temporaries,
    writable_folder,
)
from tuner.plan.engines import ENGINES

RECORD = "record.json"
# a record's state: an install under way (or killed), finished, being undone (or killed undoing)
WRITING, DONE, UNDOING = "writing", "done", "undoing"
RESTORED = "restored-"                  # a backup folder whose install was undone, being removed
LOCK_WAIT_S = float(os.environ.get("TUNER_INSTALL_LOCK_WAIT", "60"))
SEQUENCE_DIGITS = 8
# Backup folders of installs before the sequence: <engine>-<YYYYmmddTHHMMSS>-<pid>; they sort
# before every numbered one, among themselves by time, then pid.
_LEGACY = re.compile(r"^(?P<engine>[a-z]+)-(?P<time>\d{8}T\d{6})-(?P<pid>\d+)$")
_NUMBERED = re.compile(r"^(?P<engine>[a-z]+)-(?P<seq>\d{%d})-" % SEQUENCE_DIGITS)


def check_writable_folders(paths: list[Path]) -> None:
    for d in sorted({p.parent for p in paths}):
        ok, existing = writable_folder(d)
        if not ok:
            raise TunerError(f"cannot write to {existing}: permission denied or not a folder (nothing was installed)")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def locked(folders: list[Path], backup_root: Path, wait_s: float | None = None):
    """One install or restore at a time per target folder: the second waits up to wait_s,
    then refuses with one line. Lock files live beside the backups, not in the engine.
    Folders are locked in one order (their real paths, sorted), so two lockers never wait
    on each other in a circle."""
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    lock_dir = backup_root / "locks"
    ok, existing = writable_folder(lock_dir)
    if not ok:
        raise TunerError(f"cannot write to {existing} (backups and locks go there; set TUNER_BACKUP_DIR)")
    make_folder(lock_dir, backup_root)
    handles = []
    try:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            name = hashlib.sha256(folder.encode()).hexdigest()[:16]
            f = open_for_append(lock_dir / f"{name}.lock", lock_dir)
            handles.append(f)
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TunerError(f"another tuner install is writing to {folder}; waited {wait_s:.0f}s "
                                         "(TUNER_INSTALL_LOCK_WAIT): try again when it is done") from None
                    time.sleep(0.05)
        yield
    finally:
        for f in handles:
            f.close()          # closing releases the lock


def clear_leftovers(folders: list[Path], engine: str, backup_root: Path) -> list[str]:
    """Under the lock: temporary files a killed install left in the target folders, and
    backup folders whose record never got written (a kill before it: nothing was replaced
    yet, the record goes down first), older than a minute."""
    cleared = [str(p) for f in folders for p in remove_stale_temporaries(f)]
    for folder in backup_root.glob(f"{engine}-*"):
        if folder.is_dir() and not folder.is_symlink() and not (folder / RECORD).exists() \
                and time.time() - folder.stat().st_mtime > 60:
            shutil.rmtree(folder, ignore_errors=True)
            cleared.append(str(folder))
    for folder in backup_root.glob(f"{RESTORED}{engine}-*"):      # a restore killed while removing it
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
    return cleared


def order_key(folder: Path, engine: str) -> tuple | None:
    """Where a backup folder stands among an engine's installs (None: not one of them)."""
    m = _NUMBERED.match(folder.name)
    if m and m.group("engine") == engine:
        return (1, int(m.group("seq")), folder.name)
    m = _LEGACY.match(folder.name)
    if m and m.group("engine") == engine:
        return (0, m.group("time"), int(m.group("pid")))
    return None


def new_backup_folder(engine: str, backup_root: Path) -> tuple[Path, int]:
    """A fresh backup folder and its sequence number: one more than any of the engine's, the
    folder made with mkdir (which fails when another install took the number first: then the
    next). Two installs never share a number, and a later one always gets a higher one."""
    make_folder(backup_root)
    while True:
        numbers = [k[1] for p in backup_root.glob(f"{engine}-*") if (k := order_key(p, engine)) and k[0] == 1]
        seq = max(numbers, default=0) + 1
        if seq >= 10 ** SEQUENCE_DIGITS:
            raise TunerError(f"{backup_root} holds {engine} backups numbered up to {seq - 1}: move old ones aside")
        folder = backup_root / f"{engine}-{seq:0{SEQUENCE_DIGITS}d}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        return folder, seq


def _recorded(engine: str, backup_root: Path) -> list[Path]:
    """The engine's backup folders with a record, newest install first."""
    found = [(k, p.parent) for p in backup_root.glob(f"{engine}-*/{RECORD}")
             if (k := order_key(p.parent, engine)) is not None and not p.parent.is_symlink()]
    return [b for _, b in sorted(found, reverse=True)]


def real(folder) -> str:
    return os.path.realpath(folder)


def record_roots(record: dict) -> set[str]:
    """The folders (real paths) an install recorded writing into: its roots, else (a record
    from before roots were recorded) the folder of each file."""
    roots = {real(r) for r in record.get("roots") or [] if isinstance(r, str)}
    return roots or {real(Path(e["dest"]).parent) for e in record.get("files", [])}


def latest_backup(engine: str, backup_root: Path, roots: list[Path] | None = None) -> Path:
    """The backup of the engine's last install (with a record), by sequence; with `roots`, the
    last install into those folders (every folder it wrote is one of them)."""
    found = _recorded(engine, backup_root)
    if not found:
        raise TunerError(f"no {engine} install to restore (no backups in {backup_root})")
    if roots is None:
        return found[0]
    wanted = {real(r) for r in roots}
    for backup in found:
        with contextlib.suppress(TunerError):
            if record_roots(read_record(backup, engine)) <= wanted:
                return backup
    last = ", ".join(sorted(record_roots(read_record(found[0], engine))))
    raise TunerError(f"no {engine} install into {', '.join(sorted(wanted))} to restore (the last {engine} install "
                     f"went to {last})")


def interrupted(engine: str, backup_root: Path, roots: list[Path]) -> list[Path]:
    """The installs into any of `roots` that were killed before they finished (record state
    "writing"), newest first. Called under the lock of `roots`: none of them is running."""
    wanted = {real(r) for r in roots}
    found = []
    for backup in _recorded(engine, backup_root):
        try:
            record = read_record(backup, engine)
        except TunerError:
            continue
        if record.get("state") in (WRITING, UNDOING) and record_roots(record) & wanted:
            if not record_roots(record) <= wanted:       # its other folders are not under our lock
                raise TunerError(f"an interrupted {engine} install ({backup.name}) wrote into "
                                 f"{', '.join(sorted(record_roots(record)))}: undo it first with `tuner install "
                                 f"--restore --engine {engine}` and the --site-packages/--moe-config-dir it was given")
            found.append(backup)
    return found


def describe(backup: Path, record: dict) -> str:
    """Which install a backup undoes, for the line a restore prints first."""
    when = record.get("installed") if isinstance(record.get("installed"), str) else backup.name
    state = {WRITING: " (interrupted: rolled back)", UNDOING: " (its undo was interrupted: finished)"}.get(
        str(record.get("state")), "")
    return f"the {record.get('engine')} install of {when} into {', '.join(sorted(record_roots(record)))}{state}"


def read_record(backup: Path, engine: str) -> dict:
    """A backup's record, checked: one clear line naming it when it cannot be trusted."""
    path = backup / RECORD
    hint = f"move {backup} aside to restore the installs before it"
    from tuner.reading import read_bytes
    try:
        record = json.loads(read_bytes(path, "backup record "))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise TunerError(f"backup record {path} is corrupt; {hint}") from None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("engine") != engine or not isinstance(files, list) or not all(
            isinstance(e, dict) and isinstance(e.get("dest"), str)
            and (e.get("backup") is None or isinstance(e.get("backup"), str))
            and (e.get("sha256") is None or isinstance(e.get("sha256"), str)) for e in files):
        raise TunerError(f"backup record {path} is not a {engine} install record; {hint}")
    return record


def _allowed_root(entry: dict, record: dict, engine: str) -> Path | None:
    """The folder a recorded file may be restored or removed in: the one the install
    recorded (and itself an engine config folder), or for records written before roots
    were recorded, an engine config folder the path lies in."""
    eng = ENGINES[engine]
    known = (eng.gemm_folder, eng.moe_folder, "configs")
    candidates = [entry["root"]] if isinstance(entry.get("root"), str) else []
    candidates += [r for r in record.get("roots", []) if isinstance(r, str)]
    for root in candidates:
        if inside(Path(entry["dest"]), Path(root)):
            return Path(root)
    if not candidates:
        dest = os.path.realpath(entry["dest"])
        for folder in known:
            i = dest.find("/" + folder + "/")
            if i >= 0:
                return Path(dest[: i + len(folder) + 1])
    return None


def _current(dest: Path) -> bytes | None:
    """What is at `dest` now (None: nothing); one line when it is not a regular file."""
    from tuner.reading import read_bytes
    if not os.path.lexists(dest):
        return None
    return read_bytes(dest, "installed table ")


def _restore_plan(backup: Path, record: dict, engine: str) -> list[tuple[Path, Path | None, Path]]:
    """[(file, its backup or None, the folder it may be written in)], every entry checked."""
    plan = []
    for e in record["files"]:
        root = _allowed_root(e, record, engine)
        if root is None or not Path(e["dest"]).name.endswith(".json"):
            raise TunerError(f"backup record {backup / RECORD} names {e['dest']}, outside the folders that install "
                             "wrote to; refusing to touch it")
        if e["backup"] and not inside(Path(e["backup"]), backup):
            raise TunerError(f"backup record {backup / RECORD} points at {e['backup']}, outside its backup folder")
        if e["backup"] and not Path(e["backup"]).is_file():
            raise TunerError(f"the backup {e['backup']} of {e['dest']} is missing; nothing was restored")
        wrote = e.get("sha256")
        if wrote is not None:
            now = _current(Path(e["dest"]))
            # as the install wrote it, or as it was before (a file an interrupted install never reached)
            if now is not None and sha256_of(now) != wrote and (
                    not e["backup"] or now != _current(Path(e["backup"]))):
                raise TunerError(f"{e['dest']} has changed since the install of {backup.name} (another install or "
                                 "restore, an engine upgrade, or an edit): restoring would lose what is there now, "
                                 f"which no backup holds; nothing was restored (move {backup} aside to restore the "
                                 "installs before it)")
        plan.append((Path(e["dest"]), Path(e["backup"]) if e["backup"] else None, root))
    return plan


def restore(engine: str, backup_root: Path, roots: list[Path] | None = None) -> list[str]:
    """Undo the last install for an engine (with `roots`: the last into those folders),
    finished or interrupted: put replaced files back, remove added ones, under the install
    lock of every folder it touches, after checking every file. The first line says which."""
    backup = latest_backup(engine, backup_root, roots)
    record = read_record(backup, engine)
    folders = sorted({r for _, _, r in _restore_plan(backup, record, engine)}, key=str)
    with locked(folders, backup_root):
        if latest_backup(engine, backup_root, roots) != backup:
            raise TunerError(f"another {engine} install finished while this restore waited; nothing was restored: "
                             "run `tuner install --restore` again to undo that one")
        clear_leftovers(folders, engine, backup_root)
        return [f"restoring {describe(backup, record)}", *undo(backup, record, engine)]


def undo(backup: Path, record: dict, engine: str) -> list[str]:
    """Under the lock of its folders: put back what one install replaced, remove what it
    added, then its backup folder. Killed at any point, it can be run again."""
    plan = _restore_plan(backup, record, engine)        # under the lock: as the files are now
    check_writable_folders([d for d, _, _ in plan])
    if record.get("state") != UNDOING:       # a kill from here on: the next install finishes the undo
        atomic_write_json(backup / RECORD, {**record, "state": UNDOING}, root=backup)
    done: list[str] = []
    for dest, saved, root in reversed(plan):
        if saved is not None:
            from tuner.reading import read_bytes
            data = read_bytes(saved, "backup ")
            if _current(dest) != data:
                atomic_write_bytes(dest, data, root=root)
                shutil.copymode(saved, dest)          # the replaced file's mode, as it was
            done.append(f"restored {dest}")
        elif os.path.lexists(dest):
            dest.unlink()
            done.append(f"removed {dest}")
    # every file this backup held is back in place: the folder is no file's last copy. Out of
    # the installs' order first (one rename), so a kill mid-removal leaves no half a record.
    gone = backup.with_name(RESTORED + backup.name)
    os.rename(backup, gone)
    shutil.rmtree(gone, ignore_errors=True)
    return done
