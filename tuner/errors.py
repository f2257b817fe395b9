"""The one exception type the command line turns into a single clear line, and the one
place that says an operating-system error (a read-only folder, a full disk, a name too
long, a link loop) in words."""

from __future__ import annotations

import errno
import sqlite3


class TunerError(Exception):
    """A problem with the user's input or environment; printed as one line, exit 2."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping us, kill), or a measuring child stopped from outside by
    it: handled like Ctrl-C, so atomic writes clean up and the storage is left resumable
    (the command line says "terminated" and exits 143)."""


# What each errno means to someone who gave a path (strerror's words are terse or misleading:
# "File exists" for a link loop met by mkdir, "Is a directory" for a file name).
_WORDS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENAMETOOLONG: "a name in the path is too long",
    errno.ELOOP: "too many levels of symbolic links (a link loop?)",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOENT: "no such file or folder",
    errno.EEXIST: "already exists (or is a broken or looping symbolic link)",
    errno.EMFILE: "too many open files (raise `ulimit -n`)",
    errno.ENFILE: "too many open files in the system",
    errno.EIO: "input/output error (a failing disk or network file system?)",
    errno.EXDEV: "crosses file systems",
    errno.EBUSY: "busy",
    errno.ENOTEMPTY: "folder not empty",
    errno.ETXTBSY: "busy (a running program)",
    errno.EFBIG: "file too large for the file system",
    errno.ENODEV: "no such device",
    errno.ENXIO: "no such device (a socket or FIFO without a reader?)",
}
_FULL = (errno.ENOSPC, errno.EDQUOT)
# What SQLite (through SQLAlchemy and Optuna) says for the same conditions: no errno there.
_SQLITE_WORDS = (("database or disk is full", errno.ENOSPC), ("attempt to write a readonly database", errno.EROFS),
                 ("unable to open database file", errno.ENOENT), ("disk i/o error", errno.EIO))

_SQLITE_DAMAGE = ("database disk image is malformed", "file is not a database")


def _chain(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def os_error_words(e: OSError) -> str:
    """What an OSError means, in words (without the file name)."""
    words = _WORDS.get(e.errno or 0) or e.strerror or str(e)
    if e.errno in _FULL:
        words += "; free some and run the same command again (finished work is kept)"
    return words


def os_error_line(e: BaseException) -> str | None:
    """One line for an error that is (or was raised from) an operating-system error, naming
    the file and what is wrong in words, with what to do where there is one thing to do;
    None for any other error."""
    for err in _chain(e):
        if isinstance(err, OSError) and err.errno in _WORDS:
            where = err.filename if err.filename is not None else ""
            if err.filename2 is not None:
                where = f"{where} -> {err.filename2}"
            words = _WORDS[err.errno]
            line = f"{where}: {words}" if where else words
            if err.errno in _FULL:
                line += "; free some and run the same command again (finished work is kept)"
            return line
        if isinstance(err, OSError) and err.strerror:
            return f"{err.filename}: {err.strerror}" if err.filename is not None else err.strerror
        text = str(err).lower()
        if isinstance(err, sqlite3.Error) or type(err).__module__.startswith("sqlalchemy"):
            for needle in _SQLITE_DAMAGE:        # bad input, not ours to crash on (issue 42, item 5)
                if needle in text:
                    return f"the SQLite storage is damaged ({needle}): move it aside, give a new --storage"
            for needle, code in _SQLITE_WORDS:
                if needle in text:
                    words = _WORDS[code]
                    if code in _FULL:
                        words += "; free some and run the same command again (finished work is kept)"
                    return f"the SQLite storage: {words}"
    return None


def is_disk_full(e: BaseException | None) -> bool:
    """Whether an error (or one it was raised from: Optuna wraps SQLite's in its own
    "exception during the commit") is a full disk."""
    for err in _chain(e):
        if (isinstance(err, OSError) and err.errno in _FULL) or \
                "database or disk is full" in str(err).lower() or "no space left" in str(err).lower():
            return True
    return False
