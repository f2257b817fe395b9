"""One tuning run, whatever the kernel: plan, measure, search, emit.

The kernel commands (gemm, moe, mla) only differ in how they turn a model into
problems; everything after that is here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from optuna.storages import BaseStorage

from tuner.commands.run_plan import (  # noqa: F401 - a run's options and plan, imported from here too
    RunOptions,
    default_storage,
    engine_reading_notes,
    kernel_origin_text,
    plan_text,
    planned_files,
    traffic_plan_lines,
)
from tuner.emit.results import MANIFEST, manifest_entry, read_manifest, update_manifest, write_tables
from tuner.errors import TunerError
from tuner.measure.environment import now_iso, software_versions
from tuner.measure.landscape import Landscape, LandscapeWriter, landscape_source
from tuner.measure.measurers import Measurer, RecordingMeasurer, ReplayMeasurer
from tuner.measure.policy import check_replay_policy, replay_policy
from tuner.paths import atomic_write_json, remove_stale_temporaries
from tuner.plan.engines import ENGINES, lookup_nearest
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import KernelSpec, config_tuple
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace
from tuner.progress import Progress
from tuner.search.runner import SearchSettings, StudyResult, StudyRunner, identity_differences, study_name
from tuner.search.storage import journal_path, sync_storage
from tuner.search.storage_checks import (  # noqa: F401 (the names callers know from here)
    check_journal_file,
    check_sqlite_file,
    check_storage_url,
    open_checked_storage,
)
from tuner.search.warm_start import WarmPool, incumbent, installed_rows, study_seeds

log = logging.getLogger("tuner")


# -- seeds from shipped tables ----------------------------------------------------------
def load_baseline_table(baseline_dir: str, kernel: KernelSpec, gpu: GpuSpec, problem: Problem) -> dict | None:
    """The table to beat for this problem and GPU: from an earlier run of ours (its
    manifest: the table of the same kernel, problem and engine), or the engines' shipped
    file (searched recursively; the problem's own engines' file names first)."""
    root = Path(baseline_dir)
    if (root / MANIFEST).is_file():
        manifest = read_manifest(root)
        for t in manifest.get("tables", []) if manifest.get("gpu") == gpu.key else []:
            if (t.get("kernel") == kernel.name and Problem(t["kernel"], t["problem"]).key == problem.key
                    and set(t.get("files") or {}) & set(problem.engines or ENGINES)):
                table = {m: e["config"] for m, e in t.get("entries", {}).items() if e.get("config")}
                if table:
                    return table
    # The problem's own engines' file names first (SGLang's up and _down tables, vLLM's).
    order = [e for e in problem.engines if e in ENGINES] + [e for e in ENGINES if e not in problem.engines]
    names = [ENGINES[e].table_relpath(kernel.table_kind, problem.params, gpu.cuda_name, "0.0.0")
             .rsplit("/", 1)[-1] for e in order]
    # Of one name in several triton_<version> folders, the newest first (as SGLang falls back).
    files = sorted(root.rglob("*.json"), reverse=True)
    for path in sorted((p for p in files if p.name in names), key=lambda p: names.index(p.name)):
        from tuner.reading import read_json_file
        try:
            table = read_json_file(path, "baseline table ")
        except TunerError as e:
            raise TunerError(f"{e} (not readable JSON)") from None
        if not isinstance(table, dict):
            raise TunerError(f"baseline table {path} is not a JSON object of batch sizes and configs")
        return {k: v for k, v in table.items() if k != "triton_version"}
    return None


# -- the run ----------------------------------------------------------------------------
def make_measurer(opts: RunOptions, progress: Progress) -> Measurer:
    if opts.replay:
        replay = ReplayMeasurer.from_file(opts.replay, opts.kernel, opts.device_name)
        recorded = replay.landscape.header.get("policy")
        check_replay_policy(opts.replay, recorded, opts.policy)
        opts.run_info["measurement"] = replay_policy(recorded, opts.policy)     # the times are the landscape's
        return replay
    from tuner.measure import isolation
    # Every compile and timing happens in a replaceable child process (tuner/measure/isolation.py).
    gpu_m = isolation.isolated_gpu_measurer(opts.kernel, opts.gpu.key, opts.compile_workers,
                                            opts.measure_timeout, opts.recycle_after, opts.device,
                                            policy=opts.policy or None)
    if not opts.record:
        return gpu_m
    env = gpu_m.environment()
    header = {"format": "tuner-landscape/1", "kernel": opts.kernel.name, **landscape_source(opts.kernel),
              "device": env["device"], **({"device_kind": "cpu"} if opts.device == "cpu" else {}),
              "triton": env.get("triton"), "torch": env.get("torch"), "cuda": env.get("cuda"),
              "driver": env.get("driver"), "space": opts.space.version, "recorded": now_iso(),
              **({"policy": env["policy"]} if env.get("policy") else {})}
    writer = LandscapeWriter(opts.record, opts.kernel, header)
    land = Landscape(header, opts.kernel, str(opts.record))
    grid = lambda p, m: opts.space.configs(p.params, m, opts.gpu)  # noqa: E731
    return RecordingMeasurer(gpu_m, writer, land, grid, progress=progress.note)


def open_run_storage(opts: RunOptions) -> BaseStorage:
    return open_checked_storage(opts.storage or default_storage(opts.out_dir))


def run_tuning(opts: RunOptions) -> dict[str, list[StudyResult]]:
    """Tune every (problem, M) (here, or in one worker process per GPU), then write the
    tables and the manifest from what the storage holds; returns the results."""
    progress = Progress(len(opts.problems) * len(opts.batch_sizes), enabled=not opts.quiet, unit=time_unit(opts))
    t0 = time.monotonic()
    # Every input is checked before the first write: the shipped tables to beat, the landscape.
    check_baselines(opts)
    # What a killed run's atomic writes left (those no live writer holds: tuner/paths.py).
    remove_stale_temporaries(opts.out_dir)
    # A storage that is there already may hold another plan: refused before anything is written
    # (a --record landscape, the storage itself).
    storage = open_run_storage(opts) if storage_exists(opts) else None
    if storage is not None:
        check_plan(storage, opts)
    if len(opts.gpus) > 1 and not opts.replay:
        from tuner.search.identity import CPU_DEVICE, GPU
        opts.times = CPU_DEVICE if opts.device == "cpu" else GPU
        storage = storage or open_run_storage(opts)
        save_plan(storage, opts)
        _say_notes(opts, progress)
        run_gpu_workers(opts, progress)
    else:
        measurer = make_measurer(opts, progress)    # checks a landscape before anything is written
        from tuner.search.identity import times_of
        opts.times = times_of(measurer)
        try:
            if isinstance(measurer, ReplayMeasurer):
                opts.problems, opts.plan_ms = _replay_coverage(opts, measurer, progress)
                progress.total = max(1, sum(len(v) for v in opts.plan_ms.values()))
            storage = storage or open_run_storage(opts)
            save_plan(storage, opts)
            _say_notes(opts, progress)
            tune_all(opts, storage, measurer, progress,
                     after_study=lambda: collect(opts, storage, quiet=True))
        finally:
            measurer.close()
    results = collect(opts, storage)
    progress.note(f"done in {time.monotonic() - t0:.0f}s; tables and manifest in {opts.out_dir}/")
    return results


def _say_notes(opts: RunOptions, progress: Progress) -> None:
    """The run's own lines (the deployment its --tp is for), said once it has passed every check:
    a refusal stays one line."""
    for line in opts.notes:
        progress.note(f"tuner: {line}")


def tune_all(opts: RunOptions, storage: BaseStorage, measurer: Measurer, progress: Progress,
             after_study: Callable[[], object] | None = None) -> None:
    """Run every study of the plan against one measurer. Several processes may do this at
    once on one storage (workers): they share the studies."""
    runner = StudyRunner(opts.kernel, opts.space, opts.gpu, measurer, storage, opts.settings,
                         on_trial=lambda **kw: progress.trial(kw["done"], kw["budget"], kw["best"]),
                         prefix=opts.prefix, policy=opts.policy)
    # A run started again shows the studies it finished before as stored, and says so.
    finished = {(p.key, M) for p in opts.problems for M in opts.ms_for(p)
                if stored_result(storage, opts, p, M) is not None}
    if finished:
        total = sum(len(opts.ms_for(p)) for p in opts.problems)
        progress.note(f"resuming from {opts.storage or default_storage(opts.out_dir)}: {len(finished)} of {total} "
                      "studies finished before; their stored results are shown, not run again")
    for problem in opts.problems:
        baseline = load_baseline_table(opts.baseline, opts.kernel, opts.gpu, problem) if opts.baseline else None
        # the row a tuned config must beat: --baseline's, else the table the engine reads today
        installed = baseline or installed_rows(opts.warm, opts.kernel.name, problem.params, opts.gpu,
                                               problem.engines[0] if len(problem.engines) == 1 else "")
        done: list[int] = []
        for M in sorted(opts.ms_for(problem)):
            tied_config = None
            if problem.tied_to:
                tied = wait_for_result(storage, opts, by_key(opts)[problem.tied_to], M)
                if not tied or not tied.get("config"):
                    continue            # nothing to tie to at this M: left out of both tables
                tied_config = tied["config"]
            progress.start_study(f"{_label(problem)} M={M}")
            default = table_default(opts.kernel, problem, M, tied_config)
            seeds = [("default", default)]
            seeds += [("default", c) for c in opts.kernel.extra_seeds(problem.params, M)]
            if baseline:
                seeds.append(("baseline", lookup_nearest(baseline, M)))
            # warm seeds: known configs (--warm-start, shipped tables) and the batch sizes done, closest first
            seeds += study_seeds(opts.warm, opts.kernel, problem.params, M, opts.gpu,
                                 opts.settings.budget_for(problem, M), {m: runner.measured(problem, m) for m in done})
            # a tied table searches its shared keys freely too: both tables choose them together below
            r = runner.tune(problem, M, seeds, None, default, incumbent(opts.kernel, installed, M))
            if problem.tied_to and not r.tied:
                r = choose_tied(opts, runner, measurer, problem, M) or r
            done.append(M)
            progress.end_study(_summary(r, time_unit(opts)))
            sync_storage(storage)       # a finished study is on the disk (a journal syncs at most each second)
            if after_study:
                after_study()           # the tables as far as they go: a stopped run keeps them


def choose_tied(opts: RunOptions, runner: StudyRunner, measurer: Measurer, problem: Problem, M: int) -> StudyResult | None:
    """Choose the keys a tied table shares with the table it is tied to (SGLang's `_down`
    table and its up table share BLOCK_SIZE_M) for both together, once both studies are done:
    the candidate pairs are the best up config for each shared value with each down config
    measured with that value, ranked by the sum of the two times; the best few are timed again
    as the engine runs the two together, where the kernel can (`tied_params`: for SGLang the
    whole layer, whose up GEMM stores in sorted order before a TMA down GEMM), else ranked by
    the sum. Both studies are then concluded on the winning pair (numerics checked); returns
    the tied table's result (None when the studies measured no pair)."""
    from tuner.plan.kernel_api import config_dict
    kernel, keys = opts.kernel, problem.tied_keys
    if problem.tied_to is None:
        return None
    up = by_key(opts)[problem.tied_to]

    def shared(cfg: dict) -> tuple:
        return tuple(cfg[k] for k in keys)

    def timed(p: Problem) -> list[tuple[float, dict]]:
        # by time alone: two configs of the same time must not be compared (dicts do not order)
        return sorted(((t, config_dict(kernel, c)) for c, t in runner.measured(p, M).items() if t is not None),
                      key=lambda tc: tc[0])
    best_up: dict[tuple, tuple[float, dict]] = {}
    ups = timed(up)
    for t, c in ups:
        best_up.setdefault(shared(c), (t, c))
    pairs = sorted(((best_up[shared(d)][0] + t, best_up[shared(d)][1], d) for t, d in timed(problem)
                    if shared(d) in best_up), key=lambda p: p[0])          # ranked by the sum
    if not pairs:
        return None
    candidates = pairs[: max(1, opts.settings.top_k)]
    together: list[float | None] = [None] * len(candidates)
    if kernel.tied_params is not None:
        for i, (_, u, d) in enumerate(candidates):
            pair = Problem(kernel.name, kernel.tied_params(problem.params, u), problem.layers, problem.engines)
            together[i] = measurer.measure(pair, M, [d])[0].time_us
    timed_together = all(t is not None for t in together)
    ranking = [t if timed_together and t is not None else s_ for t, (s_, _, _) in zip(together, candidates)]
    order = sorted(range(len(candidates)), key=lambda i: ranking[i])
    _, u_cfg, d_cfg = candidates[order[0]]
    info = {"keys": {k: u_cfg[k] for k in keys}, "timed_together": timed_together,
            "candidates": [{"up": u, "down": d, "sum_us": round(s_, 3),
                            "together_us": None if t is None else round(t, 3)}
                           for (s_, u, d), t in zip(candidates, together)], "chosen": order[0]}

    def in_line(first: dict, ranked: list[tuple[float, dict]]) -> list[dict]:
        rest = [c for _, c in ranked if shared(c) == shared(first) and c != first]
        return [first] + rest[: opts.settings.top_k - 1]
    u_result = stored_result(runner.storage, opts, up, M) or {}
    info["up_alone"] = {k: (u_result.get("config") or {}).get(k) for k in keys}    # what the up study chose by itself
    if u_result.get("config") != u_cfg:
        u_now = runner.conclude(up, M, in_line(u_cfg, ups), kernel.default_config(up.params, M), shared=keys)
        u_cfg = u_now.config or u_cfg
    default = table_default(kernel, problem, M, u_cfg)
    return runner.conclude(problem, M, in_line(d_cfg, timed(problem)), default, info, shared=keys)


