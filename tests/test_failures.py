"""Typed failures (tuner/measure/failures.py): a failed measurement has a kind and a detail, kept on
the trial and in landscapes (old error texts are classified when read), counted per study
in the manifest, by `tuner report` and by `tuner drift`; diagnostics go through the 'tuner'
logger."""

import json

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.measure import failures
from tuner.measure.landscape import read_landscape
from tuner.measure.measurers import Measurement, NumericsCheck, ReplayMeasurer
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import SearchSettings, StudyRunner, study_name

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
PROBLEM = Problem("fp8_gemm", P)


@pytest.mark.parametrize("text,kind", [
    # what our measurers and the isolation layer write (tests/faulty.py has the same)
    ("CompilationError: at 12:8: invalid layout", "compile"),
    ("OutOfResources: shared memory, Required: 262144, Hardware limit: 232448", "out_of_resources"),
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_resources"),
    ("hang: no result within 300s", "timeout"),
    ("worker killed by SIGSEGV", "crash"),
    ("worker exited with status 1", "crash"),
    ("CUDA context lost after RuntimeError: CUDA error: an illegal memory access", "crash"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "runtime"),
    ("invalid time nan: not a positive finite number", "invalid"),
    ("not in the landscape", "invalid"),
    ("NaN left in the output (seed 3)", "numerics"),
    ("synthetic failure", "runtime"),
    ("ValueError: BLOCK_SIZE_K must divide the group", "runtime"),
])
def test_error_texts_are_classified(text, kind):
    assert failures.kind_of(text) == kind
    assert Measurement(None, None, text).kind == kind


def test_a_measurement_that_did_not_fail_has_no_kind_and_a_given_kind_wins():
    assert Measurement(12.0, 0.01).kind is None and failures.kind_of(None) is None
    assert Measurement(None, None, "worker killed by SIGKILL", "timeout").kind == "timeout"
    assert Measurement(None).kind == "runtime"


def test_exceptions_are_classified_by_type():
    class CompilationError(Exception):
        pass

    class OutOfResources(Exception):
        pass

    assert failures.exception_kind(CompilationError("at 1:2")) == "compile"
    assert failures.exception_kind(OutOfResources("shared memory")) == "out_of_resources"
    assert failures.exception_kind(RuntimeError("launch failed")) == "runtime"
    assert failures.count_by_kind(["compile", None, "timeout", "compile", float("nan")]) == {"compile": 2, "timeout": 1}
    assert failures.summary({"compile": 2, "timeout": 1}) == "compile 2, timeout 1"


class ScriptedMeasurer:
    """Fails the configs `fail` names with the given error texts; times the rest."""
    label = "gpu"

    def __init__(self, fail: dict):
        self.kernel, self.fail = KERNEL, fail

    def environment(self):
        return {"device": "NVIDIA H200", "triton": "3.6.0"}

    def candidates(self, problem, M):
        return None

    def measure(self, problem, M, configs):
        out = []
        for c in configs:
            text = self.fail.get((c["BLOCK_SIZE_N"], c["num_stages"]))
            out.append(Measurement(None, None, text) if text else Measurement(10.0 + c["num_warps"] * 0.1, 0.01))
        return out

    def check_numerics(self, problem, M, config):
        return NumericsCheck("passed", 0.001, "fake")

    def close(self):
        pass


def test_failed_trials_carry_their_kind_and_the_result_counts_them():
    space = load_space(KERNEL)
    grid = space.configs(P, 16, GPU)
    fail = {(64, 3): "CompilationError: bad", (128, 4): "hang: no result within 3s",
            (32, 5): "worker killed by SIGSEGV"}
    storage = optuna.storages.InMemoryStorage()
    runner = StudyRunner(KERNEL, space, GPU, ScriptedMeasurer(fail), storage,
                         SearchSettings(budget=len(grid), patience=10_000, batch=16, seed=0))
    result = runner.tune(PROBLEM, 16, [])
    assert result.trials == len(grid)                     # every config of the space measured
    study = optuna.load_study(study_name=study_name(PROBLEM, 16), storage=storage)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL and "config" in t.user_attrs]
    assert failed and all(t.user_attrs["failure"] == failures.kind_of(t.user_attrs["error"]) for t in failed)
    expected = failures.count_by_kind(failures.kind_of(fail.get((c["BLOCK_SIZE_N"], c["num_stages"])))
                                      for c in grid)
    assert set(expected) == {"compile", "timeout", "crash"}
    assert result.failures == expected == study.user_attrs["result"]["failures"]


