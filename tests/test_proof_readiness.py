"""The GPU run's readiness (issue 48, item 4; issue 51, item 5): boxes that fit --minutes and
leave the smoke and the environment room, a smoke cut by its box that does not end the call,
validation that re-runs only what changed (one canary per kernel source), no silent switch to
our kernel without the engines' code or tables, the committed studies still continuable,
pinned device wheels, and each window command's start-up counted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.jobs import proof_plan as pp
from tuner.jobs import proof_validation as pv
from tuner.jobs.proof_steps import default_baselines
from tuner.plan.gpus import get_gpu

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "results" / "H200-2026-11-27"


# -- issue 51, item 5: --minutes that cannot hold the boxes --------------------------------------
def test_a_plan_whose_boxes_do_not_fit_its_minutes_is_refused(capsys):
    """Before: `proof --plan --minutes 1` printed 279 s of boxes 'within --minutes 1', exit 0."""
    assert main(["proof", "--plan", "--gpu", "H200", "--minutes", "1", "--call", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--minutes 1 (60 s) cannot hold the boxes of environment smoke validate" in err[0]
    need = float(err[0].split("give --minutes ")[1].split()[0])
    # the minutes it names are enough: the same plan with them is printed, and its boxes fit
    assert main(["proof", "--plan", "--gpu", "H200", "--minutes", str(need), "--call", "gpu"]) == 0
    out = capsys.readouterr().out
    boxes = [float(ln.split()[1]) for ln in out.splitlines() if " s box;" in ln]
    assert len(boxes) == 3 and sum(boxes) <= need * 60
    # the run refuses the same before it needs a GPU; the window alone needs no box
    assert main(["proof", "--gpu", "H200", "--minutes", "1", "--call", "gpu", "--out", "/nonexistent/x"]) == 2
    assert "cannot hold the boxes" in capsys.readouterr().err
    assert main(["proof", "--plan", "--gpu", "H200", "--minutes", "1", "--steps", "window"]) == 0


def test_a_rehearsals_boxes_keep_the_gpus_proportions_and_fit():
    boxes = pp.boxes_for(2.0, rehearsal=True)
    gpu = pp.boxes_for(pp.DEVICE_MINUTES, rehearsal=False)
    assert sum(boxes.values()) <= 120
    assert boxes["smoke"] / boxes["environment"] == pytest.approx(gpu["smoke"] / gpu["environment"])


# -- the smoke's and the environment's boxes ------------------------------------------------------
def test_the_first_steps_boxes_leave_room_for_a_fresh_machine():
    """Before: the environment's box was 15 s for a `tuner ceilings` that took 7 s and does up to
    6 s more since (its warm-ups and a suspect figure's retry), and the smoke's 43 s for 33 s."""
    cost = pp.measured()
    boxes = pp.device_boxes(cost, pp.validation_plan("H200"))
    from tuner.measure.ceiling_checks import RETRY_WARMUP_S, WARMUP_S
    assert boxes["environment"] >= 1.5 * (cost.environment_s + 2 * WARMUP_S + RETRY_WARMUP_S)
    assert boxes["smoke"] >= 1.5 * cost.smoke_s


# -- a cut smoke --------------------------------------------------------------------------------
def _proof(tmp_path, statuses: dict):
    """A CPU-device proof whose steps 'run' as given (no process started), smoke writing nothing."""
    from tuner.jobs.proof import Proof, StepResult
    proof = Proof(tmp_path / "H200-smoke", get_gpu("H200"), minutes=9, device="cpu")
    proof.builders = lambda: {s: (lambda s=s: [s]) for s in ("environment", "smoke", "validate", "window")}
    proof.run = lambda commands, seconds: StepResult("", statuses.get(commands[0], "ok"), 0.0, [])
    return proof


def test_a_smoke_cut_by_its_box_does_not_end_the_call(tmp_path):
    """Before: a smoke out of time (no manifest yet) was 'failed' and every later step skipped."""
    proof = _proof(tmp_path, {"smoke": "out of time"})
    proof.execute(["environment", "smoke", "validate", "window"], log=lambda line: None)
    steps = {s["name"]: s for s in json.loads((tmp_path / "H200-smoke" / "steps.json").read_text())["steps"]}
    assert steps["smoke"]["status"] == "out of time"
    assert "cut by its box" in steps["smoke"]["detail"][-1] and "the call goes on" in steps["smoke"]["detail"][-1]
    assert steps["validate"]["status"] == steps["window"]["status"] == "ok"


def test_a_smoke_that_finished_and_timed_nothing_still_ends_the_call(tmp_path):
    proof = _proof(tmp_path, {})
    assert proof.execute(["environment", "smoke", "validate", "window"], log=lambda line: None) == 1
    steps = {s["name"]: s for s in json.loads((tmp_path / "H200-smoke" / "steps.json").read_text())["steps"]}
    assert steps["smoke"]["status"] == "failed" and steps["validate"]["status"] == "skipped"


# -- validation that re-runs only what changed -----------------------------------------------------
def _ident(**over):
    base = {"device": "NVIDIA H200", "triton": "3.6.0", "torch": "2.11.0+cu130", "kernel": "fused_moe",
            "kernel_source": "vllm 0.33.0", "code_version": "68ea9f444775bfc8", "problem": "E=256,N=256", "M": 1,
            "case": "default", "config": {"BLOCK_SIZE_M": 16}}
    return {**base, **over}


def test_a_case_passed_under_the_same_identity_is_not_run_again_but_any_change_runs_it():
    ledger = {pv.key(_ident(M=m)): _ident(M=m) for m in (1, 256)}
    ledger.update({pv.key(_ident(M=m, kernel_source="sglang 0.5.23")): {} for m in (1, 256)})
    same = [_ident(M=1), _ident(M=256), _ident(M=1, kernel_source="sglang 0.5.23"),
            _ident(M=256, kernel_source="sglang 0.5.23")]
    # the first case of each kernel source is its canary: it always runs
    assert pv.decide(same, ledger) == [pv.CANARY, pv.RECORDED, pv.CANARY, pv.RECORDED]
    for change in ({"device": "NVIDIA H100 80GB HBM3"}, {"triton": "3.7.0"}, {"torch": "2.12.0+cu130"},
                   {"code_version": "0000000000000000"}, {"config": {"BLOCK_SIZE_M": 32}}):
        assert pv.decide([_ident(M=1), _ident(M=256, **change)], ledger) == [pv.CANARY, pv.RUN], change


def test_the_ledger_records_what_passed_and_forgets_what_failed(tmp_path):
    path = tmp_path / "validated.json"
    passed = {**_ident(), "numerics": {"status": "passed", "rel_error": 1e-3}, "time_us": 50.0}
    assert pv.record([passed, {**_ident(M=2), "numerics": {"status": "failed"}, "time_us": 3.0},
                      {**_ident(M=3), "numerics": {"status": "recorded"}, "recorded": "old", "time_us": None},
                      {"kernel": "fused_moe", "numerics": {"status": "passed"}, "time_us": 1.0}], "run-1", path) == (1, 0)
    assert [c["run"] for c in pv.read_ledger(path).values()] == ["run-1"]
    assert pv.record([passed], "run-2", path) == (0, 1)                         # kept from run-1
    assert pv.record([{**passed, "numerics": {"status": "failed"}}], "run-3", path) == (0, 0)
    assert pv.read_ledger(path) == {}                                           # it fails now: it runs again
    path.write_text('{"format": "tuner-validated/1", "cases": [{"device": "x"}]}')
    from tuner.errors import TunerError
    with pytest.raises(TunerError, match="without its"):
        pv.read_ledger(path)


def _code_at(commit: str, name: str) -> str:
    """Our kernel's code hash (tuner/plan/kernel_registry.py's) from its files at `commit`."""
    import hashlib
    import re

    def read(rel: str) -> bytes:
        return subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=REPO, capture_output=True, check=True).stdout
    seen, todo = [], [name]
    while todo:
        rel = f"kernels/{todo.pop()}.py"
        if rel not in seen:
            seen.append(rel)
            todo += re.findall(r"^from kernels\.(\w+) import", read(rel).decode(), flags=re.M)
    digest = hashlib.sha256()
    for rel in sorted(seen):
        digest.update(rel.split("/")[1].encode() + b"\0" + read(rel))
    return digest.hexdigest()[:16]


def test_the_committed_validation_is_recorded_with_the_code_it_ran():
    """bench/validated.json holds the H200 run's 44 passed cases (18 engines', 26 ours), each with
    the code hash of the project at that run's commit (f6309fb): ours' from its files there, the
    engines' as the same run recorded them (its tuned MoE tables, its validation's environment)."""
    if subprocess.run(["git", "cat-file", "-e", "f6309fb"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("this clone lacks the commit of the H200 run (f6309fb)")
    ledger = list(pv.read_ledger().values())
    mine = [c for c in ledger if c["run"] == "H200-2026-11-27"]
    assert len(mine) == 44 and all(c["device"] == "NVIDIA H200" and c["triton"] == "3.6.0" for c in mine)
    files = [json.loads((RUN / f).read_text()) for f in ("validate/kernels.json", "extra/validate-ours.json")]
    assert sorted((c["problem"], c["M"], c["case"]) for c in mine) == sorted(
        (c["problem"], c["M"], c["case"]) for f in files for c in f["cases"])
    ours = {c["kernel"]: c["code_version"] for c in mine if c["kernel_source"] == "ours"}
    assert ours == {k: _code_at("f6309fb", k) for k in ("fused_moe", "fp8_gemm", "mla_decode")}
    tuned = json.loads((RUN / "tuned" / "moe" / "manifest.json").read_text())["tables"]
    recorded = {(t["kernel"], f"{t['kernel_source']['source']} {t['kernel_source']['version']}"):
                t["kernel_source"]["code_version"] for t in tuned}
    env = files[0]["environment"]
    recorded[("fp8_gemm", env["kernel"])] = env["code_version"]                  # its last group: vLLM's GEMM
    assert {(c["kernel"], c["kernel_source"]): c["code_version"] for c in mine
            if c["kernel_source"] != "ours"} == recorded


@pytest.mark.ci_variables
def test_the_validation_plan_is_the_same_without_the_shipped_tables_here(monkeypatch):
    """A GPU call carries the engines' shipped tables (.baselines/) and validates them: planned on a
    machine without them, the plan dropped their cases (52 of 58, 217 s where the GPU would take
    239 s) and bench/README.md's figures depended on whether ../shared/baselines sat beside the
    checkout. Now their cases count as new there, as many as where the tables are."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("the engines' code hashes need their wheels: TUNER_ENGINE_WHEELS is not set")
    from tuner.jobs import proof_steps
    full = sum(pp.validation_cases().values())
    with_tables = pp.validation_plan("H200") if default_baselines() is not None else None
    monkeypatch.setattr(proof_steps, "default_baselines", lambda: None)
    without = pp.validation_plan("H200")
    assert (without.cases, without.run, without.commands) == (full, full, 2)
    assert "shipped tables are not here" in without.note
    if with_tables is not None:
        assert with_tables.cases == full and with_tables.commands == 2