def table_default(kernel: KernelSpec, problem: Problem, M: int, tied_config: dict | None) -> dict:
    """What the engine runs at M without this table: for a table tied to another (SGLang's
    `_down` table, tied to its up table), the config of that table (SGLang runs the down GEMM
    with the up config when it has no `_down` table); else the kernel's default config. The
    one notion of a table's default, for tuning and for drift alike."""
    from tuner.plan.kernel_api import config_from_entry
    if tied_config:
        return config_from_entry(kernel, tied_config)
    return kernel.default_config(problem.params, M)


def by_key(opts: RunOptions) -> dict[str, Problem]:
    return {p.key: p for p in opts.problems}


def stored_result(storage: BaseStorage, opts: RunOptions, problem: Problem, M: int) -> dict | None:
    import optuna
    try:
        study = optuna.load_study(study_name=study_name(problem, M, opts.prefix, opts.kernel.source),
                                  storage=storage)
    except KeyError:
        return None
    result = study.user_attrs.get("result")
    if result is not None:
        result = {**result, "environment": study.user_attrs.get("environment", {}),
                  "measured_by": study.user_attrs.get("measured_by"), "identity": study.user_attrs.get("identity")}
    return result


def wait_for_result(storage: BaseStorage, opts: RunOptions, problem: Problem, M: int, poll_s: float = 2.0) -> dict | None:
    """The finished result of a study another worker may still be running."""
    while True:
        r = stored_result(storage, opts, problem, M)
        if r is not None or M not in opts.ms_for(problem):
            return r
        time.sleep(poll_s)


