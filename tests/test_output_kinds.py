"""Every file a command writes where the user says (an --out FILE, the files it puts in a folder
given as --out, --record, --bundle, a night's folder) replaces only a file of its own kind
(tuner/paths.py `replaceable`, the kinds in tuner/file_kinds.py): the user's notes, a link, a
FIFO, a folder or a device named by mistake is refused in one line, before any work, and left
as it was; the tool's own file of that kind is replaced as before (issue 51, item 1)."""

import datetime as _dt
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.errors import TunerError

NOTES = "my notes\n"
CANNED = {"format": "tuner-ceilings/1", "device": "CPU device (stand-in for NVIDIA H200)", "device_kind": "cpu",
          "copy_tb_s": 0.002, "bf16_tflops": 0.1, "fp8_tflops": 0.01, "sm_count": 132, "l2_bytes": 1 << 20,
          "figures": {}}


@pytest.fixture
def measured(monkeypatch):
    """`tuner ceilings` with its measurement stood in for (a canned file's figures): the calls."""
    from tuner.commands import ceilings
    calls: list = []
    monkeypatch.setattr(ceilings, "measure", lambda gpu, device="cuda": calls.append(gpu) or dict(CANNED))
    return calls


def victim(tmp_path: Path, what: str) -> tuple[Path, object]:
    """A path the user names by mistake, and how to see it was left alone."""
    path = tmp_path / "target"
    notes = tmp_path / "notes.txt"
    notes.write_text(NOTES)
    if what == "notes":
        path.write_text(NOTES)
    elif what == "a link to notes":
        path.symlink_to(notes)
    elif what == "a FIFO":
        os.mkfifo(path)
    elif what == "a folder":
        path.mkdir()
        (path / "kept").write_text(NOTES)
    elif what == "a character device":
        if os.geteuid() != 0:
            pytest.skip("making a character device needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))          # what /dev/null is
    st = os.lstat(path)
    return path, (stat.S_IFMT(st.st_mode), st.st_ino, notes.read_text(),
                  path.read_text() if what == "notes" else None)


def unchanged(path: Path, before) -> bool:
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode), st.st_ino, (path.parent / "notes.txt").read_text(),
            path.read_text() if before[3] is not None else None) == before


VICTIMS = ["notes", "a link to notes", "a FIFO", "a folder", "a character device"]


@pytest.mark.parametrize("what", VICTIMS)
def test_ceilings_out_replaces_nothing_but_a_ceilings_file(tmp_path, capsys, measured, what):
    """The issue's case: `tuner ceilings --gpu H200 --device cpu --out notes.txt` exited 0 with the
    notes gone (a character device was replaced by a regular file: as root, /dev/null). Now one
    line, before measuring, and the path as it was."""
    path, before = victim(tmp_path, what)
    assert main(["ceilings", "--gpu", "H200", "--device", "cpu", "--out", str(path)]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err and str(path) in err, err
    assert measured == [] and unchanged(path, before), what
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_ceilings_out_replaces_its_own_file_and_an_empty_one(tmp_path, capsys, measured):
    out = tmp_path / "c.json"
    out.write_text("")                                  # `mktemp` then --out: nothing to lose
    for _ in range(2):
        assert main(["ceilings", "--gpu", "H200", "--device", "cpu", "--out", str(out)]) == 0
        assert json.loads(out.read_text())["format"] == "tuner-ceilings/1"
    assert len(measured) == 2


def test_the_writer_itself_refuses_at_the_moment_it_writes(tmp_path):
    """The check is the writer's (a file put there after a command's early check is refused
    too); inside a folder of ours (no kind) a device, FIFO or folder is never replaced either,
    a link is (never followed)."""
    from tuner.file_kinds import CEILINGS
    from tuner.paths import atomic_write_json, atomic_write_text
    notes = tmp_path / "n.json"
    notes.write_text(NOTES)
    with pytest.raises(TunerError, match="is not a ceilings file"):
        atomic_write_json(notes, CANNED, kind=CEILINGS)
    assert notes.read_text() == NOTES
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, needle in (("fifo", "is a FIFO"), ("dir", "is a folder")):
        with pytest.raises(TunerError, match=needle):
            atomic_write_text(tmp_path / name, "x", root=tmp_path)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and (tmp_path / "dir").is_dir()
    (tmp_path / "link").symlink_to(notes)
    with pytest.raises(TunerError, match="symbolic link"):
        atomic_write_json(tmp_path / "link", CANNED, kind=CEILINGS)
    atomic_write_text(tmp_path / "link", "x", root=tmp_path)           # ours: replaced, not followed
    assert notes.read_text() == NOTES and not (tmp_path / "link").is_symlink()


# -- every other command that writes where the user says --------------------------------------------
GEMM = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
MS = ["1", "16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two small replay runs (one SYNTHETIC landscape) and the landscape."""
    d = tmp_path_factory.mktemp("runs")
    land = d / "l.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "gemm", *GEMM, "--kernel-source", "ours", "--batch-sizes", *MS,
                 "--out", str(land)]) == 0
    for name in ("old", "new"):
        assert main(["gemm", *GEMM, "--kernel-source", "ours", "--replay", str(land), "--trials", "3",
                     "--batch-sizes", *MS, "--out", str(d / name), "--quiet"]) == 0
    return d


