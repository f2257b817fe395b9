"""What the tuning and install commands do, as functions of plain options.

`tuner gemm|moe|mla` and `tuner install` (tuner/cli.py) parse the command line into these
calls; `tuner nightly` (tuner/commands/nightly.py) calls them with a job's options. Neither calls
the other, and the options are checked here, where both enter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError
from tuner.plan.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES
from tuner.search.samplers import SAMPLERS

log = logging.getLogger("tuner")

COMMANDS = ("gemm", "moe", "mla")
KERNEL_OF = {"gemm": "fp8_gemm", "moe": "fused_moe", "mla": "mla_decode"}
DEFAULT_TRIALS = {"gemm": 48, "moe": 32, "mla": 32}
DTYPES = {"gemm": ("fp8_w8a8",), "moe": ("fp8_w8a8", "bf16"), "mla": ("bf16",)}   # first: the default
# --sampler: the first is the default (tuner/search/runner.py make_sampler builds each; docs/search.md says why gp)
MLA_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@dataclass
class TuneRequest:
    """One tuning run, as the options of `tuner gemm|moe|mla` (same names, see docs/tuning.md)."""
    command: str                                # "gemm", "moe" or "mla"
    model: str
    gpu: str
    dtype: str | None = None
    tp: int | None = None                       # None: the smallest that serves the model (tuner/plan/deployment.py)
    ep: int = 1
    per_rank: bool = False                      # --tp is one rank's shapes on purpose: no fit check
    batch_sizes: list[int] | None = None
    engines: list[str] = field(default_factory=lambda: list(ENGINE_NAMES))
    trials: int | None = None
    patience: int | None = None
    sampler: str = SAMPLERS[0]
    seed: int = 0
    space: str | None = None
    baseline: str | None = None
    storage: str | None = None
    study_prefix: str = ""
    kernel_source: str | None = None            # "engine" (default), "ours", or one engine's ("vllm")
    engine_source: list[str] | None = None
    out: str | None = None
    replay: str | None = None
    record: str | None = None
    gpus: str | None = None                     # "0,1,2,3"; None: every visible GPU
    compile_workers: int = min(16, os.cpu_count() or 1)
    measure_timeout: int = 120
    device: str = "cuda"                        # "cpu": the CPU device (tuner/measure/device.py), for CI
    recycle_after: int = 256
    dry_run: bool = False
    quiet: bool = False
    only: list[str] | None = None               # problems whose key holds one of these texts
    routing: str = "uniform"                    # moe: uniform, zipf, or a recorded routing file (tuner/plan/routing.py)
    contexts: list[int] | None = None           # mla
    page_size: int = 64                         # mla
    traffic: str | None = None                  # gemm, moe: a traffic profile (tuner/plan/traffic.py)
    trust_engine_source: bool = False           # import engine files that match no known release
    timing: str = "graph"                       # CUDA-graph replay or eager launches (tuner/measure/policy.py)
    l2: str = "cold"                            # L2 flushed before each timed run, or warm
    warm_start: list[str] | None = None         # results folders, tables, folders of tables: seeds
    no_warm_start: bool = False                 # no seeds from the engines' shipped tables
    min_gain: float = 0.02                      # a row changes only for a gain above this (tuner/search/choice.py)
    synthetic: bool = False                     # time on a SYNTHETIC landscape made on the fly (no GPU)

    @classmethod
    def from_args(cls, args) -> "TuneRequest":
        """From the CLI's parsed options (those a command lacks keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def checked(self) -> "TuneRequest":
        """The request with its numbers checked (the CLI's parser did that for its own;
        a nightly job's come from YAML), naming the option at fault."""
        if self.command not in COMMANDS:
            raise TunerError(f"unknown tuning command {self.command!r}; choose from {', '.join(COMMANDS)}")

        def whole(name: str, value, least: int = 1, most: int | None = None) -> int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}")
            try:
                v = int(value)
            except ValueError:
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}") from None
            if v < least:
                raise TunerError(f"--{name.replace('_', '-')} must be at least {least}, not {v}")
            if most is not None and v > most:
                raise TunerError(f"--{name.replace('_', '-')} must be at most {most}, not {v}")
            return v

        from tuner.search.samplers import REMOVED
        if self.sampler in REMOVED:
            raise TunerError(REMOVED[self.sampler])
        for name, value, allowed in (("sampler", self.sampler, SAMPLERS),
                                     ("timing", self.timing, ("graph", "eager")),
                                     ("l2", self.l2, ("cold", "warm")),
                                     ("kernel_source", self.kernel_source, (None, "engine", "ours", *ENGINE_NAMES)),
                                     ("device", self.device, ("cuda", "cpu"))):
            if value not in allowed:
                raise TunerError(f"--{name.replace('_', '-')} {value!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed if a)}")
        if not isinstance(self.routing, str) or not self.routing:
            raise TunerError(f"--routing takes uniform, zipf or a routing file, not {self.routing!r}")
        if isinstance(self.min_gain, bool) or not isinstance(self.min_gain, (int, float)) or not 0 <= self.min_gain < 1:
            raise TunerError(f"--min-gain must be at least 0 and below 1 (0.02 is 2%), not {self.min_gain!r}")
        if self.warm_start is not None and (not isinstance(self.warm_start, (list, tuple))
                                            or not all(isinstance(p, str) for p in self.warm_start)):
            raise TunerError(f"--warm-start takes paths, not {self.warm_start!r}")
        if self.synthetic:
            clash = [o for o, v in (("--replay", self.replay), ("--record", self.record), ("--gpus", self.gpus),
                                    ("--device cpu", self.device == "cpu")) if v]
            if clash:
                raise TunerError(f"--synthetic makes its own SYNTHETIC landscape and replays it; drop {clash[0]}")
        if not self.engines or any(e not in ENGINE_NAMES for e in self.engines):
            raise TunerError(f"--engines takes some of {', '.join(ENGINE_NAMES)}, not {self.engines!r}")
        changes: dict = {}
        if self.kernel_source in ENGINE_NAMES:
            # one engine's own kernel: it times that engine's tables only
            if self.engines != list(ENGINE_NAMES) and self.engines != [self.kernel_source]:
                raise TunerError(f"--kernel-source {self.kernel_source} times {self.kernel_source}'s tables only, "
                                 f"not --engines {' '.join(self.engines)}")
            changes["engines"] = [self.kernel_source]
        if self.synthetic and self.kernel_source in (None, "engine"):
            changes["kernel_source"] = "ours"          # the cost model's landscape of our kernels' configs
        for name in ("ep", "measure_timeout", "recycle_after", "page_size"):
            changes[name] = whole(name, getattr(self, name))
        if self.tp is not None:
            changes["tp"] = whole("tp", self.tp)
        if not isinstance(self.per_rank, bool):
            raise TunerError(f"--per-rank is a switch (true or false), not {self.per_rank!r}")
        changes["compile_workers"] = whole("compile_workers", self.compile_workers, 0)
        # what every sampler's generator takes (numpy's RandomState: 0 to 2^32-1)
        changes["seed"] = whole("seed", self.seed, 0, (1 << 32) - 1)
        for name in ("trials", "patience"):
            if getattr(self, name) is not None:
                changes[name] = whole(name, getattr(self, name))
        for name in ("batch_sizes", "contexts"):
            values = getattr(self, name)
            if values is not None:
                if not isinstance(values, (list, tuple)) or not values:
                    raise TunerError(f"--{name.replace('_', '-')} takes a list of integers, not {values!r}")
                changes[name] = [whole(name, v) for v in values]
        return dataclasses.replace(self, **changes)


