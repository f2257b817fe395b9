"""Bounds for the hostile-input tests: memory (a command in a child process under an
address-space cap, whose peak resident memory is read back) and time (an alarm, so that a
read that would wait forever fails the test instead of hanging it)."""

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
COMMAND_CAP = 3 * GIB // 2      # issue 33: no command's memory on a hostile input exceeds 1.5 GB


class TookTooLong(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """Inside: after `seconds` TookTooLong is raised in this (main) thread, even out of a
    blocking system call (a FIFO's open(), which waits for a writer): the alarm is sent to
    the main thread itself, since a process-wide one may land on another thread and leave
    the call waiting."""
    import threading

    def ring(signum, frame):
        raise TookTooLong(f"still running after {seconds}s")
    previous = signal.signal(signal.SIGALRM, ring)
    main = threading.main_thread().ident
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGALRM))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGALRM, previous)


def run_measured(args: list[str], env: dict | None = None, timeout: float = 300, cap: int = 4 * GIB,
                 cwd: Path = REPO, code: str | None = None) -> tuple[int, str, str, int]:
    """`python -m tuner ARGS` (or `python -c CODE ARGS`) in a child process under an
    address-space cap of `cap` bytes, so that an unbounded one fails (MemoryError) instead
    of taking the machine, and killed after `timeout`: (exit status, stdout, stderr, its peak
    resident memory in bytes, from the kernel's accounting of that child: wait4). A child,
    not this process: one that hit the cap keeps what it holds while it unwinds."""
    import tempfile

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        head = ["-c", code] if code is not None else ["-m", "tuner"]
        proc = subprocess.Popen([sys.executable, *head, *args], cwd=cwd, stdout=out, stderr=err,
                                env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}, preexec_fn=limit)
        end = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > end:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise AssertionError(f"{' '.join(head[:1] + args)} still ran after {timeout}s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)      # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024
