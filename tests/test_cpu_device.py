"""The GPU's measuring stack, run in CI on the CPU device (tuner/measure/device.py): the commands a
GPU run uses, as a user types them, through the real isolated measuring child, its compile
workers (compiling for sm_90), recycling, the hang kill and crash restart; times labelled
CPU DEVICE and never taken for a GPU's; no process of a run left behind, kill -9 included.
Shapes are the tiny model's (configs/examples/small-moe.json) and budgets a few configs, so
that the interpreter keeps each test to seconds."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.measure.process_tree import members

# triton_incidental: what these tests check is the CPU device's processes, not the kernels they run
# (the kernels' own tests check those under the newest Triton): .ci/run runs them with the pinned Triton only
pytestmark = [pytest.mark.triton, pytest.mark.triton_incidental]     # runs Triton kernels (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
SMALL = str(REPO / "configs" / "examples" / "small-moe.json")
GEMM_ARGS = ["--model", SMALL, "--gpu", "H100", "--device", "cpu", "--kernel-source", "ours", "--only", "N=256,K=256"]


def tuner(*args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, int]:
    """`python -m tuner ARGS` as a user runs it, in a session of its own (whose id is its
    pid: every process of the run, measuring child and compile workers included, is in it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def left_in(sid: int | None = None, pgids: list[int] | None = None, within_s: float = 60.0) -> list[int]:
    """The processes still alive in a session (or in any of some process groups) once they
    had `within_s` to go (a resource tracker notices its clients are gone within a moment; the
    wait ends as soon as none is left, so a loaded machine only waits longer)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = members(sid=sid) if sid is not None else [p for g in pgids or [] for p in members(pgid=g)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One small tune on the CPU device with two compile workers."""
    out = tmp_path_factory.mktemp("cpu") / "run"
    result, sid = tuner("gemm", *GEMM_ARGS, "--batch-sizes", "1", "16", "--trials", "3", "--patience", "3",
                        "--compile-workers", "2", "--out", str(out))
    return out, result, sid


def test_a_tune_on_the_cpu_device_times_every_config_and_leaves_no_process(cpu_run):
    out, result, sid = cpu_run
    assert result.returncode == 0, result.stderr
    assert not left_in(sid=sid), "processes of the run outlived it"
    manifest = json.loads((out / "manifest.json").read_text())
    [table] = manifest["tables"]
    assert manifest["measured_by"] == "cpu-device"
    env = table["environment"]
    assert env["device"] == "CPU device (stand-in for NVIDIA H100 80GB HBM3)" and env["device_kind"] == "cpu"
    # the compile workers built the configs (for sm_90), none failed: the timed run found them built
    assert env["compiles"]["built"] >= 3 and env["compiles"]["failed"] == 0, env["compiles"]
    assert env["worker_starts"] == 1 and env["compile_workers"] == 2
    for M, entry in table["entries"].items():
        assert entry["time_us"] > 0 and entry["failures"] == {} and entry["trials"] == 3, (M, entry)
        assert entry["numerics"]["status"] == "passed"
    # every time shown says where it came from
    assert result.stdout.splitlines()[0].startswith("*** CPU DEVICE: the GPU's code path run on a CPU")
    studies = [ln for ln in result.stderr.splitlines() if ln.startswith("[")]
    assert len(studies) == 2 and all(" us (CPU device), " in ln for ln in studies), studies


def test_drift_on_the_cpu_device(cpu_run, tmp_path):
    out, _, _ = cpu_run
    [table] = (out / "vllm").rglob("N=256,K=256,*.json")
    result, sid = tuner("drift", str(table), "--gpu", "H100", "--device", "cpu", "--kernel-source", "ours",
                        "--out", str(tmp_path / "drift.json"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("*** CPU DEVICE")
    rows = json.loads((tmp_path / "drift.json").read_text())
    assert {r["M"] for r in rows} == {1, 16} and all(r["table_us"] > 0 and r["default_us"] > 0 for r in rows)
    assert not left_in(sid=sid)


def test_cpu_device_times_are_never_taken_for_a_gpus(cpu_run, tmp_path, monkeypatch, capsys):
    out, _, _ = cpu_run
    from test_install import site_packages

    from tuner.cli import main
    # `tuner install` refuses them without --force, naming why
    site = site_packages(tmp_path / "site")
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site)]) == 2
    assert "timed on the CPU device" in capsys.readouterr().err
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site), "--force"]) == 0
    capsys.readouterr()
    # the report says so; the same --out with a GPU's measurer is refused: other studies
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.startswith("*** CPU DEVICE")
    import shutil

    import tuner.measure.device
    import tuner.measure.isolation
    from tuner.measure.measurers import Measurement, NumericsCheck
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)

    class GpuHere:
        label = "gpu"

        def __init__(self, kernel, *args, **kw):
            self.kernel = kernel

        def environment(self):
            return {"device": "NVIDIA H100 80GB HBM3", "triton": "3.6.0"}

        def candidates(self, problem, M):
            return None

        def measure(self, problem, M, configs):
            return [Measurement(10.0, 0.01) for _ in configs]

        def check_numerics(self, problem, M, config, seed=None):
            return NumericsCheck("passed", 0.001)

        def close(self):
            pass
    monkeypatch.setattr(tuner.measure.isolation, "IsolatedMeasurer", GpuHere)
    monkeypatch.setattr(tuner.measure.device, "require_gpu", lambda *a: None)
    args = [a for a in GEMM_ARGS if a not in ("--device", "cpu")]
    assert main(["gemm", *args, "--batch-sizes", "1", "16", "--trials", "3", "--out", str(copy), "--quiet"]) == 2
    err = capsys.readouterr().err
    # its manifest's tables refuse it first (tests/test_cli_errors.py), before its storage's studies would
    assert "holds tables timed on the CPU device" in err and "this run's would be measured on a GPU" in err, err


