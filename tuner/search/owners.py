"""Who owns a RUNNING trial, and whether that owner is gone (the claim protocol's liveness test).

A trial is named after the process that asked for it: "host:pid/boot/start", where boot is
the kernel's boot id (/proc/sys/kernel/random/boot_id) and start the process's start time in
clock ticks since that boot (/proc/PID/stat, field 22). A pid alone cannot say whose a trial is:
a window killed while tuner was pid 1 (a container's first process) left trials owned by
"host:1", and the next container's pid 1 is alive whoever it is; after a reboot every pid is
handed out again under the same host name. A live pid owns a trial only where the boot and
its start time agree: a reused pid cannot fake both. Trials named by an older tuner
("host:pid") are judged by when they were asked: a pid whose process started after the trial
was asked (or a trial asked before this boot) is not its owner.
Where /proc is not there (not Linux), the pid alone decides, as before.
"""

from __future__ import annotations

import datetime
import os
import socket
from functools import lru_cache
from pathlib import Path

PROC = Path("/proc")
# A legacy owner's process must have started this much after its trial was asked to be taken as
# another process (the two clocks read are the wall clock's, a second apart at worst).
LEGACY_SLACK_S = 5.0


@lru_cache(maxsize=1)
def boot_id() -> str:
    """This boot's id (empty where the system does not say)."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:16]
    except OSError:
        return ""


def start_ticks(pid: int | str) -> int | None:
    """A process's start time in clock ticks since boot ("self": this process's; None: no such
    process, or no /proc)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    try:     # the command name (field 2) may hold spaces and parentheses: fields after its last ')'
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def boot_time() -> float | None:
    """When this system booted, on the wall clock (seconds since the epoch)."""
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def owner_id() -> str:
    """The name this process gives the trials it asks for: host:pid, and where known /boot/start
    (its own start read through /proc/self: right inside a PID namespace too)."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    start, boot = start_ticks("self"), boot_id()
    return f"{name}/{boot}/{start}" if start is not None and boot else name


def parse(worker: str) -> tuple[str, int, str | None, int | None] | None:
    """(host, pid, boot, start) of an owner's name (boot and start None for an older tuner's
    "host:pid"); None for a name that is not one."""
    if not isinstance(worker, str) or ":" not in worker:
        return None
    host, rest = worker.rsplit(":", 1)
    pid_s, _, identity = rest.partition("/")
    boot, _, start_s = identity.partition("/")
    if not pid_s.isascii() or not pid_s.isdigit() or len(pid_s) > 9:
        return None
    start = int(start_s) if start_s.isascii() and start_s.isdigit() and len(start_s) < 20 else None
    return host, int(pid_s), (boot or None) if start is not None else None, start


def same_process(worker: str) -> bool:
    """Whether `worker` names this very process (its pid, boot and start: not a pid reused)."""
    owner = parse(worker)
    return owner is not None and owner[0] == socket.gethostname() and owner[1] == os.getpid() and (
        owner[3] is None or (owner[2] == boot_id() and owner[3] == start_ticks("self")))


def process_gone(worker: str, asked: datetime.datetime | None = None) -> bool | None:
    """Whether the process named `worker` on this host is gone: True (exited, or its pid now
    another process's), False (alive, or it cannot be told), None (another host's, or a name
    that is not one: Optuna's heartbeat decides)."""
    owner = parse(worker)
    if owner is None or owner[0] != socket.gethostname():
        return None
    _, pid, boot, start = owner
    if start is not None and boot_id() and boot != boot_id():
        return True                       # named in another boot: every process of it is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass                              # alive, another user's: its start time still tells
    now_start = start_ticks(pid)
    if now_start is None:
        return False                      # no /proc: the pid alone decides
    if start is not None:
        return now_start != start         # the pid is another process's now
    # an older tuner's "host:pid": gone if that pid's process began after the trial was asked
    if asked is None:
        return False
    booted = boot_time()
    if booted is None:
        return False
    began = booted + now_start / _ticks_per_second()
    asked_s = asked.timestamp()
    return asked_s < booted or began > asked_s + LEGACY_SLACK_S


@lru_cache(maxsize=1)
def _ticks_per_second() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100
