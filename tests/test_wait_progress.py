"""A run that waits on its measuring child shows what the child is doing (issue 41, item 2):
starting, compiling config k of n, timing config k of n (in Triton's interpreter on the CPU
device), with the seconds it has taken, redrawn on a terminal every WAIT_TICK_S and said into a
log once a wait has lasted LOG_WAIT_AFTER_S; and a SIGTERM while the child is busy (a config
the interpreter takes minutes over) ends the run and every process of it at once, instead of
asking the busy child to close and waiting 10 s for it. CPU-device times mean nothing about a GPU."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cpu_device import left_in

from tuner.progress import LOG_WAIT_AFTER_S, LOG_WAIT_EVERY_S, Progress

# the CPU device's compile workers build Triton kernels (triton); what is checked is the wait and the
# signal, not the kernels (their own tests check those under the newest Triton): triton_incidental
pytestmark = [pytest.mark.triton, pytest.mark.triton_incidental]

REPO = Path(__file__).resolve().parents[1]
SMALL = str(REPO / "configs" / "examples" / "small-moe.json")

# One study whose every config hangs (the faulty test kernel: BLOCK_SIZE_N 32, num_stages 4
# sleeps an hour, after writing its pid into $FAULTY_KERNEL_HANG_FILE), with the timeout far
# away: the run waits on its child until it is stopped. The command's own SIGTERM handling.
HANGING_RUN = """
import signal, sys
sys.path.insert(0, sys.argv[2])
import faulty_kernel
from tuner.cli import _on_sigterm
from tuner.pipeline.run import run_tuning
signal.signal(signal.SIGTERM, _on_sigterm)
opts = faulty_kernel.hanging_plan(sys.argv[1], sys.argv[3], measure_timeout=3000, budget=1)
try:
    run_tuning(opts)
except KeyboardInterrupt:
    sys.exit(143)
"""


def _wait_for(predicate, what: str, within_s: float = 300.0):
    """Until `predicate()` is true (no race: what it waits for stays true once it is)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_a_busy_child_is_shown_and_a_sigterm_ends_the_run_at_once(tmp_path):
    # calibration: a process with the run's imports, started and ended on this machine now
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", "import tuner.cli, tuner.pipeline.run, torch, triton, optuna"],
                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    calibration = time.monotonic() - t
    hang_file, err = tmp_path / "hanging", tmp_path / "stderr"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAULTY_KERNEL_HANG_FILE": str(hang_file), "COLUMNS": "100"}
    with open(err, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-c", HANGING_RUN, str(tmp_path), str(REPO / "tests"), SMALL],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err_f, start_new_session=True)
    try:
        _wait_for(lambda: hang_file.exists() and hang_file.read_text(), "the config began to hang")
        # said into the log (stderr is no terminal) once the wait has lasted LOG_WAIT_AFTER_S
        line = _wait_for(lambda: re.search(r"timing config 1 of 1 in Triton's interpreter: (\d+)s.*",
                                           err.read_text()), "the wait was said")
        assert int(line.group(1)) >= LOG_WAIT_AFTER_S and len(line.group(0)) <= 100, line.group(0)
        t = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
        ended = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 143, err.read_text()
    assert not left_in(sid=proc.pid)
    # before: the busy child was asked to close and waited for 10 s (it never reads the request)
    assert ended < calibration + 2.0, (ended, calibration)


class Terminal:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def fileno(self):
        raise OSError("not a real terminal")

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_a_terminal_sees_every_tick_within_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    term = Terminal(tty=True)
    p = Progress(3, stream=term)
    p.waiting("starting the measuring worker", 0.0)
    p.start_study("vllm fused_moe E=256,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128] M=1")
    for s in range(3):
        p.waiting("timing config 1 of 8 in Triton's interpreter", float(s))
    drawn = [seg for seg in re.split(r"[\r\n]", term.text) if seg.strip()]
    assert drawn[0].startswith("starting the measuring worker: 0s")
    assert [seg.split(":")[1].split()[0] for seg in drawn[1:]] == ["0s", "1s", "2s"]
    assert all(seg.startswith("[1/3] timing config 1 of 8") for seg in drawn[1:])
    assert max(map(len, drawn)) < 80


def test_a_log_hears_of_a_long_wait_only(monkeypatch):
    log = Terminal(tty=False)
    p = Progress(1, stream=log)
    p.start_study("gemm N=256,K=256 M=1")
    p.waiting("compiling config 1 of 8", LOG_WAIT_AFTER_S - 1)        # a GPU's wait: nothing in the log
    assert log.text == ""
    for s in (LOG_WAIT_AFTER_S, LOG_WAIT_AFTER_S + 1, LOG_WAIT_AFTER_S + LOG_WAIT_EVERY_S):
        p.waiting("compiling config 1 of 8", s)
    p.waiting("timing config 1 of 8", LOG_WAIT_AFTER_S)
    lines = log.text.splitlines()
    assert [ln.split(":")[1].strip() for ln in lines] == ["compiling config 1 of 8"] * 2 + ["timing config 1 of 8"]
    assert all(ln.startswith("tuner: ") and ln.endswith("study 1/1 gemm N=256,K=256 M=1") for ln in lines)


def test_a_config_the_interpreter_takes_minutes_over_is_said_with_what_it_means():
    """The CPU device at a served model's shapes: once one config's timing passes SLOW_CONFIG_S,
    one line (within 120 columns) with the plan's lower bound at that rate and what to try."""
    from tuner.progress import SLOW_CONFIG_S
    log = Terminal(tty=False)
    p = Progress(54, stream=log)
    p.interpreted = True
    p.start_study("vllm fused_moe E=256,N=256 M=1")
    p.waiting("compiling config 1 of 2", SLOW_CONFIG_S + 5)             # a compile: not the interpreter's time
    p.waiting("timing config 1 of 2 in Triton's interpreter", SLOW_CONFIG_S - 1)
    assert "studies take over" not in log.text
    for s in (SLOW_CONFIG_S, SLOW_CONFIG_S + 40):
        p.waiting("timing config 1 of 2 in Triton's interpreter", s)
    [said] = [ln for ln in log.text.splitlines() if "studies take over" in ln]
    assert said == (f"tuner: {SLOW_CONFIG_S:.0f}s in Triton's interpreter for one config: 54 studies take over "
                    f"{54 * SLOW_CONFIG_S / 3600:.1f} h; try --synthetic or a small --model") and len(said) <= 120
    gpu = Terminal(tty=False)
    q = Progress(54, stream=gpu)                                          # a GPU's run: never said
    q.waiting("timing config 1 of 2", SLOW_CONFIG_S * 2)
    assert "studies take over" not in gpu.text
