"""The GPU proof rehearsed on the CPU device: both device calls and the local part run every
step through the code a GPU call runs (measuring child, compile workers, the engines' kernels
from their wheels when .ci/run provides them), with a tiny model; every result is labelled
CPU DEVICE, lands in the folder and the bundle after every step, and leaves no process
behind. Also: what is cut by its time box keeps what it has, and the device calls in
bench/README.md fit the device tool."""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_engine_kernels import triton_unsqueezes_scalars

from tuner.cli import main
from tuner.jobs.proof import CALLS, STEPS, Proof
from tuner.plan.gpus import get_gpu

# Under a Triton that refuses `scalar[:, None]` (3.9), SGLang 0.5.23's own fused MoE kernel
# cannot compile the swap-AB rows of its shipped table: the proof's check of that table fails
# there, rightly, and with it call 1. On the GPU machines' Triton (3.6) every step passes.
SGLANG_COMPILES_HERE = triton_unsqueezes_scalars()

REPO = Path(__file__).resolve().parents[1]
# The rehearsal runs the engines' kernels, as the GPU call does, from their wheels: where
# TUNER_ENGINE_WHEELS is not set (a plain clone) it is skipped (ci_variables; .ci/run's run with
# the variables rehearses it). Ours alone would rehearse less than the GPU call runs, for the
# three minutes that are most of a plain clone's run. Every step's kernels run in Triton's
# interpreter (triton).
# .ci/run leaves the rehearsal out of its newest-Triton run (triton_incidental): the proof runs on
# the GPU machines, whose Triton is 3.6.0, and the kernels it runs are checked under the newest
# Triton by their own tests (test_engine_kernels.py, test_capture_kernels.py, ...).
pytestmark = [pytest.mark.triton, pytest.mark.triton_incidental]
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The device command's steps, then two windows back to back on the same folder (the first
    cut by its clock, the second with time for all), then the local part. The first window's
    state is copied aside before the second starts."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("the proof's rehearsal runs the engines' kernels from their wheels, as the GPU call does: "
                    "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
    root = tmp_path_factory.mktemp("proof")
    out, bundle = root / "H200-rehearsal", root / "OUT"
    common = ["proof", "--device", "cpu", "--gpu", "H200", "--out", str(out), "--bundle", str(bundle)]
    took = {}

    def run(name, *args):
        t0 = time.monotonic()
        code = main([*common, *args])
        took[name] = time.monotonic() - t0
        return code
    # --minutes far above what the rehearsal's fixed work takes idle (its steps' boxes keep the GPU's
    # proportions to it): a loaded machine only waits longer, no step is cut by the clock
    codes = {"gpu": run("gpu", "--minutes", "60", "--steps", "environment", "smoke", "validate")}
    # the first window: twice what the smoke (one study, one config, the whole measuring path)
    # took on this machine just now: it is cut somewhere in its work list, wherever that is
    smoke = next(s for s in json.loads((out / "steps.json").read_text())["steps"] if s["name"] == "smoke")
    window_1 = 2 * smoke["seconds"] / 60
    codes["window 1"] = run("window 1", "--minutes", f"{window_1:.2f}", "--steps", "window")
    first = root / "window-1"
    if (out / "tuned").is_dir():
        shutil.copytree(out / "tuned", first)
    codes["window 2"] = run("window 2", "--minutes", "60", "--steps", "window")
    codes["local"] = run("local", "--minutes", "60", "--call", "local")
    print("rehearsal step times (s):", {k: round(v) for k, v in took.items()}, "load", os.getloadavg())
    took["window 1 minutes"] = window_1
    return out, bundle, codes, first, took


def sglang_shipped(case: dict) -> bool:
    return case["kernel_source"].startswith("sglang") and case["case"].startswith("shipped ")


STATE = ("tuned", "CPU_DEVICE")          # the window's state folder in a rehearsal


def validated_cases(out: Path) -> list[dict]:
    return [c for name in ("kernels.json", "ours.json") if (out / "validate" / name).is_file()
            for c in json.loads((out / "validate" / name).read_text())["cases"]]


