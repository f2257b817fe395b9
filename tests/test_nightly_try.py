"""`tuner nightly` tried without a GPU (issue 41, item 3): --dry-run prints every job's plan and
writes nothing; --synthetic runs the night on SYNTHETIC landscapes (into RUNS_DIR-synthetic),
and a second such night finds nothing changed; without a device, a night that would time on
the GPU refuses before its first job, writing nothing."""

import json
from pathlib import Path

import pytest
import yaml
from synthetic import block_fp8_model

from tuner.cli import main


def nightly_yaml(root: Path) -> Path:
    model = block_fp8_model(root / "tiny.yaml", 1024, 8)
    job = {"kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": 4, "batch_sizes": [1],
           "kernel_source": "ours"}
    path = root / "n.yaml"
    path.write_text(yaml.safe_dump({"runs_dir": str(root / "runs"), "jobs": [{**job, "name": "a"}]}))
    return path


def no_gpu() -> bool:
    import torch
    return not torch.cuda.is_available()


@pytest.mark.skipif(not no_gpu(), reason="a GPU is visible: the night would run")
def test_a_night_without_a_device_refuses_up_front_and_writes_nothing(tmp_path, capsys):
    config = nightly_yaml(tmp_path)
    assert main(["nightly", str(config), "--night", "n1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "job 'a'" in err[0] and "no CUDA GPU" in err[0], err
    assert "--dry-run" in err[0] and "--synthetic" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.yaml", "tiny.yaml"]


def test_a_dry_run_prints_every_jobs_plan_and_writes_nothing(tmp_path, capsys):
    config = nightly_yaml(tmp_path)
    assert main(["nightly", str(config), "--night", "n1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "job a: tuner gemm" in out and "first run" in out and "studies" in out
    assert str(tmp_path / "runs" / "n1" / "a") in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.yaml", "tiny.yaml"]


def test_two_synthetic_nights_tune_then_keep(tmp_path, capsys):
    config = nightly_yaml(tmp_path)
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 0
    runs = tmp_path / "runs-synthetic"
    [first] = json.loads((runs / "n1" / "summary.json").read_text())
    assert first["status"] == "fresh"
    manifest = json.loads((runs / "n1" / "a" / "manifest.json").read_text())
    assert manifest["tables"] and (runs / "n1" / "a" / "synthetic-fp8_gemm.jsonl.gz").is_file()
    assert main(["nightly", str(config), "--night", "n2", "--synthetic"]) == 0
    [second] = json.loads((runs / "n2" / "summary.json").read_text())
    assert second["status"] == "unchanged"                # the same cost model: no drift, nothing retuned
    assert "SYNTHETIC" in json.loads((runs / "state.json").read_text())["a"]["environment"]["device"]
    assert not (tmp_path / "runs").exists()               # a real night's folder is never touched
    capsys.readouterr()


def test_a_synthetic_night_on_a_full_disk_says_so_and_leaves_no_temporary(tmp_path, capsys):
    """The file size limit (as `ulimit -f`) stands for a full disk (issue 42, item 8). Before:
    the job failed with 'internal error: OSError', and the night's own state write ended in a
    traceback-like internal error."""
    import os
    import resource
    import signal
    config = nightly_yaml(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 10, hard))
    try:
        rc = main(["nightly", str(config), "--night", "n1", "--synthetic"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    cap = capsys.readouterr()
    err = cap.err + cap.out
    assert rc in (1, 2) and "internal error" not in err and "Traceback" not in err, err
    assert ("space" in err.lower() or "too large" in err.lower()), err
    left = [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    assert left == [], left
    assert os.path.isfile(config)


def _night_then_compact_state(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A synthetic night n1, then its state.json rewritten compact (the same jobs), so that the
    next night's state write changes the file's bytes: what a failed write must leave as it was."""
    config = nightly_yaml(tmp_path)
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 0
    state = tmp_path / "runs-synthetic" / "state.json"
    state.write_text(json.dumps(json.loads(state.read_text()), separators=(",", ":")))
    return config, state, state.read_bytes()


def test_a_full_disk_at_the_nights_state_write_is_one_line_and_keeps_the_state(tmp_path, capsys):
    """A full disk (the file size limit, as `ulimit -f 0`, smaller than state.json) when the
    night writes its own state, the job itself done: exit 2, one line naming the state file and
    the full disk, the previous state.json byte for byte, no temporary, no half report. Before:
    the line named no file ('file too large for the file system')."""
    import resource
    import signal
    config, state, before = _night_then_compact_state(tmp_path)
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, hard))
    try:
        rc = main(["nightly", str(config), "--night", "n2", "--synthetic"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(state) in err[0] and "too large" in err[0], err
    assert state.read_bytes() == before
    night = tmp_path / "runs-synthetic" / "n2"
    assert not (night / "report.md").exists() and not (night / "summary.json").exists()
    assert [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")] == []


def _no_space_at(monkeypatch, target: str) -> None:
    """ENOSPC at the write of each file named `target`, after half its bytes were written."""
    import errno

    from tuner import paths
    real = paths.atomic_write_file

    def filling(path, fill, root=None, **kw):
        if Path(path).name != target:
            return real(path, fill, root, **kw)

        def half_then_full(tmp):
            fill(tmp)
            data = tmp.read_bytes()
            tmp.write_bytes(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, half_then_full, root, **kw)
    monkeypatch.setattr(paths, "atomic_write_file", filling)


@pytest.mark.parametrize("target", ["report.md", "summary.json"])
def test_a_night_rerun_after_its_report_failed_to_be_written_reports_the_retune(tmp_path, monkeypatch, capsys,
                                                                                 target):
    """The disk full at the report (or summary) after the job's retune and state.json were
    written; the same night run again reports what the night did to the job (here its first
    run: "fresh"), from the outcome kept with the state. Before: "unchanged", the retune lost."""
    config = nightly_yaml(tmp_path)
    _no_space_at(monkeypatch, target)
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 2
    monkeypatch.undo()
    night = tmp_path / "runs-synthetic" / "n1"
    assert not (night / target).exists() and (night / "a" / "manifest.json").is_file()
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 0
    [job] = json.loads((night / "summary.json").read_text())
    assert job["status"] == "fresh" and job["why"] == "first run" and job["run"] == str(night / "a"), job
    assert "| a | fresh | why first run |" in (night / "report.md").read_text()
    assert "a fresh" in capsys.readouterr().out
    # another night's report says the job is unchanged: the outcome is this night's alone
    assert main(["nightly", str(config), "--night", "n2", "--synthetic"]) == 0
    [job] = json.loads((tmp_path / "runs-synthetic" / "n2" / "summary.json").read_text())
    assert job["status"] == "unchanged", job


@pytest.mark.parametrize("target", ["state.json", "report.md", "summary.json"])
def test_no_space_at_the_nights_own_writes_is_one_line_and_nothing_half_written(tmp_path, monkeypatch, capsys,
                                                                                target):
    """ENOSPC injected where the bytes go (half the file written, as a filling disk does) into
    each of the night's own files in turn: exit 2, one line naming that file and the full disk,
    the file as it was (state.json: the previous night's, byte for byte), no temporary. Before:
    the line named no file."""
    config, state, before = _night_then_compact_state(tmp_path)
    capsys.readouterr()
    _no_space_at(monkeypatch, target)
    rc = main(["nightly", str(config), "--night", "n2", "--synthetic"])
    err = capsys.readouterr().err.strip().splitlines()
    written = tmp_path / "runs-synthetic" / ("" if target == "state.json" else "n2") / target
    assert rc == 2 and len(err) == 1 and str(written) in err[0] and "no space left" in err[0], err
    assert not written.exists() if target != "state.json" else state.read_bytes() == before
    assert [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")] == []


def test_the_night_compares_each_engines_entry_of_one_problem(tmp_path, capsys):
    """A results folder where one GEMM problem was timed on our kernel for vLLM's file and, by a
    second run into it, for SGLang's (as the GPU window leaves it: two manifest entries of one
    kernel, source and problem, update_manifest keeping one per file): keeping the better
    previous configs compares both entries and keeps both. Before: nightly keyed tables by
    kernel, source and problem, so it compared the last entry only and rewrote the manifest
    without the other (vLLM's table left on disk, unrecorded)."""
    from tuner.jobs.nightly_keep import keep_better
    model = block_fp8_model(tmp_path / "tiny.yaml", 1024, 8)
    runs = {}
    for run in ("prev", "new"):
        for engine in ("vllm", "sglang"):
            assert main(["gemm", "--model", str(model), "--gpu", "H200", "--tp", "1", "--batch-sizes", "1",
                         "--trials", "3", "--kernel-source", "ours", "--engines", engine, "--synthetic",
                         "--only", "N=1024,K=1024", "--out", str(tmp_path / run)]) == 0
        runs[run] = json.loads((tmp_path / run / "manifest.json").read_text())["tables"]
    capsys.readouterr()
    assert [sorted(t["files"]) for t in runs["new"]] == [["vllm"], ["sglang"]]
    job = {"name": "a", "kernel": "gemm", "gpu": "H200", "kernel_source": "ours", "synthetic": True}
    assert keep_better(tmp_path / "prev", tmp_path / "new", job, 0.02) == 2     # the same configs: both kept
    tables = json.loads((tmp_path / "new" / "manifest.json").read_text())["tables"]
    assert [sorted(t["files"]) for t in tables] == [["vllm"], ["sglang"]]
    assert all(t["entries"]["1"].get("kept_previous") for t in tables)
    for t in tables:                # each engine's file holds its entry's config, as the engine reads it
        assert json.loads((tmp_path / "new" / next(iter(t["files"].values()))).read_text())["1"]


@pytest.mark.parametrize("runs_dir", [".", "/", "..", "runs/.."])
def test_a_synthetic_night_into_a_runs_dir_with_no_name_is_one_line(tmp_path, monkeypatch, capsys, runs_dir):
    """RUNS_DIR-synthetic has no meaning for '.', '/' or '..'. Before: '.' and '/' ended in
    'internal error: ValueError', '..' wrote into a folder named '..-synthetic'."""
    config = nightly_yaml(tmp_path)
    config.write_text(config.read_text().replace(str(tmp_path / "runs"), runs_dir))
    monkeypatch.chdir(tmp_path)
    for mode in ("--dry-run", None):
        assert main(["nightly", str(config), "--night", "n1", "--synthetic", *([mode] if mode else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"runs_dir {runs_dir!r} names no folder of its own" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.yaml", "tiny.yaml"]


@pytest.mark.parametrize("key,value", [("routing", "r.npy"), ("traffic", "t.json")], ids=["gemm routing", "mla traffic"])
def test_a_job_with_an_option_its_kernel_does_not_take_is_refused_before_the_night(tmp_path, capsys, key, value):
    """A GEMM job with a routing file, an MLA job with a traffic profile: refused with the
    job's name before anything is written, in a dry run as in a night. Before: for the routing
    file the dry run's line named no job, and the night ran, wrote its folder and failed the job
    (exit 1); the MLA job's profile was read first (this empty one refused as empty)."""
    config = nightly_yaml(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    (tmp_path / value).write_text("")
    cfg["jobs"][0].update({key: str(tmp_path / value), **({"kernel": "mla"} if key == "traffic" else {})})
    config.write_text(yaml.safe_dump(cfg))
    for mode in ("--dry-run", "--synthetic"):
        assert main(["nightly", str(config), "--night", "n1", mode]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "job 'a'" in err[0] and f"--{key} applies to" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["n.yaml", "tiny.yaml", value])


@pytest.mark.parametrize("edit", ["unfinished elsewhere", "baseline a number", "unfinished a word", "outcome a list",
                                  "outcome forging a report line", "outcome of no status"])
def test_a_state_naming_a_folder_of_no_night_is_refused_before_anything_is_written(tmp_path, capsys, edit):
    """A night continues a job's unfinished retune in the folder the state names: a state
    edited (or forged) to name another folder had the night write its run there (into '/',
    as root). Before: the run was written into that folder; a baseline that is a number ended
    in 'internal error: TypeError'. Now the state is refused in one line, nothing written."""
    config = nightly_yaml(tmp_path)
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 0
    state = tmp_path / "runs-synthetic" / "state.json"
    entry = json.loads(state.read_text())["a"]
    (tmp_path / "elsewhere").mkdir()
    entry.update({"unfinished elsewhere": {"unfinished": True, "run": str(tmp_path / "elsewhere")},
                  "baseline a number": {"unfinished": True, "baseline": 5},
                  "unfinished a word": {"unfinished": "no"},
                  # the night's outcome, kept for a rerun of that night to report (read when the night is n2)
                  "outcome a list": {"night": "n2", "outcome": ["fresh"]},
                  "outcome forging a report line": {"night": "n2", "outcome": {
                      "status": "fresh", "run": entry["run"], "why": "x |\n| b | improved | y"}},
                  "outcome of no status": {"night": "n2", "outcome": {"status": "unchanged", "run": entry["run"]}},
                  }[edit])
    state.write_text(json.dumps({"a": entry}))
    capsys.readouterr()
    for mode in ("--dry-run", None):
        assert main(["nightly", str(config), "--night", "n2", "--synthetic", *([mode] if mode else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"nightly state {state}: job 'a'" in err[0], err
    assert list((tmp_path / "elsewhere").iterdir()) == [] and not (tmp_path / "runs-synthetic" / "n2").exists()


def test_a_key_given_twice_in_the_jobs_yaml_is_refused(tmp_path, capsys):
    """`trials: 4` then `trials: 400` in one job: PyYAML kept the last silently, so the night
    ran 400 trials a study with nothing said. Now every YAML tuner reads (tuner/reading.py)
    refuses a mapping holding a key twice, naming the key and its line."""
    config = nightly_yaml(tmp_path)
    text = config.read_text()
    assert "\n  trials: 4\n" in text
    config.write_text(text.replace("  trials: 4\n", "  trials: 4\n  trials: 400\n"))
    assert main(["nightly", str(config), "--night", "n1", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has the key 'trials' twice in one mapping (line" in err[0], err


def test_a_synthetic_night_says_why_its_tables_are_not_installed(tmp_path, capsys):
    """A job with `install:` in a --synthetic night: the tables are SYNTHETIC, which is why they
    stay (not a missing engine, whose advice would lead to one more refusal)."""
    config = nightly_yaml(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    cfg["jobs"][0]["install"] = {"engine": "vllm"}
    config.write_text(yaml.safe_dump(cfg))
    assert main(["nightly", str(config), "--night", "n1", "--synthetic"]) == 0
    printed = "".join(capsys.readouterr())
    assert "a: not installed: its tables are SYNTHETIC" in printed and "site-packages" not in printed
    [first] = json.loads((tmp_path / "runs-synthetic" / "n1" / "summary.json").read_text())
    assert first["installed"] is False