@pytest.fixture
def small_space(tmp_path):
    """Three configs: BLOCK_SIZE_N 32 with 3, 4, 5 stages (the faulty kernel's lost context,
    hang and crash); the engines' two default configs, seeds of every study, are fine."""
    f = tmp_path / "space.yaml"
    f.write_text("kernel: fp8_gemm\nparams:\n  BLOCK_SIZE_M: [16]\n  BLOCK_SIZE_N: [32]\n  BLOCK_SIZE_K: [128]\n"
                 "  GROUP_SIZE_M: [1]\n  num_warps: [4]\n  num_stages: [3, 4, 5]\n"
                 "constraints: {block_k_divides_group: {}}\n")
    return f


def test_a_hang_a_crash_and_a_lost_context_on_the_cpu_device(small_space, tmp_path, monkeypatch):
    """The real tuning run (search, measuring child, compile workers, CPU device) over a test
    kernel that hangs, segfaults or loses its 'CUDA context' for three of five configs, the
    child recycled every 2 configs: the hang is killed at the timeout and the next config
    measured, every config is a trial (nothing lost), the manifest records the failures by
    kind and what took children down, and no process of any child is left.

    The hang is timed by the measurer's own timeout, from the moment it starts (the kernel
    says so in a file); the configs that do not hang are waited for as long as the machine's
    load makes them take, so the 6 s never races a slow, busy machine (on 2 shared cores the
    first healthy config alone, compile workers starting, can take longer than 6 s)."""
    import faulty_kernel

    import tuner.measure.isolation
    from tuner.pipeline.request import TuneRequest
    from tuner.pipeline.run import run_tuning
    from tuner.pipeline.run_plan import RunPlan
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import gemm_problems, load_model
    from tuner.plan.space import load_space
    from tuner.search.runner import SearchSettings

    made = []

    hang_file = tmp_path / "hanging"
    monkeypatch.setenv(faulty_kernel.HANG_FILE, str(hang_file))

    def hanging(pid: int) -> bool:
        try:
            return hang_file.read_text() == str(pid)
        except FileNotFoundError:
            return False

    class Counted(tuner.measure.isolation.IsolatedMeasurer):
        def __init__(self, *args, **kw):
            made.append(self)
            super().__init__(*args, **kw)

        def _receive(self, timeout):
            """The measurer's own wait (its timeout and its hang verdict), entered once the
            child has a result or its config has begun to hang (at most 10 minutes)."""
            deadline = time.monotonic() + 600
            while not self.conn.poll(0.2) and not hanging(self.proc.pid) and time.monotonic() < deadline:
                pass
            return super()._receive(timeout)
    monkeypatch.setattr(tuner.measure.isolation, "IsolatedMeasurer", Counted)
    kernel = faulty_kernel.KERNEL
    [problem] = [p for p in gemm_problems(load_model(SMALL), 1) if p.params["N"] == 256]
    request = TuneRequest("gemm", SMALL, "H100", engines=["vllm"], compile_workers=1, measure_timeout=6,
                          recycle_after=2, device="cpu", quiet=True)
    opts = RunPlan(request=request, kernel=kernel, space=load_space(kernel, small_space), gpu=get_gpu("H100"),
                   problems=[problem], batch_sizes=[1], settings=SearchSettings(budget=5, patience=100, batch=5, seed=0),
                   out_dir=tmp_path / "out")
    results = run_tuning(opts)
    [measurer] = made
    assert not left_in(pgids=measurer.process_groups), "a child or compile worker outlived its restart"
    [result] = results[problem.key]
    # every config tried (the three and the engines' two defaults, seeds): nothing lost; a fine one won
    assert result.trials == 5 and faulty_kernel.fault(result.config) is None
    [table] = json.loads((tmp_path / "out" / "manifest.json").read_text())["tables"]
    assert table["entries"]["1"]["failures"] == {"timeout": 1, "crash": 1, "runtime": 1}
    downs = table["environment"]["worker_failures"]
    assert any(d.startswith("hang: no result within 6s") for d in downs)
    assert any(d.startswith("worker killed by SIGSEGV") for d in downs)
    assert any(d.startswith("CUDA context lost after RuntimeError: CUDA error: an illegal memory access") for d in downs)
    # a fresh child for each of the three, and after every 2 configs served (recycling, no failure)
    assert measurer.starts > 1 + len(downs) == 4 and len(set(measurer.process_groups)) == measurer.starts