@pytest.mark.ci_variables
def test_the_rehearsal_runs_every_step_on_the_cpu_device(rehearsal):
    out, _, codes, _, _ = rehearsal
    steps = json.loads((out / "steps.json").read_text())["steps"]
    assert [s["name"] for s in steps] == list(STEPS)
    validate = next(s for s in steps if s["name"] == "validate")
    cases = validated_cases(out)
    expect_fail = any(sglang_shipped(c) for c in cases) and not SGLANG_COMPILES_HERE
    assert codes == {"gpu": 1 if expect_fail else 0, "window 1": 0, "window 2": 0, "local": 0}
    for step in steps:
        if step is not validate or not expect_fail:
            assert step["status"] == "ok", step
        else:   # only SGLang's shipped tables fail, and they do fail: the proof does not hide them
            failed = [c for c in cases if c["numerics"]["status"] != "passed" or not c["time_us"]]
            assert step["status"] == "failed" and failed, step
            assert all(sglang_shipped(c) for c in failed), failed
    assert not any("outlived" in d for s in steps for d in s["detail"]), "a step left processes behind"
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU proof\n\n*** REHEARSAL ON THE CPU DEVICE")
    assert "measured on the GPU" not in summary and summary.count("*** CPU DEVICE") >= 3
    env = json.loads((out / "environment.json").read_text())
    ceilings = json.loads((out / "ceilings.json").read_text())
    assert env["device_kind"] == ceilings["device_kind"] == "cpu"
    assert ceilings["l2_bytes"] == 60 << 20                     # the H200's L2, from the table


@pytest.mark.ci_variables
def test_the_window_tunes_its_work_list_on_each_engines_kernel_with_compile_workers(rehearsal):
    """Both engines' MoE tables, then both engines' GEMM tables, into one state folder; the
    validation's full list (the engines' kernels and shipped tables, then ours) before it."""
    out, _, _, _, _ = rehearsal
    smoke = json.loads((out / "runs" / "smoke" / "manifest.json").read_text())
    assert [e["time_us"] > 0 for t in smoke["tables"] for e in t["entries"].values()] == [True]
    manifest = json.loads(out.joinpath(*STATE, "manifest.json").read_text())
    by = {}
    for t in manifest["tables"]:
        by.setdefault((t["kernel"], t["kernel_source"]["source"]), []).append(t)
        assert t["environment"]["device_kind"] == "cpu"
        # the measuring child started its compile workers, and they built every config for sm_90
        compiles = t["environment"]["compiles"]
        assert compiles["built"] > 0 and compiles["failed"] == compiles["lost"] == 0, compiles
        assert all(e["time_us"] > 0 and e["numerics"]["status"] == "passed" for e in t["entries"].values())
    assert sorted({s for _, s in by}) == ["sglang", "vllm"]
    assert sum(len(ts) for (k, _), ts in by.items() if k == "fused_moe") == 3   # vLLM's, SGLang's up and _down
    assert sum(len(ts) for (k, _), ts in by.items() if k == "fp8_gemm") == 2    # N=256,K=256 of each engine
    validated = validated_cases(out)
    expected_to_fail = [c for c in validated if sglang_shipped(c) and not SGLANG_COMPILES_HERE]
    assert validated and all(c["numerics"]["status"] == "passed" and c["time_us"] > 0 for c in validated
                             if c not in expected_to_fail)
    assert all(c["time_source"].startswith("CPU DEVICE") for c in validated if c["time_us"])
    assert {c["kernel_source"].split()[0] for c in validated} == {"ours", "vllm", "sglang"}
    # the engines' kernels ran before ours (a validation cut by its time loses ours first)
    order = [c["kernel_source"].split()[0] for c in validated]
    assert order == sorted(order, key=lambda s: s == "ours")