# -- tuning -------------------------------------------------------------------------------
def tune(request: TuneRequest, say: Callable[[str], None] = print) -> list:
    """Plan and run one tuning run per kernel that times some of the tables (each
    engine's own, or ours); `say` gets the plan (dry run) or each kernel's results table.
    Returns [(run options, {problem key: [StudyResult]})] (nothing on a dry run)."""
    if not request.trust_engine_source:
        return _tune(request, say)
    # for this run and the processes it starts (measuring children, compile workers)
    from tuner.plan.kernel_sources import TRUST_ENV
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1"
    try:
        return _tune(request, say)
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def _tune(request: TuneRequest, say: Callable[[str], None] = print) -> list:
    from tuner.commands.run_plan import RunOptions, plan_text  # light: a plan loads no Optuna, torch, Triton
    from tuner.plan.space import load_space

    req = request.checked()
    keys_given = req.batch_sizes is not None
    model, gpu, settings = _load_common(req)
    parallel = deployment_tp(req, model, gpu)                       # the deployment, before its shapes
    routing, recorded = recorded_routing(req, model)                # --routing FILE: read and checked first
    problems = only_problems(_problems(req, model), req.only)      # a bad --tp/--ep/--only is said first
    profile = traffic_keys(req, settings, keys_given) if req.traffic else None
    if not req.dry_run and not req.replay and not req.synthetic:
        # the first thing a run without a GPU is told (before the engines' code or --out)
        from tuner.measure.device import require
        require(req.device, gpu, "a tuning run", "--dry-run shows the plan, --replay FILE tunes over a recorded "
                "landscape, --synthetic runs it all on a SYNTHETIC one made on the fly (to try the tool), and "
                "--device cpu runs the GPU's code path on the CPU (times that mean nothing about a GPU)")
    if parallel.line and req.dry_run:
        say(parallel.line)              # the plan's first line: the deployment it is for, when not --tp's
    if not req.dry_run:
        # before anything is written: a folder we may write, a storage that is ours
        from tuner.commands.run_plan import default_storage
        from tuner.commands.tune import check_storage_url
        out = out_dir(req, model.name, gpu.key)
        check_out_dir(out)
        if recorded is not None:
            from tuner.plan.routing import install
            install(recorded, out / "routing")          # where the kernel reads the ids (this run's children too)
        check_storage_url(req.storage or default_storage(out))
    if req.synthetic:
        from tuner.measure.synthetic import SYNTHETIC_RUN_LINE, landscape_for_run
        say(SYNTHETIC_RUN_LINE)
        if not req.dry_run:
            req.replay = str(landscape_for_run(out_dir(req, model.name, gpu.key), KERNEL_OF[req.command],
                                               str(req.kernel_source), gpu, problems, req.batch_sizes or [],
                                               req.space, say=(lambda line: None) if req.quiet else say))
    notes: list[str] = []
    runs = kernel_runs(req, KERNEL_OF[req.command], problems, notes)
    from tuner.measure.policy import MeasurementPolicy
    policy = MeasurementPolicy(req.timing, req.l2, routing=req.routing if req.command == "moe" else None)
    all_opts = []
    for kernel, problems in runs:
        from tuner.commands.warm_sources import build_pool
        # the engine's own shipped tables for its kernel's tables (both engines' for ours)
        warm = build_pool(kernel, problems, gpu, req.warm_start, not req.no_warm_start,
                          [kernel.source] if kernel.source in ENGINE_NAMES else req.engines, req.engine_source, model)
        all_opts.append(RunOptions(
            kernel=kernel, space=load_space(kernel, req.space), gpu=gpu, problems=problems,
            batch_sizes=sorted(set(req.batch_sizes or [])), settings=settings,
            out_dir=out_dir(req, model.name, gpu.key), storage=req.storage,
            engines=req.engines, replay=req.replay, record=record_path(req.record, kernel, len(runs) > 1),
            baseline=req.baseline, compile_workers=req.compile_workers, measure_timeout=req.measure_timeout,
            recycle_after=req.recycle_after, prefix=req.study_prefix,
            gpus=gpu_list(req.gpus, req.device) if req.gpus is not None or not req.dry_run else [],   # (counting asks torch)
            device=req.device, warm=warm,
            run_info={"model": model.name, "model_source": model.source, "tp": req.tp, "ep": req.ep,
                      "dtype": req.dtype, **({"traffic": profile.as_manifest()} if profile else {}),
                      "measurement": policy.as_dict(), **({"routing": routing} if routing else {})},
            quiet=req.quiet, traffic=profile,
        ))
    if parallel.line and all_opts:
        all_opts[0].notes.append(parallel.line)    # a run says it with its progress, once past its checks
    if req.dry_run:
        for line in dict.fromkeys(notes):
            say(f"note: {line}")
        say("\n\n".join(plan_text(opts) for opts in all_opts))
        return []
    from tuner.commands.tune import run_tuning
    done = []
    for opts in all_opts:
        kernel = opts.kernel
        results = run_tuning(opts)
        if results:
            from tuner.commands.report import run_source
            from tuner.emit.run_table import run_table_lines, written_files
            say(run_source(opts.out_dir))
            say(f"{kernel.description} [{kernel.source_label}]; config = " + " ".join(kernel.config_keys))
            for line in run_table_lines(results, kernel.config_keys, written_files(opts), opts.out_dir):
                say(line)
            from tuner.search.outcomes import untimed, why_untimed
            for r in untimed(results):
                say(f"no config timed at M={r.M} of {r.problem.key}: {why_untimed(r)}")
        if kernel.engine_hints:
            by_key = {p.key: p for p in opts.problems}
            for line in kernel.engine_hints([(by_key[k], rs) for k, rs in results.items()]):
                say(line)
        if results and (opts.times == "GPU" or str(opts.times).startswith("landscape")):
            # (tables chosen on SYNTHETIC or CPU-device times are not pointed at for an engine to read)
            from tuner.emit.install_target import config_folder_lines
            for engine in sorted({e for p in opts.problems for e in p.engines if e in opts.engines}):
                for line in config_folder_lines(engine, kernel.table_kind, opts.out_dir / engine / kernel.table_kind):
                    say(line)
        done.append((opts, results))
    return done