def png(path: Path) -> None:
    """A PNG of the user's (drawn by a plotting script: not tuner's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    fig.savefig(path, format="png")
    plt.close(fig)


def nightly_yaml(root: Path) -> Path:
    from synthetic import block_fp8_model
    model = block_fp8_model(root / "tiny.yaml", 1024, 8)
    job = {"name": "a", "kernel": "gemm", "model": str(model), "gpu": "H200", "tp": 1, "trials": 2,
           "batch_sizes": [1], "kernel_source": "ours"}
    (root / "n.yaml").write_text(yaml.safe_dump({"runs_dir": str(root / "runs"), "jobs": [job]}))
    return root / "n.yaml"


TODAY = _dt.date.today().isoformat()
# (command, the file in its way: a path under tmp_path, "png" for a user's plot, "notes" for notes)
CASES = {
    "report --out FILE": (lambda t, r: ["report", str(r / "old"), "--out", str(t / "o" / "r.md")], "o/r.md", "notes"),
    "report --out FILE, a plot beside it": (lambda t, r: ["report", str(r / "old"), "--out", str(t / "o" / "r.md")],
                                            "o/plot-0.png", "png"),
    "diff --out DIR": (lambda t, r: ["diff", str(r / "old"), str(r / "new"), "--out", str(t / "o")], "o/diff.md",
                       "notes"),
    "diff --out DIR, a plot in it": (lambda t, r: ["diff", str(r / "old"), str(r / "new"), "--out", str(t / "o")],
                                     "o/diff-0.png", "png"),
    "diff --out DIR --force": (lambda t, r: ["diff", str(r / "old"), str(r / "new"), "--out", str(t / "o"), "--force"],
                               "o/diff.md", "notes"),
    "drift --out FILE": (lambda t, r: ["drift", str(r / "old"), "--gpu", "H200", "--replay", str(r / "l.jsonl.gz"),
                                       "--kernel-source", "ours", "--out", str(t / "o" / "d.json")], "o/d.json", "notes"),
    "bench --out DIR": (lambda t, r: ["bench", *GEMM, "--kernel", "gemm", "--kernel-source", "ours", "--replay",
                                      str(r / "l.jsonl.gz"), "--out", str(t / "o")],
                        f"o/bench-NVIDIA_H200-{TODAY}.json", "notes"),
    "bench --out DIR, a plot in it": (lambda t, r: ["bench", *GEMM, "--kernel", "gemm", "--kernel-source", "ours",
                                                    "--replay", str(r / "l.jsonl.gz"), "--out", str(t / "o")],
                                      f"o/bench-NVIDIA_H200-{TODAY}-0.png", "png"),
    "gemm --record FILE": (lambda t, r: ["gemm", *GEMM, "--kernel-source", "ours", "--batch-sizes", "1", "--device",
                                         "cpu", "--record", str(t / "o" / "land.jsonl"), "--out", str(t / "run"),
                                         "--dry-run"], "o/land.jsonl", "notes"),
    "audit --out DIR": (lambda t, r: ["audit", "--engine", "vllm", "--all", "--out", str(t / "o")], "o/audit.json",
                        "notes"),
    "audit --out DIR, its Markdown": (lambda t, r: ["audit", "--engine", "vllm", "--all", "--out", str(t / "o")],
                                      "o/audit.md", "notes"),
    "proof --bundle DIR": (lambda t, r: ["proof", "--device", "cpu", "--gpu", "H200", "--out", str(t / "p"),
                                         "--bundle", str(t / "o"), "--steps", "environment"], "o/summary.md", "notes"),
    "proof --out DIR": (lambda t, r: ["proof", "--device", "cpu", "--gpu", "H200", "--out", str(t / "o"),
                                      "--steps", "environment"], "o/environment.json", "notes"),
    "nightly: the night's report": (lambda t, r: ["nightly", str(nightly_yaml(t)), "--night", "n1", "--synthetic"],
                                    "runs-synthetic/n1/report.md", "notes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_in_the_way_of_a_command_is_refused_and_kept(runs, tmp_path, capsys, monkeypatch, case):
    """Before: each of these replaced the file in its way (exit 0)."""
    argv, rel, kind = CASES[case]
    from tuner.jobs import proof
    started: list = []
    monkeypatch.setattr(proof.Proof, "execute", lambda self, steps, log=print: started.append(1) or 0)
    target = tmp_path / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "png":
        png(target)
    else:
        target.write_text(NOTES)
    before = target.read_bytes()
    others = sorted(p for p in target.parent.iterdir())
    capsys.readouterr()
    assert main(argv(tmp_path, runs)) == 2, case
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "exists and is not" in err and target.name in err, err
    assert target.read_bytes() == before
    assert sorted(p for p in target.parent.iterdir()) == others            # nothing beside it written either
    assert not started and not (tmp_path / "runs-synthetic" / "n1" / "a").exists()


def test_what_the_commands_write_they_replace_when_run_again(runs, tmp_path, capsys):
    """Each kind is told by what the tool writes: run twice into the same place, the second run
    replaces the first's files (the kinds are not so strict that a command cannot be rerun)."""
    from tuner import file_kinds as k
    commands = [CASES["report --out FILE"][0], CASES["diff --out DIR"][0], CASES["drift --out FILE"][0],
                CASES["bench --out DIR"][0]]
    for argv in commands:
        for _ in range(2):
            assert main(argv(tmp_path, runs)) == 0, argv(tmp_path, runs)
    o = tmp_path / "o"
    checks = [(o / "r.md", k.REPORT_MD), (o / "plot-0.png", k.PLOT), (o / "diff.md", k.DIFF_MD),
              (o / "diff-0.png", k.PLOT), (o / "d.json", k.DRIFT_JSON), (runs / "l.jsonl.gz", k.LANDSCAPE),
              (o / f"bench-NVIDIA_H200-{TODAY}.json", k.BENCH_JSON), (o / f"bench-NVIDIA_H200-{TODAY}.md", k.BENCH_MD),
              (o / f"bench-NVIDIA_H200-{TODAY}-0.png", k.PLOT)]
    for path, kind in checks:
        assert kind.ours(path), path
    user = tmp_path / "user.png"
    png(user)
    assert not k.PLOT.ours(user) and not k.LANDSCAPE.ours(o / "d.json") and not k.BENCH_MD.ours(o / "r.md")