@pytest.mark.ci_variables
def test_the_rehearsal_takes_every_launch_path_of_a_gpu_call_under_the_capture_rules(rehearsal):
    """The smoke at the GPU's M=16 (vLLM's alignment), validate at M=5 (vLLM's alignment with
    fewer pairs than a block, SGLang's long sorted length), the window at M=1 (vLLM's small-batch
    path, SGLang's short sorted length); every process that timed said it timed under the rules."""
    out, _, _, _, _ = rehearsal
    from kernels.engines import vllm
    from tuner.jobs.proof_steps import GPU_PROFILE, REHEARSAL_PROFILE
    assert REHEARSAL_PROFILE.smoke_m == GPU_PROFILE.smoke_m == 16
    smoke = json.loads((out / "runs" / "smoke" / "manifest.json").read_text())
    [table] = smoke["tables"]
    E, topk = table["problem"]["E"], table["problem"]["topk"]
    assert list(table["entries"]) == ["16"] and not vllm.naive_block_assignment(16, topk, E)
    tuned = json.loads(out.joinpath(*STATE, "manifest.json").read_text())
    assert {m for t in tuned["tables"] for m in t["entries"]} == {"1"} and vllm.naive_block_assignment(1, topk, E)
    validated = validated_cases(out)
    assert {c["M"] for c in validated} == {5}
    sgl = [c for c in validated if c["kernel_source"].startswith("sglang")]
    assert sgl and all(5 * topk >= E + 1 for c in sgl)          # SGLang's long sorted length
    assert 1 * topk < E + 1                                      # and the window's short one
    environments = [smoke["tables"][0]["environment"],
                    *(json.loads((out / "validate" / n).read_text())["environment"] for n in ("kernels.json", "ours.json")
                      if (out / "validate" / n).is_file()),
                    *(t["environment"] for t in tuned["tables"])]
    assert all("capture's rules" in env["timing"] and env["clock_warmups"] >= 1 for env in environments)


def _trials(state: Path) -> dict[str, dict[int, tuple]]:
    """{study: {trial number: (state, params, values)}} of a state folder's journal."""
    from tuner.search.storage import open_journal
    storage = open_journal(state / "studies.journal")
    return {s.study_name: {t.number: (t.state.name, t.params, t.values)
                           for t in storage.get_all_trials(s._study_id)}
            for s in storage.get_all_studies()}


@pytest.mark.ci_variables
def test_the_second_window_continues_the_first(rehearsal):
    """Two windows back to back on one folder: the first, cut by its clock wherever it was, ended
    within its minutes plus the stop's grace; the second measured no trial of the first again and
    reopened no study the first finished (its trials as they were), and the state folder holds
    every table of the work list at the end."""
    out, _, _, first, took = rehearsal
    from tuner.jobs.proof_plan import STOP_GRACE_S
    # the box, SIGTERM then SIGKILL after the grace, the stray-process wait and the bundle
    assert took["window 1"] <= took["window 1 minutes"] * 60 + STOP_GRACE_S + 30, took
    state = out.joinpath(*STATE)
    before, after = _trials(first / STATE[1]) if (first / STATE[1] / "studies.journal").exists() else {}, \
        _trials(state)
    finished = set()
    if (first / STATE[1] / "manifest.json").exists():
        done = json.loads((first / STATE[1] / "manifest.json").read_text())["tables"]
        finished = {json.dumps(t["problem"], sort_keys=True) for t in done}
    for study, trials in before.items():
        kept = {n: t for n, t in trials.items() if t[0] == "COMPLETE"}
        assert {n: after[study][n] for n in kept} == kept, study          # nothing lost, nothing measured again
    final = json.loads((state / "manifest.json").read_text())["tables"]
    for t in final:
        if json.dumps(t["problem"], sort_keys=True) in finished:
            old = next(o for o in done if o["problem"] == t["problem"] and o["files"] == t["files"])
            assert t["entries"] == old["entries"]                         # a finished study is not reopened
    assert sum(t["kernel"] == "fused_moe" for t in final) == 3 and sum(t["kernel"] == "fp8_gemm" for t in final) == 2
    for t in final:
        for rel in t["files"].values():
            assert (state / rel).is_file()