def test_landscape_failures_keep_their_kind_and_old_lines_are_classified(tmp_path):
    cfgs = load_space(KERNEL).configs(P, 1, GPU)[:3]
    path = tmp_path / "l.jsonl"
    header = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200", "synthetic": True}
    rows = [{"problem": P, "M": 1, "config": cfgs[0], "error": "worker killed by SIGSEGV", "failure": "crash"},
            {"problem": P, "M": 1, "config": cfgs[1], "error": "OutOfResources: shared memory"},   # an old line
            {"problem": P, "M": 1, "config": cfgs[2], "error": "it broke", "failure": "timeout"}]   # kind as stored
    path.write_text("\n".join(json.dumps(r) for r in [header, *rows]) + "\n")
    m = ReplayMeasurer(read_landscape(path, KERNEL))
    got = m.measure(PROBLEM, 1, [*cfgs, {**cfgs[0], "num_warps": 16}])
    assert [x.kind for x in got] == ["crash", "out_of_resources", "timeout", "invalid"]
    assert [x.error for x in got][:3] == [r["error"] for r in rows]
    path.write_text("\n".join(json.dumps(r) for r in [header, {**rows[0], "failure": 3}]) + "\n")
    with pytest.raises(Exception, match="line 2 is malformed"):
        read_landscape(path, KERNEL)


@pytest.fixture(scope="module")
def replayed_run(tmp_path_factory):
    """A replay run over a SYNTHETIC landscape (about 3 % of its points fail) that
    measures every config of the space at each M."""
    d = tmp_path_factory.mktemp("failed")
    land = d / "land.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), GPU, [P], [1, 16])
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
                 "--batch-sizes", "1", "16", "--trials", "200", "--patience", "1000", "--out", str(d / "out"),
                 "--quiet"]) == 0
    return d / "out", land


def test_report_counts_failures_by_kind(replayed_run, capsys):
    out, land = replayed_run
    landscape = read_landscape(land, KERNEL)
    manifest = json.loads((out / "manifest.json").read_text())
    entries = manifest["tables"][0]["entries"]
    # every point of the space was measured: each study's failures are the landscape's there
    for M, e in entries.items():
        points = landscape.lookup(P, int(M)).values()
        assert e["failures"] == failures.count_by_kind(p.kind for p in points), M
    total = sum(sum(e["failures"].values()) for e in entries.values())
    assert total > 0
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "failures" in printed
    assert all(failures.summary(e["failures"]) in printed for e in entries.values())
    md = (out / "report" / "report.md").read_text()
    assert f"Failed configs by kind: runtime {total} ({total} over 2 studies)." in md


def test_report_of_a_manifest_from_before_kinds(replayed_run, tmp_path, capsys):
    out, _ = replayed_run
    manifest = json.loads((out / "manifest.json").read_text())
    for t in manifest["tables"]:
        for e in t["entries"].values():
            e.pop("failures")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert main(["report", str(tmp_path)]) == 0
    assert "Failed configs by kind" not in (tmp_path / "report" / "report.md").read_text()