def collect(opts: RunOptions, storage: BaseStorage, quiet: bool = False, wait: bool = False) -> dict[str, list[StudyResult]]:
    """Write the tables and the manifest from the studies' stored results (tuner collect,
    and the end of every run). Batch sizes whose study has not finished are left out."""
    results: dict[str, list[StudyResult]] = {}
    envs, labels, identities = [], set(), []
    missing = 0
    for problem in opts.problems:
        rs = []
        for M in sorted(opts.ms_for(problem)):
            d = wait_for_result(storage, opts, problem, M) if wait else stored_result(storage, opts, problem, M)
            if d is None:
                missing += 1
                continue
            envs.append(d.pop("environment"))
            labels.add(d.pop("measured_by") or "")
            identities.append(d.pop("identity"))
            rs.append(StudyRunner.result_from_dict(problem, M, d))
        if rs:
            results[problem.key] = rs
    env: dict = next((e for e in envs if e), {})
    run_info = {**opts.run_info, "gpu": opts.gpu.key, "measured_by": ", ".join(sorted(x for x in labels if x)),
                "environment": env, "identity": next((i for i in identities if i), None),
                "search": {"sampler": opts.settings.sampler, "budget": opts.settings.budget,
                           "patience": opts.settings.patience, "space": opts.space.source,
                           **({"budgets": opts.settings.budgets} if opts.settings.budgets else {})}}
    from tuner.search.warm_start import summary
    run_info["warm_start"] = summary(opts.warm, ((r.search or {}).get("seeds") or {} for rs in results.values() for r in rs))
    earlier = _searched_otherwise(opts, results)
    if earlier:
        run_info["search"]["earlier_runs"] = earlier
        if not quiet:
            log.warning("%s", "; ".join(f"{e['studies']} studies were finished by an earlier run searching with "
                                        f"--trials {e['budget']} --sampler {e['sampler']}" for e in earlier)
                        + f": kept as they are (this run: --trials {opts.settings.budget} --sampler "
                        f"{opts.settings.sampler}); give another --out to tune them again with this run's")
    if opts.traffic is not None and opts.kernel.emit_table is None:
        results = _prefer_defaults(opts, results)
    done = [p for p in opts.problems if p.key in results]
    if opts.kernel.emit_table is not None:
        if done:
            _emit_own_format(opts, done, results, run_info)
    else:
        from tuner.emit.run_findings import RunFindings
        keys = by_key(opts)
        findings = None if quiet else RunFindings({m for p in opts.problems for m in opts.ms_for(p)})
        for problem in done:
            # Tables tied together are written together, over the batch sizes both have.
            if problem.tied_to or any(q.tied_to == problem.key for q in opts.problems):
                if not problem.tied_to or problem.tied_to not in results:
                    continue
                group = [keys[problem.tied_to], problem]
            else:
                group = [problem]
            _emit(opts, group, [results[p.key] for p in group], env, run_info, findings)
        for line in findings.lines() if findings is not None else []:
            log.warning("%s", line)
    if missing and not quiet:
        log.warning("%d studies have no result yet; their batch sizes are left out", missing)
    return results


