"""Faults while installing and tuning: kill -9 and SIGTERM mid-install, two installs into one
package at once, SIGTERM mid-tune, a disk that fills up. Each leaves whole files only, and
the next run cleans up and completes. Landscapes are SYNTHETIC."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from results_folders import results_folder
from synthetic import slowed_cli, write_synthetic_landscape

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space

REPO = Path(__file__).resolve().parents[1]
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}
GEMM_FOLDER = "vllm/model_executor/layers/quantization/utils/configs"


def slowed_install(seconds: float) -> str:
    """python -c source: the command line with every file write held open `seconds` before
    it is renamed into place (so that a kill lands in the middle of an install)."""
    return f"""
import os, sys, time
real = os.fsync
def slow(fd):
    time.sleep({seconds})
    return real(fd)
os.fsync = slow
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def gemm_name(n: int) -> str:
    return f"N={n},K=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"


def make_results(root: Path, warps: int, count: int = 12) -> Path:
    """A results folder of `count` vLLM GEMM tables, all holding num_warps=`warps`."""
    return results_folder(root, "fp8_gemm", {f"vllm/fp8_gemm/{gemm_name(128 * (i + 1))}": {"1": {**CFG, "num_warps": warps}}
                                             for i in range(count)})


def make_site(root: Path, count: int = 12) -> Path:
    """A fake site-packages whose vLLM ships every table with num_warps=2, mode 0644."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "triton-3.6.0.dist-info").mkdir()
    folder = root / GEMM_FOLDER
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / gemm_name(128 * (i + 1))).write_text(json.dumps({"1": {**CFG, "num_warps": 2}}))
        os.chmod(folder / gemm_name(128 * (i + 1)), 0o644)
    return root


def warps_installed(site: Path) -> list[int]:
    """num_warps of every table in the package (each file must be whole JSON)."""
    return [json.loads(p.read_text())["1"]["num_warps"] for p in sorted((site / GEMM_FOLDER).glob("*.json"))]


def start(args, env, source=None):
    return subprocess.Popen([sys.executable, "-c", source or slowed_install(0.15), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lock_held_by(proc, lock_dir: Path, timeout: float = 60) -> None:
    """Wait until proc holds an install lock in lock_dir (a non-blocking flock fails)."""
    import fcntl
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        for lock in lock_dir.glob("*.lock"):
            with open(lock, "a+") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                except BlockingIOError:
                    return
        time.sleep(0.05)
    raise AssertionError("the first install never took its lock")


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "TUNER_BACKUP_DIR": str(tmp_path / "backups"), "PYTHONPATH": str(REPO)}


def install_args(results, site):
    return ["install", str(results), "--engine", "vllm", "--site-packages", str(site), "--force"]


def test_kill_9_mid_install_then_install_again(tmp_path, env):
    site, results = make_site(tmp_path / "site"), make_results(tmp_path / "r", warps=8)
    proc = start(install_args(results, site), env)
    deadline = time.monotonic() + 120          # mid-install: a table's temporary held open (0.15 s each)
    while not list((site / GEMM_FOLDER).glob(".*.tmp")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert set(warps_installed(site)) <= {2, 8} and len(warps_installed(site)) == 12   # whole files only
    # the next install clears what the killed one left and completes
    r = subprocess.run([sys.executable, "-m", "tuner", *install_args(results, site)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert warps_installed(site) == [8] * 12
    assert not list((site / GEMM_FOLDER).glob(".*.tmp"))
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in (site / GEMM_FOLDER).glob("*.json"))


def test_sigterm_mid_install_is_like_ctrl_c(tmp_path, env):
    site, results = make_site(tmp_path / "site"), make_results(tmp_path / "r", warps=8)
    proc = start(install_args(results, site), env)
    lock_held_by(proc, tmp_path / "backups" / "locks")     # mid-install, not still importing
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    # The warnings the install printed before the signal may come first (a loaded machine
    # gets further in); the signal itself is one line, the last, and nothing else.
    lines = err.strip().splitlines()
    assert all(line.startswith("tuner: ") for line in lines), err
    assert "terminated" in lines[-1] and sum("terminated" in line for line in lines) == 1
    assert set(warps_installed(site)) <= {2, 8}
    assert not list((site / GEMM_FOLDER).glob(".*.tmp"))          # the interrupted write cleaned up


def test_two_installs_at_once_do_not_interleave(tmp_path, env):
    site = make_site(tmp_path / "site")
    a, b = make_results(tmp_path / "a", warps=4), make_results(tmp_path / "b", warps=8)
    pa = start(install_args(a, site), env)
    lock_held_by(pa, tmp_path / "backups" / "locks")       # a's install is under way, holding the lock
    pb = start(install_args(b, site), env)
    for p in (pa, pb):
        p.communicate(timeout=120)
        assert p.returncode == 0
    assert warps_installed(site) == [8] * 12                        # the second, whole, after the first
    restore = [sys.executable, "-m", "tuner", "install", "--restore", "--engine", "vllm"]
    for expected in ([4] * 12, [2] * 12):
        r = subprocess.run(restore, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert warps_installed(site) == expected


def test_sigterm_mid_tune_then_resume(tmp_path, env):
    kernel = get_kernel("fp8_gemm")
    land = tmp_path / "l.jsonl"
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [1, 16, 64])
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
            "--batch-sizes", "1", "16", "64", "--replay", str(land), "--trials", "10", "--out", str(tmp_path / "o"),
            "--quiet"]
    proc = start(args, env, source=slowed_cli(0.2))       # 30 configs, 6 s of measuring at least
    journal = tmp_path / "o" / "studies.journal"            # the default storage
    deadline = time.monotonic() + 120
    while not (journal.is_file() and b'"config"' in journal.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.1)                                     # until a trial is under way: mid-tune
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (143, 0), err
    if proc.returncode == 143:
        assert len(err.strip().splitlines()) == 1 and "run the same command to resume" in err
    r = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert sorted(int(m) for m in manifest["tables"][0]["entries"]) == [1, 16, 64]
    assert not list((tmp_path / "o").rglob(".*.tmp"))


@pytest.mark.parametrize("size", ["96k", "200k"])      # full at once; full while tuning
def test_a_full_disk_is_one_clear_line(tmp_path, env, size):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root in a mount namespace): "
                    + mounted.stderr.decode().strip()[:100])
    try:
        kernel = get_kernel("fp8_gemm")
        land = tmp_path / "l.jsonl"
        write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"),
                                  [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [1, 16, 64, 128])
        r = subprocess.run([sys.executable, "-m", "tuner", "gemm", "--model", "deepseek-v3", "--gpu", "H200",
                            "--tp", "8", "--only", "N=7168,K=2048", "--batch-sizes", "1", "16", "64", "128",
                            "--replay", str(land), "--trials", "40", "--out", str(disk / "o"), "--quiet"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "no space left" in lines[0] and "Traceback" not in r.stderr
        if size == "200k":       # full while tuning: the storage (a journal of ~2.4 KB a trial) filled it
            assert (disk / "o" / "studies.journal").stat().st_size > 100_000
        # no half file: whatever JSON is there parses
        for f in (disk / "o").rglob("*.json"):
            json.loads(f.read_text())
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
        shutil.rmtree(disk, ignore_errors=True)


def test_leftovers_of_killed_runs_are_cleared(tmp_path, env):
    """A temporary file in the engine's folder and a backup folder without its record (what a
    kill leaves) are gone after the next install; an old temporary in --out after the next run."""
    site, results = make_site(tmp_path / "site", count=2), make_results(tmp_path / "r", warps=8, count=2)
    stray = site / GEMM_FOLDER / f".{gemm_name(128)}.abc123.tmp"
    stray.write_text('{"1": {"BLOCK')
    orphan = tmp_path / "backups" / "vllm-20250101T000000-99"
    (orphan / "files").mkdir(parents=True)
    (orphan / "files" / "0000-x.json").write_text("{}")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    r = subprocess.run([sys.executable, "-m", "tuner", *install_args(results, site)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not stray.exists() and not orphan.exists()
    out = tmp_path / "o"
    (out / "vllm").mkdir(parents=True)
    left = out / "vllm" / ".t.json.x1.tmp"
    left.write_text("{")
    os.utime(left, (old, old))
    kernel = get_kernel("fp8_gemm")
    land = tmp_path / "l.jsonl"
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [1])
    r = subprocess.run([sys.executable, "-m", "tuner", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                        "--only", "N=7168,K=2048", "--batch-sizes", "1", "--replay", str(land), "--trials", "6",
                        "--out", str(out), "--quiet"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not left.exists()


# A proof whose one step is a command that sleeps (its pid in PIDFILE): what a kill of the
# proof does to the step's process, without a tuning run's cost.
PROOF_WITH_A_SLEEPING_STEP = """
import signal, sys
from pathlib import Path
from tuner.cli import _on_sigterm
from tuner.plan.gpus import get_gpu
from tuner.jobs.proof import Proof
from tuner.jobs.proof_steps import Command
signal.signal(signal.SIGTERM, _on_sigterm)
proof = Proof(Path(sys.argv[1]), get_gpu("H200"), minutes=5, device="cpu")
sleeper = [sys.executable, "-c", "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); "
           "time.sleep(300)"]