@pytest.mark.ci_variables
def test_the_plan_gives_validation_a_minute_when_nothing_changed(tmp_path):
    """Issue 48's bar: with every case of the list recorded as passed under this checkout's
    identities, validation's box is at most 60 s (the canaries and two starts) and the window
    gets at least 420 s of the 9-minute call, every box used whole."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("the engines' code hashes need their wheels: TUNER_ENGINE_WHEELS is not set")
    idents, commands, why = pp.validation_identities("H200")
    if idents is None and default_baselines() is None:
        pytest.skip(f"the shipped tables' cases cannot be known here: {why}")
    assert idents and commands == 2
    ledger = tmp_path / "validated.json"
    ledger.write_text(json.dumps({"format": pv.FORMAT, "cases": [{**i, "run": "x"} for i in idents]}))
    lines = pp.plan_lines(list(pp.CALLS["gpu"]), pp.DEVICE_MINUTES, "cuda", ledger=ledger)
    box = {ln.split()[0]: float(ln.split()[1]) for ln in lines if " s box;" in ln}
    window = next(float(ln.split()[1]) for ln in lines if ln.startswith("  window "))
    assert box["validate"] <= 60 and window >= 420, lines
    assert any(f"3 of {len(idents)} cases (3 canaries)" in ln for ln in lines)
    # and a change of the code re-runs what it touches: a new hash for vLLM's MoE kernel
    changed = [{**i, "code_version": "0" * 16} if i["kernel"] == "fused_moe" and i["kernel_source"].startswith("vllm")
               else i for i in idents]
    ledger.write_text(json.dumps({"format": pv.FORMAT, "cases": [{**i, "run": "x"} for i in changed]}))
    plan = pp.validation_plan("H200", ledger)
    vllm_moe = sum(1 for i in idents if i["kernel"] == "fused_moe" and i["kernel_source"].startswith("vllm"))
    assert plan.run == 3 + vllm_moe - 1                                          # its canary was running anyway


@pytest.mark.triton
@pytest.mark.triton_incidental     # the ledger's choice of what runs; the kernels' numerics have their own tests
def test_validate_kernels_skips_a_recorded_case_and_runs_the_canary(tmp_path):
    """On the CPU device, the script's own path: two cases of our GEMM, both recorded; the first
    (the canary) runs, the second is written as recorded, not run."""
    out, ledger = tmp_path / "ours.json", tmp_path / "validated.json"
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.models import gemm_problems, load_model
    kernel = get_kernel("fp8_gemm")
    problem = next(p for p in gemm_problems(load_model("configs/examples/small-moe.json"), 1) if p.key.startswith("N=256,K=256,"))
    import torch
    import triton
    on = {"device": "CPU device (stand-in for NVIDIA H200)", "triton": triton.__version__, "torch": torch.__version__}
    cases = [{**pv.case_identity(kernel, problem, M, kernel.default_config(problem.params, M), "default", on),
              "run": "rehearsal"} for M in (1, 2)]
    ledger.write_text(json.dumps({"format": pv.FORMAT, "cases": cases}))
    r = subprocess.run([sys.executable, "scripts/validate_kernels.py", "--gpu", "H200", "--device", "cpu",
                        "--model", "configs/examples/small-moe.json", "--tp", "1", "--only", "N=256,K=256,block",
                        "--batch-sizes", "1", "2", "--compile-workers", "1", "--recorded", str(ledger),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["cases"]
    assert [(c["M"], c.get("recorded"), c.get("canary")) for c in rows] == [(2, "rehearsal", None), (1, None, True)]
    assert rows[1]["time_us"] > 0 and rows[1]["numerics"]["status"] == "passed"
    assert "1 passed, 0 failed; 1 recorded as passed before" in r.stdout.splitlines()[-1]
    from tuner.jobs.proof_outcomes import step_outcome
    (tmp_path / "validate").mkdir()
    out.rename(tmp_path / "validate" / "ours.json")
    assert step_outcome(tmp_path, "validate").line() is None                      # recorded is no failure


# -- no silent switch to our kernel on a GPU ---------------------------------------------------------
def test_a_gpu_call_without_the_engines_code_or_tables_is_refused(tmp_path, monkeypatch, capsys):
    """Before: a missing .engine-src/ made the window time our kernel into the engines' committed
    tables, and a missing .baselines/ dropped the rows they ship, both silently."""
    monkeypatch.setenv("TUNER_ENGINE_WHEELS", str(tmp_path))          # no wheel there
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["proof", "--gpu", "H200", "--call", "gpu", "--out", str(tmp_path / "o"), "--baselines", str(empty),
                 "--engine-source", str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing vllm's code, sglang's code, vllm's shipped tables, sglang's shipped tables" \
        in err[0] and "prepare_gpu_proof.sh" in err[0]
    from tuner.errors import TunerError
    from tuner.jobs.proof_steps import ProofSteps
    steps = ProofSteps(tmp_path, get_gpu("H200"), 9, "cuda", [str(empty)], empty)
    with pytest.raises(TunerError, match="vllm's code is not here"):
        steps.source_for("vllm")
    assert ProofSteps(tmp_path, get_gpu("H200"), 9, "cpu", [str(empty)], empty).source_for("vllm") == "ours"


# -- the committed studies stay continuable ------------------------------------------------------------
@pytest.mark.ci_variables
def test_the_committed_studies_are_still_this_checkouts_to_continue():
    """The window continues tuned/NVIDIA_H200's studies only where their identity is this
    checkout's (tuner/search/identity.py: the kernel's code hash covers kernels/engines/, the
    launchers): a change there makes the window refuse them. This fails on such a change, here,
    before a GPU call finds it."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("the engines' code hashes need their wheels: TUNER_ENGINE_WHEELS is not set")
    from tuner.plan.kernel_registry import kernel_for
    from tuner.plan.space import load_space
    from tuner.search.identity import identity_differences
    tables = json.loads((REPO / "tuned" / "NVIDIA_H200" / "manifest.json").read_text())["tables"]
    assert tables
    for t in tables:
        source = t["kernel_source"]["source"]
        kernel = kernel_for(t["kernel"], source, source, None)
        now = {**t["identity"], "code_version": kernel.code_version, "kernel": kernel.source_label,
               "space": load_space(kernel).version}
        assert identity_differences(t["identity"], now) == "", (
            f"{t['files']}: committed with {t['identity']['code_version']}, this checkout's {kernel.code_version}: "
            "the next GPU window would refuse to continue it")