def deployment_tp(req: TuneRequest, model, gpu):
    """The request's tensor-parallel size (tuner/plan/deployment.py): --tp, checked to hold the
    weights, or the smallest that does; set into the request."""
    from tuner.plan.deployment import check_tp
    from tuner.plan.precision import checkpoint_dtype
    parallel = check_tp(model, gpu, req.tp, req.ep, checkpoint_dtype(model), req.per_rank)
    req.tp = parallel.tp
    return parallel


def _load_common(req: TuneRequest):
    """Everything the kernel commands share: model, GPU, search settings (and the
    command's defaults filled into the request)."""
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    from tuner.search.settings import default_settings

    if req.batch_sizes is None:
        req.batch_sizes = MLA_BATCH_SIZES if req.command == "mla" else DEFAULT_BATCH_SIZES
    if req.dtype is not None and req.dtype not in DTYPES[req.command]:
        raise TunerError(f"--dtype {req.dtype} is not supported by `tuner {req.command}`; "
                         f"choose from {', '.join(DTYPES[req.command])}")
    if req.replay and req.record:
        raise TunerError("--replay and --record cannot be combined: one replays timings, the other takes them")
    if req.replay and not Path(req.replay).is_file():
        raise TunerError(f"landscape {req.replay} not found")
    if req.baseline and not Path(req.baseline).is_dir():
        raise TunerError(f"--baseline {req.baseline} is not a folder")
    gpu = get_gpu(req.gpu)
    model = load_model(req.model)
    req.dtype = command_dtype(req.command, model, req.dtype)
    trials = req.trials or DEFAULT_TRIALS[req.command]
    # Batches as large as the configs compiled at once on a GPU; a replay compiles nothing.
    settings = default_settings(trials, sampler=req.sampler, seed=req.seed, patience=req.patience,
                                parallel=1 if req.replay else req.compile_workers)
    settings.row_gain = float(req.min_gain)
    return model, gpu, settings


