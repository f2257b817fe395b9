"""The lines of a journal file (tuner/search/storage.py's JournalFile): what its torn tail
is and where it starts, what can begin an operation, whether a file is a journal of ours.

A writer of ours appends each operation as one line with one write(2); one killed in the
middle of it leaves the beginning of an operation without its newline: a torn tail, of any
length (a study's plan is one long line). Anything else at the end of the file was left by
no writer of ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def end_of_line(f) -> int | None:
    """Read on to the end of the line `f` is in (chunk by chunk); the offset after its newline,
    or None when the file ends first."""
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return None
        i = chunk.find(b"\n")
        if i >= 0:
            stop = f.tell() - len(chunk) + i + 1
            f.seek(stop)
            return stop


def torn_tail_start(fd: int, size: int) -> int:
    """Where the last line of a file that does not end in a newline starts: just after its
    last newline (0 when it has none), found by reading back chunk by chunk."""
    pos = size
    while pos > 0:
        n = min(pos, 1 << 20)
        i = os.pread(fd, n, pos - n).rfind(b"\n")
        if i >= 0:
            return pos - n + i + 1
        pos -= n
    return 0


# A line longer than this is no operation of ours (the longest, a study's plan: ~100 KiB): the
# storage's readers, the repair and the check of a journal's last line read at most this much.
LONGEST_LINE = 64 << 20


# Every operation of a journal starts so: ours write {"op_code":N,..., Optuna's file backend
# {"op_code": N, ...}. A torn line is a beginning of one.
OPERATION_START = b'{"op_code":'


def looks_like_operation(head: bytes) -> bool:
    """Whether `head` (the first bytes of a line, or all of a torn one) can begin an operation."""
    if len(head) <= len(OPERATION_START):
        return OPERATION_START.startswith(head)
    if not head.startswith(OPERATION_START):
        return False
    rest = head[len(OPERATION_START):].lstrip(b" ")
    return not rest or rest[:1].isdigit()


def is_journal(path: Path) -> bool:
    """Whether an existing regular file is a journal a tuner wrote: empty, or a first line
    that is an operation, or no whole line yet and the beginning of one (a first write
    killed midway), and a last line that is a whole operation or the beginning of one."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return True
        first = os.pread(fd, 1 << 16, 0)
        end = first.find(b"\n")
        if end < 0 and size <= len(first):          # one torn line: a first write cut short
            return looks_like_operation(first[: len(OPERATION_START) + 1])
        try:
            if not isinstance(json.loads(first[:end]).get("op_code"), int):
                return False
        except (ValueError, AttributeError, RecursionError):
            return False
        if os.pread(fd, 1, size - 1) == b"\n":
            return _whole_operation_last(fd, size)
        start = torn_tail_start(fd, size)
        return looks_like_operation(os.pread(fd, len(OPERATION_START) + 1, start))
    finally:
        os.close(fd)



def _whole_operation_last(fd: int, size: int) -> bool:
    """Whether the last line of a file ending in a newline is an operation. A whole line that is none
    was left by no writer of ours: where the storage read past it and appended after it, `tuner
    repair-journal` would then move every later operation aside with it (found by a new-user pass)."""
    start = torn_tail_start(fd, size - 1)
    if size - start > LONGEST_LINE:
        return False
    try:
        op = json.loads(os.pread(fd, size - start, start))
    except (ValueError, RecursionError):
        return False
    return is_operation(op)


def is_operation(op: object) -> bool:
    """Whether a line's JSON has an operation's shape: an object with an integer op_code (whether
    Optuna replays it is another question: tuner/search/journal_repair.py)."""
    return isinstance(op, dict) and isinstance(op.get("op_code"), int) and not isinstance(op.get("op_code"), bool)