def _searched_otherwise(opts: RunOptions, results: dict[str, list[StudyResult]]) -> list[dict]:
    """The studies of these results searched (by an earlier run into the same storage) with
    another budget or sampler than this run's, counted by those settings: the manifest says
    so, so that it never claims a budget its studies did not have."""
    by: dict[tuple, int] = {}
    for rs in results.values():
        for r in rs:
            s = r.search or {}
            budget = opts.settings.budget_for(r.problem, r.M)
            if s and (s.get("budget") != budget or s.get("sampler") != opts.settings.sampler):
                key = (s.get("budget"), s.get("sampler"))
                by[key] = by.get(key, 0) + 1
    return [{"budget": b, "sampler": s, "studies": n} for (b, s), n in sorted(by.items(), key=str)]


def _prefer_defaults(opts: RunOptions, results: dict[str, list[StudyResult]]) -> dict[str, list[StudyResult]]:
    """Traffic-keyed tables: the default where the tuned config does not beat it (each table
    alone, or SGLang's up table with the `_down` table tied to it: results.prefer_defaults)."""
    from tuner.emit.results import prefer_defaults
    out = dict(results)
    for p in opts.problems:
        if p.tied_to or p.key not in results:
            continue
        group = [p] + [q for q in opts.problems if q.tied_to == p.key and q.key in results]
        for q, rs in zip(group, prefer_defaults(opts.kernel, group, [results[q.key] for q in group])):
            out[q.key] = rs
    return out


