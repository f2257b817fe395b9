"""One tuning run, whatever the kernel: plan, measure, search, emit.

The kernel commands (gemm, moe, mla) only differ in how they turn a model into
problems; everything after that is here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tuner.engines import ENGINES, lookup_nearest
from tuner.environment import now_iso, software_versions
from tuner.errors import TunerError
from tuner.gpus import GpuSpec
from tuner.kernel_api import KernelSpec
from tuner.landscape import Landscape, LandscapeWriter, read_landscape
from tuner.measure import RecordingMeasurer, ReplayMeasurer
from tuner.problems import Problem
from tuner.progress import Progress
from tuner.paths import atomic_write_json
from tuner.results import manifest_entry, update_manifest, write_tables
from tuner.search import SearchSettings, StudyResult, StudyRunner
from tuner.space import SearchSpace


@dataclass
class RunOptions:
    kernel: KernelSpec
    space: SearchSpace
    gpu: GpuSpec
    problems: list[Problem]
    batch_sizes: list[int]
    settings: SearchSettings
    out_dir: Path
    storage: str | None = None
    engines: list[str] = field(default_factory=lambda: ["vllm", "sglang"])
    replay: str | None = None
    record: str | None = None
    baseline: str | None = None
    compile_workers: int = 8
    measure_timeout: float = 300.0   # seconds one config may take before its worker is replaced
    recycle_after: int = 256         # configs a measuring worker serves before a fresh one
    run_info: dict = field(default_factory=dict)   # model, tp, ep, dtype: for the manifest
    quiet: bool = False


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{(out_dir / 'studies.db').resolve()}"


# -- the plan ---------------------------------------------------------------------------
def plan_text(opts: RunOptions) -> str:
    k, gpu = opts.kernel, opts.gpu
    lines = [f"plan: {k.name} ({k.description}) on {gpu.cuda_name}",
             f"  {opts.run_info.get('model', '')}  " + "  ".join(
                 f"{key}={opts.run_info[key]}" for key in ("tp", "ep", "dtype") if key in opts.run_info),
             f"  search space {opts.space.source}: {opts.space.size} configs before pruning",
             f"  budget {opts.settings.budget} trials per batch size, sampler {opts.settings.sampler}, "
             f"patience {opts.settings.patience}",
             f"  storage {opts.storage or default_storage(opts.out_dir)}",
             f"  output {opts.out_dir}/"]
    triton_version = software_versions()["triton"]
    for p in opts.problems:
        lines.append(f"problem {p.key}  ({', '.join(p.layers)})"
                     + (f"  [{k.measurement_note(p.params)}]" if k.measurement_note(p.params) else ""))
        for name, path in planned_files(opts, p, triton_version):
            lines.append(f"  {name:7s} {path}")
        sizes = [f"{m}:{len(opts.space.configs(p.params, m, gpu))}" for m in opts.batch_sizes]
        lines.append("  configs after pruning, per M: " + " ".join(sizes))
        floor = [f"{m}:{max(k.bytes_moved(p.params, m) / (gpu.hbm_tb_s * 1e6), k.flops(p.params, m) / (gpu.fp8_tflops * 1e6)):.1f}"
                 for m in opts.batch_sizes]
        lines.append("  datasheet floor, us per M: " + " ".join(floor))
    total = len(opts.problems) * len(opts.batch_sizes)
    lines.append(f"{len(opts.problems)} problems x {len(opts.batch_sizes)} batch sizes = {total} studies, "
                 f"at most {total * opts.settings.budget} measured configs")
    return "\n".join(lines)


def planned_files(opts: RunOptions, p: Problem, triton_version: str) -> list[tuple[str, str]]:
    """(who reads it, relative path) of each file a problem's results go to."""
    k = opts.kernel
    if k.emit_table is not None:
        m = opts.batch_sizes[0]
        stand_in = StudyResult(p, m, k.default_config(p.params, m), None, None, {}, None, 0, "plan")
        _, file_of = k.emit_table([(p, [stand_in])], opts.gpu.cuda_name)
        return [("tuner", file_of[p.key])]
    return [(name, ENGINES[name].table_relpath(k.table_kind, p.params, opts.gpu.cuda_name, triton_version))
            for name in opts.engines if name in p.engines]


