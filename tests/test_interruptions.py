"""Noise and leftovers of interrupted runs (issue 33, item 8), through the real measuring
stack on the CPU device where a process is involved: a Ctrl-C or SIGTERM while the measuring
child starts is one line, never its BrokenPipeError traceback; a measuring child stopped from
outside (SIGINT, SIGTERM) stops the run with 130/143 instead of being taken for a crashed
config (exit 0); a child killed at its timeout leaves no "leaked semaphore objects" warning;
a killed writer's temporary file is removed by the next command that writes there, whatever
its age, and a live writer's never. Landscapes are SYNTHETIC; CPU-device times mean nothing
about a GPU."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cpu_device import GEMM_ARGS, left_in

from tuner.cli import main
from tuner.measure.process_tree import members

# triton_incidental: signals, children and temporary files, not the kernels the CPU device runs on the way
# (their own tests check those under the newest Triton): .ci/run runs these with the pinned Triton only
pytestmark = [pytest.mark.triton, pytest.mark.triton_incidental]     # runs Triton kernels (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
SMALL = str(REPO / "configs" / "examples" / "small-moe.json")
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}


def _as_a_terminal_starts_it() -> None:
    """A shell starts a foreground command with SIGINT at its default, whatever it inherited: a
    test run started in the background of a non-interactive shell (`.ci/run &`) ignores SIGINT,
    which Python, and so the command, would keep ignoring."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str) -> subprocess.Popen:
    """`python -m tuner ARGS` in a session (and process group) of its own, as a terminal
    starts a command: its id is its pid, every process of the run is in the session."""
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_a_terminal_starts_it)


def measuring_child(proc: subprocess.Popen, on_its_own: bool, timeout: float = 120) -> int:
    """The pid of the run's measuring child once it exists (`on_its_own`: once it leads a
    process group of its own, which it makes first thing when it runs our code)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for pid in members(sid=proc.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if pid == proc.pid or b"resource_tracker import main" in cmd or b"spawn_main" not in cmd:
                    continue
                if not on_its_own or os.getpgid(pid) == pid:
                    return pid
            except (FileNotFoundError, ProcessLookupError):
                continue
        time.sleep(0.02)
    raise AssertionError("the run never started a measuring child")


def takes_sigint_again(pid: int, timeout: float = 60.0) -> None:
    """Wait until `pid` no longer ignores SIGINT (/proc/PID/status SigIgn): while it starts a
    child it ignores one, and a Ctrl-C then is lost by design (tuner/measure/isolation.py
    _quiet_start); the child can lead its own group before the parent leaves that window."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
        if not ignored & (1 << (signal.SIGINT - 1)):
            return
        time.sleep(0.005)
    raise AssertionError("the run kept ignoring SIGINT")


def ended(proc: subprocess.Popen) -> tuple[int, list[str]]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err.strip().splitlines()


