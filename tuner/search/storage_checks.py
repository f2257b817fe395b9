"""Whether a storage URL may be used, decided before anything is written to it.

`tuner gemm|moe|mla`, `worker` and `collect` take a storage URL: a journal file, a SQLite
file or a database server. A local file that is there must be one of ours (a journal of
Optuna operations, or SQLite with Optuna's tables), in a folder we can write; judging it
writes nothing beside it (no -wal or -shm on a file refused) and takes no lock. Then the
storage is opened, with one clear line for bad URLs, missing drivers, unreachable servers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage

from tuner.errors import TunerError
from tuner.search.journal_lines import is_journal
from tuner.search.storage import journal_path, open_storage
from tuner.search.storage_urls import shown

log = logging.getLogger("tuner")


def _sqlite_tables(path: Path, mode: str) -> set[str]:
    import sqlite3
    from urllib.parse import quote
    # mode "immutable": a look that writes nothing beside the file (no -wal, -shm or lock) and
    # waits on no lock; it sees the file as it is, without what a write-ahead log still holds
    query = "mode=ro&immutable=1" if mode == "immutable" else f"mode={mode}"
    con = sqlite3.connect(f"file:{quote(str(path))}?{query}", uri=True, timeout=30)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite_file(path: Path, url: str) -> None:
    """An existing SQLite file must be one of our storages (Optuna's tables), never another
    program's database we would add tables to; judging it writes nothing beside it.

    A file without SQLite's header is refused unopened. Then it is looked at immutable (SQLite
    creates no -wal or -shm for that): another program's tables, or a file SQLite cannot read,
    are refused there, with nothing written. Only a file with a hot rollback journal or a
    write-ahead log beside it (what a process killed in the middle of a write leaves, kill -9
    during a commit) is opened as before: read-only, and when that needs a recovery it may not
    do ("attempt to write a readonly database", though nothing is lost), read-write, which
    rolls the interrupted write back (or recovers the log) as every SQLite client does, and
    the file is judged after that."""
    import sqlite3
    if not path.exists():
        return
    if not path.is_file():
        raise TunerError(f"--storage {shown(url)}: {path} is not a file")
    if path.stat().st_size == 0:
        return
    from tuner.reading import read_head
    if read_head(path, len(SQLITE_HEADER), "--storage ") != SQLITE_HEADER:
        raise TunerError(f"--storage {shown(url)}: {path} is not a SQLite database (no SQLite header)")
    pending = [p for p in (Path(f"{path}-journal"), Path(f"{path}-wal")) if p.exists() and p.stat().st_size > 0]
    try:
        tables = _sqlite_tables(path, "immutable")
    except sqlite3.Error as e:
        if not pending:
            raise TunerError(f"--storage {shown(url)}: {path} is not a SQLite database ({e})") from None
        tables = set()
    if tables and "studies" not in tables:
        raise TunerError(f"--storage {shown(url)}: {path} is another program's database (tables "
                         f"{', '.join(sorted(tables)[:5])}); give a new file")
    if not pending:
        return
    try:
        try:
            tables = _sqlite_tables(path, "ro")
        except sqlite3.Error as e:
            name = getattr(e, "sqlite_errorname", "") or ""
            if not (name.startswith("SQLITE_READONLY") or "readonly" in str(e)):
                raise
            log.info("storage %s: recovering what a killed writer left (%s)", path, name or e)
            tables = _sqlite_tables(path, "rw")           # rolls back the hot journal, recovers the WAL
    except sqlite3.Error as e:
        if "readonly" in str(e) or getattr(e, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
            raise TunerError(f"--storage {shown(url)}: {path} holds a write that a killed process left unfinished, and "
                             "rolling it back needs write access to it and its folder (nothing is lost): run "
                             "where it can be written") from None
        if "locked" in str(e) or "busy" in str(e).lower():
            raise TunerError(f"--storage {shown(url)}: {path} is locked by another process (a run or worker still "
                             "writing?); try again when it is done") from None
        raise TunerError(f"--storage {shown(url)}: {path} is not a SQLite database ({e})") from None
    if tables and "studies" not in tables:
        raise TunerError(f"--storage {shown(url)}: {path} is another program's database (tables "
                         f"{', '.join(sorted(tables)[:5])}); give a new file")


def check_journal_file(path: Path, url: str) -> None:
    """An existing journal file must be one of ours (Optuna operations, one per line)."""
    if not path.exists():
        return
    if not path.is_file():
        raise TunerError(f"--storage {shown(url)}: {path} is not a file")
    try:
        ours = is_journal(path)
    except OSError as e:
        raise TunerError(f"--storage {shown(url)}: cannot read {path} ({e.strerror})") from None
    if not ours:
        from tuner.search.journal_repair import damaged_tail_line
        line = damaged_tail_line(path, shown(url))
        raise TunerError(line or f"--storage {shown(url)}: {path} is not a journal of Optuna operations; give a new "
                         "file")


def local_file(url: str) -> Path | None:
    """The file a journal or SQLite storage URL names; None for a database server's."""
    return journal_path(url) or (Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None)