@pytest.mark.ci_variables
def test_the_rehearsal_records_a_landscape_and_studies_it_labelled_cpu_device(rehearsal):
    out, _, _, _, _ = rehearsal
    with gzip.open(out / "landscapes" / "gemm.jsonl.gz", "rt") as f:
        header, *points = [json.loads(line) for line in f]
    assert header["device_kind"] == "cpu" and header["device"] == "CPU device (stand-in for NVIDIA H200)"
    assert len(points) >= 2 and all(p.get("time_us") for p in points)
    study = (out / "sampler" / "gemm.md").read_text()
    assert "CPU DEVICE landscape" in study and "| tpe |" in study
    assert out.joinpath(*STATE, "report", "report.md").read_text().count("CPU DEVICE") >= 1


@pytest.mark.ci_variables
def test_the_bundle_comes_back_through_the_device_tool(rehearsal):
    """At most 8 files, plain names, not deeper than 2 folders, under 16 MiB each; the
    tarball's top folder is where bench/README.md says it unpacks: bench/results/<name>."""
    out, bundle, _, _, _ = rehearsal
    files = [p for p in bundle.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["proof-H200-rehearsal.tar.gz", "summary.md"]
    assert all(NAME_OK.match(p.name) and p.stat().st_size < 16 << 20 for p in files)
    with tarfile.open(bundle / "proof-H200-rehearsal.tar.gz") as tar:
        names = tar.getnames()
    top = "bench/results/H200-rehearsal"
    assert all(n == top or n.startswith(top + "/") for n in names)
    for rel in ("summary.md", "steps.json", "tuned/CPU_DEVICE/manifest.json", "tuned/CPU_DEVICE/studies.journal",
                "landscapes/gemm.jsonl.gz", "validate/kernels.json", "validate/ours.json"):
        assert f"{top}/{rel}" in names
    assert (bundle / "summary.md").read_text() == (out / "summary.md").read_text()


def test_a_call_cut_by_its_time_keeps_what_it_has(tmp_path):
    """A call with next to no time (0.3 s, all of it the environment step's by its floor, too
    little to start Python): each step is stopped, says so, and is bundled; a smoke cut by its
    box (it timed nothing, but was not let finish) does not stop the call
    (tests/test_proof_readiness.py: one that finished and timed nothing does)."""
    proof = Proof(tmp_path / "H200-cut", get_gpu("H200"), minutes=0.005, device="cpu", bundle=tmp_path / "OUT")
    assert proof.execute(CALLS["gpu"], log=lambda line: None) == 0
    steps = {s["name"]: s for s in json.loads((tmp_path / "H200-cut" / "steps.json").read_text())["steps"]}
    assert steps["environment"]["status"] == "out of time"
    assert steps["smoke"]["status"] == "out of time" and "the call goes on" in steps["smoke"]["detail"][-1]
    assert steps["validate"]["status"] == steps["window"]["status"] == "out of time"
    with tarfile.open(tmp_path / "OUT" / "proof-H200-cut.tar.gz") as tar:
        assert "bench/results/H200-cut/summary.md" in tar.getnames()


def test_the_shell_wrapper_bundles_into_the_device_tools_out(tmp_path):
    out_dir = tmp_path / "OUT"
    out_dir.mkdir()
    env = {**os.environ, "OUT": str(out_dir), "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    # --minutes 60: a rehearsal's boxes keep the GPU's proportions to it (the environment's: 100 s)
    r = subprocess.run(["bash", "scripts/gpu_proof.sh", "--device", "cpu", "--gpu", "H200", "--minutes", "60",
                        "--out", str(tmp_path / "res" / "H200-x"), "--steps", "environment"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with tarfile.open(out_dir / "proof-H200-x.tar.gz") as tar:
        assert {"bench/results/H200-x/summary.md", "bench/results/H200-x/ceilings.json"} <= set(tar.getnames())
    assert (out_dir / "summary.md").read_text().startswith("# GPU proof\n\n*** REHEARSAL ON THE CPU DEVICE")


# The device tool's limits (/work/.library/device/README.md, as of 2026-11): device time per task,
# starts and idle waits included; a start's cost at worst; one command.
DEVICE_BUDGET_S, START_S, COMMAND_S = 15 * 60, 120, 600
# Besides its steps: installing the carried wheels, a stopped step's 20 s, the bundle.
CALL_OVERHEAD_S = 50


def test_the_device_command_in_bench_readme_fits_the_device_tool():
    """The one `run` call bench/README.md gives: a command of at most 2,000 characters whose
    timeout covers its --minutes and overhead and is at most the tool's 10 minutes, kind
    nvidia-h200, the carried paths prepare_gpu_proof.sh makes; within the task's device time
    even after a failed start; its --minutes the plan's (DEVICE_MINUTES)."""
    from tuner.jobs.proof_plan import DEVICE_MINUTES
    text = (REPO / "bench" / "README.md").read_text()
    [call] = [json.loads(m) for m in re.findall(r"^run\((\{.*\})\)$", text, flags=re.M)]
    assert call["kind"] == "nvidia-h200" and call["timeout_s"] <= COMMAND_S
    assert len(call["command"]) <= 2000 and "scripts/gpu_proof.sh" in call["command"]
    minutes = float(re.search(r"--minutes (\d+(?:\.\d+)?)", call["command"]).group(1))
    assert minutes == DEVICE_MINUTES and minutes * 60 + CALL_OVERHEAD_S <= call["timeout_s"]
    assert call["carry"] == [".whl", ".engine-src", ".baselines"]
    assert 2 * START_S + call["timeout_s"] <= DEVICE_BUDGET_S        # a failed start, then this one
    assert "scripts/commit_gpu_proof.sh" in text and "nvidia-h100-x1" in text
    prepare = (REPO / "scripts" / "prepare_gpu_proof.sh").read_text()
    assert all(c in prepare for c in (".whl", ".engine-src", ".baselines", "scripts/gpu_wheels.txt"))
    assert "threadpoolctl==" in (REPO / "scripts" / "gpu_wheels.txt").read_text()


def test_bad_proof_options_are_one_line(tmp_path, capsys):
    assert main(["proof", "--device", "cpu", "--call", "gpu", "--steps", "smoke", "--out", str(tmp_path / "p")]) == 2
    assert main(["proof", "--device", "cpu", "--steps", "tune", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "not both" in err[0] and "not a step" in err[1]


def test_a_step_that_times_nothing_says_why_in_the_log_steps_and_summary(tmp_path):
    """What the smoke's manifest and validate's cases say about failures reaches the smoke's
    verdict, the step's detail (steps.json, printed) and summary.md: the first failure's
    text; a case validate could not time is a failure."""
    from tuner.jobs.proof import StepResult
    from tuner.jobs.proof_outcomes import step_outcome
    from tuner.jobs.proof_summary import summary_markdown
    out = tmp_path / "H200-why"
    first = ("CaptureRuleError: Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
             "tensor is pinned.")
    (out / "runs" / "smoke").mkdir(parents=True)
    entry = {"M": 16, "time_us": None, "failures": {"runtime": 1}, "first_failure": first, "numerics": {}}
    (out / "runs" / "smoke" / "manifest.json").write_text(json.dumps(
        {"format": "tuner-manifest/1", "measured_by": "cpu-device",
         "tables": [{"kernel": "fused_moe", "problem": {"E": 8}, "kernel_source": {"source": "vllm"},
                     "files": {"vllm": "x.json"}, "environment": {"device": "CPU device (stand-in for NVIDIA H200)"},
                     "entries": {"16": entry}}]}))
    (out / "validate").mkdir()
    ok = {"kernel": "fused_moe", "kernel_source": "vllm 0.33.0", "problem": "E=8", "M": 5, "case": "default",
          "numerics": {"status": "passed"}, "time_us": 3.0, "error": None}
    (out / "validate" / "kernels.json").write_text(json.dumps({"environment": {}, "cases": [
        ok, {**ok, "case": "shipped t.json", "time_us": None, "error": first}]}))
    proof = Proof(out, get_gpu("H200"), minutes=8, device="cpu")
    assert proof.smoke_timed().endswith(f"; first failure: {first})")
    assert step_outcome(out, "smoke").line() == f"timed nothing (1 failed); first failure: {first}"
    assert step_outcome(out, "validate").line() == f"timed 1 of 2; first failure: {first}"
    # the landscapes' records, streamed past their headers; a torn file counts what it held
    (out / "landscapes").mkdir()
    header, timed = {"format": "tuner-landscape/1"}, {"M": 1, "time_us": 2.0}
    with gzip.open(out / "landscapes" / "a.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in (header, timed, {"M": 2, "error": first}, timed)) + "\n")
    with gzip.open(out / "landscapes" / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps(header) + "\n" + json.dumps(timed) + "\n{torn")
    assert step_outcome(out, "landscapes").line() == f"timed 3 of 4; first failure: {first}"
    summary = summary_markdown(out, [StepResult("smoke", "failed", 1.0, [f"first failure: {first}"])], "cpu", 60.0)
    assert f"- vllm M=16: no time ({{'runtime': 1}}; first failure: {first})" in summary
    assert "- validate_kernels (kernels.json): 1 passed, 1 failed (1 not timed; default configs and 1 shipped tables" \
        in summary
    assert f"FAILED [vllm 0.33.0] fused_moe E=8 M=5 (shipped t.json): not timed: {first}" in summary


def test_the_plan_gives_measured_boxes_and_what_a_window_finishes(capsys):
    """Every figure of `tuner proof --plan` comes from the committed H200 run and state: each
    step's box is its time in steps.json times its margin (the environment's with what `tuner
    ceilings` added since; validate: its commands' starts and the cases it runs at its seconds
    per case), the costs per study are the tune steps' seconds but their start-up over the
    studies their manifest holds and the MLA journal's span over its studies, the studies left
    are the engines' grid less the committed tables' rows; and a 12-minute window finishes what
    those add up to, each item's start-up counted once."""
    from tuner.jobs.proof_plan import COLD_MARGIN, MARGIN, environment_added_s, measured, validation_plan
    run = REPO / "bench" / "results" / "H200-2026-11-27"
    steps = {s["name"]: s["seconds"] for s in json.loads((run / "steps.json").read_text())["steps"]}
    tables = json.loads((run / "tuned" / "moe" / "manifest.json").read_text())["tables"]
    start = measured().command_start_s
    vllm = (steps["tune-vllm"] - start) / sum(len(t["entries"]) for t in tables if "vllm" in t["files"])
    sglang = (steps["tune-sglang"] - start) / sum(len(t["entries"]) for t in tables if "sglang" in t["files"])
    per_case = (steps["validate"] - start) / len(json.loads((run / "validate" / "kernels.json").read_text())["cases"])
    assert round(steps["tune-vllm"] / 5, 1) == 21.2 and round(steps["tune-sglang"] / 10, 1) == 8.5  # the issue's
    committed = json.loads((REPO / "tuned" / "NVIDIA_H200" / "manifest.json").read_text())["tables"]
    left_vllm = 18 - sum(len(t["entries"]) for t in committed if "vllm" in t["files"])
    left_sglang = 36 - sum(len(t["entries"]) for t in committed if "sglang" in t["files"])

    assert main(["proof", "--plan", "--gpu", "H200", "--minutes", "9", "--call", "gpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120
    box = {ln.split()[0]: float(ln.split()[1]) for ln in lines if re.match(r"^  \w+ +\d+ s box", ln)}
    assert box["environment"] == pytest.approx(max(15, (steps["environment"] + environment_added_s()) * COLD_MARGIN),
                                               abs=0.5)
    assert box["smoke"] == pytest.approx(steps["smoke"] * COLD_MARGIN, abs=0.5)
    plan = validation_plan("H200")
    assert box["validate"] == pytest.approx(max(15, (plan.commands * start + plan.run * per_case) * MARGIN), abs=0.5)
    # the committed state's deployment (DeepSeek-V3 TP8 fp8), less its rows, at the measured costs
    assert re.search(rf"MoE vllm +TP8 fp8 +{left_vllm} studies x +{vllm:.1f} s", out), out
    assert re.search(rf"MoE sglang +TP8 fp8 +{left_sglang} studies x +{sglang:.1f} s", out), out
    assert re.search(r"MoE vllm +TP16 fp8 +18 studies x", out)            # nothing of it tuned yet: the grid
    assert re.search(r"MLA +TP8 every context +63 studies x +2[45]\.\d s", out)
    items = [ln for ln in lines if re.match(r"^  (MoE|GEMM|MLA) ", ln)]
    first = re.match(r"^  (.+?) +(\d+) studies x +([\d.]+) s", items[0])
    twelve = next(ln for ln in lines if ln.startswith("a 12-minute window (720 s) finishes:"))
    done = min(int(first.group(2)), int((720 - start) // float(first.group(3))))      # its start-up first
    got = re.match(rf"a 12-minute window \(720 s\) finishes: {' '.join(first.group(1).split())} (\d+)/", twelve)
    assert got and abs(int(got.group(1)) - done) <= 1, (twelve, items[0])


@pytest.mark.ci_variables
def test_the_plans_first_work_item_is_a_table_that_runs_the_default_config(capsys):
    """With the engines' tables at hand (their wheels), the window's work list comes from the
    coverage map: its first item is a table the engine reads today and finds no table for (the
    default config runs), DeepSeek-V3's TP16 fp8 MoE table of vLLM on the H200; the fallbacks
    and shipped tables of TP8 come after every default one."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("the coverage map reads the engines' tables from their wheels: TUNER_ENGINE_WHEELS is not set")
    assert main(["proof", "--plan", "--gpu", "H200", "--call", "gpu"]) == 0
    items = [ln for ln in capsys.readouterr().out.splitlines() if re.match(r"^  (MoE|GEMM|MLA) ", ln)]
    assert re.match(r"^  MoE vllm +TP16 fp8 +\d+ studies .* default +1\.22x expected$", items[0]), items
    statuses = [re.search(r" (default|fallback|shipped) ", ln).group(1) for ln in items if ln.startswith("  MoE")]
    assert statuses == sorted(statuses, key=["default", "fallback", "shipped"].index), items
    assert any(re.search(r"MoE sglang +TP8 EP8 fp8 .* default ", ln) for ln in items)
    assert any(re.search(r"MoE sglang +TP8 fp8 .* fallback", ln) for ln in items)


@pytest.mark.ci_variables
def test_the_gpu_window_continues_the_committed_state_in_the_work_lists_order(tmp_path):
    """On a GPU, the window's state folder starts as a copy of tuned/NVIDIA_H200 (tables,
    manifest, studies journal), and its commands run in the work list's order (one per item:
    the MoE tables of each deployment and engine at the engines' 18 batch sizes, both engines'
    GEMM tables at every TP8 shape, MLA decode), each into that folder, then the landscape.
    A GPU window times the engines' own kernels, never ours in their place (without their code
    it is refused: proof_steps.source_for): their code comes from their wheels here."""
    if not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("a GPU window runs the engines' own kernels, from their wheels here: "
                    "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
    from tuner.plan.engines import DEFAULT_BATCH_SIZES
    proof = Proof(tmp_path / "H200-x", get_gpu("H200"), minutes=9, device="cuda")
    cmds = proof.step_window()
    state = tmp_path / "H200-x" / "tuned" / "NVIDIA_H200"
    assert "continues the committed state tuned/NVIDIA_H200" in proof.window_note
    for name in ("manifest.json", "studies.journal"):
        assert (state / name).read_bytes() == (REPO / "tuned" / "NVIDIA_H200" / name).read_bytes()
    work, _ = proof.work()
    kinds = [(c.argv[3], c.argv[c.argv.index("--engines") + 1] if "--engines" in c.argv else None) for c in cmds]
    assert kinds == [(w.kind, w.engine) for w in work] + [("gemm", "vllm")]
    assert [k for k, _ in kinds[:-1]] == sorted((k for k, _ in kinds[:-1]), key=["moe", "gemm", "mla"].index)
    for c, w in zip(cmds, work):
        assert c.window and c.argv[c.argv.index("--out") + 1] == str(state)
        if w.kind == "moe":
            assert (c.argv[c.argv.index("--tp") + 1], c.argv[c.argv.index("--dtype") + 1]) == (str(w.tp), w.dtype)
            assert ("--ep" in c.argv) == (w.ep > 1) and "--per-rank" in c.argv
        if w.kind in ("moe", "gemm"):
            ms = c.argv[c.argv.index("--batch-sizes") + 1:]
            assert [int(m) for m in ms[:len(DEFAULT_BATCH_SIZES)]] == DEFAULT_BATCH_SIZES
            assert "--only" not in c.argv                                  # every shape of the model
    assert ("moe", "vllm", 8, "fp8_w8a8") in {(w.kind, w.engine, w.tp, w.dtype) for w in work}   # 13 of 18 left
    assert proof.seed_state() is None                                   # a second window continues, never re-seeds
    # the committed studies are this window's to continue: the same search space (and settings)
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.space import load_space
    committed = json.loads((state / "manifest.json").read_text())
    for t in committed["tables"]:
        engine = t["kernel_source"]["source"]
        assert t["identity"]["space"] == load_space(get_kernel("fused_moe", engine, load_code=False)).version
    moe = cmds[0].argv
    assert (moe[moe.index("--trials") + 1], moe[moe.index("--patience") + 1]) == (
        str(committed["search"]["budget"]), str(committed["search"]["patience"]))


def test_mark_partial_marks_what_lacks_the_grid(tmp_path):
    """After a window, each table lacking rows of its kernel's grid is marked partial, a whole
    one unmarked: what install and audit read. A table holding a row at every batch size is
    whole only where its run tuned them all: the rows a --minutes window did not tune hold the
    incumbent (partial.tuned says which), and the committed tables are partial at 5 of 18."""
    from tuner.emit.partial import of_entry
    from tuner.pipeline.mark_partial import mark
    from tuner.plan.engines import DEFAULT_BATCH_SIZES
    shutil.copy(REPO / "tuned" / "NVIDIA_H200" / "manifest.json", tmp_path / "manifest.json")
    data = json.loads((tmp_path / "manifest.json").read_text())
    whole, held = data["tables"][:2]
    row = next(iter(whole["entries"].values()))
    for t in (whole, held):
        t["entries"] = {str(m): {**row, "M": m} for m in DEFAULT_BATCH_SIZES}
    whole.pop("partial")                   # tuned at every batch size (held's 13 others are incumbent rows)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    said = mark(tmp_path, "a test")
    assert [s.split(":")[0] for s in said] == ["whole", "partial (5 of 18 batch sizes)",
                                               "partial (5 of 18 batch sizes)"]
    tables = json.loads((tmp_path / "manifest.json").read_text())["tables"]
    assert "partial" not in tables[0] and [of_entry(t)["left"][:2] for t in tables[1:]] == [[2, 4], [2, 4]]


def test_the_grid_a_table_is_whole_at_is_its_kernel_specs(tmp_path, monkeypatch):
    """mark_partial takes a table's grid from its kernel's spec (KernelSpec.batch_sizes), not
    from the kernel's name (the house rule): a MoE spec declaring the grid 1, 16, 64 makes the
    H200 run's MoE tables (M = 1, 16, 64, 256, 1024) whole, and MLA's spec holds its own grid.
    Before: only a table named mla_decode had a grid other than the engines' 18."""
    import dataclasses

    import kernels.fused_moe_spec as moe_spec
    from tuner.emit.partial import of_entry
    from tuner.pipeline.mark_partial import mark
    from tuner.plan.kernel_registry import batch_grid, ours
    assert batch_grid("mla_decode") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    shutil.copy(REPO / "tuned" / "NVIDIA_H200" / "manifest.json", tmp_path / "manifest.json")
    monkeypatch.setattr(moe_spec, "SPEC", dataclasses.replace(moe_spec.SPEC, batch_sizes=(1, 16, 64)))
    ours.cache_clear()
    try:
        said = mark(tmp_path, "a test")
    finally:
        ours.cache_clear()
    tables = json.loads((tmp_path / "manifest.json").read_text())["tables"]
    assert {t["kernel"] for t in tables} == {"fused_moe"} and said == [s for s in said if s.startswith("whole")]
    assert all(of_entry(t) is None for t in tables)
