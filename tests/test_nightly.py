"""`tuner nightly` and scripts/nightly_retune.sh over SYNTHETIC landscapes: night 2 changes
Triton and makes one job's GPU faster and the other's slower."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from synthetic import block_fp8_model, scaled_landscape, write_synthetic_landscape

from tuner.cli import main
from tuner.measure.landscape import read_landscape
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.problems import Problem
from tuner.plan.space import load_space

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def script_turn():
    """The script's lock (logs/.nightly.lock) is the checkout's: the tests that start it take turns.
    With xdist, this file and test_night_slots.py run at once on two workers, and the second start
    exited 75 ("another night is still running")."""
    (REPO / "logs").mkdir(exist_ok=True)
    with open(REPO / "logs" / ".tests-nightly-script.lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        yield
KERNEL = get_kernel("fp8_gemm")
MS = [1, 16]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("nightly")
    model = block_fp8_model(d / "tiny.yaml", 1024, 8)
    problems = [p.params for p in gemm_problems(load_model(str(model)), 1)]
    base = d / "base.jsonl"
    write_synthetic_landscape(base, KERNEL, load_space(KERNEL), get_gpu("H200"), problems, MS)
    lands = {"a1": base, "b1": base,
             "a2": scaled_landscape(base, d / "a2.jsonl", KERNEL, 0.8, triton="3.7.0"),   # job a: faster
             "b2": scaled_landscape(base, d / "b2.jsonl", KERNEL, 1.3, triton="3.7.0")}   # job b: slower
    return d, model, lands


def config(d: Path, model: Path, a: Path, b: Path, name: str) -> Path:
    job = {"kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": 10, "batch_sizes": MS}
    cfg = {"runs_dir": str(d / "runs"), "noise": 0.02,
           "jobs": [{**job, "name": "a", "replay": str(a)}, {**job, "name": "b", "replay": str(b)}]}
    path = d / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_three_nights(world, capsys):
    d, model, lands = world
    night1 = config(d, model, lands["a1"], lands["b1"], "night1.yaml")
    night2 = config(d, model, lands["a2"], lands["b2"], "night2.yaml")
    assert main(["nightly", str(night1), "--night", "n1"]) == 0
    summary = json.loads((d / "runs/n1/summary.json").read_text())
    assert [r["status"] for r in summary] == ["fresh", "fresh"]

    # Triton changed: both retune; a got faster, b slower even with its old configs kept
    assert main(["nightly", str(night2), "--night", "n2"]) == 3
    summary = {r["job"]: r for r in json.loads((d / "runs/n2/summary.json").read_text())}
    assert summary["a"]["status"] == "improved" and summary["a"]["slower"] == 0
    assert summary["b"]["status"] == "regressed" and summary["b"]["slower"] > 0
    report = (d / "runs/n2/report.md").read_text()
    assert "| a | improved |" in report and "| b | regressed |" in report
    assert "environment changed" in report
    diff_b = Path(summary["b"]["diff"]).read_text()
    assert "+30.0%" in diff_b
    # b's new tables keep last night's configs where the new ones were not faster
    manifest_b = json.loads((d / "runs/n2/b/manifest.json").read_text())
    kept = [e for t in manifest_b["tables"] for e in t["entries"].values() if e.get("kept_previous")]
    assert len(kept) == summary["b"]["kept_previous"] > 0
    for t in manifest_b["tables"]:
        table = json.loads((d / "runs/n2/b" / t["files"]["vllm"]).read_text())
        assert {m: e["config"] for m, e in t["entries"].items()} == table

    # nothing changed since: drift says the tables still win, nothing is retuned
    assert main(["nightly", str(night2), "--night", "n3"]) == 0
    summary = json.loads((d / "runs/n3/summary.json").read_text())
    assert [r["status"] for r in summary] == ["unchanged", "unchanged"]
    assert not (d / "runs/n3/a").exists()


def test_bad_nightly_config(tmp_path, capsys):
    f = tmp_path / "n.yaml"
    f.write_text("jobs:\n  - name: x\n    kernel: conv\n    model: deepseek-v3\n    gpu: H200\n")
    assert main(["nightly", str(f)]) == 2
    assert "kernel must be one of" in capsys.readouterr().err


def test_script_lock_log_and_exit_status(world, tmp_path):
    d, model, lands = world
    cfg = config(tmp_path, model, lands["a1"], lands["b1"], "n.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_NIGHT": "s1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = REPO / "scripts" / "nightly_retune.sh"
    with script_turn():
        with open(REPO / "logs" / ".nightly.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)          # another night holds the lock
            busy = subprocess.run(["bash", str(script), str(cfg)], env=env, capture_output=True, text=True)
            fcntl.flock(lock, fcntl.LOCK_UN)
        assert busy.returncode == 75 and "another night" in busy.stderr
        done = subprocess.run(["bash", str(script), "--python", sys.executable, str(cfg)], env=env,
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    log = (REPO / "logs" / "nightly-s1.log").read_text()
    assert "exit 0" in log and "a fresh" in log
    (REPO / "logs" / "nightly-s1.log").unlink()


def test_script_help_and_bad_arguments():
    script = REPO / "scripts" / "nightly_retune.sh"
    shown = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: scripts/nightly_retune.sh")
    assert "--python PYTHON" in shown.stdout and not (REPO / "--help").exists()
    bad = subprocess.run(["bash", str(script), "--nights", "2"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip() == "nightly: unknown option --nights (see --help)"


def test_script_runs_from_a_bare_cron_environment(world, tmp_path):
    """As the header's crontab line runs it: no PATH beyond /usr/bin:/bin, no activated
    environment, another working folder; only --python names the environment. A Python
    without tuner is one clear line and exit 1, in the log too."""
    d, model, lands = world
    cfg = config(tmp_path, model, lands["a1"], lands["b1"], "n.yaml")
    script = REPO / "scripts" / "nightly_retune.sh"
    cron = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh", "TUNER_NIGHT": "cron1"}
    log = REPO / "logs" / "nightly-cron1.log"
    try:
        with script_turn():
            none = subprocess.run([str(script), "--python", "/bin/false", str(cfg)], env=cron, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)
            ran = subprocess.run([str(script), "--python", sys.executable, str(cfg)], env=cron, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=300)
        assert none.returncode == 1 and "/bin/false cannot import tuner" in none.stderr
        assert len(none.stderr.strip().splitlines()) == 1 and "cannot import tuner" in log.read_text()
        assert ran.returncode == 0, ran.stderr + log.read_text()
        assert "exit 0" in log.read_text() and (tmp_path / "runs" / "cron1" / "report.md").is_file()
    finally:
        log.unlink(missing_ok=True)


def test_mla_tables_drift_retune_and_never_get_slower(tmp_path, capsys):
    """MLA decode tables (our own format) go through the same night: drift re-times them,
    a retune is seeded with them, and the new table is never slower than the old one."""
    import kernels.mla_decode as md
    from tuner.plan.models import mla_problems

    kernel, gpu = get_kernel("mla_decode"), get_gpu("H200")
    space = load_space(kernel)
    problems, _ = mla_problems(load_model("deepseek-v3"), 8, [4096], 64)
    base = tmp_path / "mla1.jsonl"
    write_synthetic_landscape(base, kernel, space, gpu, [p.params for p in problems], MS)
    job = {"name": "mla", "kernel": "mla", "model": "deepseek-v3", "gpu": "H200", "tp": 8, "trials": 12,
           "batch_sizes": MS, "contexts": [4096]}

    def night(land, name):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "noise": 0.02,
                                       "jobs": [{**job, "replay": str(land)}]}))
        return main(["nightly", str(cfg), "--night", name])

    def table_of(name):
        path = tmp_path / "runs" / name / "mla/tuner/mla_decode" / md.table_filename(16, 64, "NVIDIA H200")
        return {(p["context"], M): (p, c) for p, rows in md.read_table(json.loads(path.read_text()))
                for M, c in rows.items()}

    assert night(base, "n1") == 0
    old = table_of("n1")
    default = {k: space.canonical(p, k[1], gpu, kernel.default_config(p, k[1])) for k, (p, _) in old.items()}
    beaten = [k for k, (_, c) in old.items() if c != default[k]]
    assert beaten                                  # the first night found better than the default

    # Same software, but last night's winners got 3x slower here: drift sees them lose.
    slow = scaled_landscape(base, tmp_path / "mla2.jsonl", kernel, 3.0,
                            only=lambda p, M, c: old.get((p["context"], M), (None, None))[1] == c)
    rows = tmp_path / "drift.json"
    assert main(["drift", str(tmp_path / "runs/n1/mla"), "--gpu", "H200", "--replay", str(slow),
                 "--out", str(rows)]) == 0
    losing = {(4096, r["M"]) for r in json.loads(rows.read_text()) if r["verdict"] == "loses"}
    assert losing and losing <= set(beaten)
    assert f"{len(losing)} of {len(old)} entries no longer beat the default" in capsys.readouterr().out
    assert night(slow, "n2") in (0, 3)
    summary = json.loads((tmp_path / "runs/n2/summary.json").read_text())[0]
    assert summary["why"] == "a table lost to the default"
    new = table_of("n2")
    times = read_landscape(slow, kernel)
    for k, (p, c) in new.items():
        def point(cfg, p=p, m=k[1]):
            return times.points[(Problem("mla_decode", p).key, m)][tuple(cfg[x] for x in kernel.config_keys)]
        assert point(c).time_us <= point(old[k][1]).time_us        # never slower than last night's config
        if k in losing:
            assert c != old[k][1]
    manifest = json.loads((tmp_path / "runs/n2/mla/manifest.json").read_text())
    entries = {(t["problem"]["context"], int(M)): e["config"] for t in manifest["tables"] for M, e in t["entries"].items()}
    assert entries == {k: c for k, (_, c) in new.items()}           # the file says what the manifest says

    # nothing changed since: the new table still wins, nothing is retuned
    assert night(slow, "n3") == 0
    assert json.loads((tmp_path / "runs/n3/summary.json").read_text())[0]["status"] == "unchanged"


def test_a_job_tunes_by_its_traffic_profile(world, tmp_path, capsys):
    """`traffic: FILE` in a job: the night's run budgets its studies by that profile and its
    manifest records the profile (so report and diff weigh by it); a traffic value that is
    not a path is one line."""
    d, model, lands = world
    traffic = tmp_path / "traffic.csv"
    traffic.write_text("M,weight\n1,1\n16,9\n")
    job = {"name": "t", "kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": 10,
           "batch_sizes": MS, "replay": str(lands["a1"]), "traffic": str(traffic)}
    cfg = tmp_path / "night.yaml"
    cfg.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "jobs": [job]}))
    assert main(["nightly", str(cfg), "--night", "n1"]) == 0
    manifest = json.loads((tmp_path / "runs/n1/t/manifest.json").read_text())
    recorded = manifest["traffic"]
    assert recorded["source"] == str(traffic) and {tuple(r) for b in recorded["buckets"] for r in b["runs"]} == \
        {(1, 1, 1.0), (16, 16, 9.0)}
    trials = {int(M): e["trials"] for t in manifest["tables"] for M, e in t["entries"].items()}
    assert trials[16] > trials[1]                   # 90 % of the passes get the larger budget
    capsys.readouterr()
    cfg.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "jobs": [{**job, "traffic": ["a", "b"]}]}))
    assert main(["nightly", str(cfg), "--night", "n2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "traffic must be a name or a path" in err
