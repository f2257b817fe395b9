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
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_engine_kernels import triton_unsqueezes_scalars

from tuner.cli import main
from tuner.commands.proof import CALLS, STEPS, Proof
from tuner.plan.gpus import get_gpu

# Under a Triton that refuses `scalar[:, None]` (3.9), SGLang 0.5.23's own fused MoE kernel
# cannot compile the swap-AB rows of its shipped table: the proof's check of that table fails
# there, rightly, and with it call 1. On the GPU machines' Triton (3.6) every step passes.
SGLANG_COMPILES_HERE = triton_unsqueezes_scalars()

REPO = Path(__file__).resolve().parents[1]
# The rehearsal runs the engines' kernels where TUNER_ENGINE_WHEELS is set, ours alone where it
# is not (ci_variables), and every step's kernels in Triton's interpreter (triton).
# .ci/run leaves the rehearsal out of its newest-Triton run (proof_rehearsal): the proof runs on
# the GPU machines, whose Triton is 3.6.0, and the kernels it runs are checked under the newest
# Triton by their own tests (test_engine_kernels.py, test_capture_kernels.py, ...).
pytestmark = [pytest.mark.triton, pytest.mark.proof_rehearsal]
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    root = tmp_path_factory.mktemp("proof")
    out, bundle = root / "H200-rehearsal", root / "OUT"
    # --minutes far above what the rehearsal's fixed work takes idle (its steps' boxes are shares of
    # it): a loaded machine only waits longer, no step is cut by the clock
    codes = {call: main(["proof", "--device", "cpu", "--gpu", "H200", "--minutes", "60", "--out", str(out),
                         "--bundle", str(bundle), "--call", call]) for call in ("1", "2", "local")}
    return out, bundle, codes


def sglang_shipped(case: dict) -> bool:
    return case["kernel_source"].startswith("sglang") and case["case"].startswith("shipped ")


@pytest.mark.ci_variables
def test_the_rehearsal_runs_every_step_on_the_cpu_device(rehearsal):
    out, _, codes = rehearsal
    steps = json.loads((out / "steps.json").read_text())["steps"]
    assert [s["name"] for s in steps] == list(STEPS)
    validate = next(s for s in steps if s["name"] == "validate")
    cases = json.loads((out / "validate" / "kernels.json").read_text())["cases"]
    expect_fail = any(sglang_shipped(c) for c in cases) and not SGLANG_COMPILES_HERE
    assert codes == {"1": 1 if expect_fail else 0, "2": 0, "local": 0}
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
def test_the_rehearsal_tunes_on_each_engines_kernel_with_compile_workers(rehearsal):
    out, _, _ = rehearsal
    smoke = json.loads((out / "runs" / "smoke" / "manifest.json").read_text())
    assert [e["time_us"] > 0 for t in smoke["tables"] for e in t["entries"].values()] == [True]
    manifest = json.loads((out / "tuned" / "moe" / "manifest.json").read_text())
    engines = os.environ.get("TUNER_ENGINE_WHEELS")
    by_source = {}
    for t in manifest["tables"]:
        by_source.setdefault(t["kernel_source"]["source"], []).append(t)
        assert t["environment"]["device_kind"] == "cpu"
        # the measuring child started its compile workers, and they built every config for sm_90
        compiles = t["environment"]["compiles"]
        assert compiles["built"] > 0 and compiles["failed"] == compiles["lost"] == 0, compiles
        assert all(e["time_us"] > 0 and e["numerics"]["status"] == "passed" for e in t["entries"].values())
    assert sorted(by_source) == (["sglang", "vllm"] if engines else ["ours"])
    assert sum(len(ts) for ts in by_source.values()) == 3        # vLLM's table, SGLang's up and _down
    validated = json.loads((out / "validate" / "kernels.json").read_text())["cases"]
    expected_to_fail = [c for c in validated if sglang_shipped(c) and not SGLANG_COMPILES_HERE]
    assert validated and all(c["numerics"]["status"] == "passed" and c["time_us"] > 0 for c in validated
                             if c not in expected_to_fail)
    assert all(c["time_source"].startswith("CPU DEVICE") for c in validated if c["time_us"])
    assert {c["kernel_source"].split()[0] for c in validated} == ({"ours", "vllm", "sglang"} if engines else {"ours"})
    # the engines' kernels ran before ours (a validation cut by its time loses ours first)
    sources = [c["kernel_source"].split()[0] for c in validated]
    assert sources == sorted(sources, key=lambda s: s == "ours")