# -- seeds from shipped tables ----------------------------------------------------------
def load_baseline_table(baseline_dir: str, opts: RunOptions, problem: Problem) -> dict | None:
    """The engines' shipped table for this problem and GPU, if the folder holds one
    (searched recursively, under either engine's file name)."""
    root = Path(baseline_dir)
    names = {ENGINES[e].table_relpath(opts.kernel.table_kind, problem.params, opts.gpu.cuda_name, "0.0.0")
             .rsplit("/", 1)[-1] for e in ENGINES}
    for path in sorted(root.rglob("*.json")):
        if path.name in names:
            try:
                table = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise TunerError(f"baseline table {path} is not readable JSON: {e}") from None
            return {k: v for k, v in table.items() if k != "triton_version"}
    return None


# -- the run ----------------------------------------------------------------------------
def make_measurer(opts: RunOptions, progress: Progress):
    if opts.replay:
        land = read_landscape(opts.replay, opts.kernel)
        if land.header["device"] != opts.gpu.cuda_name:
            raise TunerError(f"landscape {opts.replay} was recorded on {land.header['device']!r}, "
                             f"but --gpu is {opts.gpu.cuda_name!r}")
        return ReplayMeasurer(land)
    from tuner.isolation import IsolatedMeasurer
    # Every compile and timing happens in a replaceable child process (tuner/isolation.py).
    gpu_m = IsolatedMeasurer(opts.kernel, "tuner.measure_gpu:make_gpu_measurer",
                             {"kernel": opts.kernel.name, "gpu": opts.gpu.key,
                              "compile_workers": opts.compile_workers},
                             timeout_s=opts.measure_timeout, recycle_after=opts.recycle_after)
    if not opts.record:
        return gpu_m
    env = gpu_m.environment()
    header = {"format": "tuner-landscape/1", "kernel": opts.kernel.name, "device": env["device"],
              "triton": env.get("triton"), "torch": env.get("torch"), "cuda": env.get("cuda"),
              "driver": env.get("driver"), "recorded": now_iso()}
    writer = LandscapeWriter(opts.record, opts.kernel, header)
    land = Landscape(header, opts.kernel, str(opts.record))
    grid = lambda p, m: opts.space.configs(p.params, m, opts.gpu)  # noqa: E731
    return RecordingMeasurer(gpu_m, writer, land, grid, progress=progress.note)


def run_tuning(opts: RunOptions) -> dict[str, list[StudyResult]]:
    """Tune every (problem, M), write the tables and the manifest; returns the results."""
    import optuna

    progress = Progress(len(opts.problems) * len(opts.batch_sizes), enabled=not opts.quiet)
    measurer = make_measurer(opts, progress)
    problems = opts.problems
    plan_ms = {p.key: list(opts.batch_sizes) for p in problems}
    if isinstance(measurer, ReplayMeasurer):
        problems, plan_ms = _replay_coverage(opts, measurer, progress)
        progress.total = max(1, sum(len(v) for v in plan_ms.values()))
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    storage_url = opts.storage or default_storage(opts.out_dir)
    try:
        storage = optuna.storages.get_storage(storage_url)
    except Exception as e:  # noqa: BLE001 - bad URLs, missing drivers, unreachable servers
        raise TunerError(f"cannot open storage {storage_url}: {str(e).splitlines()[0]}") from None

    runner = StudyRunner(opts.kernel, opts.space, opts.gpu, measurer, storage, opts.settings,
                         on_trial=lambda **kw: progress.trial(kw["done"], kw["budget"], kw["best"]))
    env = measurer.environment()
    run_info = {**opts.run_info, "gpu": opts.gpu.key, "measured_by": measurer.label, "environment": env,
                "search": {"sampler": opts.settings.sampler, "budget": opts.settings.budget,
                           "patience": opts.settings.patience, "space": opts.space.source}}
    all_results: dict[str, list[StudyResult]] = {}
    by_key = {p.key: p for p in problems}
    t0 = time.monotonic()
    try:
        for problem in problems:
            baseline = load_baseline_table(opts.baseline, opts, problem) if opts.baseline else None
            tied = {r.M: r.config for r in all_results.get(problem.tied_to, [])} if problem.tied_to else None
            results: list[StudyResult] = []
            neighbour = None
            for M in sorted(plan_ms[problem.key]):
                fixed = None
                if tied is not None:
                    if not tied.get(M):
                        continue            # nothing to tie to at this M: leave it out of both tables
                    fixed = {k: tied[M][k] for k in problem.tied_keys}
                progress.start_study(f"{_label(problem)} M={M}")
                seeds = [("default", opts.kernel.default_config(problem.params, M))]
                seeds += [("default", c) for c in opts.kernel.extra_seeds(problem.params, M)]
                if baseline:
                    seeds.append(("baseline", lookup_nearest(baseline, M)))
                if neighbour:
                    seeds.append(("neighbour", neighbour))
                r = runner.tune(problem, M, seeds, fixed)
                results.append(r)
                neighbour = r.config or neighbour
                progress.end_study(_summary(r))
            all_results[problem.key] = results
            if opts.kernel.emit_table is not None:
                _emit_own_format(opts, [p for p in problems if p.key in all_results], all_results, run_info)
                continue
            # Tables tied together are written together, over the batch sizes both have.
            if any(p.tied_to == problem.key for p in problems):
                continue
            group = [by_key[problem.tied_to], problem] if problem.tied_to else [problem]
            _emit(opts, group, [all_results[p.key] for p in group], env, run_info)
    finally:
        measurer.close()
    progress.note(f"done in {time.monotonic() - t0:.0f}s; tables and manifest in {opts.out_dir}/")
    return all_results


