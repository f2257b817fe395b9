"""The journal file, the default storage of a local run (tuner/search/storage.py, JournalFile
under Optuna's JournalStorage): what a writer killed mid-line leaves is cut off and never
read, writers of several processes never interleave, a lock dies with its process, syncs
are rare, and a results folder of the tuner before it (SQLite) still resumes. Landscapes
are SYNTHETIC."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from bounded import deadline
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.pipeline.run_plan import default_storage
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search import storage as study_storage
from tuner.search.storage import open_storage

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


def journal(path: Path):
    return open_storage(f"journal:///{path}")


def test_a_line_torn_by_a_killed_writer_is_never_read_and_cut_by_the_next(tmp_path):
    path = tmp_path / "s.journal"
    study = optuna.create_study(study_name="s", storage=journal(path))
    study.set_user_attr("kept", 1)
    whole = path.read_bytes()
    with open(path, "ab") as f:                  # what a writer killed inside write(2) leaves
        f.write(b'{"op_code":2,"worker_id":"x","study_id":0,"user_attr":{"torn":')
    reader = optuna.load_study(study_name="s", storage=journal(path))
    assert reader.user_attrs == {"kept": 1}      # the torn line is not a record
    reader.set_user_attr("after", 2)             # the next writer cuts it off, then appends
    assert path.read_bytes().startswith(whole) and b"torn" not in path.read_bytes()
    assert all(json.loads(line) for line in path.read_bytes().splitlines())
    assert optuna.load_study(study_name="s", storage=journal(path)).user_attrs == {"kept": 1, "after": 2}
    # Optuna's own file backend reads that journal as it is
    from optuna.storages.journal import JournalFileBackend
    plain = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    assert optuna.load_study(study_name="s", storage=plain).user_attrs == {"kept": 1, "after": 2}


def test_a_line_that_is_no_record_is_skipped_alike_by_every_reader(tmp_path, caplog):
    path = tmp_path / "s.journal"
    study = optuna.create_study(study_name="s", storage=journal(path))
    with open(path, "ab") as f:                  # garbage a power cut can leave, with a newline after it
        f.write(b"\0\0\0\0\n")
    study.set_user_attr("a", 1)
    for _ in range(2):
        assert optuna.load_study(study_name="s", storage=journal(path)).user_attrs == {"a": 1}
    assert study.user_attrs == {"a": 1}
    assert "not a whole record" in caplog.text


WRITER = """
import sys, optuna
from tuner.search.storage import open_storage
storage = open_storage(sys.argv[1])
study = optuna.load_study(study_name="s", storage=storage)
for i in range(int(sys.argv[2])):
    t = study.ask()
    t.set_user_attr("writer", sys.argv[3])
    study.tell(t, float(i))
