"""A journal with a damaged tail (issue 42, item 7): its whole operations counted, and kept by
`tuner repair-journal FILE`, the rest moved aside, nothing deleted.

A journal a killed writer left ends in a torn operation (tuner/search/journal_lines.py), which
the storage reads past. A tail of NULs or random bytes (a disk that lost its last blocks, a
copy cut short and padded) is no operation at all: the file is still the operations before it,
whole, and nothing after them can be read as one."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from tuner.errors import TunerError
from tuner.search.journal_lines import LONGEST_LINE, is_operation


def whole_operations(path: Path) -> tuple[int, int, int]:
    """(operations, the byte after the last of them, the file's size): the lines from the
    start that are each a whole operation Optuna replays (a line of JSON with an op_code can
    still be none: an unknown op_code, a field missing), read a line at a time (each bounded)."""
    from tuner.search.optuna_private import journal_replay
    replay = journal_replay("tuner-repair-")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        count = good = 0
        while True:
            line = f.readline(LONGEST_LINE + 1)
            if not line.endswith(b"\n"):
                return count, good, size
            try:
                op = json.loads(line)
            except (ValueError, RecursionError):
                return count, good, size
            if not is_operation(op):
                return count, good, size
            try:
                replay.apply_logs([op])
            except Exception:  # noqa: BLE001 - whatever Optuna raises on it, it is no operation
                return count, good, size
            count += 1
            good += len(line)


def damaged_tail_line(path: Path, url_shown: str) -> str | None:
    """The refusal for a journal whose tail is damaged after whole operations (None: it has
    none, so it is no journal of ours)."""
    count, good, size = whole_operations(path)
    if count == 0:
        return None
    return (f"--storage {url_shown}: {path} has a damaged tail after {count} whole operations ({size - good} bytes "
            f"from byte {good} are no operation); `tuner repair-journal {path}` keeps the {count} operations and "
            "moves the rest aside")


def unreplayable_line(path: Path, error: Exception) -> str:
    """Why a journal whose lines all parse cannot be opened (an operation Optuna cannot replay),
    and the repair, as damaged_tail_line says it."""
    count, good, size = whole_operations(path)
    what = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:100]
    if count == 0:
        return f"{path}: its first operation is none Optuna can replay ({what}): not a journal of ours; give a new file"
    return (f"{path}: operation {count + 1} is none Optuna can replay ({what}), after {count} whole operations; "
            f"`tuner repair-journal {path}` keeps the {count} operations and moves the rest ({size - good} bytes) aside")


def repair(path: Path) -> list[str]:
    """Keep the whole operations of a journal, move its damaged tail to `<file>.damaged-tail`
    (a new name when that exists): the tail is written aside, flushed, then cut off, all under
    the lock a writer appends under (tuner/search/storage.py JournalFile), so that an operation
    a live writer appends meanwhile is neither cut off unsaved nor half copied."""
    import fcntl
    if path.is_dir():          # a run's folder, most likely: its journal is OUT/studies.journal
        inside = path / "studies.journal"
        raise TunerError(f"{path} is a folder, not a journal file" + (
            f": a run's journal is {inside}" if inside.is_file() else
            " (a run's journal is studies.journal in its folder; this one holds none)"))
    if not path.is_file():
        raise TunerError(f"{path}: no such journal file")
    from tuner.errors import os_error_words
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as e:                        # a journal we may only read: fine when it needs no repair
        count, good, size = whole_operations(path)
        if count and good == size:
            return _repair_locked(path, -1)
        raise TunerError(f"cannot repair {path}: {os_error_words(e)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _repair_locked(path, fd)
    except OSError as e:
        raise TunerError(f"cannot repair {path}: {os_error_words(e)}") from None
    finally:
        os.close(fd)                            # releases the lock


def _repair_locked(path: Path, fd: int) -> list[str]:
    count, good, size = whole_operations(path)
    if count == 0:
        raise TunerError(f"{path} holds no whole operation of Optuna's: not a journal of ours; nothing was changed")
    if good == size:
        return [f"{path}: {count} whole operations and nothing after them: nothing to repair"]
    aside = path.with_name(path.name + ".damaged-tail")
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = path.with_name(f"{path.name}.damaged-tail-{n}")
    out = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        _copy_sparse(fd, out, good, size)
        os.fsync(out)
    except BaseException:
        os.close(out)
        os.unlink(aside)
        raise
    os.close(out)
    os.ftruncate(fd, good)
    os.fsync(fd)
    return [f"{path}: kept its {count} whole operations ({good} bytes); the damaged tail ({size - good} bytes) is in "
            f"{aside}"]


BLOCK = 64 << 10


def _copy_sparse(src: int, dst: int, start: int, end: int) -> None:
    """Bytes start..end of `src` into `dst` from its offset 0, its runs of NULs left as holes
    (a tail of a GiB of zeros keeps its size aside, not a GiB on a disk): holes in `src` are
    skipped unread where the file system says where its data is (SEEK_DATA), and a block read
    as all zeros is seeked over, not written."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)      # the next byte that is not a hole
        except OSError as e:                              # none left (ENXIO), or not said here: read on
            data = end if e.errno == errno.ENXIO else pos
        except AttributeError:                            # no SEEK_DATA on this system
            data = pos
        pos = min(max(pos, data), end)
        if pos >= end:
            break
        chunk = os.pread(src, min(BLOCK, end - pos), pos)
        if not chunk:
            break
        if chunk.count(0) != len(chunk):
            os.pwrite(dst, chunk, pos - start)
        pos += len(chunk)
    os.ftruncate(dst, end - start)            # its size, whatever zeros end it