def _label(problem: Problem) -> str:
    return problem.key + (f" [{', '.join(problem.engines)}]" if len(problem.engines) == 1 else "")


def _emit_own_format(opts: RunOptions, done: list[Problem], all_results: dict, run_info: dict) -> None:
    """Kernels that no engine reads tables for write their own files (rewritten as each
    problem finishes, so a stopped run keeps what it has)."""
    pairs = [(p, all_results[p.key]) for p in done]
    tables, file_of = opts.kernel.emit_table(pairs, opts.gpu.cuda_name)
    for rel, obj in tables.items():
        atomic_write_json(opts.out_dir / rel, obj)
    entries = [manifest_entry(opts.kernel, p, results, {"tuner": file_of[p.key]} if p.key in file_of else {},
                              run_info) for p, results in pairs]
    update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k != "environment"}, entries)


def _emit(opts: RunOptions, group: list[Problem], group_results: list[list[StudyResult]], env: dict,
          run_info: dict) -> None:
    if len(group) > 1:
        common = set.intersection(*({r.M for r in rs if r.config} for rs in group_results))
        group_results = [[r for r in rs if r.M in common] for rs in group_results]
    triton_version = env.get("triton") or software_versions()["triton"]
    entries = []
    for problem, results in zip(group, group_results):
        files = write_tables(opts.out_dir, opts.kernel, problem, results, opts.gpu.cuda_name,
                             triton_version, opts.engines)
        entries.append(manifest_entry(opts.kernel, problem, results, files, run_info))
    update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k != "environment"}, entries)


def _replay_coverage(opts: RunOptions, measurer: ReplayMeasurer, progress: Progress):
    covered, plan_ms = [], {}
    for p in opts.problems:
        ms = [m for m in opts.batch_sizes if measurer.covers(p, m)]
        missing = [m for m in opts.batch_sizes if m not in ms]
        if not ms:
            progress.note(f"skip {p.key}: the landscape has no timings for it")
            continue
        if missing:
            progress.note(f"{p.key}: the landscape lacks M={','.join(map(str, missing))}; tuning M={','.join(map(str, ms))}")
        covered.append(p)
        plan_ms[p.key] = ms
    if not covered:
        raise TunerError(f"landscape {opts.replay} covers none of the planned problems and batch sizes")
    return covered, plan_ms


def _summary(r: StudyResult) -> str:
    if r.config is None:
        return f"no config ({r.numerics.get('detail', r.stopped)})"
    sp = f", {r.speedup:.2f}x default" if r.speedup else ""
    return f"{r.time_us:.2f} us{sp} after {r.trials} trials ({r.stopped})"


def results_table(results: dict[str, list[StudyResult]], keys: tuple[str, ...]) -> pd.DataFrame:
    rows = []
    for pkey, rs in results.items():
        for r in rs:
            rows.append({
                "problem": pkey, "M": r.M,
                "config": " ".join(f"{r.config[k]}" for k in keys) if r.config else "-",
                "time_us": round(r.time_us, 2) if r.time_us else None,
                "default_us": round(r.default_time_us, 2) if r.default_time_us else None,
                "speedup": round(r.speedup, 3) if r.speedup else None,
                "trials": r.trials,
                "numerics": r.numerics.get("status", "-"),
            })
    return pd.DataFrame(rows)