def test_kill_9_of_the_run_leaves_no_process(tmp_path):
    """SIGKILL to the command (nothing of ours runs in it then): its measuring child notices
    its parent is gone and kills its process group, compile workers included."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "gemm", *GEMM_ARGS, "--batch-sizes", "1", "16", "32",
                             "--trials", "20", "--compile-workers", "2", "--out", str(tmp_path / "out"), "--quiet"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    def child_group() -> list[int]:
        """The measuring child's process group (its own, not the command's), once its two
        compile workers have joined it."""
        groups: dict = {}
        for pid in members(sid=proc.pid):
            try:
                groups.setdefault(os.getpgid(pid), []).append(pid)
            except ProcessLookupError:
                pass
        return next((g for pgid, g in groups.items() if pgid != proc.pid and len(g) >= 3), [])
    try:
        deadline = time.monotonic() + 120
        while not child_group() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None and child_group(), "the run never had a child with two compile workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = left_in(sid=proc.pid)
        assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
    finally:
        for pid in members(sid=proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_checks_run_isolated_a_crash_or_a_lost_context_fails_its_own_line():
    """What `tuner check` and validate_kernels do per case: a config that kills the child, or
    loses its CUDA context, fails its own check; the next one runs in a fresh child."""
    import faulty_kernel

    from tuner.measure.isolation import isolated_gpu_measurer
    from tuner.plan.problems import Problem
    problem = Problem("fp8_gemm", {"N": 256, "K": 256, "block_shape": [128, 128]})
    good = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 3}
    m = isolated_gpu_measurer(faulty_kernel.KERNEL, "H100", compile_workers=0, timeout_s=30, device="cpu")
    try:
        crashed = m.check_numerics(problem, 1, {**good, "BLOCK_SIZE_N": 32, "num_stages": 5}, 1)
        lost = m.check_numerics(problem, 1, {**good, "BLOCK_SIZE_N": 32, "num_stages": 3}, 2)
        fine = m.check_numerics(problem, 1, good, 3)
    finally:
        m.close()
    assert crashed.failed and crashed.detail == "worker killed by SIGSEGV"
    assert lost.failed and "illegal memory access" in lost.detail
    assert fine.status == "passed" and fine.rel_error < 0.01
    assert m.starts == 3 and m.failures[1].startswith("CUDA context lost after check_numerics")
    assert not left_in(pgids=m.process_groups)


def test_inputs_that_cannot_be_made_fail_each_config_not_the_measurer():
    """Out of memory while making a (problem, M)'s inputs is that config's failure (kind
    out_of_resources), as a launch's would be; the measurer goes on."""
    import dataclasses

    import torch

    from tuner.measure.device_measurer import DeviceMeasurer
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.problems import Problem

    def too_big(params, M, device, seed):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")
    kernel = dataclasses.replace(get_kernel("fp8_gemm"), make_inputs=too_big)
    m = DeviceMeasurer(kernel, get_gpu("H100"), compile_workers=0, device="cpu")
    problem = Problem("fp8_gemm", {"N": 256, "K": 256, "block_shape": [128, 128]})
    got = m.measure(problem, 1, [kernel.default_config(problem.params, 1)] * 2)
    assert [(x.time_us, x.kind) for x in got] == [(None, "out_of_resources")] * 2
    assert got[0].error.startswith("OutOfMemoryError: CUDA out of memory")