# -- plans in the storage, and workers -------------------------------------------------
PLAN_FORMAT = "tuner-plan/1"


def plan_study_name(prefix: str, kernel_name: str, source: str = "ours") -> str:
    return f"{prefix}tuner-plan:{kernel_name}" + ("" if source == "ours" else f"@{source}")


def save_plan(storage: BaseStorage, opts: RunOptions) -> None:
    """Store what to tune beside the studies, so `tuner worker` and `tuner collect` need
    only the storage URL and the study prefix."""
    import optuna
    check_plan(storage, opts)          # read first, write after: another plan is refused unwritten
    study = optuna.create_study(study_name=plan_study_name(opts.prefix, opts.kernel.name, opts.kernel.source),
                                storage=storage, load_if_exists=True)
    identity = plan_identity(opts)
    study.set_user_attr("plan", {
        "identity": identity,
        "format": PLAN_FORMAT, "kernel": opts.kernel.name, "kernel_ref": opts.kernel.ref, "gpu": opts.gpu.key,
        "problems": [{"params": p.params, "layers": list(p.layers), "engines": list(p.engines),
                      "tied_to": p.tied_to, "tied_keys": list(p.tied_keys)} for p in opts.problems],
        "batch_sizes": {p.key: sorted(opts.ms_for(p)) for p in opts.problems},
        "settings": dataclasses.asdict(opts.settings),
        "space": {"choices": opts.space.choices, "constraints": opts.space.constraints,
                  "source": opts.space.source},
        "engines": opts.engines, "baseline": opts.baseline, "run_info": opts.run_info,
        **({"warm": opts.warm.as_dict()} if opts.warm else {}),
    })


def storage_exists(opts: RunOptions) -> bool:
    """Whether the run's storage holds anything yet: its file is there (a journal, SQLite), or
    it is a database server's."""
    url = opts.storage or default_storage(opts.out_dir)
    local = journal_path(url) or (Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None)
    return local is None or (local.is_file() and local.stat().st_size > 0)


