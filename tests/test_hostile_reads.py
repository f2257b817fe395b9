"""Unbounded reads (issue 33, item 4): what a file says never sets how much the tool reads or
computes. A traffic histogram bucket labelled le="1e9" is bounded by the M a table can
serve, not spread over a billion integers; `tuner audit` finds a FIFO, a link to /dev/zero
and a zip bomb in a wheel where it reads tables, and says so as findings, neither waiting
nor filling the memory; every reader of the tool goes through tuner/reading.py (a scan of
the source). Memory is capped (an address-space limit) where the input is hostile, and one
command is run in a child process whose peak memory is read back."""

import json
import os
import re
import zipfile
from pathlib import Path

import pytest
from bounded import COMMAND_CAP, GIB, deadline, run_measured

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
V3_MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
ROW = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
VMOE = "vllm/model_executor/layers/fused_moe/configs"


def vllm_dump(path: Path, bound: str = "1e9", inf_count: float = 20.0) -> Path:
    """A 4-line vLLM /metrics dump whose last finite bucket is labelled `bound`."""
    path.write_text(
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 0.0\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="m"} 10.0\n'
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="{bound}",model_name="m"}} 20.0\n'
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {inf_count}\n')
    return path


# -- traffic: bounded by the served range ---------------------------------------------------------
PROFILE = """
import json, sys
from tuner.plan.traffic import choose_keys, key_coverage, load_profile, split_budget
profile = load_profile(sys.argv[1], tp=8)
ms, ws = profile.arrays()
plan = choose_keys(profile)
coverage = key_coverage(plan.keys, profile)
budget = split_budget(plan.shares(), 32)
print(json.dumps({"first": int(ms[0]), "last": int(ms[-1]), "total": float(ws.sum()), "notes": profile.notes,
                  "keys": plan.keys, "covered": sum(c.share for c in coverage), "budget": sum(budget.values()),
                  "far": [c.ratio for c in coverage if c.share > 0.01 and c.ratio > 1.25]}))
"""


def test_a_bucket_labelled_1e9_is_bounded_by_the_served_range(tmp_path):
    """The profile, its key choice, coverage and budget: every served M within 1..MAX_M,
    said in a note, in a process whose peak memory stays under 1.5 GB (unbounded, this took
    4-7 GB and minutes)."""
    from tuner.plan.traffic_profile import MAX_M
    rc, out, err, peak = run_measured([str(vllm_dump(tmp_path / "m.txt"))], code=PROFILE, timeout=120)
    assert rc == 0, err[-2000:]
    got = json.loads(out)
    assert got["first"] == 2 and got["last"] == MAX_M and abs(got["total"] - 1) < 1e-9
    assert any(f"taken as 9 to {MAX_M}" in n for n in got["notes"])
    assert max(got["keys"]) == MAX_M and abs(got["covered"] - 1) < 1e-9 and got["budget"] == 32 * len(got["keys"])
    assert got["far"] == []
    assert peak < COMMAND_CAP, f"peak resident memory {peak / GIB:.2f} GiB"


def test_passes_beyond_every_table_key_are_left_out_and_said(tmp_path):
    """A bucket that starts above MAX_M holds no M a table serves: left out, with a note."""
    from tuner.plan.traffic import load_profile
    dump = tmp_path / "m.txt"
    dump.write_text(
        'vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="m"} 10.0\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="4e6",model_name="m"} 10.0\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 30.0\n')
    with deadline(30):
        profile = load_profile(dump)
        assert profile.arrays()[0][-1] == 8 and any("left out" in n for n in profile.notes)