def test_drift_counts_the_tables_failing_configs_by_kind(replayed_run, tmp_path, capsys):
    """A table whose M=16 config fails (compile) on the landscape: drift says so, by kind."""
    out, land = replayed_run
    manifest = json.loads((out / "manifest.json").read_text())
    table_file = out / manifest["tables"][0]["files"]["vllm"]
    table = json.loads(table_file.read_text())
    broken = land.read_text().splitlines()
    header, lines = broken[0], [json.loads(x) for x in broken[1:]]
    for rec in lines:
        if rec["M"] == 16 and rec["config"] == table["16"]:
            rec.pop("time_us"), rec.pop("spread", None)
            rec["error"] = "CompilationError: at 3:4"
    (tmp_path / "broken.jsonl").write_text("\n".join([header, *map(json.dumps, lines)]) + "\n")
    capsys.readouterr()
    assert main(["drift", str(table_file), "--gpu", "H200", "--replay", str(tmp_path / "broken.jsonl"),
                 "--kernel-source", "ours", "--out", str(tmp_path / "d.json")]) == 0
    printed = capsys.readouterr().out
    assert "tables' configs that failed, by kind: compile 1" in printed
    rows = {r["M"]: r for r in json.loads((tmp_path / "d.json").read_text())}
    assert rows[16]["verdict"] == "fails" and rows[16]["failure"] == "compile"
    assert rows[1]["verdict"] != "fails" and not isinstance(rows[1]["failure"], str)    # None (NaN in JSON)


def test_diagnostics_are_tuner_log_lines_on_stderr(tmp_path, capsys):
    """A warning from deep inside (contexts beyond the model's positions) is one
    'tuner: ...' line on stderr, through logging.getLogger('tuner')."""
    assert main(["mla", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--contexts", "4096", "999999",
                 "--dry-run", "--kernel-source", "ours"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["tuner: skipping contexts beyond deepseek-v3's positions: [999999]"]


def test_clearing_a_dead_workers_trial_is_logged_at_info(caplog):
    import logging
    import socket

    from tuner.search.storage import fail_stale
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    trial.set_user_attr("worker", f"{socket.gethostname()}:{2 ** 22 + 12345}")     # no such process
    trial.set_user_attr("config", {"BLOCK_SIZE_M": 16})
    requeued = []
    with caplog.at_level(logging.INFO, logger="tuner"):
        fail_stale(study, requeued.append)
    assert requeued == [{"BLOCK_SIZE_M": 16}]
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "failed as interrupted, its config queued again" in caplog.records[0].getMessage()


def test_a_run_that_times_nothing_at_a_batch_size_says_why_and_exits_1(replayed_run, tmp_path, capsys):
    """Every config at M=16 fails (here from a landscape; on a device, as a capture rule would
    make them): the table keeps M=1, the closing table is followed by the first failure's
    text, the manifest has it, and the command ends with one line on stderr and exit 1."""
    _, land = replayed_run
    lines = land.read_text().splitlines()
    header, recs = lines[0], [json.loads(x) for x in lines[1:]]
    first = "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture (planted)"
    for rec in recs:
        if rec["M"] == 16:
            rec.pop("time_us", None), rec.pop("spread", None)
            rec["error"], rec["failure"] = first, "runtime"
    (tmp_path / "l16.jsonl").write_text("\n".join([header, *map(json.dumps, recs)]) + "\n")
    capsys.readouterr()
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(tmp_path / "l16.jsonl"),
                 "--batch-sizes", "1", "16", "--trials", "6", "--only", "N=7168,K=2048", "--out",
                 str(tmp_path / "out"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert f"no config timed at M=16 of {PROBLEM.key}: first failure: {first}" in out.splitlines()
    [line] = [ln for ln in err.splitlines() if "no config was timed" in ln]
    assert line == err.splitlines()[-1]
    assert line.startswith("tuner: no config was timed for 1 of 2 studies (M=16 of ")
    assert line.endswith(f"; first failure: {first}")
    entries = json.loads((tmp_path / "out" / "manifest.json").read_text())["tables"][0]["entries"]
    assert entries["16"]["time_us"] is None and entries["16"]["first_failure"] == first
    assert entries["1"]["time_us"] > 0