def check_plan(storage: BaseStorage, opts: RunOptions) -> None:
    """Reading only: a plan of the same name in the storage must be this run's (the same
    device, kernel, code and space), else one line and nothing written to the storage
    (create_study(load_if_exists) would append a create operation before it loads)."""
    import optuna
    name = plan_study_name(opts.prefix, opts.kernel.name, opts.kernel.source)
    if name not in optuna.get_all_study_names(storage):
        return
    stored = optuna.load_study(study_name=name, storage=storage).user_attrs.get("plan") or {}
    what = identity_differences(stored.get("identity") or {}, plan_identity(opts))
    if what:
        raise TunerError(f"the storage already holds a plan ({name}) for another {what}; its studies "
                         "are not this run's: give another --out (or --storage, or --study-prefix)")


def plan_identity(opts: RunOptions) -> dict:
    """What a plan's studies will be timed on, as far as it is known before measuring
    (tuner/search/identity.py); a replay's policy is the landscape's, so only its routing is known."""
    from tuner.search.identity import plan_identity as identity
    policy = opts.policy if not opts.replay else {"routing": opts.policy.get("routing")}
    return identity(opts.device_name, opts.kernel, opts.space, opts.times, policy)


def load_plans(store: BaseStorage, prefix: str, out_dir: Path | None = None, load_code: bool = False,
               engine_source: list[str] | None = None, **overrides) -> list[RunOptions]:
    """The plans stored under a prefix, as run options; `overrides` set options the plan
    leaves to each worker (replay file, storage URL, compile workers...). load_code: an
    engine kernel's code is needed (a worker measuring on a GPU); it is read from
    `engine_source` when given (another machine's paths mean nothing here), else from where
    the plan's machine read it, the installed engine, or $TUNER_ENGINE_WHEELS."""
    import optuna

    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel

    names = [n for n in optuna.get_all_study_names(store) if n.startswith(plan_study_name(prefix, ""))]
    plans = []
    for name in sorted(names):
        plan = optuna.load_study(study_name=name, storage=store).user_attrs.get("plan")
        if not plan or plan.get("format") != PLAN_FORMAT:
            continue
        ref = dict(plan.get("kernel_ref") or {"name": plan["kernel"]})
        if ref.get("source", "ours") != "ours" and (engine_source or not Path(ref.get("origin") or "").exists()):
            from tuner.plan.kernel_sources import origin_for
            ref["origin"] = origin_for(ref["source"], engine_source)
        kernel = get_kernel(**ref, load_code=load_code)
        space = SearchSpace(kernel, {k: list(v) for k, v in plan["space"]["choices"].items()},
                            plan["space"]["constraints"], plan["space"]["source"])
        problems = [Problem(kernel.name, d["params"], tuple(d["layers"]), tuple(d["engines"]),
                            d.get("tied_to"), tuple(d.get("tied_keys", ()))) for d in plan["problems"]]
        opts = RunOptions(kernel=kernel, space=space, gpu=get_gpu(plan["gpu"]), problems=problems,
                          batch_sizes=sorted({m for ms in plan["batch_sizes"].values() for m in ms}),
                          settings=SearchSettings(**plan["settings"]), out_dir=out_dir or Path("."),
                          engines=plan["engines"], baseline=plan["baseline"], run_info=plan["run_info"],
                          prefix=prefix, plan_ms=plan["batch_sizes"],
                          warm=WarmPool.from_dict(plan["warm"]) if plan.get("warm") else None)
        if (plan.get("run_info") or {}).get("traffic"):
            from tuner.plan.traffic import TrafficProfile
            opts.traffic = TrafficProfile.from_manifest(plan["run_info"]["traffic"], "the stored plan")
        for k, v in overrides.items():
            setattr(opts, k, v)
        if (plan.get("run_info") or {}).get("routing"):
            from tuner.plan.routing import use_stored
            use_stored(opts.out_dir / "routing")       # the recorded routing's ids (tuner/plan/routing.py)
        plans.append(opts)
    if not plans:
        raise TunerError(f"the storage holds no tuning plan under the study prefix {prefix!r}; "
                         "start one with `tuner gemm|moe|mla ... --storage URL --study-prefix NAME`")
    return plans


