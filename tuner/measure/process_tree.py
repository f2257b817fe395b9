"""The processes of a measuring run: one group per measuring child, killed together, and
none outliving the process that started it.

A measuring child (tuner/measure/isolation.py) puts itself in a process group of its own; its
compile workers and whatever they start (ptxas) inherit that group. The parent ends a child
by killing the whole group, so a restart (a hang, a crash, recycling) leaves no compile
worker behind holding a CUDA context. A child, and each compile worker, also watches its
parent: when the parent is gone (kill -9, a crash of the run), it kills its own group at
once, so nothing of the run is left either way. On Linux the child also asks the kernel for
SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG), for a child too busy in
native code to run its watch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

WATCH_INTERVAL_S = 0.5


def become_group_leader() -> None:
    """Put this process in a process group of its own (same session, so a device tool that
    ends a command's session still reaches it)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass                            # already a leader, or not allowed: the watch still works


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have the kernel send `sig` to this process when the thread that started it exits
    (Linux; elsewhere a no-op). `parent`: the pid that started it; when that one is already
    gone (it died before this ran), `sig` is raised here at once."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def child_of_this_process(sig: int = signal.SIGTERM):
    """A subprocess preexec_fn: the child gets `sig` when this process dies, kill -9
    included (SIGTERM: a tuner command answers it by keeping what it has and exiting)."""
    parent = os.getpid()
    return lambda: die_with_parent(sig, parent)


def stop_group(proc, grace_s: float = 20.0) -> None:
    """End a child that leads its own process group, and the group: SIGTERM (a tuner command
    keeps what it has), then after `grace_s` SIGKILL."""
    import subprocess
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def watch_parent(kill_group: bool = True, interval_s: float = WATCH_INTERVAL_S,
                 parent: int | None = None) -> threading.Thread:
    """A daemon thread that ends this process (and with kill_group its whole process group)
    as soon as its parent is gone. `parent`: the pid the parent had when it started this
    process (a process still starting up when its parent died already has another parent)."""
    parent = parent or os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                if kill_group:
                    try:
                        os.killpg(os.getpgrp(), signal.SIGKILL)
                    except OSError:
                        pass
                os._exit(1)

    thread = threading.Thread(target=watch, name="tuner-parent-watch", daemon=True)
    thread.start()
    return thread


def kill_group(pgid: int | None) -> None:
    """SIGKILL every process of a group (a dead leader's group still reaches its members)."""
    if not pgid or pgid <= 1 or pgid == os.getpgrp():
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return text[text.rindex(")") + 2:].split()


def members(pgid: int | None = None, sid: int | None = None) -> list[int]:
    """Live (not zombie) processes in process group `pgid` and/or session `sid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if not fields or fields[0] in ("Z", "X"):
            continue
        group, session = int(fields[2]), int(fields[3])
        if (pgid is None or group == pgid) and (sid is None or session == sid):
            out.append(int(entry.name))
    return out