def check_storage_url(url: str) -> None:
    """Before anything is written: a storage URL, and for a journal or SQLite a file that is
    ours (or new) in a folder we can write."""
    if not isinstance(url, str) or "://" not in url:
        raise TunerError(f"--storage {shown(url)!r} is not a storage URL (journal:///FILE, sqlite:///FILE, "
                         "postgresql://...)")
    local = local_file(url)
    if local is not None:
        if journal_path(url):
            check_journal_file(local, url)
        else:
            check_sqlite_file(local, url)
        from tuner.paths import writable_folder
        ok, existing = writable_folder(local.parent)
        if not ok:
            raise TunerError(f"--storage {shown(url)}: cannot write to {existing}")



def check_storage_driver(url: str) -> None:
    """For a database URL, that its SQLAlchemy dialect and driver load here (no connection is
    made): what a dry run can say of a storage it does not open."""
    if journal_path(url) or url.split(":", 1)[0] == "sqlite":      # sqlite+<driver> is checked
        return
    import sqlalchemy
    try:
        dialect = sqlalchemy.engine.make_url(url).get_dialect()
        # SQLAlchemy 2 imports the driver in import_dbapi, 1.4 (which Optuna still allows) in dbapi
        load: Any = getattr(dialect, "import_dbapi", None) or getattr(dialect, "dbapi")
        load()
    except Exception as e:  # noqa: BLE001 - a bad URL, an unknown dialect, a driver not installed
        text = str(e).strip().splitlines()
        raise TunerError(f"cannot open storage {shown(url)}: {text[0] if text else type(e).__name__}") from None

def open_checked_storage(url: str, existing: bool = False) -> BaseStorage:
    """The run's storage, after checking it is ours: one clear line for bad URLs, missing
    drivers, unreachable servers and foreign databases. `existing`: a storage to read
    (collect, worker): a SQLite file that is not there is refused, nothing is created."""
    check_storage_url(url)
    local = local_file(url)
    if local is not None:
        if existing and not local.is_file():
            raise TunerError(f"--storage {shown(url)}: {local} not found (no run stored there; nothing was created)")
        from tuner.paths import make_folder
        make_folder(local.parent)
    try:
        return open_storage(url)
    except Exception as e:  # noqa: BLE001 - bad URLs, missing drivers, unreachable servers
        from tuner.paths import is_disk_full
        if is_disk_full(e):
            raise TunerError(f"no space left on the device for storage {shown(url)}: free some and run the same "
                             "command again") from None
        text = str(e).strip().splitlines()
        raise TunerError(f"cannot open storage {shown(url)}: {text[0] if text else type(e).__name__}") from None


def storage_holds_anything(url: str) -> bool:
    """Whether a storage holds anything yet: its file is there (a journal, SQLite), or it is a
    database server's."""
    local = local_file(url)
    return local is None or (local.is_file() and local.stat().st_size > 0)