proof.builders = lambda: {"environment": lambda: [Command("sleeper", sleeper, "logs/sleeper.txt")]}
try:
    sys.exit(proof.execute(["environment"], log=lambda line: None))
except KeyboardInterrupt:
    sys.exit(143)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_proof_takes_its_step_along_and_reruns(tmp_path, env, sig):
    """kill -9 or SIGTERM of the proof mid-step: the step's process does not run on outside
    its time box, and the proof run again in the same folder completes (exit 0)."""
    out, pidfile = tmp_path / "proof", tmp_path / "step.pid"
    proc = subprocess.Popen([sys.executable, "-c", PROOF_WITH_A_SLEEPING_STEP, str(out)], cwd=REPO,
                            env={**env, "PIDFILE": str(pidfile)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    step = int(pidfile.read_text())
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while alive(step) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(step), "the proof's step ran on after the proof was killed"
    if sig == signal.SIGTERM:              # said, in the record of the steps, before it went
        steps = json.loads((out / "steps.json").read_text())["steps"]
        assert steps[0]["name"] == "environment" and steps[0]["status"] == "interrupted"
    rerun = ("import sys\nfrom pathlib import Path\nfrom tuner.plan.gpus import get_gpu\n"
             "from tuner.jobs.proof import Proof\nfrom tuner.jobs.proof_steps import Command\n"
             "p = Proof(Path(sys.argv[1]), get_gpu('H200'), minutes=1, device='cpu')\n"
             "p.builders = lambda: {'environment': lambda: [Command('quick', [sys.executable, '-c', 'pass'], "
             "'logs/quick.txt')]}\nsys.exit(p.execute(['environment'], log=lambda line: None))\n")
    r = subprocess.run([sys.executable, "-c", rerun, str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    steps = json.loads((out / "steps.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("environment", "ok")]


SLOWED_SYNTH = """
import sys, time
from tuner.measure import landscape
real = landscape.LandscapeWriter.write
def slow(self, *a, **k):
    time.sleep(0.02)
    return real(self, *a, **k)
landscape.LandscapeWriter.write = slow
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_synth_leaves_nothing_a_rerun_trips_on(tmp_path, env, sig):
    """kill -9 or SIGTERM of `landscape synth` mid-write: no file at --out, and the rerun
    writes the whole landscape once (no point of the killed run, no other run's .partial merged)
    and leaves no temporary (the killed run's goes at once, seconds after the kill)."""
    out = tmp_path / "l.jsonl"
    (tmp_path / "l.jsonl.partial").write_text('{"format": "tuner-landscape/1", "kernel": "fp8_gemm"}\n'
                                               '{"stray": "a recording of another run"}\n')
    args = ["landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
            "--batch-sizes", "1", "16", "--out", str(out)]
    proc = start(args, env, source=SLOWED_SYNTH)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 2000 for p in tmp_path.glob(".l.jsonl.*.tmp")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert not out.exists()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and len(err.strip().splitlines()) == 1 and not list(tmp_path.glob(".*.tmp"))
    r = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob(".l.jsonl.*.tmp")), "the killed run's temporary outlived the rerun"
    written = int(r.stdout.split("wrote ")[1].split()[0])
    lines = out.read_text().splitlines()
    assert len(lines) == written + 1 and "stray" not in out.read_text()
    keys = [json.dumps([(r := json.loads(line))["problem"], r["M"], r["config"]], sort_keys=True) for line in lines[1:]]
    assert len(set(keys)) == len(keys), "a point was written twice"


def test_two_runs_with_different_trials_say_so_in_the_manifest(tmp_path, env):
    """A second run into the same --out with a smaller --trials keeps the finished study as it
    is, and the manifest says with which budget it was searched (a larger one extends it)."""
    kernel = get_kernel("fp8_gemm")
    land = tmp_path / "l.jsonl"
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [1, 16])
    base = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
            "--replay", str(land), "--out", str(tmp_path / "o"), "--quiet"]
    first = subprocess.run([sys.executable, "-m", "tuner", *base, "--batch-sizes", "1", "--trials", "9"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-m", "tuner", *base, "--batch-sizes", "1", "16", "--trials", "5"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    search = manifest["search"] if "search" in manifest else manifest["run"]["search"]
    assert search["budget"] == 5
    assert search["earlier_runs"] == [{"budget": 9, "sampler": search["sampler"], "studies": 1}]


def test_a_write_killed_mid_commit_does_not_block_the_storage(tmp_path):
    """kill -9 in the middle of a write to a SQLite storage leaves a hot journal: the storage
    check rolls it back (as any SQLite client does) instead of calling the file no database."""
    import sqlite3

    from tuner.search.storage_checks import check_sqlite_file
    db = tmp_path / "studies.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE studies (study_id INTEGER, study_name TEXT)")
    con.executemany("INSERT INTO studies VALUES (?, ?)", [(i, "s" * 200) for i in range(2000)])
    con.commit()
    con.close()
    killed_mid_write = ("import os, signal, sqlite3, sys\ncon = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                        "con.execute('PRAGMA cache_size=2')\ncon.execute('BEGIN')\n"
                        "con.execute(\"UPDATE studies SET study_name = 'half' || study_name\")\n"
                        "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", killed_mid_write, str(db)], timeout=60)
    assert (tmp_path / "studies.db-journal").stat().st_size > 0          # the hot journal is there
    check_sqlite_file(db, f"sqlite:///{db}")
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM studies WHERE study_name LIKE 'half%'").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM studies").fetchone() == (2000,)
    con.close()
