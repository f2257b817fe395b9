"""Installs at once and restores in order (issue 33, items 1 and 2), into FAKE site-packages
laid out like vLLM 0.33: two `--merge` installs at the same time keep both installs' entries
(a loop of them), backups are restored last-first whatever their second and process id, a
restore never overwrites a file that changed since the install it undoes (the only copy of
what is there now), and a refused install or restore changes nothing."""

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from test_install import MOE, site_packages

from tuner.cli import main

CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}
MOE_FOLDER = "vllm/model_executor/layers/fused_moe/configs"


def results(root: Path, table: dict) -> Path:
    """A results folder holding one vLLM MoE table (the H200's, numerics passed)."""
    rel = f"vllm/fused_moe/{MOE}"
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_text(json.dumps(table))
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": [
        {"kernel": "fused_moe", "problem": {"E": 256}, "files": {"vllm": rel},
         "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "numerics_passed": True}]}))
    return root


def tree(*roots: Path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for root in roots if root.exists() for p in sorted(root.rglob("*"))}


def install(res: Path, site: Path, *extra: str) -> int:
    return main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), *extra])


def test_two_merges_at_once_keep_both_installs_entries(tmp_path, monkeypatch, capsys):
    """Rounds of two `install --merge` at once (threads: the install lock is an flock, which
    two open files of one process contend for as two processes do), each adding a batch size
    the other lacks; planning is slowed so that both read the installed table before either
    writes. After every round the table holds every key installed so far."""
    from tuner.emit import install as inst
    slow_coverage = inst._coverage

    def coverage(*args, **kwargs):
        notes = slow_coverage(*args, **kwargs)
        time.sleep(0.1)                 # between reading the installed table and writing it
        return notes

    monkeypatch.setattr(inst, "_coverage", coverage)
    site = site_packages(tmp_path / "site")
    table = site / MOE_FOLDER / MOE
    table.write_text(json.dumps({"1": CFG}))
    expected = {1}
    for round_ in range(4):
        a, b = 2 + 2 * round_, 3 + 2 * round_
        folders = [results(tmp_path / f"r{round_}{m}", {str(m): {**CFG, "num_warps": 8}}) for m in (a, b)]
        codes: list[int] = []
        threads = [threading.Thread(target=lambda f=f: codes.append(install(f, site, "--merge"))) for f in folders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert codes == [0, 0], capsys.readouterr().err
        expected |= {a, b}
        assert {int(k) for k in json.loads(table.read_text())} == expected, f"round {round_}: an install's entry is lost"
    capsys.readouterr()
    # and every install is undone, last first, down to the table as it was
    for _ in range(8):
        assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert json.loads(table.read_text()) == {"1": CFG}


def test_installs_in_one_second_restore_last_first(tmp_path, monkeypatch, capsys):
    """Two installs within one second, the first by a process whose id sorts after the second's as text (as
    917 after 4242): the first restore undoes the second install, the next the first, and then the
    shipped table is in place and no backup is left to restore."""
    site = site_packages(tmp_path / "site")
    table = site / MOE_FOLDER / MOE
    shipped = table.read_text()
    first, second = results(tmp_path / "a", {"1": CFG}), results(tmp_path / "b", {"1": {**CFG, "num_warps": 8}})
    with monkeypatch.context() as m:
        m.setattr(time, "strftime", lambda fmt, *a: "20260101T000000")
        for folder, pid in ((first, 917), (second, 4242)):
            m.setattr(os, "getpid", lambda pid=pid: pid)
            assert install(folder, site, "--force") == 0
    assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert json.loads(table.read_text()) == {"1": CFG}, "the first restore did not undo the last install"
    assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert table.read_text() == shipped
    capsys.readouterr()
    assert main(["install", "--restore", "--engine", "vllm"]) == 2
    assert "no vllm install to restore" in capsys.readouterr().err


def test_two_installs_in_one_process_keep_two_backups(tmp_path, capsys):
    """One process installing twice in a second (nightly's jobs, a script) gets two backup
    folders: the second record never replaces the first."""
    site = site_packages(tmp_path / "site")
    for warps in (4, 8):
        assert install(results(tmp_path / f"r{warps}", {"1": {**CFG, "num_warps": warps}}), site, "--force") == 0
    records = sorted((tmp_path / "backups").glob("vllm-*/record.json"))
    assert len(records) == 2
    assert sorted(json.loads(r.read_text())["sequence"] for r in records) == [1, 2]
    capsys.readouterr()


@pytest.mark.parametrize("change", ["edited", "removed-then-other"])
def test_a_restore_never_overwrites_a_file_changed_since(tmp_path, capsys, change):
    """An engine upgrade (or a hand, or another tool) changed the installed table after the
    install: restoring would put the old shipped table over the only copy of the new one.
    Refused in one line; nothing changed, the backup kept."""
    site = site_packages(tmp_path / "site")
    table = site / MOE_FOLDER / MOE
    assert install(results(tmp_path / "r", {"1": CFG}), site, "--force") == 0
    upgraded = '{"1": "shipped by the next release"}'
    if change == "removed-then-other":
        table.unlink()
    table.write_text(upgraded)
    before = tree(site, tmp_path / "backups")
    capsys.readouterr()
    assert main(["install", "--restore", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "has changed since the install" in err, err
    assert tree(site, tmp_path / "backups") == before and table.read_text() == upgraded


def test_a_refused_install_takes_no_lock_and_writes_nothing(tmp_path, capsys):
    """A merge onto a folder where the table belongs, and one onto a FIFO: one line, exit 2,
    no backup folder, no lock file, nothing waited on."""
    site = site_packages(tmp_path / "site")
    table = site / MOE_FOLDER / MOE
    table.unlink()
    for make, needle in ((lambda: table.mkdir(), "is a folder"), (lambda: os.mkfifo(table), "is a FIFO")):
        if table.is_dir():
            table.rmdir()
        elif os.path.lexists(table):
            table.unlink()
        make()
        res = results(tmp_path / f"r{needle[-4:]}", {"1": CFG})
        before = tree(tmp_path)
        assert install(res, site, "--merge") == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
        assert tree(tmp_path) == before and not (tmp_path / "backups").exists()
