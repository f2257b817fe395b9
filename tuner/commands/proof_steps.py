"""The GPU proof's steps (`tuner proof`): what each step runs, as tuner commands and scripts
in child processes, for the real proof on a GPU or the CPU device's rehearsal (the profiles).
tuner/commands/proof.py runs them in order within their time boxes, keeps what they measured
and bundles it. The window's work (both engines' MoE tables, then their GEMM tables, then MLA
decode, then a landscape) goes into one state folder, OUT/tuned/<device>/, seeded on a GPU from
the committed state (tuned/NVIDIA_H200/) and continued by every later window: its studies'
journal keeps every finished trial, and a study finished before is not opened again.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.environment import now_iso, software_versions
from tuner.paths import atomic_write_json, atomic_write_text
from tuner.plan.engines import DEFAULT_BATCH_SIZES
from tuner.plan.gpus import GpuSpec

GEMM_SHAPES = ["N=7168,K=2048", "N=3072,K=1536", "N=4608,K=7168"]
# Issue 52: the validation list's one case of each integer MoE precision on each engine kernel that
# runs it, at the model's shapes: (--dtype, the quantization_config the weights are read as; None:
# the model's own, where an FP8 block checkpoint gives INT8 its blocks and W8A16 is per channel).
MOE_PRECISION_CASES = (("int8_w8a8", None), ("int8_w8a8", {"quant_method": "w8a8_int8"}), ("int8_w8a16", None),
                       ("int8_w8a16", {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True}),
                       ("int4_w4a16", {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}))


def precision_case_problems(model, tp: int, engine: str) -> list:
    """The first MoE problem of each MOE_PRECISION_CASES precision `engine` runs (SGLang: its up
    table), the model's checkpoint read as that case's quantization_config."""
    import dataclasses

    from tuner.plan.models import moe_problems
    out = []
    for dtype, qc in MOE_PRECISION_CASES:
        m = model if qc is None else dataclasses.replace(model, raw={**model.raw, "quantization_config": qc},
                                                         weight_block_size=None)
        if engine not in _engines_running(m, dtype):
            continue
        out += moe_problems(m, tp, 1, dtype, engines=[engine])[:1]
    return out


def _engines_running(model, dtype: str) -> set[str]:
    from tuner.plan.engines import ENGINES
    from tuner.plan.precision import moe_precision
    scheme = moe_precision(model, dtype).scheme
    return {name for name, e in ENGINES.items() if (dtype, scheme) in e.moe_precisions}


@dataclass(frozen=True)
class Profile:
    """What the steps measure: the real proof, or the rehearsal's tiny version of it."""
    model: str
    tp: int
    moe_ms: tuple[int, ...]          # the window's MoE and GEMM batch sizes (the engines' grid on a GPU)
    smoke_m: int
    validate_ms: tuple[int, ...]     # the engines' kernels and shipped tables
    gemm_shapes: tuple[str, ...]     # the GEMM shapes validated on the engines' kernels, the landscape's first
    gemm_ms: tuple[int, ...]         # ours, on every problem of the model
    landscape_ms: tuple[int, ...]
    trials: int | None               # None: the tuning command's default
    compile_workers: int
    measure_timeout: int
    sampler_budget: int
    sampler_seeds: int
    landscape_space: str | None = None   # a YAML written into the folder (the rehearsal's small grid)
    ours_only: tuple[str, ...] = ()      # ours validated on these problems only (the GPU: every one)
    window_gemm_only: tuple[str, ...] = ()   # the window's GEMM shapes (the GPU: every one of the model)
    patience: int | None = None          # None: as many as the trials


# The window's search settings are the committed state's (tuned/NVIDIA_H200/manifest.json: budget 32,
# patience 16), so that its studies continue as one run would, at the cost per study measured.
GPU_PROFILE = Profile("deepseek-v3", 8, tuple(DEFAULT_BATCH_SIZES), 16, (1, 256), tuple(GEMM_SHAPES),
                      (1, 64), (64, 256), 32, min(16, os.cpu_count() or 1), 90, 48, 2, patience=16)