def test_the_cpu_device_stands_in_for_the_gpu_of_the_table(monkeypatch):
    """Its name says what it stands in for (so its studies and landscapes are never a GPU's),
    its properties come from tuner/plan/gpus.py (L2: H100 50 MB, H200 60 MB), and a compile waits
    at most half the time a config may take, which fits a 10-minute device command."""
    from tuner.measure.device import CpuDevice, device_name
    from tuner.measure.isolation import DEFAULT_TIMEOUT_S, IsolatedMeasurer, isolated_gpu_measurer
    from tuner.measure.provenance import banner, short_label
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    h100, h200 = get_gpu("H100"), get_gpu("H200")
    assert (h100.l2_bytes, h200.l2_bytes) == (50 << 20, 60 << 20)
    assert CpuDevice(h200).properties()["l2_bytes"] == 60 << 20
    assert device_name("cpu", h200) == "CPU device (stand-in for NVIDIA H200)" != device_name("cuda", h200)
    env = {"device": device_name("cpu", h200), "device_kind": "cpu"}
    assert banner(env, "cpu-device").startswith("*** CPU DEVICE") and short_label(env) == "CPU device"
    assert banner({"device": "NVIDIA H200"}, "gpu") == "times: measured on the GPU (NVIDIA H200)"
    made = {}

    class Recorded(IsolatedMeasurer):
        def __init__(self, kernel, factory, kwargs, timeout_s, **kw):
            made.update(kwargs, timeout_s=timeout_s)
    import tuner.measure.isolation
    monkeypatch.setattr(tuner.measure.isolation, "IsolatedMeasurer", Recorded)
    isolated_gpu_measurer(get_kernel("fp8_gemm"), "H200", device="cpu")
    assert made["timeout_s"] == DEFAULT_TIMEOUT_S <= 120 and made["compile_timeout_s"] == made["timeout_s"] / 2