@pytest.mark.ci_variables
def test_the_rehearsal_takes_every_launch_path_of_a_gpu_call_under_the_capture_rules(rehearsal):
    """The smoke at the GPU's M=16 (vLLM's alignment), validate at M=5 (vLLM's alignment with
    fewer pairs than a block, SGLang's long sorted length), the tunes at M=1 (vLLM's small-batch
    path, SGLang's short sorted length); every process that timed said it timed under the rules."""
    out, _, _ = rehearsal
    from kernels.engines import vllm
    from tuner.commands.proof_steps import GPU_PROFILE, REHEARSAL_PROFILE
    assert REHEARSAL_PROFILE.smoke_m == GPU_PROFILE.smoke_m == 16
    smoke = json.loads((out / "runs" / "smoke" / "manifest.json").read_text())
    [table] = smoke["tables"]
    E, topk = table["problem"]["E"], table["problem"]["topk"]
    assert list(table["entries"]) == ["16"] and not vllm.naive_block_assignment(16, topk, E)
    tuned = json.loads((out / "tuned" / "moe" / "manifest.json").read_text())
    assert {m for t in tuned["tables"] for m in t["entries"]} == {"1"} and vllm.naive_block_assignment(1, topk, E)
    validated = json.loads((out / "validate" / "kernels.json").read_text())
    assert {c["M"] for c in validated["cases"]} == {5}
    if os.environ.get("TUNER_ENGINE_WHEELS"):
        sgl = [c for c in validated["cases"] if c["kernel_source"].startswith("sglang")]
        assert sgl and all(5 * topk >= E + 1 for c in sgl)          # SGLang's long sorted length
        assert 1 * topk < E + 1                                      # and the tunes' short one
    environments = [smoke["tables"][0]["environment"], validated["environment"],
                    *(t["environment"] for t in tuned["tables"])]
    assert all("capture's rules" in env["timing"] and env["clock_warmups"] >= 1 for env in environments)


@pytest.mark.ci_variables
def test_the_rehearsal_benches_records_and_studies_labelled_cpu_device(rehearsal):
    out, _, _ = rehearsal
    for kernel in ("moe", "gemm"):
        [path] = (out / "bench" / kernel).glob("bench-*.json")
        bench = json.loads(path.read_text())
        assert bench["cpu_device"] is True and bench["banner"].startswith("*** CPU DEVICE")
        timed = [r for r in bench["rows"] if r["time_us"]]
        assert timed and all(r["time_source"].startswith("CPU DEVICE") for r in timed)
    moe = json.loads(next((out / "bench" / "moe").glob("bench-*.json")).read_text())
    assert {"default", "tuned"} <= {r["contender"] for r in moe["rows"]}      # same kernel, one run
    import gzip
    with gzip.open(out / "landscapes" / "gemm.jsonl.gz", "rt") as f:
        header, *points = [json.loads(line) for line in f]
    assert header["device_kind"] == "cpu" and header["device"] == "CPU device (stand-in for NVIDIA H200)"
    assert len(points) >= 2 and all(p.get("time_us") for p in points)
    study = (out / "sampler" / "gemm.md").read_text()
    assert "CPU DEVICE landscape" in study and "| tpe |" in study
    assert (out / "tuned" / "moe" / "report" / "report.md").read_text().count("CPU DEVICE") >= 1