@pytest.mark.parametrize("command", ["gemm", "audit"])
def test_commands_on_a_1e9_bucket_take_under_1_5_gb(tmp_path, command):
    """The plan of a tuning run, and an audit, under that profile, each in a process of its
    own: no internal error, the served range said, peak resident memory (wait4's ru_maxrss)
    under 1.5 GB."""
    dump = vllm_dump(tmp_path / "m.txt")
    if command == "gemm":
        argv = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
                "--kernel-source", "ours", "--traffic", str(dump), "--dry-run"]
    else:
        (tmp_path / "ov").mkdir()
        (tmp_path / "ov" / V3_MOE).write_text(json.dumps({"1": ROW, "64": ROW}))
        argv = ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(tmp_path / "ov"),
                "--traffic", str(dump)]
    rc, out, err, peak = run_measured(argv, timeout=300)
    assert rc in (0, 1) and "internal error" not in err, err[-2000:]
    assert "1048576" in out
    assert peak < COMMAND_CAP, f"peak resident memory {peak / GIB:.2f} GiB"


# -- the audit's reads: FIFOs, devices, zip bombs ----------------------------------------------------
def audit_override(tmp_path: Path, make) -> list[str]:
    """`tuner audit` of deepseek-v3 on vLLM 0.33.0 with an override folder whose MoE table
    is what `make(path)` puts there."""
    folder = tmp_path / "ov"
    folder.mkdir()
    make(folder / V3_MOE)
    return ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model", "deepseek-v3",
            "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(folder)]


@pytest.mark.parametrize("what,make", [
    ("FIFO", os.mkfifo),
    ("link to a FIFO", lambda p: (os.mkfifo(p.with_name("pipe")), p.symlink_to(p.with_name("pipe")))),
])
def test_audit_reports_a_table_it_would_wait_on(tmp_path, capsys, what, make):
    """The table the engine reads is a FIFO (or a link to one): an error finding that says
    why (the engine would wait on it forever), in seconds, never a read that waits."""
    argv = audit_override(tmp_path, make)
    with deadline(30):
        rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 1 and "internal error" not in err, err
    assert "crashes_loader" in out and "is not a regular file" in out


def test_audit_reports_a_link_to_dev_zero(tmp_path):
    """The table is a link to /dev/zero: a finding, in a process whose memory stays under
    1.5 GB (read, it never ends)."""
    rc, out, err, peak = run_measured(audit_override(tmp_path, lambda p: p.symlink_to("/dev/zero")), timeout=120)
    assert rc == 1 and "internal error" not in err, err[-2000:]
    assert "crashes_loader" in out and "is not a regular file" in out
    assert peak < COMMAND_CAP, f"peak resident memory {peak / GIB:.2f} GiB"


def test_audit_all_names_a_fifo_among_the_tables(tmp_path, capsys):
    """--all over an override folder: a FIFO named like a table is a finding too, not skipped."""
    folder = tmp_path / "ov"
    folder.mkdir()
    os.mkfifo(folder / V3_MOE)
    with deadline(30):
        rc = main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--all",
                   "--moe-config-dir", str(folder)])
    out = capsys.readouterr().out
    assert rc == 1 and "is not a regular file" in out


def bomb_wheel(tmp_path: Path, inflated: int) -> Path:
    """A wheel named as vLLM 0.33.0's whose shipped DeepSeek-V3 MoE table is a few KB that
    inflate to `inflated` bytes (a JSON string of spaces)."""
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:       # level 1: made in seconds
        z.writestr("vllm/__init__.py", "")
        with z.open(f"{VMOE}/{V3_MOE}", "w", force_zip64=True) as f:
            f.write(b'{"1": "')
            chunk = b" " * (1 << 20)
            for _ in range(inflated >> 20):
                f.write(chunk)
            f.write(b'"}')
    return wheel


