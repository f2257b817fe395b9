"""The GPU proof's steps (`tuner proof`): what each step runs, as tuner commands and scripts
in child processes, for the real proof on a GPU or the CPU device's rehearsal (the profiles).
tuner/jobs/proof.py runs them in order within their time boxes, keeps what they measured
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
from tuner.file_kinds import PROOF_ENV
from tuner.measure.environment import now_iso, software_versions
from tuner.paths import atomic_write_json, atomic_write_text
from tuner.plan.engines import DEFAULT_BATCH_SIZES
from tuner.plan.gpus import GpuSpec

GEMM_SHAPES = ["N=7168,K=2048", "N=3072,K=1536", "N=4608,K=7168"]
ENGINE_NAMES = ("vllm", "sglang")
MAKE_INPUTS = ("a GPU call times each engine's own kernel and beats the tables it ships: make .engine-src/ and "
               ".baselines/ with bash scripts/prepare_gpu_proof.sh and carry them (bench/README.md)")


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
    window_dtypes: tuple[str, ...] | None = None   # the window's MoE precisions (None: every one it is served at)


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
                            window_gemm_only=("N=256,K=256",), window_dtypes=("fp8_w8a8",))


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
        for engine in ENGINE_NAMES:
            try:
                locate(engine, origin_for(engine, self.engine_source))
                found.append(engine)
            except TunerError:
                pass
        return found

    def source_for(self, engine: str) -> str:
        """The engine's own kernel where its code is here. On a GPU, never ours in its place: its
        rows would go into the engine's committed tables (refused, one line); the rehearsal (CI
        without the engines' wheels) times ours."""
        if engine in self.available_engines():
            return engine
        if not self.rehearsal:
            raise TunerError(f"{engine}'s code is not here: {MAKE_INPUTS}")
        return "ours"

    def missing_inputs(self) -> list[str]:
        """What a GPU call needs beside the repository and lacks: each engine's code (.engine-src/)
        and its shipped tables (.baselines/), without which the window would time our kernel in
        an engine's place and its choices would be made without the rows the engine ships."""
        missing = [f"{e}'s code" for e in ENGINE_NAMES if e not in self.available_engines()]
        missing += [f"{e}'s shipped tables" for e in ENGINE_NAMES if not self.baseline_dirs(e)]
        return missing

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
                 kind: str = "moe", window: bool = False, tp: int | None = None, ep: int = 1,
                 dtype: str = "fp8_w8a8") -> Command:
        """A tuning command (`kind`: moe or gemm) of `engine`'s tables at the profile's TP (or
        `tp`/`ep`: one rank's shapes of a deployment of the work list) and `dtype`."""
        baseline = self.baseline_dirs(engine) if kind == "moe" else []
        only = list(self.profile.window_gemm_only) if kind == "gemm" else []
        parallel = self.parallel_args() if tp is None else \
            ["--tp", str(tp), *(["--ep", str(ep)] if ep > 1 else []), "--per-rank"]
        return Command(label, self.tuner(
            kind, "--model", self.model(), "--gpu", self.gpu.key, *parallel,
            *(["--dtype", dtype] if kind == "moe" else []), *(["--only", *only] if only else []),
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
        atomic_write_json(self.out / "environment.json", env, indent=2, root=self.out, kind=PROOF_ENV)
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

    def validation_runs(self) -> list[dict]:
        """The validation's commands as arguments of scripts/validate_kernels.py (the full list, the
        engines' first: their kernels (the MoE layer, then the GEMM shapes the window's landscape
        starts from), each engine's shipped MoE tables at the validate batch sizes on its own kernel
        right after its default cases (same measuring child); then ours on every problem of the
        model, MLA decode included: what a cut step loses is the least valuable)."""
        p = self.profile
        engines = self.available_engines()
        tables = [str(path) for engine, path in self.shipped_moe_tables() if engine in engines]
        runs: list[dict] = []
        if engines:
            runs.append({"label": "validate the engines' kernels", "sources": engines,
                         "only": ["E=8,"] if self.rehearsal else ["E=25", *p.gemm_shapes],
                         "batch_sizes": list(p.validate_ms), "tables": tables, "out": "kernels.json",
                         "log": "logs/validate-kernels.txt"})
        runs.append({"label": "validate ours", "sources": ["ours"], "only": list(p.ours_only) or None,
                     "batch_sizes": list(p.gemm_ms), "tables": [], "out": "ours.json", "log": "logs/validate-ours.txt"})
        return runs

    def step_validate(self) -> list[Command]:
        """The full validation list (validation_runs); a case recorded as passed on this GPU model
        with the same Triton, torch and kernel code is not run again, but one canary per kernel
        source (bench/validated.json: tuner/jobs/proof_validation.py)."""
        from tuner.jobs.proof_validation import LEDGER
        p = self.profile
        common = [self.python, "scripts/validate_kernels.py", "--gpu", self.gpu.key, "--model", self.model(),
                  "--tp", str(p.tp)]
        return [Command(r["label"], [
            *common, "--kernel-source", *r["sources"], *(self.engine_args() if r["sources"] != ["ours"] else []),
            *(["--only", *r["only"]] if r["only"] else []), "--batch-sizes", *map(str, r["batch_sizes"]),
            *self.measuring_args(), *(["--tables", *r["tables"]] if r["tables"] else []),
            "--recorded", str(LEDGER), "--out", str(self.out / "validate" / r["out"])], r["log"])
            for r in self.validation_runs()]

    def work(self) -> tuple[list, list[str]]:
        """The window's work list in order (tuner/jobs/proof_work.py: by expected value from
        the coverage map, less what the state folder holds), and what its order could not know."""
        from tuner.jobs.proof_work import work_list
        p = self.profile
        return work_list(self.model(), self.gpu, self.tuned(), {}, p.tp, self.engine_source, p.window_dtypes,
                         p.window_gemm_only)

    def step_window(self) -> list[Command]:
        """The window's work list, most valuable first (self.work): the fused-MoE tables of the
        model's deployments on this GPU that run the engine's default config, then fallbacks,
        then shipped ones; both engines' GEMM tables (every TP8 shape of the model), MLA decode
        (where the model has it); then a landscape. Each command continues the state folder."""
        p = self.profile
        self.window_note = self.seed_state()
        state = self.tuned()
        work, notes = self.work()
        if notes:
            self.window_note = "; ".join(filter(None, [self.window_note, *notes]))
        cmds = []
        for w in work:
            name = f"{w.kind}-{w.engine}" + (f"-tp{w.tp}-ep{w.ep}-{w.dtype}" if w.kind == "moe" else "")
            if w.kind in ("moe", "gemm"):
                cmds.append(self.moe_tune(w.engine, p.moe_ms, state, p.trials, f"logs/window-{name}.txt",
                                          f"the {self.model()} {w.label} tables ({w.status or 'TP8'})", kind=w.kind,
                                          window=True, **({"tp": w.tp, "ep": w.ep, "dtype": w.dtype}
                                                          if w.kind == "moe" else {})))
            elif w.kind == "mla":
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


def default_baselines() -> Path | None:
    from tuner.paths import REPO_ROOT
    for candidate in (REPO_ROOT / ".baselines", REPO_ROOT.parent / "shared" / "baselines"):
        if candidate.is_dir():
            return candidate
    return None


def default_engine_source() -> list[str] | None:
    from tuner.paths import REPO_ROOT
    folder = REPO_ROOT / ".engine-src"
    if folder.is_dir():
        return [str(p) for p in sorted(folder.iterdir()) if p.is_dir()]
    return None


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