def run_gpu_workers(opts: RunOptions, progress: Progress) -> None:
    """One `tuner worker` process per GPU, all on the run's storage; wait for them."""
    url = opts.storage or default_storage(opts.out_dir)
    procs = []
    for gpu in opts.gpus:
        cmd = [sys.executable, "-m", "tuner", "worker", "--storage", url, "--study-prefix", opts.prefix,
               "--device", opts.device, "--compile-workers", str(max(1, opts.compile_workers // len(opts.gpus))),
               "--measure-timeout", str(int(opts.measure_timeout)), "--recycle-after", str(opts.recycle_after),
               "--quiet"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        procs.append(subprocess.Popen(cmd, env=env))
        progress.note(f"worker on GPU {gpu}: pid {procs[-1].pid}")
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        progress.note(f"{len(failed)} of {len(procs)} workers failed; the studies they left are finished by the rest "
                      "or by running the command again")


def _label(problem: Problem) -> str:
    return problem.key + (f" [{', '.join(problem.engines)}]" if len(problem.engines) == 1 else "")


def _emit_own_format(opts: RunOptions, done: list[Problem], all_results: dict, run_info: dict) -> None:
    """Kernels that no engine reads tables for write their own files (rewritten as each
    problem finishes, so a stopped run keeps what it has)."""
    pairs = [(p, all_results[p.key]) for p in done]
    emit = opts.kernel.emit_table
    if emit is None:                # only called for own-format kernels (see tune_run)
        return
    tables, file_of = emit(pairs, opts.gpu.cuda_name)
    for rel, obj in tables.items():
        atomic_write_json(opts.out_dir / rel, obj, root=opts.out_dir)
    entries = [manifest_entry(opts.kernel, p, results, {"tuner": file_of[p.key]} if p.key in file_of else {},
                              run_info) for p, results in pairs]
    update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k not in ("environment", "identity")}, entries)


def _emit(opts: RunOptions, group: list[Problem], group_results: list[list[StudyResult]], env: dict,
          run_info: dict, findings=None) -> None:
    if len(group) > 1:
        common = set.intersection(*({r.M for r in rs if r.config} for rs in group_results))
        # tied tables are written together where they agree on the keys they share (a tied
        # study not chosen with its partner yet, e.g. still running elsewhere, waits)
        keys = next((p.tied_keys for p in group if p.tied_to), ())
        by_m = [{r.M: r.config for r in rs if r.config} for rs in group_results]
        common = {m for m in common if len({tuple(c[m][k] for k in keys) for c in by_m}) == 1}
        group_results = [[r for r in rs if r.M in common] for rs in group_results]
    triton_version = env.get("triton") or software_versions()["triton"]
    entries = []
    copies = _copied_tied_tables(opts.kernel, group, group_results)
    for problem, results in zip(group, group_results):
        engines = [] if problem.key in copies else opts.engines
        files = write_tables(opts.out_dir, opts.kernel, problem, results, opts.gpu.cuda_name, triton_version, engines)
        entry = manifest_entry(opts.kernel, problem, results, files, run_info)
        if problem.key in copies:
            entry["not_written"] = copies[problem.key]
        entries.append(entry)
        _audit_emitted(opts, problem, files, findings)
    update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k not in ("environment", "identity")}, entries)


def _copied_tied_tables(kernel: KernelSpec, group: list[Problem], group_results: list[list[StudyResult]]) -> dict:
    """{problem key: why} of the tied tables (SGLang's `_down`) that came out the same as the
    table they are tied to at every M: not written, since the engine then reuses that table
    anyway, and `tuner audit` flags such a file as a copy that was never tuned."""
    from tuner.plan.kernel_api import table_entry
    tables = {p.key: {r.M: table_entry(kernel, r.config) for r in rs if r.config is not None}
              for p, rs in zip(group, group_results)}
    return {p.key: f"the same configs as {p.tied_to} at every M: the engine reuses that table for it without a file"
            for p in group if p.tied_to and tables.get(p.key) and tables[p.key] == tables.get(p.tied_to)}


def _audit_emitted(opts: RunOptions, problem: Problem, files: dict[str, str], findings=None) -> None:
    """`tuner audit`'s table checks on each table just written, over the batch sizes up to the
    largest tuned: a tuned table should pass them; where it cannot (too few batch sizes tuned,
    studies without a result) the run says so, naming the batch sizes that snap far. Tables
    written while the run goes on (warn=False) are partial by design: only the loader's
    reading of them is checked, and the findings are said once, for the final tables (gathered
    into `findings`, a tuner.emit.run_findings.RunFindings)."""
    from tuner.emit.audit import Batches, named_table_findings
    from tuner.plan.engines import load_table, table_family
    batches = Batches(max(opts.batch_sizes))
    for engine, rel in files.items():
        family = table_family(engine, opts.kernel.table_kind)
        from tuner.reading import read_bytes
        table, crash = load_table(family, read_bytes(opts.out_dir / rel, "table "))
        if findings is not None and table is not None:
            for f in named_table_findings(family, Path(rel).name, table, rel, batches):
                findings.add(rel, f, table)
        if crash:
            raise TunerError(f"{rel} was written but {engine}'s loader would not read it ({crash}): a bug, please report")


