"""Round five of the attacker's cases (issue 42, items 5 to 8) outside install: expert ids out of
range, a journal with a damaged tail, a damaged SQLite storage, refusals that write, and
temporaries left behind."""

import random
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.plan import routing as rt


@pytest.mark.parametrize("ids,dtype", [([[2 ** 32 + 1, 2]], np.int64), ([[2 ** 63, 1]], np.uint64),
                                       ([[2 ** 31, 1]], np.int64), ([[-2, 1]], np.int64)],
                         ids=["2^32+1", "uint64 2^63", "2^31", "-2"])
def test_expert_ids_out_of_range_are_refused(tmp_path, ids, dtype):
    """Before: 2^32 + 1 read as 1 (an int32 cast) and the file got the valid one's digest;
    uint64 2^63 read as 0."""
    np.save(tmp_path / "r.npy", np.array(ids, dtype=dtype))
    with pytest.raises(TunerError, match="is out of range"):
        rt.load_routing(tmp_path / "r.npy")


def journal_of_16_trials(path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    for i in range(16):
        study.add_trial(optuna.trial.create_trial(params={"x": i}, distributions={
            "x": optuna.distributions.IntDistribution(0, 99)}, value=float(i)))
    return path.read_bytes()


@pytest.mark.parametrize("tail", [b"\0" * 3000, bytes(random.Random(7).randrange(256) for _ in range(3000)),
                                  b'{"op_code": 4, "worker_id": "x", "study_id": 0, "tri' + b"\0" * 100 + b"\n junk"],
                         ids=["NUL", "random", "torn then junk"])
def test_a_journal_with_a_damaged_tail_is_said_and_repaired(tmp_path, capsys, tail):
    """Before: 'is not a journal of Optuna operations; give a new file', though its 16 trials
    were whole. Now the line says what is wrong, and the command it names repairs it."""
    from tuner.cli import main
    journal = tmp_path / "s.journal"
    whole = journal_of_16_trials(journal)
    journal.write_bytes(whole + tail)
    capsys.readouterr()
    assert main(["collect", "--storage", f"journal:///{journal}", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "damaged tail after" in err, err
    assert f"tuner repair-journal {journal}" in err and not (tmp_path / "o").exists()
    assert main(["repair-journal", str(journal)]) == 0
    assert journal.read_bytes() == whole
    assert (tmp_path / "s.journal.damaged-tail").read_bytes() == tail
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(study.trials) == 16


def test_a_sparse_tail_of_nuls_is_kept_aside_without_its_zeros(tmp_path, capsys):
    """A journal whose tail is 1 GiB of NULs (a hole: a disk that lost its last blocks) with a
    few bytes in it: the repair keeps the tail's size and those bytes aside, not a GiB of
    zeros on disk. Before: 1.1 GB written aside (issue 51, item 11)."""
    from tuner.cli import main
    journal = tmp_path / "s.journal"
    whole = journal_of_16_trials(journal)
    tail = 1 << 30
    with open(journal, "r+b") as f:
        f.truncate(len(whole) + tail)                   # a hole: no block of it is on disk
        f.seek(len(whole) + (300 << 20))
        f.write(b"kept")                                # what of the tail is not zeros
        f.seek(len(whole) + tail - 3)
        f.write(b"end")
    capsys.readouterr()
    assert main(["repair-journal", str(journal)]) == 0
    assert f"the damaged tail ({tail} bytes) is in" in capsys.readouterr().out
    assert journal.read_bytes() == whole
    aside = tmp_path / "s.journal.damaged-tail"
    assert aside.stat().st_size == tail and aside.stat().st_blocks * 512 < 1 << 20      # its size, not its zeros
    with open(aside, "rb") as f:
        f.seek(300 << 20)
        assert f.read(4) == b"kept"
        f.seek(tail - 3)
        assert f.read() == b"end"
        f.seek((300 << 20) - 100)
        assert f.read(100) == b"\0" * 100


@pytest.mark.parametrize("command", ["collect", "worker"])
def test_a_damaged_sqlite_storage_is_one_line(tmp_path, capsys, command):
    """An Optuna SQLite storage of 16 trials whose second page is random bytes (its header and
    schema read fine, so the storage checks pass): one line, exit 2. Before:
    StorageInternalError, exit 1."""
    import optuna

    from tuner.cli import main
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = tmp_path / "s.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    for i in range(16):
        study.add_trial(optuna.trial.create_trial(params={"x": i}, distributions={
            "x": optuna.distributions.IntDistribution(0, 99)}, value=float(i)))
    del study
    with open(db, "r+b") as f:
        f.seek(4096)
        f.write(bytes(random.Random(1).randrange(256) for _ in range(4096)))
    argv = ["--storage", f"sqlite:///{db}"] + (["--out", str(tmp_path / "o")] if command == "collect" else [])
    capsys.readouterr()
    rc = main([command, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1, err


def test_a_routing_store_on_a_full_disk_says_so_and_leaves_nothing(tmp_path):
    """The file size limit (as `ulimit -f`) stands for a full disk. Before: numpy's writer
    raised 'N requested and 0 written' with no errno (an internal error) and left its
    temporary in OUT/routing/."""
    import errno
    import resource
    import signal
    ids = np.random.default_rng(0).integers(0, 256, size=(1, 20_000, 8)).astype(np.int32)
    routing = rt.RecordedRouting(ids, "test", "r")
    folder = tmp_path / "routing"
    folder.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    try:
        with pytest.raises(OSError) as e:
            rt.install(routing, folder)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
    assert list(folder.iterdir()) == []


def test_an_extraction_of_another_engine_is_not_replaced(tmp_path, capsys):
    """Before: `engine-source extract --engine sglang --out DIR` replaced vLLM's extraction in
    DIR without a word (exit 0)."""
    import json

    from tuner.cli import main
    out = tmp_path / "src"
    out.mkdir()
    (out / "tuner-engine-source.json").write_text(json.dumps({"engine": "vllm", "version": "0.33.0", "files": {}}))
    (out / "kept.py").write_text("x = 1\n")
    assert main(["engine-source", "extract", "--engine", "sglang", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds vllm's extracted source, not sglang's" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "kept.py").read_text() == "x = 1\n"


def test_what_a_killed_fetch_left_is_removed_by_the_next(tmp_path, monkeypatch):
    """A killed `engine-source fetch` left its download folder in the wheel cache (321 MB for
    vLLM's wheel); the next fetch removes it, and never a live fetch's (its lock is held)."""
    import fcntl
    import os
    import subprocess

    from tuner.commands.engine_source import fetch
    from tuner.paths import FOLDER_LOCK, new_temporary_folder
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "engine-wheels"
    cache.mkdir(parents=True)
    dead = cache / ".vllm-0.33.0.x1y2.tmp"            # as a fetch killed mid-download leaves it
    dead.mkdir()
    (dead / FOLDER_LOCK).write_text("")
    (dead / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl.part").write_bytes(b"\0" * 4096)
    live, held = new_temporary_folder(cache, ".sglang-0.5.23.")      # a fetch still running
    try:
        with pytest.raises(TunerError):
            fetch("vllm", "0.33.0", runner=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
        assert not dead.exists() and live.is_dir()
        assert [p.name for p in cache.iterdir()] == [live.name]       # the failed fetch's own is gone too
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)


def test_a_refused_routing_run_stores_no_routing_file(tmp_path, capsys):
    """A --routing run refused by a check of the plan (a --warm-start that is not there):
    exit 2 and nothing under OUT. Before: OUT/routing/<hash>.npy was stored first."""
    from tuner.cli import main
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(256)[:8] for _ in range(64)]).astype(np.int32)
    np.save(tmp_path / "r.npy", ids)
    out = tmp_path / "out"
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel-source", "ours",
               "--synthetic", "--batch-sizes", "1", "--routing", str(tmp_path / "r.npy"),
               "--warm-start", str(tmp_path / "none"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "internal error" not in err, err
    assert not (out / "routing").exists()


def test_a_refused_routing_replay_leaves_nothing_under_out(tmp_path, capsys):
    """A --routing replay of a landscape recorded under another routing is refused when its
    measurer opens the landscape (after planning): exit 2 and no OUT at all. Before:
    OUT/routing/<hash>.npy stayed (issue 51, item 11). An earlier run's routing file stays."""
    from tuner.cli import main
    rng = np.random.default_rng(0)
    np.save(tmp_path / "r.npy", np.stack([rng.permutation(256)[:8] for _ in range(64)]).astype(np.int32))
    common = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel-source", "ours", "--batch-sizes", "1"]
    assert main(["landscape", "synth", "--kernel", "moe", *common, "--out", str(tmp_path / "l.jsonl.gz")]) == 0
    out = tmp_path / "out"
    argv = ["moe", *common, "--trials", "2", "--replay", str(tmp_path / "l.jsonl.gz"),
            "--routing", str(tmp_path / "r.npy"), "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "covers none of the planned problems" in err and "internal error" not in err, err
    assert not out.exists(), sorted(out.rglob("*"))
    (out / "routing").mkdir(parents=True)
    earlier = np.stack([rng.permutation(256)[:8] for _ in range(64)]).astype(np.int32)
    np.save(out / "routing" / "mine.npy", earlier)
    assert main(argv) == 2
    assert sorted(p.name for p in out.rglob("*")) == ["mine.npy", "routing"]


def test_warm_start_from_a_folder_with_a_random_journal(tmp_path, capsys):
    """Before: exit 0 after 108 lines naming the temporary copies it read; now the journal
    given is named, once."""
    from test_bad_input import CFG, GEMM, GEMM_ARGS, results_with

    from tuner.cli import main
    res = results_with(tmp_path / "r", {f"vllm/fp8_gemm/{GEMM}": {"1": CFG}})
    (res / "studies.journal").write_bytes(b'{"op_code": 0, "worker_id": "w"}\n'
                                          + bytes(random.Random(5).randrange(256) for _ in range(4000)))
    rc = main([*GEMM_ARGS, "--synthetic", "--batch-sizes", "1", "--trials", "2", "--warm-start", str(res),
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "internal error" not in err and "tuner-warm-" not in err, err
    assert sum(str(res / "studies.journal") in line for line in err.splitlines()) == 1, err
    assert rc in (0, 2) and len(err.strip().splitlines()) <= 4, err


def test_a_run_refused_for_another_routing_leaves_the_earlier_runs_files(tmp_path, capsys):
    """A --routing run into an --out whose stored plan has another routing: exit 2, and the
    earlier run's synthetic landscape and routing file stay as they were. Before: the refusal
    came after planning had replaced both."""
    from tuner.cli import main
    rng = np.random.default_rng(0)
    out = tmp_path / "out"
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", np.stack([rng.permutation(256)[:8] for _ in range(64)]).astype(np.int32))
    argv = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel-source", "ours",
            "--synthetic", "--batch-sizes", "1", "--trials", "2", "--out", str(out)]
    assert main([*argv, "--routing", str(tmp_path / "a.npy")]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ("routing" in p.parts
                                                                            or p.name.startswith("synthetic-"))}
    assert any(p.name.startswith("synthetic-") for p in before) and any("routing" in p.parts for p in before)
    capsys.readouterr()
    assert main([*argv, "--routing", str(tmp_path / "b.npy")]) == 2
    err = capsys.readouterr().err
    assert "for another" in err and "internal error" not in err, err
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ("routing" in p.parts
                                                                           or p.name.startswith("synthetic-"))}
    assert after == before


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_landscape_synth_on_a_full_disk_says_so_and_leaves_nothing(tmp_path, capsys, name):
    """The file size limit (as `ulimit -f`) stands for a full disk. Before: closing the
    temporary raised again while it was abandoned, so it stayed beside --out."""
    import resource
    import signal

    from tuner.cli import main
    out = tmp_path / name
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, hard))
    try:
        rc = main(["landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", "H200",
                   "--tp", "8", "--batch-sizes", "1", "2", "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    err = capsys.readouterr().err
    assert rc == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def stored_plan_timed_on_a_gpu(journal: Path) -> None:
    """Make the plan a SYNTHETIC run stored in `journal` say its times came from the GPU (as an
    earlier run on an H200 into the same storage would have stored it)."""
    import optuna

    from tuner.search.storage import open_storage
    store = open_storage(f"journal:///{journal}")
    [name] = [n for n in optuna.get_all_study_names(store) if "tuner-plan:" in n]
    study = optuna.load_study(study_name=name, storage=store)
    plan = study.user_attrs["plan"]
    assert plan["identity"]["times"] == "SYNTHETIC"
    study.set_user_attr("plan", {**plan, "identity": {**plan["identity"], "times": "GPU"}})


def test_a_plan_stored_for_other_times_is_refused_before_the_synthetic_landscape(tmp_path, capsys):
    """A --synthetic run into an --out whose stored plan differs only in the source of times
    (timed on the GPU, as an earlier run there on an H200 would have stored it): exit 2 naming
    the source of times, and OUT as it was (its synthetic landscape not rewritten). Before: the
    plan's check knew no source of times until the landscape was made, so the refusal came after
    the landscape had been replaced."""
    from test_bad_input import GEMM_ARGS

    from tuner.cli import main
    out = tmp_path / "out"
    argv = [*GEMM_ARGS, "--synthetic", "--trials", "2", "--out", str(out)]
    assert main(argv) == 0
    stored_plan_timed_on_a_gpu(out / "studies.journal")
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "source of times GPU (now SYNTHETIC)" in err and "internal error" not in err, err
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("tail", [b'{"op_code": 99}\n', b'{"op_code": 4}\n',
                                  b'{"op_code": 0, "worker_id": "w", "study_name": "t", "directions": ["x"]}\n'],
                         ids=["unknown op_code", "a field missing", "a field of another kind"])
def test_a_journal_ending_in_an_operation_optuna_cannot_replay_is_said_and_repaired(tmp_path, capsys, tail):
    """A last line that parses, with an op_code, but that Optuna cannot replay. Before: 'cannot
    open storage ...: Should not reach.' (or "'study_id'"), and `tuner repair-journal` found
    nothing to repair. Now the line names the operation and the repair, which keeps the 17
    operations before it."""
    from tuner.cli import main
    journal = tmp_path / "s.journal"
    whole = journal_of_16_trials(journal)
    journal.write_bytes(whole + tail)
    capsys.readouterr()
    assert main(["collect", "--storage", f"journal:///{journal}", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "operation 18 is none Optuna can replay" in err, err
    assert f"tuner repair-journal {journal}" in err and not (tmp_path / "o").exists()
    assert main(["repair-journal", str(journal)]) == 0
    assert journal.read_bytes() == whole and (tmp_path / "s.journal.damaged-tail").read_bytes() == tail


def test_a_repair_waits_for_a_writer_appending_to_the_journal(tmp_path):
    """A live writer appends under an flock on the journal (tuner/search/storage.py): a repair
    taking no lock measured the file, then cut it, so an operation appended between the two was
    cut off and copied nowhere. Now the repair takes the writers' lock first: while the lock is
    held it changes nothing, once released it repairs. Before: it repaired under the lock."""
    import fcntl
    import os
    import threading

    from tuner.search.journal_repair import repair
    journal = tmp_path / "s.journal"
    whole = journal_of_16_trials(journal)
    journal.write_bytes(whole + b"\0" * 300)
    held = os.open(journal, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)              # a writer in the middle of its append
    said: list = []
    worker = threading.Thread(target=lambda: said.extend(repair(journal)), daemon=True)
    try:
        worker.start()
        worker.join(2)
        assert worker.is_alive() and said == [] and journal.read_bytes() == whole + b"\0" * 300
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)
    worker.join(30)
    assert not worker.is_alive() and "kept its 17 whole operations" in said[0]
    assert journal.read_bytes() == whole


def test_a_replay_plan_stored_for_other_times_is_refused_before_the_routing_file(tmp_path, capsys):
    """A --routing replay into a new --out, sharing a --storage whose stored plan differs only in
    the source of times (timed on the GPU): exit 2 naming the source of times, and nothing
    written (every file by inode and bytes; no OUT). Before: the plan's early check knew no
    replay's source of times, so OUT/routing/<hash>.npy was stored before the refusal."""
    from tuner.cli import main
    rng = np.random.default_rng(0)
    np.save(tmp_path / "r.npy", np.stack([rng.permutation(256)[:8] for _ in range(64)]).astype(np.int32))
    argv = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--kernel-source", "ours",
            "--batch-sizes", "1", "--trials", "2", "--routing", str(tmp_path / "r.npy")]
    assert main([*argv, "--synthetic", "--out", str(tmp_path / "s")]) == 0
    [landscape] = (tmp_path / "s").glob("synthetic-*")
    journal = tmp_path / "shared.journal"
    argv += ["--replay", str(landscape), "--storage", f"journal:///{journal}"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    stored_plan_timed_on_a_gpu(journal)
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "source of times GPU (now SYNTHETIC)" in err and "internal error" not in err, err
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "b").exists()


def test_a_replays_times_known_before_reading_it_are_those_its_replay_stores():
    """The early check's source of times for a replay (its header, and the hash of its lines)
    is the one the replay itself stores, for a recorded (hashed) landscape as for a SYNTHETIC
    one: else a run of the same landscape would be refused as another plan."""
    from pathlib import Path

    from tuner.measure.landscape import read_header, replay_times
    from tuner.measure.measurers import ReplayMeasurer
    from tuner.plan.kernel_registry import get_kernel
    recorded = next(Path(__file__).parent.parent.glob("landscapes/NVIDIA_H200/*.jsonl.gz"))
    header = read_header(recorded)
    kernel = get_kernel(header["kernel"], header.get("kernel_source", "ours"), load_code=False)
    replay = ReplayMeasurer.from_file(str(recorded), kernel, header["device"])
    assert replay.times.startswith("landscape sha256:") and replay_times(recorded) == replay.times
    assert replay_times(Path(__file__)) is None         # no landscape: refused where it is read
