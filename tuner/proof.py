"""`tuner proof`: the whole GPU proof in one unattended call, every step time-boxed.

For a freshly started, bare GPU machine (scripts/gpu_proof.sh sets it up): each step runs
as child processes with its share of `--minutes`, writes its results into the output folder
before the next starts, and a step that runs out of time is stopped, says so, and keeps
what it measured. Steps:
  1. environment   GPU, driver, clocks, versions; `tuner ceilings`
  2. validate      scripts/validate_kernels.py on every kernel source present; `tuner check`
                   of the engines' shipped tables on the engines' kernels
  3. landscapes    record GEMM (7168, 2048), (3072, 1536), (4608, 7168) at M = 1, 16, 128,
                   1024 and the MoE E=256 N=256 K=7168 top-8 at M = 1, 16, 64, 256, 1024
  4. tune          the full DeepSeek-V3 TP8 MoE tables (both engines), with the wall time
  5. bench         MoE and GEMM (engine kernels and ours side by side, shipped and tuned
                   tables), MLA at B = 32, 64, 128 and contexts 4K, 8K, 32K
  6. sampler       TPE, CMA-ES, random and seeded TPE over the new landscapes
  7. summary       summary.md of all the above
With --fake (for tests on a CPU) the same flow runs over SYNTHETIC landscapes and a small
model, and says so everywhere: the only new thing on a GPU is the GPU.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.environment import now_iso, software_versions
from tuner.errors import TunerError
from tuner.gpus import GpuSpec
from tuner.paths import REPO_ROOT, atomic_write_json, atomic_write_text

MOE_MS = [1, 16, 64, 256, 1024]
GEMM_MS = [1, 16, 128, 1024]
GEMM_SHAPES = ["N=7168,K=2048", "N=3072,K=1536", "N=4608,K=7168"]
BENCH_MS = [1, 16, 64, 256]
# Share of the budget per step (the summary takes what is left).
STEPS = ("environment", "validate", "landscapes", "tune", "bench", "sampler")
SHARES = {"environment": 0.05, "validate": 0.12, "landscapes": 0.22, "tune": 0.22, "bench": 0.27, "sampler": 0.08}
FAKE_MODEL = {"hidden_size": 256, "num_attention_heads": 2, "head_dim": 128, "n_routed_experts": 8,
              "n_shared_experts": 1, "moe_intermediate_size": 256, "num_experts_per_tok": 2,
              "intermediate_size": 512, "first_k_dense_replace": 1,
              "quantization_config": {"weight_block_size": [128, 128]}}


@dataclass
class Command:
    label: str
    argv: list[str]
    log: str                             # file under the output folder


@dataclass
class StepResult:
    name: str
    status: str                          # ok, failed, out of time, skipped
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


@dataclass
class Proof:
    out: Path
    gpu: GpuSpec
    minutes: float
    fake: bool = False
    engine_source: list[str] | None = None
    baselines: Path | None = None
    python: str = sys.executable
    results: list[StepResult] = field(default_factory=list)

    # -- running commands inside a time box --------------------------------------------
    def tuner(self, *args: str) -> list[str]:
        return [self.python, "-m", "tuner", *args]

    def run(self, commands: list[Command], seconds: float) -> StepResult:
        """Run the commands in order within `seconds`; each writes its own log."""
        t0 = time.monotonic()
        detail, status = [], "ok"
        for c in commands:
            left = seconds - (time.monotonic() - t0)
            if left <= 1:
                detail.append(f"{c.label}: not started, out of time")
                status = "out of time"
                continue
            log = self.out / c.log
            log.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
            started = time.monotonic()
            with open(log, "w") as f:
                f.write(f"$ {' '.join(c.argv)}\n")
                f.flush()
                # its own process group: a timeout stops its compile workers and children too
                proc = subprocess.Popen(c.argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                                        start_new_session=True)
                try:
                    rc = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    rc = None
            took = time.monotonic() - started
            if rc is None:
                detail.append(f"{c.label}: out of time after {took:.0f}s (kept what it wrote; log {c.log})")
                status = "out of time" if status == "ok" else status
            elif rc != 0:
                detail.append(f"{c.label}: failed, exit {rc} after {took:.0f}s (log {c.log})")
                status = "failed"
            else:
                detail.append(f"{c.label}: ok in {took:.0f}s")
        return StepResult("", status, time.monotonic() - t0, detail)

    # -- the steps ---------------------------------------------------------------------
    def model(self) -> str:
        if not self.fake:
            return "deepseek-v3"
        path = self.out / "fake" / "model.json"
        if not path.is_file():
            atomic_write_json(path, FAKE_MODEL)
        return str(path)

    def engine_args(self) -> list[str]:
        return ["--engine-source", *self.engine_source] if self.engine_source else []

    def step_environment(self) -> list[Command]:
        env = {"format": "tuner-proof-environment/1", "written": now_iso(), "fake": self.fake,
               **software_versions(), "gpu": self.gpu.key}
        try:
            import torch
            if torch.cuda.is_available():
                p = torch.cuda.get_device_properties(0)
                env.update(device=torch.cuda.get_device_name(), sm_count=p.multi_processor_count,
                           l2_bytes=getattr(p, "L2_cache_size", None), memory_bytes=p.total_memory)
                from tuner.environment import nvml_index, nvml_snapshot
                env.update(nvml_snapshot(nvml_index(0)))
        except Exception as e:  # noqa: BLE001 - the environment record says what failed
            env["error"] = str(e)
        atomic_write_json(self.out / "environment.json", env, indent=2)
        if self.fake:
            return []
        cmds = []
        if shutil.which("nvidia-smi"):
            cmds.append(Command("nvidia-smi", ["nvidia-smi", "-q"], "logs/nvidia-smi.txt"))
        cmds.append(Command("ceilings", self.tuner("ceilings", "--gpu", self.gpu.key, "--out",
                                                   str(self.out / "ceilings.json")), "logs/ceilings.txt"))
        return cmds

    def shipped_tables(self) -> list[tuple[str, str, Path]]:
        """(kernel command, engine, table) of the engines' shipped DeepSeek-V3 TP8 tables for this GPU."""
        if not self.baselines or not self.baselines.is_dir():
            return []
        from tuner.engines import ENGINES
        out = []
        for engine in ENGINES:
            dev = ENGINES[engine].device_name(self.gpu.cuda_name)
            for path in sorted(self.baselines.glob(f"{engine}-*/**/E=*,N=256,device_name={dev},*.json")):
                if "triton_3_1_0" not in str(path) and "triton_3_2_0" not in str(path) and "triton_3_3_1" not in str(path):
                    out.append(("moe", engine, path))
            for shape in GEMM_SHAPES:
                out += [("gemm", engine, p) for p in sorted(self.baselines.glob(f"{engine}-*/**/{shape},device_name={dev},*.json"))]
        return out

    def step_validate(self) -> list[Command]:
        cmds = []
        sources = ["ours"] + ([] if self.fake else self.available_engines())
        if not self.fake:
            cmds.append(Command("validate_kernels", [self.python, "scripts/validate_kernels.py", "--gpu", self.gpu.key,
                                                     "--kernel-source", *sources, *self.engine_args(),
                                                     "--out", str(self.out / "validate" / "kernels.json")],
                                "logs/validate-kernels.txt"))
        ms = ["1"] if self.fake else [str(m) for m in BENCH_MS]
        tables = self.shipped_tables()
        if self.fake:
            tables = [t for t in tables if t[0] == "moe"][:1]
        available = self.available_engines()
        for kind, engine, path in tables:
            if not self.fake and engine not in available:
                continue
            # a rehearsal without the engine's code still runs the table's configs, on our kernel
            source = "engine" if engine in available else "ours"
            cmds.append(Command(f"check {engine} {path.name} on {source}", self.tuner(
                "check", "--model", self.model(), "--tp", "1" if self.fake else "8", "--kernel", kind,
                "--table", str(path), "--kernel-source", source, *self.engine_args(), "--batch-sizes", *ms,
                "--seed", "1"), f"validate/check-{engine}-{path.stem.replace(' ', '')[:80]}.txt"))
        return cmds

    def available_engines(self) -> list[str]:
        from tuner.kernel_sources import locate, origin_for
        found = []
        for engine in ("vllm", "sglang"):
            try:
                locate(engine, origin_for(engine, self.engine_source))
                found.append(engine)
            except TunerError:
                pass
        return found

    def step_landscapes(self) -> list[Command]:
        land = self.out / "landscapes"
        if self.fake:
            return [Command("synthetic gemm landscape", self.tuner(
                        "landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", self.gpu.key,
                        "--tp", "8", "--batch-sizes", "1", "16", "--out", str(land / "gemm.jsonl.gz")), "logs/land-gemm.txt"),
                    Command("synthetic moe landscape", self.tuner(
                        "landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", self.gpu.key,
                        "--tp", "8", "--batch-sizes", "1", "16", "--engines", "vllm", "--out",
                        str(land / "moe.jsonl.gz")), "logs/land-moe.txt")]
        engines = ["--engines", "vllm"]
        source = ["--kernel-source", "engine" if "vllm" in self.available_engines() else "ours"]
        return [Command("record gemm", self.tuner(
                    "gemm", "--model", "deepseek-v3", "--gpu", self.gpu.key, "--tp", "8", "--only", *GEMM_SHAPES,
                    "--batch-sizes", *map(str, GEMM_MS), "--trials", "8", *engines, *source, *self.engine_args(),
                    "--record", str(land / "gemm.jsonl.gz"), "--out", str(self.out / "runs" / "record-gemm"),
                    "--quiet"), "logs/record-gemm.txt"),
                Command("record moe", self.tuner(
                    "moe", "--model", "deepseek-v3", "--gpu", self.gpu.key, "--tp", "8",
                    "--batch-sizes", *map(str, MOE_MS), "--trials", "8", *engines, *source, *self.engine_args(),
                    "--record", str(land / "moe.jsonl.gz"), "--out", str(self.out / "runs" / "record-moe"),
                    "--quiet"), "logs/record-moe.txt")]

    def step_tune(self) -> list[Command]:
        run = self.out / "tuned" / "moe-deepseek-v3-tp8"
        if self.fake:
            tune = self.tuner("moe", "--model", "deepseek-v3", "--gpu", self.gpu.key, "--tp", "8", "--replay",
                              str(self.out / "landscapes" / "moe.jsonl.gz"), "--trials", "8", "--out", str(run))
        else:
            source = ["--kernel-source", "engine" if self.available_engines() else "ours"]
            tune = self.tuner("moe", "--model", "deepseek-v3", "--gpu", self.gpu.key, "--tp", "8", *source,
                              *self.engine_args(), "--out", str(run))
        return [Command("tune the DeepSeek-V3 TP8 MoE tables", tune, "logs/tune-moe.txt"),
                Command("report", self.tuner("report", str(run)), "logs/report-moe.txt")]

    def step_bench(self) -> list[Command]:
        bench = self.out / "bench"
        common = ["--gpu", self.gpu.key, "--tp", "8", "--model", "deepseek-v3", "--quiet"]
        shipped = ["--baseline", *[str(p) for p in sorted(self.baselines.iterdir()) if p.is_dir()]] \
            if self.baselines and self.baselines.is_dir() else []
        tuned = self.out / "tuned" / "moe-deepseek-v3-tp8"
        if self.fake:
            replay = lambda name: ["--replay", str(self.out / "landscapes" / name)]  # noqa: E731
            return [Command("bench moe", self.tuner("bench", "--kernel", "moe", *common, "--engines", "vllm",
                                                    "--batch-sizes", "1", "16", *replay("moe.jsonl.gz"), *shipped,
                                                    "--out", str(bench / "moe")), "logs/bench-moe.txt"),
                    Command("bench gemm", self.tuner("bench", "--kernel", "gemm", *common, "--only", *GEMM_SHAPES,
                                                     "--batch-sizes", "1", "16", *replay("gemm.jsonl.gz"), *shipped,
                                                     "--out", str(bench / "gemm")), "logs/bench-gemm.txt")]
        sources = ["--kernel-source", "engine", "ours"] if self.available_engines() else ["--kernel-source", "ours"]
        ceil = ["--ceilings", str(self.out / "ceilings.json")] if (self.out / "ceilings.json").is_file() else []
        with_tuned = ["--tuned", str(tuned)] if (tuned / "manifest.json").is_file() else []
        return [Command("bench moe", self.tuner("bench", "--kernel", "moe", *common, *sources, *self.engine_args(),
                                                "--batch-sizes", *map(str, BENCH_MS), *shipped, *with_tuned, *ceil,
                                                "--out", str(bench / "moe")), "logs/bench-moe.txt"),
                Command("bench gemm", self.tuner("bench", "--kernel", "gemm", *common, "--only", *GEMM_SHAPES, *sources,
                                                 *self.engine_args(), "--batch-sizes", *map(str, GEMM_MS), *shipped,
                                                 *ceil, "--out", str(bench / "gemm")), "logs/bench-gemm.txt"),
                Command("bench mla", self.tuner("bench", "--kernel", "mla", *common, "--kernel-source", "ours",
                                                "--batch-sizes", "32", "64", "128", "--contexts", "4096", "8192",
                                                "32768", *ceil, "--out", str(bench / "mla")), "logs/bench-mla.txt")]

    def step_sampler(self) -> list[Command]:
        cmds = []
        for land in sorted((self.out / "landscapes").glob("*.jsonl.gz")):
            budget, seeds = ("16", "1") if self.fake else ("48", "2")
            cmds.append(Command(f"sampler study {land.name}", [
                self.python, "scripts/search_efficiency.py", str(land), "--gpu", self.gpu.key, "--budget", budget,
                "--seeds", seeds], f"sampler/{land.name.split('.')[0]}.md"))
        return cmds

    # -- the whole proof ---------------------------------------------------------------
    def keep_partial_landscapes(self) -> list[str]:
        """A recording stopped by its time box leaves FILE.partial: keep it, gzipped."""
        kept = []
        for partial in (self.out / "landscapes").glob("*.partial"):
            target = partial.with_name(partial.name[: -len(".partial")])
            target = target if target.name.endswith(".gz") else target.with_name(target.name + ".gz")
            target = target.with_name(target.name.replace(".jsonl.gz", ".partial.jsonl.gz"))
            with open(partial, "rb") as src, gzip.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            partial.unlink()
            kept.append(target.name)
        return kept

    def previous_results(self) -> list[StepResult]:
        """Steps an earlier call into the same folder ran (a proof split over several calls)."""
        data = json_or_none(self.out / "steps.json") or {}
        return [StepResult(**r) for r in data.get("steps", []) if isinstance(r, dict) and "name" in r]

    def execute(self, log=print, only: list[str] | None = None) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        budget = self.minutes * 60.0
        t0 = time.monotonic()
        steps = [("environment", self.step_environment), ("validate", self.step_validate),
                 ("landscapes", self.step_landscapes), ("tune", self.step_tune), ("bench", self.step_bench),
                 ("sampler", self.step_sampler)]
        if only:
            steps = [s for s in steps if s[0] in only]
            self.results = [r for r in self.previous_results() if r.name not in only]
        for i, (name, build) in enumerate(steps):
            left = budget - (time.monotonic() - t0)
            later = sum(SHARES[n] for n, _ in steps[i:])
            seconds = max(0.0, left * SHARES[name] / later) if later else left
            log(f"[proof] {name}: up to {seconds:.0f}s")
            try:
                commands = build()
            except TunerError as e:
                result = StepResult(name, "failed", 0.0, [str(e)])
            else:
                result = self.run(commands, seconds) if commands else StepResult(name, "skipped", 0.0,
                                                                                   ["needs a GPU"] if self.fake else [])
            result.name = name
            if name == "landscapes":
                kept = self.keep_partial_landscapes()
                result.detail += [f"kept the partial landscape {k}" for k in kept]
            self.results.append(result)
            for line in result.detail:
                log(f"[proof]   {line}")
            log(f"[proof] {name}: {result.status} ({result.seconds:.0f}s)")
            self.write_summary(time.monotonic() - t0)            # after every step: nothing is lost
        log(f"[proof] summary: {self.out / 'summary.md'}")
        return 1 if any(r.status == "failed" for r in self.results) else 0

    def write_summary(self, elapsed: float) -> None:
        from tuner.proof_summary import summary_markdown
        atomic_write_json(self.out / "steps.json", {"fake": self.fake, "minutes": self.minutes,
                                                    "elapsed_s": elapsed, "gpu": self.gpu.key,
                                                    "steps": [r.__dict__ for r in self.results]}, indent=2)
        atomic_write_text(self.out / "summary.md", summary_markdown(self.out, self.results, self.fake, elapsed))


def default_out(gpu: GpuSpec, fake: bool) -> Path:
    date = _dt.date.today().isoformat()
    if fake:
        return REPO_ROOT / "runs" / f"proof-fake-{date}"
    return REPO_ROOT / "bench" / "results" / f"{gpu.key}-{date}"


def default_baselines() -> Path | None:
    for candidate in (REPO_ROOT / ".baselines", REPO_ROOT.parent / "shared" / "baselines"):
        if candidate.is_dir():
            return candidate
    return None


def default_engine_source() -> list[str] | None:
    folder = REPO_ROOT / ".engine-src"
    if folder.is_dir():
        return [str(p) for p in sorted(folder.iterdir()) if p.is_dir()]
    return None


def json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