# configs/examples/small-moe.json: its GEMM shapes are (768, 256), (256, 256), (512, 256); 8 experts,
# top-2. Every launch path a GPU call takes, at least once, under the capture rules: vLLM's
# small-batch path (M * topk * 4 <= E) at M=1 (tune-vllm), its alignment at M=16 (the smoke, as on
# the GPU) and with fewer pairs than BLOCK_SIZE_M at M=5 (validate); SGLang's short sorted length
# (pairs < E + 1) at M=1 (tune-sglang) and its long one at M=5 (validate, with the shipped tables'
# entries, USE_TMA ones among them, where ../shared/baselines is there).
REHEARSAL_PROFILE = Profile("configs/examples/small-moe.json", 1, (1,), 16, (5,), ("N=256,K=256",), (5,), (1,),
                            2, 2, 60, 6, 1, landscape_space=(
                                "kernel: fp8_gemm\nparams:\n  BLOCK_SIZE_M: [16]\n  BLOCK_SIZE_N: [64, 128]\n"
                                "  BLOCK_SIZE_K: [128]\n  GROUP_SIZE_M: [1]\n  num_warps: [4]\n  num_stages: [3]\n"
                                "constraints: {block_k_divides_group: {}}\n"), ours_only=("E=8,",),
                            window_gemm_only=("N=256,K=256",))


@dataclass
class Command:
    label: str
    argv: list[str]
    log: str                             # file under the output folder
    window: bool = False                 # a tuning command of the window: told the time it has (--minutes)