def _replay_coverage(opts: RunOptions, measurer: ReplayMeasurer, progress: Progress):
    covered, plan_ms = [], {}
    serving = _traffic_shares(opts)
    for p in opts.problems:
        ms = [m for m in opts.batch_sizes if measurer.covers(p, m)]
        missing = [m for m in opts.batch_sizes if m not in ms]
        lost = [m for m in missing if serving.get(m, 0.0) > 0]
        if lost and ms:
            # the profile's keys where the traffic is: tuning without them keys the table far away
            share = sum(serving[m] for m in lost)
            raise TunerError(f"landscape {opts.replay} lacks M={','.join(map(str, lost))} of {p.key}, the keys that "
                             f"serve {share:.1%} of the traffic profile's passes: record them (--record), or give "
                             f"--batch-sizes the landscape holds (M={','.join(map(str, ms))})")
        if not ms:
            progress.note(f"skip {p.key}: the landscape has no timings for it")
            continue
        if missing:
            progress.note(f"{p.key}: the landscape lacks M={','.join(map(str, missing))}; tuning M={','.join(map(str, ms))}")
        covered.append(p)
        plan_ms[p.key] = ms
    if not covered:
        raise TunerError(f"landscape {opts.replay} covers none of the planned problems and batch sizes")
    # Its points must be configs of the search space (or the seeds), or nothing can be chosen.
    usable = False
    for p in covered:
        for m in plan_ms[p.key]:
            points = measurer.candidates(p, m) or set()
            space = {config_tuple(opts.kernel, c) for c in opts.space.configs(p.params, m, opts.gpu)}
            seeds = {config_tuple(opts.kernel, opts.space.canonical(p.params, m, opts.gpu, c)) for c in
                     [opts.kernel.default_config(p.params, m), *opts.kernel.extra_seeds(p.params, m)]}
            if points & (space | seeds):
                usable = True
                break
        if usable:
            break
    if not usable:
        raise TunerError(f"landscape {opts.replay} holds no config of the search space "
                         f"({opts.space.source}) nor the default: recorded with another space or kernel?")
    return covered, plan_ms


def _traffic_shares(opts: RunOptions) -> dict[int, float]:
    """{key: its share of the traffic's passes} of the run's batch sizes ({} without --traffic)."""
    if opts.traffic is None:
        return {}
    from tuner.plan.traffic import key_coverage
    return {c.key: c.share for c in key_coverage(sorted(opts.batch_sizes), opts.traffic)}


def check_baselines(opts: RunOptions) -> None:
    """--baseline's tables, read and checked before anything is written."""
    if not opts.baseline:
        return
    from tuner.plan.kernel_api import checked_config, table_batch_size
    for problem in opts.problems:
        table = load_baseline_table(opts.baseline, opts.kernel, opts.gpu, problem)
        for key, entry in (table or {}).items():
            where = f"--baseline {opts.baseline}: the table for {problem.key} has an unusable entry {str(key)[:40]!r}"
            table_batch_size(key, where)
            checked_config(opts.kernel, entry, where)


def time_unit(opts: RunOptions) -> str:
    """How a time of this run is shown: microseconds, and where they were not taken on a GPU, so."""
    if opts.replay:
        from tuner.measure.landscape import read_header
        from tuner.measure.provenance import is_cpu_device
        try:
            header = read_header(opts.replay)
        except TunerError:
            return "us"
        return "us (SYNTHETIC)" if header.get("synthetic") else "us (CPU device)" if is_cpu_device(header) else "us"
    return "us (CPU device)" if opts.device == "cpu" else "us"


def _summary(r: StudyResult, unit: str = "us") -> str:
    if r.resumed:
        return "stored: " + _summary(dataclasses.replace(r, resumed=False), unit)
    if r.config is None:
        why = r.numerics.get('detail', r.stopped)
        return f"no config ({why}; first failure: {r.first_failure})" if r.timed_nothing and r.first_failure \
            else f"no config ({why})"
    sp = f", {r.speedup:.2f}x default" if r.speedup else ""
    return f"{r.time_us:.2f} {unit}{sp} after {r.trials} trials ({r.stopped})"