# -- pinned device wheels -------------------------------------------------------------------------------
def test_the_device_wheels_are_pinned_and_checked(tmp_path):
    """Before: prepare_gpu_proof.sh downloaded threadpoolctl, alembic, colorlog, sqlalchemy, mako and
    greenlet at whatever version the index had that day."""
    from tuner.jobs.proof_wheels import PINS, problems, read_pins
    pins = read_pins()
    assert {"optuna", "threadpoolctl", "alembic", "colorlog", "sqlalchemy", "mako"} <= set(pins)
    assert pins["optuna"] == json.loads((RUN / "environment.json").read_text())["optuna"]
    folder = tmp_path / "whl"
    folder.mkdir()
    for dist, version in pins.items():
        (folder / f"{dist}-{version}-py3-none-any.whl").write_bytes(b"")
    assert problems(folder) == []
    (folder / "optuna-4.9.0-py3-none-any.whl").write_bytes(b"")
    (folder / "greenlet-3.0.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"")
    (folder / f"mako-{pins['mako']}-py3-none-any.whl").unlink()
    assert sorted(problems(folder)) == sorted([
        f"2 wheels of optuna (4.9.0, {pins['optuna']}): keep one, the pinned {pins['optuna']}",
        f"no wheel of mako=={pins['mako']}", f"greenlet 3.0.0 is not pinned in {PINS.name}"])
    prepare = (REPO / "scripts" / "prepare_gpu_proof.sh").read_text()
    assert "scripts/gpu_wheels.txt" in prepare and "proof_wheels .whl" in prepare and "device/wheels.sh" not in prepare
    gpu = (REPO / "scripts" / "gpu_proof.sh").read_text()
    assert gpu.index("proof_wheels .whl") < gpu.index("pip install")
    r = subprocess.run([sys.executable, "-m", "tuner.jobs.proof_wheels", str(folder)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not pinned" in r.stderr


# -- each window command's start-up -----------------------------------------------------------------------
def test_each_window_commands_start_up_is_counted():
    """Before: the window's projection charged only per study, though each item is a tuning
    command that first starts (about 10 s on the H200: its start to its first trial)."""
    cost = pp.measured()
    assert 8 < cost.command_start_s < 13
    a = pp.Work("a", 3, 10.0, "measured", start_s=cost.command_start_s)
    b = pp.Work("b", 5, 2.0, "measured", start_s=cost.command_start_s)
    assert a.seconds == pytest.approx(30 + cost.command_start_s)
    assert pp.finished_in([a, b], 30.0) == [(a, 1), (b, 0)]
    assert pp.finished_in([a, b], a.seconds + cost.command_start_s + 4.0) == [(a, 3), (b, 2)]
    assert pp.finished_in([pp.Work("done", 0, 5.0, "measured", start_s=10.0), b], 12.0) == [
        (pp.Work("done", 0, 5.0, "measured", start_s=10.0), 0), (b, 0)]


@pytest.mark.ci_variables
def test_bench_readme_states_the_plans_figures(capsys):
    """bench/README.md's boxes, start-up and costs per study are what `tuner proof --plan` prints; the
    validation's with the engines' code at hand, as on the GPU machine (.engine-src/): ci_variables, or CI's
    run with the wheels never checked them (they said 58 cases and 239 s where the plan said 52 and 217 s).
    The same figures whether the engines' shipped tables are here or not: planned where ../shared/baselines
    was missing, their 6 cases dropped out and the README said 52 and 217 s, which CI (tables there) refused."""
    text = (REPO / "bench" / "README.md").read_text()
    assert main(["proof", "--plan", "--gpu", "H200", "--call", "gpu"]) == 0
    out = capsys.readouterr().out
    box = {ln.split()[0]: round(float(ln.split()[1])) for ln in out.splitlines() if " s box;" in ln}
    assert f"| {box['environment']} s (took 7 s;" in text and f"| {box['smoke']} s (took 33 s) |" in text
    cost = pp.measured()
    assert f"start-up, its start to its first trial, {cost.command_start_s:.1f} s" in text
    assert f"{cost.vllm_s_per_study:.1f} s a vLLM batch size, {cost.sglang_s_per_study:.1f} s a SGLang study" in text
    if os.environ.get("TUNER_ENGINE_WHEELS"):     # the validation's cases need the engines' code hashes
        plan = pp.validation_plan("H200")
        boxes = pp.device_boxes(cost, plan)
        assert f"{boxes['validate']:.0f} s at this writing ({plan.run} of {plan.cases} cases" in text
        nothing = pp.ValidationPlan(plan.cases, 3, 3, plan.commands, "")
        quiet = pp.device_boxes(cost, nothing)
        assert f"| {quiet['validate']:.0f} s when nothing changed" in text
        assert f"at least {pp.DEVICE_MINUTES * 60 - sum(quiet.values()):.0f} s when nothing changed" in text
        assert f"({pp.DEVICE_MINUTES * 60 - sum(boxes.values()):.0f} s at this writing)" in text


def test_a_window_command_is_not_started_with_less_time_than_the_smoke_took(tmp_path):
    """A window command given less than this machine's smoke took (start-up and one config) ends
    having measured nothing, exit 1, and failed the call (the rehearsal's second GEMM command under
    load: 'the window of 0.1 min is too short'). Now it is not started and the step is out of time;
    a command with time enough still runs."""
    import sys

    from tuner.jobs.proof import Proof, StepResult
    from tuner.jobs.proof_steps import Command
    proof = Proof(tmp_path / "H200-window", get_gpu("H200"), minutes=9, device="cpu")
    (tmp_path / "H200-window").mkdir()
    ran = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(ran)!r}, 'a').write('x')"]
    window = [Command("first", cmd, "first.txt", window=True), Command("second", cmd, "second.txt", window=True)]
    proof.results = [StepResult("smoke", "ok", 40.0, [])]
    result = proof.run(window, 50.0)                  # 50 s less the 15 s close margin: under the smoke's 40
    assert not ran.exists() and result.status == "out of time"
    assert all("not started" in d for d in result.detail), result.detail
    proof.results = [StepResult("smoke", "ok", 2.0, [])]
    result = proof.run(window, 60.0)
    assert ran.read_text() == "xx" and result.status == "ok", result.detail