@dataclass
class ProofSteps:
    """The proof's settings and the commands each step runs."""
    out: Path
    gpu: GpuSpec
    minutes: float
    device: str = "cuda"
    engine_source: list[str] | None = None
    baselines: Path | None = None
    bundle: Path | None = None           # where the tarball and summary.md go (the device tool's $OUT)
    python: str = sys.executable
    window_note: str | None = None       # what the window started from (said in its step's detail)

    @property
    def profile(self) -> Profile:
        return REHEARSAL_PROFILE if self.device == "cpu" else GPU_PROFILE

    @property
    def rehearsal(self) -> bool:
        return self.device == "cpu"

    # -- running commands inside a time box --------------------------------------------
    def tuner(self, *args: str) -> list[str]:
        return [self.python, "-m", "tuner", *args]
    # -- what the steps share -------------------------------------------------------------
    def model(self) -> str:
        return self.profile.model

    def engine_args(self) -> list[str]:
        return ["--engine-source", *self.engine_source] if self.engine_source else []

    def device_args(self) -> list[str]:
        return ["--device", self.device]

    def measuring_args(self) -> list[str]:
        p = self.profile
        return [*self.device_args(), "--compile-workers", str(p.compile_workers),
                "--measure-timeout", str(p.measure_timeout)]

    def available_engines(self) -> list[str]:
        from tuner.plan.kernel_sources import locate, origin_for
        found = []
        for engine in ("vllm", "sglang"):
            try:
                locate(engine, origin_for(engine, self.engine_source))
                found.append(engine)
            except TunerError:
                pass
        return found

    def source_for(self, engine: str) -> str:
        """The engine's own kernel where its code is here; else ours (said in the log)."""
        return engine if engine in self.available_engines() else "ours"

    def baseline_dirs(self, engine: str | None = None) -> list[Path]:
        """The shipped tables' folders (one per engine version), `engine`'s only when given."""
        if not self.baselines or not self.baselines.is_dir():
            return []
        return [d for d in sorted(self.baselines.iterdir()) if d.is_dir() and (engine is None or d.name.startswith(engine))]

    def state_name(self) -> str:
        """The state folder's name: the device as the engines name it (a rehearsal's: CPU_DEVICE)."""
        return "CPU_DEVICE" if self.rehearsal else self.gpu.cuda_name.replace(" ", "_")

    def tuned(self) -> Path:
        """The window's state folder: tables, manifest and studies of every window so far."""
        return self.out / "tuned" / self.state_name()

    def seed_state(self) -> str | None:
        """On a GPU, the first window starts from the committed state of this device
        (tuned/<device>/: tables, manifest, studies journal); a rehearsal starts empty."""
        from tuner.paths import REPO_ROOT
        committed = REPO_ROOT / "tuned" / self.state_name()
        if self.rehearsal or (self.tuned() / "manifest.json").exists() or not committed.is_dir():
            return None
        shutil.copytree(committed, self.tuned(), dirs_exist_ok=True)
        return f"continues the committed state {committed.relative_to(REPO_ROOT)}"

    def parallel_args(self) -> list[str]:
        # the proof times TP8's shapes on whichever Hopper it gets (an H100 node cannot hold
        # DeepSeek-V3's weights at TP8): one rank's shapes, on purpose
        return ["--tp", str(self.profile.tp), "--per-rank"]

    def moe_tune(self, engine: str, ms, out: Path, trials: int | None, log: str, label: str,
                 kind: str = "moe", window: bool = False) -> Command:
        baseline = self.baseline_dirs(engine) if kind == "moe" else []
        only = list(self.profile.window_gemm_only) if kind == "gemm" else []
        return Command(label, self.tuner(
            kind, "--model", self.model(), "--gpu", self.gpu.key, *self.parallel_args(),
            *(["--dtype", "fp8_w8a8"] if kind == "moe" else []), *(["--only", *only] if only else []),
            "--kernel-source", self.source_for(engine), "--engines", engine, *self.engine_args(),
            "--batch-sizes", *map(str, ms), *(["--trials", str(trials)] if trials else []),
            *(["--patience", str(self.profile.patience or trials if window else trials)] if trials else []),
            *(["--baseline", str(baseline[0])] if baseline else []),
            *self.measuring_args(), "--out", str(out), "--quiet"), log, window)

    # -- the steps ---------------------------------------------------------------------
    def step_environment(self) -> list[Command]:
        from tuner.measure.device import device_name
        env = {"format": "tuner-proof-environment/1", "written": now_iso(), "device_kind": self.device,
               "device": device_name(self.device, self.gpu), **software_versions(), "gpu": self.gpu.key}
        try:
            import torch
            if self.device == "cuda" and torch.cuda.is_available():
                p = torch.cuda.get_device_properties(0)
                env.update(device=torch.cuda.get_device_name(), sm_count=p.multi_processor_count,
                           l2_bytes=getattr(p, "L2_cache_size", None), memory_bytes=p.total_memory)
                from tuner.measure.environment import nvml_index, nvml_snapshot
                env.update(nvml_snapshot(nvml_index(0)))
        except Exception as e:  # noqa: BLE001 - the environment record says what failed
            env["error"] = str(e)
        atomic_write_json(self.out / "environment.json", env, indent=2, root=self.out)
        cmds = []
        if self.device == "cuda" and shutil.which("nvidia-smi"):
            cmds.append(Command("nvidia-smi", ["nvidia-smi", "-q"], "logs/nvidia-smi.txt"))
        cmds.append(Command("ceilings", self.tuner("ceilings", "--gpu", self.gpu.key, *self.device_args(), "--out",
                                                   str(self.out / "ceilings.json")), "logs/ceilings.txt"))
        return cmds

    def step_smoke(self) -> list[Command]:
        p = self.profile
        return [self.moe_tune("vllm", [p.smoke_m], self.out / "runs" / "smoke", 1, "logs/smoke.txt",
                              "one MoE config through the isolated measurer with compile workers")]

    def smoke_timed(self) -> str | None:
        """None when the smoke test timed a config, else why not (the call stops there)."""
        path = self.out / "runs" / "smoke" / "manifest.json"
        data = json_or_none(path)
        if not data:
            return f"it wrote no manifest (log logs/smoke.txt: {_last_line(self.out / 'logs' / 'smoke.txt')})"
        entries = [e for t in data.get("tables", []) for e in (t.get("entries") or {}).values()]
        if any(e.get("time_us") for e in entries):
            return None
        failures = {k: v for e in entries for k, v in (e.get("failures") or {}).items()}
        errors = data.get("environment", {}).get("worker_failures") or []
        first = next((e["first_failure"] for e in entries if e.get("first_failure")), None)
        return (f"no config was timed (failures {failures or '-'}; {'; '.join(errors[:2]) or 'no worker failure'}"
                + (f"; first failure: {first})" if first else ")"))

    def shipped_moe_tables(self) -> list[tuple[str, Path]]:
        """(engine, table) of the engines' shipped DeepSeek-V3 TP8 MoE tables for this GPU."""
        from tuner.plan.engines import ENGINES
        out = []
        for engine in ENGINES:
            dev = ENGINES[engine].device_name(self.gpu.cuda_name)
            for d in self.baseline_dirs(engine):
                for path in sorted(d.glob(f"**/E=*,N=256,device_name={dev},*.json")):
                    if not any(old in str(path) for old in ("triton_3_1_0", "triton_3_2_0", "triton_3_3_1")):
                        out.append((engine, path))
        return out

    def step_validate(self) -> list[Command]:
        """The full validation list, the engines' first: their kernels (the MoE layer, then the
        GEMM shapes the window's landscape starts from), each engine's shipped MoE tables at the
        validate batch sizes on its own kernel right after its default cases (same measuring
        child); then ours on every problem of the model, MLA decode included: what a cut step
        loses is the least valuable."""
        p = self.profile
        engines = self.available_engines()
        only = ["E=8,"] if self.rehearsal else ["E=25", *p.gemm_shapes]
        tables = [str(path) for engine, path in self.shipped_moe_tables() if engine in engines]
        common = [self.python, "scripts/validate_kernels.py", "--gpu", self.gpu.key, "--model", self.model(),
                  "--tp", str(p.tp)]
        cmds = []
        if engines:
            cmds.append(Command("validate the engines' kernels", [
                *common, "--kernel-source", *engines, *self.engine_args(), "--only", *only,
                "--batch-sizes", *map(str, p.validate_ms), *self.measuring_args(),
                *(["--tables", *tables] if tables else []), "--out", str(self.out / "validate" / "kernels.json")],
                "logs/validate-kernels.txt"))
        cmds.append(Command("validate ours", [
            *common, "--kernel-source", "ours", *(["--only", *p.ours_only] if p.ours_only else []),
            "--batch-sizes", *map(str, p.gemm_ms), *self.measuring_args(),
            "--out", str(self.out / "validate" / "ours.json")], "logs/validate-ours.txt"))
        return cmds

    def step_window(self) -> list[Command]:
        """The window's work list, most valuable first: both engines' MoE tables at the window's
        batch sizes, both engines' GEMM tables (every shape of the model), MLA decode (where the
        model has it), then a landscape; each command continues the state folder."""
        from tuner.plan.models import load_model
        p = self.profile
        self.window_note = self.seed_state()
        state = self.tuned()
        cmds = [self.moe_tune(e, p.moe_ms, state, p.trials, f"logs/window-moe-{e}.txt",
                              f"the {self.model()} MoE tables of {e}", window=True) for e in ("vllm", "sglang")]
        cmds += [self.moe_tune(e, p.moe_ms, state, p.trials, f"logs/window-gemm-{e}.txt",
                               f"the {self.model()} GEMM tables of {e}", kind="gemm", window=True)
                 for e in ("vllm", "sglang")]
        if load_model(self.model()).is_mla:
            cmds.append(Command(f"the {self.model()} MLA decode table", self.tuner(
                "mla", "--model", self.model(), "--gpu", self.gpu.key, "--tp", str(p.tp),
                *(["--trials", str(p.trials), "--patience", str(p.patience or p.trials)] if p.trials else []),
                *self.measuring_args(), "--out", str(state), "--quiet"), "logs/window-mla.txt", window=True))
        return cmds + self.step_landscapes()

    def step_landscapes(self) -> list[Command]:
        p = self.profile
        space = []
        if p.landscape_space:
            path = self.out / "rehearsal" / "space-gemm.yaml"
            atomic_write_text(path, p.landscape_space, root=self.out)
            space = ["--space", str(path)]
        return [Command("record gemm", self.tuner(
            "gemm", "--model", self.model(), "--gpu", self.gpu.key, *self.parallel_args(), "--only", p.gemm_shapes[0],
            "--batch-sizes", *map(str, p.landscape_ms), "--trials", "8", "--engines", "vllm",
            "--kernel-source", self.source_for("vllm"), *self.engine_args(), *space, *self.measuring_args(),
            "--record", str(self.out / "landscapes" / "gemm.jsonl.gz"),
            "--out", str(self.out / "runs" / "record-gemm"), "--quiet"), "logs/record-gemm.txt")]

    def step_report(self) -> list[Command]:
        if not (self.tuned() / "manifest.json").is_file():
            return []
        return [Command("report", self.tuner("report", str(self.tuned())), "logs/report.txt")]

    def step_sampler(self) -> list[Command]:
        p = self.profile
        return [Command(f"sampler study {land.name}", [
                    self.python, "scripts/search_efficiency.py", str(land), "--gpu", self.gpu.key,
                    "--budget", str(p.sampler_budget), "--seeds", str(p.sampler_seeds)],
                    f"sampler/{land.name.split('.')[0]}.md")
                for land in sorted((self.out / "landscapes").glob("*.jsonl.gz"))]

    def builders(self) -> dict:
        return {"environment": self.step_environment, "smoke": self.step_smoke, "validate": self.step_validate,
                "window": self.step_window, "report": self.step_report, "sampler": self.step_sampler}


def _last_line(path: Path) -> str:
    from tuner.reading import last_line
    return (last_line(path) or "-")[:200]


def json_or_none(path: Path):
    """The JSON in a file a step wrote, or None when there is none (or it is not JSON)."""
    from tuner.reading import read_json_file
    try:
        return read_json_file(path)
    except TunerError:
        return None