def test_audit_does_not_inflate_a_zip_bomb(tmp_path):
    """A 2 GiB table in a 10 MB wheel: refused at the bound as a finding (the engine would
    unpack and parse all of it), the command's peak memory under 1.5 GB."""
    wheel = bomb_wheel(tmp_path, 2 * GIB)
    assert wheel.stat().st_size < 16 << 20
    rc, out, err, peak = run_measured(["audit", "--engine", "vllm", "--engine-source", str(wheel), "--triton", "3.6.0",
                                       "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"], timeout=300)
    assert rc == 1 and "internal error" not in err, err[-2000:]
    words = " ".join(out.split())      # the finding's text wraps where the temporary path's length puts it
    assert "crashes_loader" in words and "zip bomb" in words
    assert peak < COMMAND_CAP, f"peak resident memory {peak / GIB:.2f} GiB"


# -- every reader is a bounded one --------------------------------------------------------------------
# Reads of files that are the repository's own (its kernel files, the release hashes it ships)
# or the kernel's (/proc): never a file a user hands the tool.
OWN_FILES = {
    "tuner/plan/kernel_registry.py": "the repository's own kernel modules",
    "kernels/engines/base.py": "the launcher's own source",
    "tuner/measure/process_tree.py": "/proc/<pid>/stat",
    "tuner/plan/kernel_sources.py": "RELEASE_FILES, shipped beside the kernels package",
    "tuner/search/owners.py": "/proc/sys/kernel/random/boot_id, /proc/<pid>/stat and /proc/stat",
    "tuner/jobs/proof_wheels.py": "scripts/gpu_wheels.txt, read on the GPU machine before anything is installed "
                                      "(the standard library only: tuner/reading.py needs PyYAML)",
}
# Files streamed a block or a line at a time (never held whole), each a file of the tool's own:
# the journal (tuner/search/storage.py reads it line by line, each line bounded) and a
# landscape's .partial gzipped into place.
STREAMED = {("tuner/search/storage.py", 'open(self.path, "rb") as f'),
            ("tuner/measure/landscape.py", 'open(self.partial, "rb") as src, gzip.open'),
            ("tuner/jobs/proof.py", 'open(partial, "rb") as src, gzip.open')}
READ = re.compile(r"\.read_text\(|\.read_bytes\(|json\.load\(|yaml\.(safe_)?load\(|\.readlines\(|_zip\.read\(|"
                  r"ZipFile\([^)]*\)\.read\(|[^.]\bopen\([^)]*['\"]r|"
                  r"ZipFile\((?![^)]*['\"][wax]['\"])|tarfile\.open\((?![^)]*['\"][wx])")


def test_every_reader_goes_through_the_bounded_ones():
    """No module reads a file but through tuner/reading.py (or streams it a line at a time:
    the journal, a landscape's copy), except the repository's own files."""
    found = []
    for path in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]):
        rel = str(path.relative_to(REPO))
        if rel == "tuner/reading.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if READ.search(line) and rel not in OWN_FILES and not any(
                    rel == f and text in line for f, text in STREAMED):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "reads around tuner/reading.py:\n" + "\n".join(found)


def test_a_fifo_named_like_a_wheel_is_refused_not_waited_on(tmp_path, capsys, monkeypatch):
    """$TUNER_ENGINE_WHEELS holding a FIFO named as vLLM 0.33.0's wheel (the audit takes the
    newest wheel there): one line, exit 2, in seconds (opening it waited for a writer)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    os.mkfifo(wheels / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    monkeypatch.setenv("TUNER_ENGINE_WHEELS", str(wheels))
    with deadline(30):
        rc = main(["audit", "--engine", "vllm", "--triton", "3.6.0", "--model", "deepseek-v3", "--gpu", "H200",
                   "--tp", "8", "--moe-config-dir", ""])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "is not a regular file" in err, err


def test_a_fifo_named_as_the_plot_is_refused_not_waited_on(tmp_path, capsys):
    """`tuner coverage --plot` checks that a file already there is a PNG before replacing it: a
    FIFO there is refused in one line (opening it to read its header waited for a writer)."""
    fifo = tmp_path / "map.png"
    os.mkfifo(fifo)
    with deadline(30):
        rc = main(["coverage", "--plot", str(fifo)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "is not a regular file" in err, err