@pytest.mark.ci_variables
def test_the_bundle_comes_back_through_the_device_tool(rehearsal):
    """At most 8 files, plain names, not deeper than 2 folders, under 16 MiB each; the
    tarball's top folder is where bench/README.md says it unpacks: bench/results/<name>."""
    out, bundle, _ = rehearsal
    files = [p for p in bundle.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["proof-H200-rehearsal.tar.gz", "summary.md"]
    assert all(NAME_OK.match(p.name) and p.stat().st_size < 16 << 20 for p in files)
    with tarfile.open(bundle / "proof-H200-rehearsal.tar.gz") as tar:
        names = tar.getnames()
    top = "bench/results/H200-rehearsal"
    assert all(n == top or n.startswith(top + "/") for n in names)
    for rel in ("summary.md", "steps.json", "tuned/moe/manifest.json", "landscapes/gemm.jsonl.gz",
                "validate/kernels.json"):
        assert f"{top}/{rel}" in names
    assert (bundle / "summary.md").read_text() == (out / "summary.md").read_text()


def test_a_call_cut_by_its_time_keeps_what_it_has_and_a_failed_smoke_stops_it(tmp_path):
    """A call with next to no time (0.3 s, all of it the environment step's by its floor, too
    little to start Python): each step is stopped, says so, and is bundled; the smoke test that
    timed nothing stops the rest of the call, with the reason."""
    proof = Proof(tmp_path / "H200-cut", get_gpu("H200"), minutes=0.005, device="cpu", bundle=tmp_path / "OUT")
    assert proof.execute(CALLS["1"], log=lambda line: None) == 1
    steps = {s["name"]: s for s in json.loads((tmp_path / "H200-cut" / "steps.json").read_text())["steps"]}
    assert steps["environment"]["status"] == "out of time"
    assert steps["smoke"]["status"] == "failed" and "the smoke test failed" in steps["smoke"]["detail"][-1]
    assert steps["validate"]["status"] == steps["tune-vllm"]["status"] == "skipped"
    assert steps["validate"]["detail"][0].startswith("not run: the smoke test timed no config")
    with tarfile.open(tmp_path / "OUT" / "proof-H200-cut.tar.gz") as tar:
        assert "bench/results/H200-cut/summary.md" in tar.getnames()


def test_the_shell_wrapper_bundles_into_the_device_tools_out(tmp_path):
    out_dir = tmp_path / "OUT"
    out_dir.mkdir()
    env = {**os.environ, "OUT": str(out_dir), "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", "scripts/gpu_proof.sh", "--device", "cpu", "--gpu", "H200", "--minutes", "10",
                        "--out", str(tmp_path / "res" / "H200-x"), "--steps", "environment"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with tarfile.open(out_dir / "proof-H200-x.tar.gz") as tar:
        assert {"bench/results/H200-x/summary.md", "bench/results/H200-x/ceilings.json"} <= set(tar.getnames())
    assert (out_dir / "summary.md").read_text().startswith("# GPU proof\n\n*** REHEARSAL ON THE CPU DEVICE")


# The device tool's limits (/work/.library/device/README.md, as of 2026-11): device time per task,
# starts and idle waits included; the least left for a start; a start's cost at worst; one command.
DEVICE_BUDGET_S, START_NEEDS_S, START_S, COMMAND_S = 15 * 60, 4 * 60, 120, 600
IDLE_S = 30                     # a warm machine's idle wait before it goes back, counted too
# Per call besides its steps: installing the carried wheels, a stopped step's 20 s, the bundle.
CALL_OVERHEAD_S = 50


def test_the_device_calls_in_bench_readme_fit_the_device_tool():
    """The `run` calls bench/README.md gives: two GPU calls, each a command of at most 2,000
    characters whose timeout covers its steps' --minutes and overhead, kind nvidia-h200, the
    carried paths prepare_gpu_proof.sh makes; both within the task's device time even when the
    machine goes back between them (idle wait and a new start counted), and after a failed
    start call 1 still leaving what a start needs; the H100 fallback said."""
    text = (REPO / "bench" / "README.md").read_text()
    calls = [json.loads(m) for m in re.findall(r"^run\((\{.*\})\)$", text, flags=re.M)]
    assert len(calls) == 2
    for call, part in zip(calls, ("1", "2")):
        assert call["kind"] == "nvidia-h200" and call["timeout_s"] <= COMMAND_S
        assert len(call["command"]) <= 2000 and f"--call {part}" in call["command"]
        minutes = float(re.search(r"--minutes (\d+(?:\.\d+)?)", call["command"]).group(1))
        assert minutes * 60 + CALL_OVERHEAD_S <= call["timeout_s"]     # the proof stops itself before the tool does
        assert call["carry"] == [".whl", ".engine-src", ".baselines"]
    first, second = (c["timeout_s"] for c in calls)
    # call 2 on a machine gone back: call 1's start, its idle wait, a new start
    assert 2 * START_S + first + IDLE_S + second <= DEVICE_BUDGET_S
    # a failed start first (the H100 fallback): call 1 still leaves what a start needs, and call 2
    # fits on the warm machine (else the README's formula shortens it)
    assert DEVICE_BUDGET_S - (2 * START_S + first) >= START_NEEDS_S
    assert 2 * START_S + first + second <= DEVICE_BUDGET_S
    assert "(budget_left_s - 200) / 60" in text
    assert "nvidia-h100-x1" in text and "tar xzf" in text
    prepare = (REPO / "scripts" / "prepare_gpu_proof.sh").read_text()
    assert all(c in prepare for c in (".whl", ".engine-src", ".baselines", "threadpoolctl"))


def test_bad_proof_options_are_one_line(tmp_path, capsys):
    assert main(["proof", "--device", "cpu", "--call", "1", "--steps", "smoke", "--out", str(tmp_path / "p")]) == 2
    assert main(["proof", "--device", "cpu", "--steps", "tune", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "not both" in err[0] and "not a step" in err[1]


def test_a_step_that_times_nothing_says_why_in_the_log_steps_and_summary(tmp_path):
    """What the smoke's manifest and validate's cases say about failures reaches the smoke's
    verdict, the step's detail (steps.json, printed) and summary.md: the first failure's
    text; a case validate could not time is a failure."""
    from tuner.commands.proof import StepResult
    from tuner.commands.proof_outcomes import step_outcome
    from tuner.commands.proof_summary import summary_markdown
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
    assert "- validate_kernels: 1 passed, 1 failed (1 not timed; default configs and 1 shipped tables" in summary
    assert f"FAILED [vllm 0.33.0] fused_moe E=8 M=5 (shipped t.json): not timed: {first}" in summary


def test_the_plan_prints_each_steps_time_box_without_a_gpu(capsys):
    assert main(["proof", "--plan", "--gpu", "H200", "--minutes", "8", "--call", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "estimates from the plan's shares, not measurements" in lines[0]
    boxes = {ln.split()[0]: float(ln.split()[1]) for ln in lines[1:-1]}
    assert list(boxes) == list(CALLS["1"]) and sum(boxes.values()) == pytest.approx(480, abs=1)
    assert boxes["smoke"] == 150                         # the smoke's floor: a cold machine's first measurement


def test_call_2_without_call_1s_folder_says_to_unpack_it_first(tmp_path):
    printed = []
    proof = Proof(tmp_path / "H200-two", get_gpu("H200"), minutes=0.005, device="cpu")
    proof.execute(CALLS["2"], log=printed.append)
    assert any("holds no call-1 results" in line and "tar xzf" in line for line in printed), printed