def recorded_routing(req: TuneRequest, model):
    """--routing FILE (moe): (what the manifest says of it, the recorded top-k ids), checked
    against the model; the request then names the routing as problems do
    ("recorded:<stem>@<hash>"). (None, None) for uniform and zipf."""
    from tuner.plan import routing as rt
    if not rt.is_file_routing(req.routing):
        return None, None
    if req.command != "moe":
        raise TunerError(f"--routing applies to `tuner moe`, not `tuner {req.command}`")
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
    if req.command not in ("gemm", "moe"):
        raise TunerError(f"--traffic applies to `tuner gemm` and `tuner moe` (M = tokens per forward pass); "
                         f"`tuner {req.command}` tunes another M")
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


def _problems(req: TuneRequest, model) -> list:
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
    for p in problems:
        engines = [e for e in p.engines if e in req.engines] or list(p.engines)
        for engine in engines:
            try:
                kernel = kernel_for(kernel_name, engine, mode, req.engine_source, load_code=not req.replay)
            except TunerError as e:
                if not req.dry_run:
                    raise
                notes.append(str(e))
                kernel = kernel_for(kernel_name, engine, mode, req.engine_source, load_code=False)
            kernel = as_recorded(kernel, req.replay)
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
    return list(runs.values())


def out_dir(req: TuneRequest, model_name: str, gpu_key: str) -> Path:
    if req.out:
        return Path(req.out)
    name = f"{req.command}-{model_name}-{gpu_key}-tp{req.tp}" + (f"-ep{req.ep}" if req.ep > 1 else "") \
        + ("-synthetic" if req.synthetic else "")
    return Path("runs") / name


def check_out_dir(out: Path) -> None:
    """Before the first write: --out must be a folder we can write, holding nothing of
    another program (a manifest.json that is not ours)."""
    from tuner.emit.results import MANIFEST, manifest_problem
    from tuner.paths import writable_folder
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    ok, existing = writable_folder(out)
    if not ok:
        raise TunerError(f"cannot write to {existing} (--out {out}): permission denied or not a folder")
    manifest = out / MANIFEST
    if os.path.lexists(manifest):
        from tuner.reading import read_json_file
        try:
            problem = manifest_problem(read_json_file(manifest))
        except TunerError as e:
            problem = f"unreadable: {e}"
        if problem:
            raise TunerError(f"--out {out} holds a {MANIFEST} that is not ours ({problem}); give another --out")


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