"""


def test_writers_in_several_processes_never_interleave(tmp_path):
    path = tmp_path / "s.journal"
    url = f"journal:///{path}"
    optuna.create_study(study_name="s", storage=journal(path))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, "60", str(i)], env=env) for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    lines = path.read_bytes().splitlines()
    assert all(isinstance(json.loads(line)["op_code"], int) for line in lines)
    trials = optuna.load_study(study_name="s", storage=journal(path)).trials
    assert len(trials) == 180 and len({t.number for t in trials}) == 180
    assert sorted(sum(t.user_attrs["writer"] == str(i) for t in trials) for i in range(3)) == [60, 60, 60]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def test_a_lock_held_by_a_killed_process_is_gone_with_it(tmp_path):
    path = tmp_path / "s.journal"
    optuna.create_study(study_name="s", storage=journal(path))
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, time
fd = os.open({str(path)!r}, os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with deadline(120):         # a lock left held would block for ever; a loaded machine is only slower
        optuna.load_study(study_name="s", storage=journal(path)).set_user_attr("after", 1)


def test_writes_sync_at_most_once_a_second_and_at_the_end_of_a_study(tmp_path, monkeypatch):
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(study_storage.os, "fdatasync", lambda fd: syncs.append(fd) or real(fd))
    storage = journal(tmp_path / "s.journal")
    study = optuna.create_study(study_name="s", storage=storage)
    start = time.monotonic()
    for i in range(200):
        study.set_user_attr(str(i), i)
    elapsed = time.monotonic() - start
    assert len(syncs) <= elapsed / study_storage.JOURNAL_SYNC_S + 1
    before = len(syncs)
    study_storage.sync_storage(storage)
    assert len(syncs) == before + 1                 # what was written since is synced now
    study_storage.sync_storage(storage)
    assert len(syncs) == before + 1                 # nothing new: no sync


def test_a_results_folder_of_the_tuner_before_resumes_from_its_sqlite_storage(tmp_path, monkeypatch, capsys):
    """A folder a tuner before the journal left (OUT/studies.db, stopped part-way) resumes
    from that database when run again without --storage, and gets no journal."""
    land = tmp_path / "l.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [P], [1, 16])
    out = tmp_path / "o"
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
            "--batch-sizes", "1", "16", "--replay", str(land), "--trials", "8", "--out", str(out)]
    from tuner.measure import measurers as measure
    real = measure.ReplayMeasurer.measure
    calls = []

    def stopping(self, problem, M, configs):
        calls.extend(configs if M == 16 else [])
        if len(calls) > 4:
            raise KeyboardInterrupt          # stopped in the second study, as Ctrl-C would
        return real(self, problem, M, configs)
    monkeypatch.setattr(measure.ReplayMeasurer, "measure", stopping)
    # the default storage of the tuner before: sqlite:///OUT/studies.db
    assert main([*args, "--storage", f"sqlite:///{(out / 'studies.db').resolve()}"]) == 130
    monkeypatch.setattr(measure.ReplayMeasurer, "measure", real)
    capsys.readouterr()
    assert default_storage(out) == f"sqlite:///{(out / 'studies.db').resolve()}"
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"resuming from sqlite:///{(out / 'studies.db').resolve()}: 1 of 2 studies" in err
    assert not (out / "studies.journal").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["tables"][0]["entries"]) == ["1", "16"]


@pytest.mark.parametrize("first", ["journal", "sqlite"])
def test_a_new_folder_gets_a_journal_and_keeps_it(tmp_path, first):
    out = tmp_path / "o"
    out.mkdir()
    if first == "sqlite":          # a folder with both: the journal is the newer, and wins
        (out / "studies.db").write_bytes(b"")
        (out / "studies.journal").write_bytes(b"")
    assert default_storage(out) == f"journal:///{(out / 'studies.journal').resolve()}"


def complete_trials(path: Path) -> dict:
    """{(study, trial number): value} of every complete trial in a journal."""
    storage = journal(path)
    out = {}
    for name in optuna.get_all_study_names(storage):
        for t in optuna.load_study(study_name=name, storage=storage).trials:
            if t.state == optuna.trial.TrialState.COMPLETE:
                out[(name, t.number)] = t.value
    return out


def torn_run(tmp_path: Path) -> tuple[list[str], Path]:
    """A small replayed run (its argv, its journal) after it finished once."""
    land = tmp_path / "l.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [P], [1, 16])
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
            "--batch-sizes", "1", "16", "--replay", str(land), "--out", str(tmp_path / "o"), "--quiet"]
    assert main([*args, "--trials", "6"]) == 0
    return args, tmp_path / "o" / "studies.journal"


# What a writer killed inside write(2) leaves: the start of one operation (the longest,
# a study's plan, is of any length), or a first write cut short (the file has no whole line).
TORN = {"short": lambda: b'{"op_code":5,"worker_id":"w","study_id":0,"user_attr":{"pla',
        "over 1 MiB": lambda: b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"plan":"' + b"p" * (1 << 20) + b"x" * 17,
        "3 MiB": lambda: b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"plan":"' + b"q" * (3 << 20),
        "cut in its key": lambda: b'{"op_co'}


@pytest.mark.parametrize("torn", list(TORN))
def test_a_torn_tail_of_any_length_resumes_with_every_complete_trial(tmp_path, capsys, torn):
    """A journal ending in a torn line of any length: the run started again (with a larger
    budget) keeps every complete trial, cuts exactly the torn tail and nothing else."""
    args, path = torn_run(tmp_path)
    before = complete_trials(path)
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(TORN[torn]())
    assert main([*args, "--trials", "8"]) == 0, capsys.readouterr().err
    after = complete_trials(path)
    assert {k: after.get(k) for k in before} == before and len(after) > len(before)
    data = path.read_bytes()
    assert data.startswith(whole) and all(json.loads(line) for line in data.splitlines())


def test_a_torn_first_write_is_a_journal_started_again(tmp_path, capsys):
    """A journal whose first write was cut short (no whole line): taken as the journal it
    is, cut, and the run starts on it."""
    args, path = torn_run(tmp_path)
    path.write_bytes(b'{"op_code":0,"worker_id":"w","study_na')
    assert main([*args, "--trials", "4"]) == 0, capsys.readouterr().err
    assert len(complete_trials(path)) >= 2 and b"study_na" not in path.read_bytes().split(b"\n")[0][:40]


@pytest.mark.parametrize("tail", [b"2026-01-01 a log line appended by hand", b"\x00" * 100, b"x" * (2 << 20),
                                  b"xx not json\n", b'{"op_code": "no"}\n'],
                         ids=["a log line", "zeros", "2 MiB of x", "a whole line", "a whole line of JSON"])
def test_a_tail_that_no_tuner_wrote_is_refused_and_left_alone(tmp_path, capsys, tail):
    """A journal followed by something no writer of ours leaves (no beginning of an
    operation, or a whole line that is none): one line, exit 2, the file as it was. Before, a whole
    line was read past and the run appended after it, so that `tuner repair-journal` then moved the
    run's new operations aside with it (found by a new-user pass)."""
    args, path = torn_run(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\n" + tail if tail.startswith(b"\x00") else tail)
    before = path.read_bytes()
    capsys.readouterr()
    assert main([*args, "--trials", "8"]) == 2
    err = capsys.readouterr().err
    # its whole operations are counted and the repair named (issue 42, item 7)
    assert len(err.strip().splitlines()) == 1 and "a damaged tail after" in err and "repair-journal" in err, err
    assert path.read_bytes() == before


def test_repair_journal_of_a_folder_says_it_is_one_and_names_its_journal(tmp_path, capsys):
    """`tuner repair-journal RUN_DIR` said 'no such journal file': it is a folder; a run's names
    the journal inside."""
    args, path = torn_run(tmp_path)
    capsys.readouterr()
    run = path.parent
    assert main(["repair-journal", str(run)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tuner: error: {run} is a folder, not a journal file: a run's journal is {path}"]
    assert main(["repair-journal", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tuner: error: {tmp_path} is a folder, not a journal file (a run's journal is studies.journal in its "
        "folder; this one holds none)"]
    assert main(["repair-journal", str(tmp_path / "none.journal")]) == 2
    assert "no such journal file" in capsys.readouterr().err


def test_collect_out_with_a_slash_says_the_folder_once(tmp_path, capsys):
    """`tuner collect --out tables/` said 'tables and manifest in tables//' (a run's journal here
    is the storage collect reads; tests/test_workers.py collects a shared one, much slower)."""
    args, path = torn_run(tmp_path)
    capsys.readouterr()
    out = tmp_path / "collected"
    assert main(["collect", "--storage", f"journal:///{path}", "--out", f"{out}/"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == f"tables and manifest in {out}/" and (out / "manifest.json").is_file()