@pytest.mark.parametrize("how", ["SIGTERM to the command", "Ctrl-C (SIGINT to its process group)"])
def test_a_signal_while_the_measuring_child_starts_is_one_line(tmp_path, how):
    """`tuner check` on the CPU device, signalled while its measuring child starts (building
    its measurer, seconds, before it says it is ready): one line, 143 or 130, no traceback of
    the child's broken pipe (the parent gone), no process left."""
    table = tmp_path / "t.json"
    table.write_text(json.dumps({str(m): CFG for m in range(1, 9)}))
    proc = start("check", "--model", SMALL, "--kernel", "gemm", "--kernel-source", "ours", "--table", str(table),
                 "--device", "cpu")
    measuring_child(proc, on_its_own=True)      # in its own group, building its measurer (seconds)
    if not how.startswith("SIGTERM"):
        takes_sigint_again(proc.pid)            # past the start's milliseconds that ignore a Ctrl-C
    if how.startswith("SIGTERM"):
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    rc, err = ended(proc)
    assert rc == (143 if how.startswith("SIGTERM") else 130), err
    assert len(err) == 1 and ("terminated" in err[0] or "interrupted" in err[0]), "\n".join(err)
    assert not left_in(sid=proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_measuring_child_stopped_from_outside_stops_the_run(tmp_path, sig):
    """SIGINT or SIGTERM to the measuring child (a Ctrl-C or a scheduler reaching it): the run
    stops, 130 or 143, one line, no process left; not a crashed config and exit 0. Run again,
    it finishes every study with no config recorded as crashed."""
    args = ["gemm", *GEMM_ARGS, "--batch-sizes", "1", "16", "--trials", "4", "--compile-workers", "1",
            "--out", str(tmp_path / "o"), "--quiet"]
    proc = start(*args)
    os.kill(measuring_child(proc, on_its_own=True), sig)
    rc, err = ended(proc)
    assert rc == (130 if sig == signal.SIGINT else 143), err
    assert len(err) == 1 and ("interrupted" in err[0] or "terminated" in err[0]), "\n".join(err)
    assert not left_in(sid=proc.pid)
    if sig == signal.SIGINT:
        again = start(*args)
        rc, err = ended(again)
        assert rc == 0, err
        entries = json.loads((tmp_path / "o" / "manifest.json").read_text())["tables"][0]["entries"]
        assert sorted(entries) == ["1", "16"] and all("crash" not in e["failures"] for e in entries.values())


LEAKY = """
import sys
sys.path.insert(0, sys.argv[2])
import faulty_kernel
from tuner.pipeline.run import run_tuning
# every config the study measures hangs, the default too: under any load each ends at the
# timeout (a slow compile only loses its head start), so no working config races the 2 s
opts = faulty_kernel.hanging_plan(sys.argv[1], sys.argv[3], measure_timeout=2, budget=3, quiet=True)
[result] = run_tuning(opts)[opts.problems[0].key]
print(result.failures)
"""


def test_a_child_killed_at_its_timeout_leaves_no_leak_warning(tmp_path):
    """A config that hangs (the faulty test kernel) on the CPU device: its child, with a
    compile worker, is killed at the timeout; when the run ends, no "leaked semaphore
    objects" warning (Python's resource tracker unlinks what the killed child left)."""
    r = subprocess.run([sys.executable, "-c", LEAKY, str(tmp_path), str(REPO / "tests"), SMALL], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    failures = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    assert set(failures) == {"timeout"} and failures["timeout"] >= 1, r.stdout
    assert "leaked" not in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- temporaries of killed writers ---------------------------------------------------------------
def dead_writers_temporary(folder: Path, name: str) -> Path:
    """What a writer killed with SIGKILL mid-write leaves: `.<name>.<random>.tmp`, half written,
    made by a process that is gone (a fresh one: seconds old, not minutes)."""
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import os, sys, tempfile\n"
            "fd, tmp = tempfile.mkstemp(dir=sys.argv[1], prefix='.' + sys.argv[2] + '.', suffix='.tmp')\n"
            "os.write(fd, b'{\"half\": ')\nprint(tmp, flush=True)\nos.kill(os.getpid(), 9)\n")
    r = subprocess.run([sys.executable, "-c", code, str(folder), name], capture_output=True, text=True, timeout=60)
    tmp = Path(r.stdout.strip())
    assert tmp.is_file()
    past = time.time() - 2                  # older than the moment between mkstemp and a writer's lock
    os.utime(tmp, (past, past))
    return tmp


def live_writers_temporary(folder: Path, name: str):
    """A temporary a live writer holds (tuner/paths.py new_temporary, in another process)."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom tuner.paths import new_temporary\n"
            "fd, tmp = new_temporary(Path(sys.argv[1]) / sys.argv[2])\nprint(tmp, flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder), name], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    tmp = Path(proc.stdout.readline().strip())
    past = time.time() - 120
    os.utime(tmp, (past, past))
    return proc, tmp


def test_a_killed_benchs_temporary_goes_with_the_next_bench(tmp_path, capsys):
    """`tuner bench` killed while writing leaves its temporary in --out (named for a report of
    its day); the next bench into that folder removes it, seconds after the kill, while a
    temporary a live writer holds there stays."""
    from test_bad_input import landscape
    land = landscape(tmp_path / "l.jsonl")
    out = tmp_path / "b"
    dead = dead_writers_temporary(out, "bench-x-2020-01-01.json")
    writer, live = live_writers_temporary(out, "bench-y.json")
    try:
        assert main(["bench", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel", "gemm",
                     "--only", "N=7168,K=2048", "--batch-sizes", "1", "--replay", str(land), "--out", str(out),
                     "--quiet"]) == 0
        assert not dead.exists() and live.exists()
    finally:
        writer.kill()
        writer.wait()
    capsys.readouterr()


@pytest.mark.parametrize("command", ["gemm", "audit --out", "write of the same file"])
def test_a_killed_writers_temporary_goes_with_the_next_write_there(tmp_path, capsys, command):
    """The same for a tuning run's --out, an audit's --out, and any atomic write of a file
    whose killed writer left its temporary beside it (tables, manifests, state)."""
    from test_bad_input import GEMM_ARGS as REPLAY_ARGS
    from test_bad_input import landscape
    out = tmp_path / "o"
    if command == "gemm":
        dead = dead_writers_temporary(out / "vllm" / "fp8_gemm", "t.json")
        argv = [*REPLAY_ARGS, "--replay", str(landscape(tmp_path / "l.jsonl")), "--trials", "4", "--out", str(out),
                "--quiet"]
        assert main(argv) == 0
    elif command == "audit --out":
        dead = dead_writers_temporary(out, "audit.json")
        assert main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                     "deepseek-v3", "--gpu", "H200", "--moe-config-dir", "", "--out", str(out)]) in (0, 1)
    else:
        from tuner.paths import atomic_write_text
        dead = dead_writers_temporary(out, "state.json")
        atomic_write_text(out / "state.json", "{}", root=out)
    assert not dead.exists()
    capsys.readouterr()


def test_temporaries_are_written_locked(tmp_path):
    """While an atomic write fills its temporary, the temporary is locked (what tells a live
    writer's from a dead one's), and no temporary stays after it."""
    import fcntl

    from tuner.paths import atomic_write_file
    seen = []

    def fill(tmp: Path) -> None:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("unlocked")
        except BlockingIOError:
            seen.append("locked")
        finally:
            os.close(fd)
        tmp.write_text("x")
    atomic_write_file(tmp_path / "f.json", fill, root=tmp_path)
    assert seen == ["locked"] and (tmp_path / "f.json").read_text() == "x"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_fresh_dead_temporary_goes_but_a_fresh_empty_one_waits(tmp_path):
    """A killed writer's temporary goes however fresh it is once it holds a byte (a writer locks
    before it writes one), so a rerun seconds after a kill -9 clears it; an empty unlocked one
    (a live writer between mkstemp and its flock) waits out the grace; a locked one stays."""
    from tuner.paths import UNLOCKED_GRACE_S, remove_stale_temporaries_of
    target = tmp_path / "l.jsonl"
    written = tmp_path / ".l.jsonl.dead.tmp"
    written.write_text('{"format": "tuner-landscape/1"}\n')
    empty = tmp_path / ".l.jsonl.new.tmp"
    empty.touch()
    writer, live = live_writers_temporary(tmp_path, "l.jsonl")
    try:
        live.write_text("held\n")
        assert remove_stale_temporaries_of(target) == [written]
        assert empty.exists() and live.exists()
        past = time.time() - UNLOCKED_GRACE_S - 1
        os.utime(empty, (past, past))
        assert remove_stale_temporaries_of(target) == [empty] and live.exists()
    finally:
        writer.kill()
        writer.wait()


def test_a_ctrl_c_while_the_command_exits_changes_nothing(tmp_path):
    """A Ctrl-C landing after the command's work, while its exit cleans up (here an exit
    hook standing in for ending a measuring child): no "Exception ignored" traceback, and the
    exit status is the command's (a death by SIGINT, -2, had no line at all)."""
    code = ("import atexit, os, runpy, signal, sys, time\n"
            "def late():\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.3)\n"
            "atexit.register(late)\n"
            "sys.argv = ['tuner', 'landscape', 'info', sys.argv[1]]\n"
            "runpy.run_module('tuner', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "none.jsonl")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_ctrl_c_says_what_the_command_keeps(monkeypatch, capsys):
    """A Ctrl-C (or SIGTERM) during `tuner coverage` or `tuner landscape synth` said 'what was
    finished is kept (finished trials in the storage...): run the same command to resume': they
    have no storage; each command says only what is true of it."""
    from tuner import cli
    from tuner.errors import Terminated

    def stopped(args):
        raise KeyboardInterrupt

    def ended(args):
        raise Terminated()
    for name in ("coverage", "landscape", "gemm", "audit"):
        monkeypatch.setitem(cli.COMMANDS, name, stopped)
    monkeypatch.setitem(cli.COMMANDS, "bench", ended)
    said = {}
    for argv in (["coverage"], ["landscape", "info", "x.jsonl"], ["gemm", "--model", "deepseek-v3", "--gpu", "H200"],
                 ["audit", "--engine", "vllm"], ["bench", "--model", "m", "--gpu", "H200", "--kernel", "gemm",
                                                 "--out", "o"]):
        rc = cli.main(argv)
        out, err = capsys.readouterr()
        assert rc == (143 if argv[0] == "bench" else 130) and not out and len(err.splitlines()) == 1, err
        said[argv[0]] = err.strip()
    assert said["coverage"] == said["landscape"] == "tuner: interrupted; nothing was written: run the command again"
    assert said["gemm"] == ("tuner: interrupted; what was finished is kept (finished trials in the storage, whole "
                            "files only): run the same command to resume")
    assert said["audit"] == ("tuner: interrupted; no file is left half-written (each is written whole, or not at "
                             "all): run the command again")
    assert said["bench"].startswith("tuner: terminated; no file is left half-written")
    assert not any("storage" in said[c] or "resume" in said[c] for c in ("coverage", "landscape", "audit", "bench"))