# -- installing -----------------------------------------------------------------------------
def install_results(results: str | Path, engine: str, site_packages: str | None = None,
                    moe_config_dir: str | None = None, gpu: str | None = None, force: bool = False,
                    dry_run: bool = False, say: Callable[[str], None] = print, merge: bool = False,
                    min_gain: float = 0.02, engine_version: str | None = None) -> Path | None:
    """Install a results folder's tables where `engine` reads them (`tuner install`);
    returns the backup folder (None on a dry run). `say` gets what is (or would be) done:
    the audit of what the install leaves in place (error findings refuse it unless `force`),
    and the lines the engine logs when it loads each table, or finds none. Without the engine
    here, a config folder (`moe_config_dir`) or a dry run for `engine_version`
    (tuner/emit/install_target.py)."""
    from tuner.emit import install as inst
    from tuner.emit.install_target import install_target, shipped_copies

    results = Path(results)
    if not results.is_dir():
        raise TunerError(f"results folder {results} not found")
    where = install_target(engine, site_packages, moe_config_dir, dry_run, engine_version)
    site = where.site
    config_dir = Path(moe_config_dir) if moe_config_dir else None
    from tuner.plan.gpus import get_gpu
    target = get_gpu(gpu).cuda_name if gpu else None
    if not where.present:
        what = f"a config folder for it, {config_dir}" if config_dir else "what an install into it would write"
        say(f"{where.label} is not installed here: {what}, by its loader rules (tuner/plan/engines.py)")

    def plan() -> tuple[list, list, list, list]:
        copies, notes = inst.plan_install(results, engine, site, force, config_dir, target, merge, where.version,
                                          where.present, min_gain)
        extra = shipped_copies(where, config_dir, notes) if config_dir else []
        inst.check_destinations([*extra, *copies])
        findings = inst.audit_install(copies, engine)
        errors = [f for f in findings if f.severity == "error"]
        if errors and not force:
            raise TunerError(f"refusing the install: the audit of what it would leave finds {len(errors)} error(s), "
                             f"first {Path(errors[0].table).name}: {errors[0].reason} (--force installs it anyway)")
        return copies, notes, extra, findings

    # Everything that refuses is checked before anything is written (the lock files included);
    # then the plan is made again under the install lock of every folder it may write, so that
    # what a --merge keeps is the table as it is when this install writes, not as it was
    # before another install finished.
    planned = plan()
    roots = list(inst.config_roots(site, engine, config_dir).values())
    with contextlib.nullcontext() if dry_run else inst.locked(roots, inst.BACKUP_ROOT):
        copies, notes, extra, findings = planned if dry_run else plan()
        for note in notes:
            log.warning("%s", note)
        grouped: dict[tuple[str, str, str], list[str]] = {}      # one line per finding, naming its tables
        for f in findings:
            grouped.setdefault((f.severity, f.kind, f.reason), []).append(Path(f.table).name)
        for (severity, kind, reason), names in grouped.items():
            tables = names[0] if len(names) == 1 else f"{len(names)} tables ({names[0]} and {len(names) - 1} more)"
            say(f"audit: {severity}: {kind}: {tables}: {reason}")
        if not findings:
            say(f"audit: the {len(copies)} tables pass `tuner audit`'s table checks as they would stand")
        if extra:
            say(f"{'would copy' if dry_run else 'copying'} {len(extra)} shipped {engine} MoE tables "
                f"into {config_dir} (the variable hides the package's own)")
        for label in sorted({c.not_a_gpu for c in copies if c.not_a_gpu}):
            count = sum(c.not_a_gpu == label for c in copies)
            say(f"*** {label}: {count} of these {len(copies)} tables {'were' if count > 1 else 'was'} chosen on times "
                f"that never came from a GPU{' (a cost model)' if label == 'SYNTHETIC' else ''}: "
                f"{'installed' if not dry_run else 'installing them'} only because --force says so ***")
        for c in copies:
            say(f"{'would install' if dry_run else 'install'} {c.dest}"
                + (f" (merged: kept M={','.join(map(str, c.merged['kept']))})" if c.merged else "")
                + (f"  [{c.not_a_gpu}: never timed on a GPU]" if c.not_a_gpu else ""))
        from tuner.emit.install_target import engine_log_lines
        for line in engine_log_lines(copies, engine, site, config_dir, where.version):
            say(line)
        if dry_run:
            return None
        backup = inst.install(copies, engine, extra, lock=False)
    say(f"{len(copies)} tables installed; backup in {backup} (`tuner install --restore --engine {engine}`)")
    if config_dir:
        say(f"export {inst.ENV_VARS[engine]}={config_dir.resolve()}")
    from tuner.plan.engines import install_notes
    in_package = any(config_dir is None or not str(c.dest).startswith(str(config_dir)) for c in copies)
    for line in install_notes(engine, in_package):
        say(line)
    return backup
