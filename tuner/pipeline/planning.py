"""A tuning request resolved into plans (tuner/pipeline/run_plan.py): the model, GPU and search
settings loaded, the deployment's --tp, the model's problems on one GPU, a traffic profile's
keys and budgets, a recorded routing, each engine's kernel and its space, the warm-start
pool, the output folder and storage checked. Everything that can refuse is asked here, before
the first write. Light at import: `tuner --help` loads the commands that import it."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tuner.errors import TunerError
from tuner.pipeline.request import DEFAULT_TRIALS, DTYPES, KERNEL_OF, TuneRequest
from tuner.plan.engines import ENGINE_NAMES

if TYPE_CHECKING:
    from tuner.pipeline.run_plan import RunPlan

log = logging.getLogger("tuner")


def plan_runs(req: TuneRequest, say: Callable[[str], None] = print) -> list[RunPlan]:
    """The request resolved into one plan per kernel that times some of the tables (each
    engine's own, or ours), every input checked before anything is written; `req` (the
    pipeline's own copy) gets the defaults it left open (batch sizes, dtype, --tp, a recorded
    routing's name, a synthetic landscape). A dry run's notes are said here."""
    from tuner.pipeline.run_plan import RunPlan
    from tuner.plan.space import load_space

    keys_given = req.batch_sizes is not None
    model, gpu, settings = load_common(req)
    parallel = deployment_tp(req, model, gpu)                       # the deployment, before its shapes
    routing, recorded = recorded_routing(req, model)                # --routing FILE: read and checked first
    problems = only_problems(problems_of(req, model), req.only)      # a bad --tp/--ep/--only is said first
    profile = traffic_keys(req, settings, keys_given) if req.traffic else None
    if not req.dry_run and not req.replay and not req.synthetic:
        # the first thing a run without a GPU is told (before the engines' code or --out)
        from tuner.measure.device import require
        # only what works here (issue 41): --device cpu at a served model's shapes times no config in minutes
        require(req.device, gpu, "tuning", "try --dry-run, --synthetic or docs/cpu-device-and-proof.md")
    if parallel.line and req.dry_run:
        say(parallel.line)              # the plan's first line: the deployment it is for, when not --tp's
    if not req.dry_run:
        # before anything is written: a folder we may write, a storage that is ours
        from tuner.pipeline.run_plan import default_storage
        from tuner.search.storage_checks import check_storage_url
        out = out_dir(req, model.name, gpu.key)
        check_out_dir(out, req, gpu.key, model.name)
        check_storage_url(req.storage or default_storage(out))
    else:
        # a dry run writes and opens nothing, but refuses what the run would: an --out it cannot
        # write (a file, another program's folder), a storage not ours, no driver
        check_out_dir(out_dir(req, model.name, gpu.key), req, gpu.key, model.name)
        if req.storage:
            from tuner.search.storage_checks import check_storage_driver, check_storage_url
            check_storage_url(req.storage)
            check_storage_driver(req.storage)
    synthetic_landscape = None
    if req.synthetic:
        landscape_path = out_dir(req, model.name, gpu.key) / f"synthetic-{KERNEL_OF[req.command]}.jsonl.gz"
        from tuner.measure.synthetic import check_replaceable
        check_replaceable(landscape_path, "the run's landscape")     # refused before anything is said (a dry run too)
        if not req.dry_run:         # replayed from where it will be made, once every check has passed (below)
            synthetic_landscape = landscape_path
            req.replay = str(synthetic_landscape)
    notes: list[str] = []
    runs = kernel_runs(req, KERNEL_OF[req.command], problems, notes)
    from tuner.measure.policy import MeasurementPolicy
    policy = MeasurementPolicy(req.timing, req.l2, routing=req.routing if req.command == "moe" else None)
    plans = []
    for kernel, problems in runs:
        from tuner.pipeline.warm_sources import build_pool
        space = load_space(kernel, req.space, problems)
        # the engine's own shipped tables for its kernel's tables (both engines' for ours)
        warm = build_pool(kernel, problems, gpu, req.warm_start, not req.no_warm_start,
                          [kernel.source] if kernel.source in ENGINE_NAMES else req.engines, req.engine_source, model)
        plans.append(RunPlan(
            request=req, kernel=kernel, space=space, gpu=gpu, problems=problems,
            batch_sizes=sorted(set(req.batch_sizes or [])),
            settings=sized(req, settings, space, problems, gpu) if req.trials is None and not req.traffic else settings,
            out_dir=out_dir(req, model.name, gpu.key), record=record_path(req.record, kernel, len(runs) > 1),
            # counting GPUs imports torch (1.4 s): only where a run will measure on them
            gpus=gpu_list(req.gpus, req.device) if req.gpus is not None or not (req.dry_run or req.replay) else [],
            warm=warm,
            run_info={"model": model.name, "model_source": model.source, "tp": req.tp, "ep": req.ep,
                      "dtype": req.dtype, **precision_info(req, model),
                      **({"traffic": profile.as_manifest()} if profile else {}),
                      "measurement": policy.as_dict(), **({"routing": routing} if routing else {})},
            traffic=profile,
        ))
    for opts in plans:
        if opts.record:          # the landscape a recording replaces at the end: only a landscape (file_kinds.py)
            from tuner.file_kinds import LANDSCAPE
            from tuner.paths import check_output
            check_output(Path(opts.record), LANDSCAPE, "--record")
    if not req.dry_run and (synthetic_landscape is not None or recorded is not None):
        # a stored plan for another routing (or device, kernel, space) is refused before the
        # landscape and routing file below replace an earlier run's (issue 42, item 8)
        from tuner.pipeline.stored_plans import check_plan, open_run_storage, storage_exists
        from tuner.search.identity import CPU_DEVICE, GPU, SYNTHETIC
        for opts in plans:
            # where the times will come from, known before measuring, so that a plan for other times
            # is refused here too (a replay's from its landscape's header and lines: read only for this)
            opts.times = SYNTHETIC if req.synthetic else None if req.replay else \
                CPU_DEVICE if req.device == "cpu" else GPU
            if storage_exists(opts):
                if req.replay and not req.synthetic:
                    from tuner.measure.landscape import replay_times
                    opts.times = replay_times(req.replay)
                check_plan(open_run_storage(opts), opts)
    if req.synthetic:
        # said once every input is checked: a refused run (a --warm-start with no configs, say) is its one line
        from tuner.measure.synthetic import SYNTHETIC_RUN_LINE
        say(SYNTHETIC_RUN_LINE)
    out = out_dir(req, model.name, gpu.key)
    # what planning creates below, for undo_planning (a run refused before it measures leaves none of it)
    made = [] if req.dry_run or out.exists() else [out]
    if synthetic_landscape is not None:
        if not os.path.lexists(synthetic_landscape):
            made.append(synthetic_landscape)
        # made last: a run refused above (a missing --warm-start, say) replaced no landscape of an earlier one
        from tuner.measure.synthetic import landscape_for_run
        landscape_for_run(out_dir(req, model.name, gpu.key), KERNEL_OF[req.command], str(req.kernel_source), gpu,
                          problems, req.batch_sizes or [], req.space, say=(lambda line: None) if req.quiet else say)
    if recorded is not None and not req.dry_run:
        # stored last too, where the kernel reads the ids (this run's children too): a run refused
        # above stored no routing file (issue 42, item 8)
        from tuner.plan.routing import install
        folder = out / "routing"
        made += [] if folder.exists() else [folder]
        made += [] if (folder / f"{recorded.digest}.npy").exists() else [folder / f"{recorded.digest}.npy"]
        install(recorded, folder)
    for opts in plans:
        opts.made = made
    if parallel.line and plans:
        plans[0].notes.append(parallel.line)    # a run says it with its progress, once past its checks
    if not req.dry_run and plans:
        plans[0].notes += list(dict.fromkeys(notes))     # the tables a replay's kernel does not time
    if req.dry_run:
        for line in dict.fromkeys(notes):
            say(f"note: {line}")
    return plans


def precision_info(req: TuneRequest, model) -> dict:
    """{"precision": in words} for a fused MoE of an integer precision (its blocks, K groups,
    zero points, and where they were read: tuner/plan/precision.py); {} otherwise."""
    if req.command != "moe" or req.dtype in (None, "bf16", "fp8_w8a8"):
        return {}
    from tuner.plan.precision import moe_precision
    return {"precision": moe_precision(model, req.dtype).describe()}


def undo_planning(opts: RunPlan) -> None:
    """Remove what planning created for a run refused before it measured (its landscape, the
    routing file, their folders when planning made them and they hold nothing else): a refused
    run leaves nothing. An earlier run's files were never planning's to list."""
    import contextlib
    for path in reversed(opts.made):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()                 # only when empty: anything else there is someone's
            else:
                path.unlink()


def sized(req: TuneRequest, settings, space, problems: list, gpu):
    """Without --trials, each M's budget from its pruned space (tuner/search/budget.py)."""
    from tuner.search.budget import pruned_sizes, sized_settings
    return sized_settings(settings, pruned_sizes(space, problems, sorted(set(req.batch_sizes or [])), gpu))


def deployment_tp(req: TuneRequest, model, gpu):
    """The request's tensor-parallel size (tuner/plan/deployment.py): --tp, checked to hold the
    weights, or the smallest that does; set into the request."""
    from tuner.plan.deployment import check_tp
    from tuner.plan.precision import checkpoint_dtype
    parallel = check_tp(model, gpu, req.tp, req.ep, checkpoint_dtype(model), req.per_rank)
    req.tp = parallel.tp
    return parallel


def load_common(req: TuneRequest):
    """Everything the kernel commands share: model, GPU, search settings (and the
    command's defaults filled into the request)."""
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    from tuner.search.settings import default_settings

    if req.batch_sizes is None:
        from tuner.plan.kernel_registry import batch_grid
        req.batch_sizes = batch_grid(KERNEL_OF[req.command])
    if req.dtype is not None and req.dtype not in DTYPES[req.command]:
        raise TunerError(f"--dtype {req.dtype} is not supported by `tuner {req.command}`; "
                         f"choose from {', '.join(DTYPES[req.command])}")
    if req.replay and req.record:
        raise TunerError("--replay and --record cannot be combined: one replays timings, the other takes them")
    if req.replay and not Path(req.replay).is_file():
        raise TunerError(f"landscape {req.replay} " + ("is not a regular file" if os.path.lexists(req.replay)
                                                       else "not found"))
    if req.baseline and not Path(req.baseline).is_dir():
        raise TunerError(f"--baseline {req.baseline} is not a folder")
    gpu = get_gpu(req.gpu)
    model = load_model(req.model)
    req.dtype = command_dtype(req.command, model, req.dtype)
    trials = req.trials or DEFAULT_TRIALS[req.command]
    # Batches as large as the configs compiled at once on a GPU; a replay compiles nothing.
    settings = default_settings(trials, sampler=req.sampler, seed=req.seed, patience=req.patience,
                                parallel=1 if req.replay else req.compile_workers)
    # a gain within the between-process noise of the device timed is not a gain (tuner/measure/noise.py)
    from tuner.measure.noise import GainThreshold, for_request
    settings.row_gain = GainThreshold(float(req.min_gain), for_request(req.device, gpu.cuda_name, req.replay,
                                                                      synthetic=req.synthetic))
    return model, gpu, settings


def recorded_routing(req: TuneRequest, model):
    """--routing FILE (moe): (what the manifest says of it, the recorded top-k ids), checked
    against the model; the request then names the routing as problems do
    ("recorded:<stem>@<hash>"). (None, None) for uniform and zipf."""
    from tuner.plan import routing as rt
    if not rt.is_file_routing(req.routing):
        return None, None
    recorded = rt.load_routing(req.routing)
    experts = (model.n_routed_experts or 0)
    rt.checked(recorded, int(model.num_experts_per_tok or 0), experts, f"--routing {req.routing}")
    info = {"file": str(Path(req.routing).resolve()), "name": recorded.name, "what": recorded.describe(),
            **rt.load_profile_stats(recorded, experts)}
    req.routing = recorded.name
    return info, recorded


def traffic_keys(req: TuneRequest, settings, keys_given: bool):
    """--traffic: the profile; the keys it chooses (unless --batch-sizes names them) become the
    batch sizes, and the trial budget is split over them by traffic (tuner/plan/traffic.py)."""
    from tuner.plan.traffic import choose_keys, key_coverage, load_profile, split_budget
    profile = load_profile(str(req.traffic), tp=req.tp)
    if keys_given:
        keys = sorted(set(req.batch_sizes or []))
        shares = {c.key: c.share for c in key_coverage(keys, profile)}
    else:
        plan = choose_keys(profile)
        keys, shares = plan.keys, plan.shares()
        req.batch_sizes = keys
    settings.budgets = {str(m): n for m, n in split_budget(shares, settings.budget).items()}
    return profile


def command_dtype(command: str, model, given: str | None) -> str:
    """The --dtype of a kernel command: for the fused MoE the checkpoint's own precision unless
    given (a given one that differs is warned about); gemm and mla have one each."""
    if command in ("moe", "fused_moe"):
        from tuner.plan.precision import resolve_dtype
        return resolve_dtype(model, given, DTYPES["moe"], "moe")
    return given or DTYPES["mla" if command in ("mla", "mla_decode") else "gemm"][0]


def problems_of(req: TuneRequest, model) -> list:
    """The model's problems for the command, as one GPU runs them at --tp/--ep (--tp set by
    deployment_tp by now)."""
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    tp = req.tp
    if tp is None:
        raise TunerError("internal: the tensor-parallel size was not planned")
    if req.command == "gemm":
        return gemm_problems(model, tp, req.ep)
    if req.command == "moe":
        return moe_problems(model, tp, req.ep, req.dtype or DTYPES['moe'][0], req.routing, req.engines)
    problems, skipped = mla_problems(model, tp, req.contexts or DEFAULT_CONTEXTS, req.page_size)
    if skipped and req.contexts:
        log.warning("skipping contexts beyond %s's positions: %s", model.name, skipped)
    return problems


def kernel_runs(req, kernel_name: str, problems: list, notes: list) -> list:
    """[(kernel, its problems)]: the problems each kernel times. With engine kernels a
    problem several engines read (a GEMM shape) becomes one problem per engine, each timed
    on that engine's kernel and written to that engine's table only. `req`: a TuneRequest
    or anything with its kernel_source, replay, engines, engine_source and dry_run."""
    from tuner.plan.kernel_registry import as_recorded, kernel_for, source_mode

    mode = source_mode(req.kernel_source, req.replay)
    runs: dict = {}
    left_out: set[str] = set()
    for p in problems:
        engines = [e for e in p.engines if e in req.engines] or list(p.engines)
        if mode in ENGINE_NAMES:
            # one engine's kernel (a landscape recorded on it): its tables only, never another engine's
            # rows timed on it (as --kernel-source ENGINE says), and only where --engines asks for them
            asked = [e for e in p.engines if e in req.engines]
            left_out |= {e for e in asked if e != mode}
            engines = [e for e in asked if e == mode]
        for engine in engines:
            try:
                kernel = kernel_for(kernel_name, engine, mode, req.engine_source, load_code=not req.replay,
                                    params=p.params)
            except TunerError as e:
                if not req.dry_run:
                    raise
                notes.append(str(e))
                kernel = kernel_for(kernel_name, engine, mode, req.engine_source, load_code=False, params=p.params)
            kernel = as_recorded(kernel, req.replay)
            why = kernel.refuses(p.params)
            if why:
                raise TunerError(f"--kernel-source {kernel.source}: {why}")
            if kernel.source == "ours":
                # one problem for every engine whose table ours times
                runs.setdefault(("ours", kernel.name), (kernel, []))
                if p not in runs[("ours", kernel.name)][1]:
                    runs[("ours", kernel.name)][1].append(p)
            else:
                runs.setdefault((kernel.source, kernel.name), (kernel, []))[1].append(
                    dataclasses.replace(p, engines=(engine,)))
    if req.replay and mode != "ours" and not runs:
        raise TunerError(f"landscape {req.replay} was recorded on {mode}'s kernel, which times none of "
                         f"the tables asked for (--engines {' '.join(req.engines)})")
    if req.replay and left_out and runs:
        notes.append(f"landscape {req.replay} was recorded on {mode}'s kernel: it times {mode}'s tables only; "
                     f"{' and '.join(sorted(left_out))}'s are not written (each engine's on its own kernel)")
    return list(runs.values())


def out_dir(req: TuneRequest, model_name: str, gpu_key: str) -> Path:
    """--out, else runs/COMMAND-MODEL-GPU-tpN[-epN], the GPU run's folder; a run whose times never
    come from a GPU says so in its name (-synthetic, -cpu-device) and leaves that folder alone."""
    if req.out:
        return Path(req.out)
    name = f"{req.command}-{model_name}-{gpu_key}-tp{req.tp}" + (f"-ep{req.ep}" if req.ep > 1 else "")
    return Path("runs") / (name + not_a_gpu_suffix(req))


def not_a_gpu_suffix(req: TuneRequest) -> str:
    """'-synthetic' for --synthetic or a replay of a SYNTHETIC landscape, '-cpu-device' for the
    CPU device or a replay of its landscape, '' for a GPU's times (measured or recorded)."""
    if req.synthetic:
        return "-synthetic"
    header: dict = {}
    if req.replay:
        from tuner.reading import landscape_header
        try:
            header = landscape_header(req.replay)
        except TunerError:
            header = {}          # a landscape that cannot be read is refused where it is checked
    from tuner.measure.provenance import is_cpu_device
    if header.get("synthetic"):
        return "-synthetic"
    if req.device == "cpu" and not req.replay or is_cpu_device(header):
        return "-cpu-device"
    return ""


def check_out_dir(out: Path, req: TuneRequest | None = None, gpu_key: str | None = None,
                  model_name: str | None = None) -> None:
    """Before the first write: --out must be a folder we can write, holding nothing of
    another program (a manifest.json that is not ours), nor tables of other times: another GPU's,
    or a GPU's where this run's are SYNTHETIC or the CPU device's (or the reverse), nor of another
    model. Its tables would be replaced, and the manifest would mix both
    (found by a new-user pass: --synthetic into a copy of tuned/NVIDIA_H200 replaced its measured
    rows and deleted a _down table; another model's run replaced the first's synthetic landscape
    and headed its manifest with the second model beside the first's tables)."""
    from tuner.paths import writable_folder
    MANIFEST = "manifest.json"           # tuner/emit/results.py's, named here: a dry run loads no Optuna
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    ok, existing = writable_folder(out)
    if not ok:
        raise TunerError(f"cannot write to {existing} (--out {out}): permission denied or not a folder")
    manifest = out / MANIFEST
    if os.path.lexists(manifest):
        from tuner.emit.results import manifest_problem
        from tuner.reading import read_json_file
        try:
            held = read_json_file(manifest)
            problem = manifest_problem(held)
        except TunerError as e:
            problem = f"unreadable: {e}"
        if problem:
            raise TunerError(f"--out {out} holds a {MANIFEST} that is not ours ({problem}); give another --out")
        if req is not None:
            _check_same_times(out, held, not_a_gpu_suffix(req), gpu_key)
            if model_name is not None:
                _check_same_model(out, held, model_name)


_KINDS = {"": "measured on a GPU", "-synthetic": "of SYNTHETIC times", "-cpu-device": "timed on the CPU device"}


def _check_same_times(out: Path, manifest: dict, kind: str, gpu_key: str | None) -> None:
    """The tables already in --out must be of this run's times: the same GPU, and a GPU's, SYNTHETIC or
    the CPU device's as this run's are."""
    from tuner.measure.provenance import is_cpu_device, is_synthetic
    tables = [t for t in manifest.get("tables", []) if t.get("entries")]
    if not tables:
        return
    held = {"-synthetic" if is_synthetic(t.get("environment")) else
            "-cpu-device" if is_cpu_device(t.get("environment")) else "" for t in tables}
    theirs = manifest.get("gpu")
    if gpu_key and theirs and theirs != gpu_key:
        raise TunerError(f"--out {out} holds tables for {theirs} ({out / 'manifest.json'}); this run is for "
                         f"{gpu_key}: give another --out")
    other = sorted(held - {kind})
    if other:
        raise TunerError(f"--out {out} holds tables {_KINDS[other[0]]} ({out / 'manifest.json'}); this run's would "
                         f"be {_KINDS[kind]} and replace theirs: give another --out")


def _check_same_model(out: Path, manifest: dict, mine: str) -> None:
    """The tables already in --out must be of this run's model: install, audit and check read a
    folder's model from its manifest, one for all its tables (tuner/emit/table_origin.py), so
    another model's tables there would be taken for this one's. Other deployments of the model
    (TP, EP, dtype) may share a folder: the GPU run's window tunes them all into one."""
    theirs = manifest.get("model")
    # by name, as the manifest records it, case aside: a config.json from a Hugging Face snapshot
    # is named as its repository (Qwen3-30B-A3B), configs/models/'s file in lower case
    if isinstance(theirs, str) and theirs and theirs.lower() != mine.lower() \
            and any(isinstance(t, dict) and t.get("entries") for t in manifest.get("tables", [])):
        raise TunerError(f"--out {out} holds tables for {theirs[:80]} ({out / 'manifest.json'}); this run is for "
                         f"{mine[:80]}, and a folder's tables are one model's: give another --out")


def only_problems(problems: list, only: list[str] | None) -> list:
    """The problems whose key holds one of the --only texts (all without --only)."""
    if not only:
        return problems
    kept = [p for p in problems if any(text in p.key for text in only)]
    if not kept:
        raise TunerError(f"--only {' '.join(only)} matches none of the problems: "
                         + "; ".join(p.key for p in problems))
    return kept


def record_path(record: str | None, kernel, several: bool) -> str | None:
    """One landscape per kernel: with several (each engine's own), the source goes into the
    name (land.jsonl.gz -> land.vllm.jsonl.gz)."""
    if not record or not several or kernel.source == "ours":
        return record
    path = Path(record)
    stem, dot, ext = path.name.partition(".")
    return str(path.with_name(f"{stem}.{kernel.source}{dot}{ext}"))


def gpu_list(text: str | None, device: str = "cuda") -> list[int]:
    if device == "cpu":
        return []                   # the CPU device is one device: no worker per GPU
    if text is None:
        try:
            import torch
            return list(range(torch.cuda.device_count()))
        except Exception:  # noqa: BLE001 - no usable torch.cuda: no GPUs to spread over
            return []
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TunerError(f"--gpus takes GPU indexes like 0,1,2,3, not {text!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise TunerError(f"--gpus takes distinct GPU indexes like 0,1,2,3, not {text!r}")
    return gpus
