"""Batch-size keys that `str.isdigit()` accepts and `int()` refuses (issue 42, item 5): '²',
'①' and a key of 5000 digits, in every command that reads a table, manifest or backup record:
one clear line and exit 2 (or, for the installed table a --merge reads, the key is no batch
size), never a ValueError. One parser reads them all (tuner/plan/batch_keys.py)."""

import json

import pytest
from test_bad_input import CFG, GEMM, GEMM_ARGS, landscape, results_with, site

from tuner.cli import main
from tuner.plan.batch_keys import batch_key

BAD_KEYS = ["²", "①", "7" * 5000, "٣", " 1", "1.0", "+1", "-1", "0"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=range(len(BAD_KEYS)))
def test_the_parser_refuses_what_is_no_ascii_batch_size(key):
    assert batch_key(key) is None


def test_the_parser_reads_batch_sizes():
    assert [batch_key(k) for k in ("1", "0064", "1048576", 7, True, "1048577")] == [1, 64, 1 << 20, 7, None, None]


def _table(t, key):
    (t / GEMM).write_text(json.dumps({key: CFG}))
    return str(t / GEMM)


def _manifest(t, key):
    return str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"1": CFG}}, manifest={
        "format": "tuner-manifest/1", "tables": [{
            "kernel": "fp8_gemm", "problem": {"N": 7168, "K": 2048, "block_shape": [128, 128]},
            "files": {"vllm": f"vllm/fp8_gemm/{GEMM}"}, "environment": {"device": "NVIDIA H200", "triton": "3.6.0"},
            "numerics_passed": True, "entries": {key: {"config": CFG, "time_us": 1.0}}}]}))


COMMANDS = {
    "check --table": lambda t, k: ["check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "ours",
                                   "--table", _table(t, k)],
    "drift": lambda t, k: ["drift", _table(t, k), "--gpu", "H200", "--replay", str(landscape(t / "l.jsonl")),
                           "--kernel-source", "ours"],
    "warm-start": lambda t, k: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--warm-start",
                                str((t / "w").mkdir() or _table(t / "w", k)), "--out", str(t / "o")],
    "report": lambda t, k: ["report", _manifest(t, k)],
    "diff": lambda t, k: ["diff", _manifest(t, k), _manifest(t, "1") if False else _manifest(t, k)],
    "install": lambda t, k: ["install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {k: CFG}})),
                             "--engine", "vllm", "--site-packages", str(site(t / "s"))],
}


@pytest.mark.parametrize("key", ["²", "①", "7" * 5000], ids=["superscript", "circled", "5000 digits"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_key_isdigit_takes_and_int_refuses(command, key, tmp_path, capsys, monkeypatch):
    from tuner.emit import install
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(install, "BACKUP_ROOT", tmp_path / "backups")
    argv = COMMANDS[command](tmp_path, key)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "internal error" not in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("tuner: error: "), err


@pytest.mark.parametrize("times", [{"1": "fast"}, {"1": None}, {"²": 3.0}, {"7" * 5000: 3.0}, {"1": True}],
                         ids=["fast", "null", "superscript", "5000 digits", "true"])
def test_a_backup_record_of_hostile_row_times(times, tmp_path):
    """What `audit` and `install --merge` read from the last install's record: a row time that
    is no number, or a key that is no batch size, is no time (before: ValueError/TypeError)."""
    from tuner.emit.merge_rule import RECORD, installed_times
    folder = tmp_path / "vllm-00000001-20260101T000000-1"
    folder.mkdir()
    dest = tmp_path / "t.json"
    (folder / RECORD).write_text(json.dumps({"engine": "vllm", "files": [
        {"dest": str(dest), "times": {**times, "8": 2.0}, "timed_on": "gpu"}]}))
    assert installed_times(dest, "vllm", tmp_path) == ({8: 2.0}, {})


def test_versions_with_digits_int_refuses():
    """An engine's dist-info or a wheel named with '²' or a 5000-digit part: compared, not a crash."""
    from tuner.emit.engine_tables import _version_key
    from tuner.plan.kernel_sources import version_key
    for v in ("0.5.²", "0.5." + "9" * 5000):
        assert _version_key(v)[:2] == (0, 5) and version_key(v)[:2] == (0, 5)