def test_sampler_cmaes_is_refused_saying_why(capsys):
    """--sampler cmaes was random search (every key is categorical, which Optuna's CMA-ES leaves
    to independent random sampling): removed, in one line that says so (issue 32)."""
    from tuner.cli import main
    assert main(["gemm", "--model", SMALL, "--gpu", "H100", "--device", "cpu", "--sampler", "cmaes",
                 "--kernel-source", "ours", "--batch-sizes", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "invalid choice: 'cmaes'" in err[0]
    from tuner.api import TuneRequest
    from tuner.errors import TunerError
    with pytest.raises(TunerError, match="--sampler cmaes was removed: .* searched nothing; use gp"):
        TuneRequest("gemm", SMALL, "H100", sampler="cmaes")


def test_the_cpu_device_honours_the_measurement_policy():
    """--timing eager and --l2 warm on the CPU device as on a GPU (tuner/measure/device.py): both
    warm every input set up before timing (as the GPU does before it captures, or launches); graph
    timing holds each timed call to CUDA-graph capture's rules, eager timing (no capture on a GPU)
    does not; an L2 left warm is never flushed; the policy is in the measurer's environment."""
    from tuner.measure.device import CpuDevice
    from tuner.measure.device_measurer import DeviceMeasurer
    from tuner.measure.policy import MeasurementPolicy
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.problems import Problem
    calls = []
    runs = [lambda i=i: calls.append(i) for i in range(3)]
    dev = CpuDevice(get_gpu("H100"))
    flush = dev.flush_buffer(1 << 10)
    flush.fill_(1)
    assert len(dev.time_runs(runs, flush, 4, graph=True)) == 4 and calls == [0, 1, 2, 0, 1, 2, 0]
    assert int(flush.sum()) == 0                        # flushed (zeroed) before the timed calls
    calls.clear()
    assert len(dev.time_runs(runs, None, 4, graph=False)) == 4 and calls == [0, 1, 2, 0, 1, 2, 0]
    import torch
    state = torch.randn(4)

    def host_scalar_write():
        state[0] = 1.0                                  # a host-to-device copy of a Python scalar
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        dev.time_runs([host_scalar_write], None, 2, graph=True)
    assert len(dev.time_runs([host_scalar_write], None, 2, graph=False)) == 2   # eager: legal on a GPU too
    kernel = get_kernel("fp8_gemm")
    warm = DeviceMeasurer(kernel, get_gpu("H100"), compile_workers=0, device="cpu",
                          policy=MeasurementPolicy("eager", "warm"))
    cold = DeviceMeasurer(kernel, get_gpu("H100"), compile_workers=0, device="cpu")
    try:
        assert warm.flush is None and cold.flush is not None
        assert warm.environment()["policy"] == {"timing": "eager", "l2": "warm", "clocks": "unlocked"}
        assert cold.environment()["policy"]["timing"] == "graph"
        seen = []
        real = warm.device.time_runs
        warm.device.time_runs = lambda runs, flush, reps, graph=True, **kw: seen.append((flush, graph)) or real(
            runs, flush, reps, graph, **kw)
        params = {"N": 256, "K": 256, "block_shape": [128, 128]}
        m = warm.measure(Problem("fp8_gemm", params), 1, [kernel.default_config(params, 1)])[0]
        assert m.time_us and seen == [(None, False)]
    finally:
        warm.close()
        cold.close()


def test_the_sampler_study_reads_the_landscapes_own_kernel_and_space(tmp_path):
    """A landscape of vLLM's MoE kernel (its space has BLOCK_SIZE_M 8, ours has not) is studied
    on vLLM's kernel and space."""
    from tuner.cli import main
    land = tmp_path / "vllm.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "moe", "--model", SMALL, "--gpu", "H200", "--batch-sizes", "1",
                 "--engines", "vllm", "--kernel-source", "vllm", "--out", str(land)]) == 0
    r = subprocess.run([sys.executable, "scripts/search_efficiency.py", str(land), "--gpu", "H200", "--budget", "6",
                        "--seeds", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Kernel: vllm's fused_moe; space" in r.stdout and "fused_moe.vllm.yaml" in r.stdout
    assert "| tpe |" in r.stdout and "SYNTHETIC" in r.stdout
