"""What the tuning and install commands do, as functions of plain options.

`tuner gemm|moe|mla` and `tuner install` (tuner/cli.py) parse the command line into these
calls; `tuner nightly` (tuner/nightly.py) calls them with a job's options. Neither calls
the other, and the options are checked here, where both enter.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from tuner.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES
from tuner.errors import TunerError

log = logging.getLogger("tuner")

COMMANDS = ("gemm", "moe", "mla")
KERNEL_OF = {"gemm": "fp8_gemm", "moe": "fused_moe", "mla": "mla_decode"}
DEFAULT_TRIALS = {"gemm": 48, "moe": 32, "mla": 32}
DTYPES = {"gemm": ("fp8_w8a8",), "moe": ("fp8_w8a8", "bf16"), "mla": ("bf16",)}   # first: the default
# --sampler: the first is the default (tuner/search.py make_sampler builds each; README says why gp)
SAMPLERS = ("gp", "tpe", "random", "cmaes")
MLA_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@dataclass
class TuneRequest:
    """One tuning run, as the options of `tuner gemm|moe|mla` (same names, see README)."""
    command: str                                # "gemm", "moe" or "mla"
    model: str
    gpu: str
    dtype: str | None = None
    tp: int = 1
    ep: int = 1
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
    kernel_source: str | None = None            # "engine" (default) or "ours"
    engine_source: list[str] | None = None
    out: str | None = None
    replay: str | None = None
    record: str | None = None
    gpus: str | None = None                     # "0,1,2,3"; None: every visible GPU
    compile_workers: int = min(16, os.cpu_count() or 1)
    measure_timeout: int = 300
    recycle_after: int = 256
    dry_run: bool = False
    quiet: bool = False
    only: list[str] | None = None               # problems whose key holds one of these texts
    routing: str = "uniform"                    # moe
    contexts: list[int] | None = None           # mla
    page_size: int = 64                         # mla

    @classmethod
    def from_args(cls, args) -> "TuneRequest":
        """From the CLI's parsed options (those a command lacks keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def checked(self) -> "TuneRequest":
        """The request with its numbers checked (the CLI's parser did that for its own;
        a nightly job's come from YAML), naming the option at fault."""
        if self.command not in COMMANDS:
            raise TunerError(f"unknown tuning command {self.command!r}; choose from {', '.join(COMMANDS)}")

        def whole(name: str, value, least: int = 1) -> int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}")
            try:
                v = int(value)
            except ValueError:
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}") from None
            if v < least:
                raise TunerError(f"--{name.replace('_', '-')} must be at least {least}, not {v}")
            return v

        for name, value, allowed in (("sampler", self.sampler, SAMPLERS),
                                     ("routing", self.routing, ("uniform", "zipf")),
                                     ("kernel_source", self.kernel_source, (None, "engine", "ours"))):
            if value not in allowed:
                raise TunerError(f"--{name.replace('_', '-')} {value!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed if a)}")
        if not self.engines or any(e not in ENGINE_NAMES for e in self.engines):
            raise TunerError(f"--engines takes some of {', '.join(ENGINE_NAMES)}, not {self.engines!r}")
        changes: dict = {}
        for name in ("tp", "ep", "measure_timeout", "recycle_after", "page_size"):
            changes[name] = whole(name, getattr(self, name))
        changes["compile_workers"] = whole("compile_workers", self.compile_workers, 0)
        changes["seed"] = whole("seed", self.seed, -(1 << 63))
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
    from tuner.space import load_space
    from tuner.tune import RunOptions, plan_text, results_table, run_tuning

    req = request.checked()
    model, gpu, settings = _load_common(req)
    if not req.dry_run:
        # before anything is written: a folder we may write, a storage that is ours
        from tuner.tune import check_storage_url, default_storage
        out = out_dir(req, model.name, gpu.key)
        check_out_dir(out)
        check_storage_url(req.storage or default_storage(out))
    notes: list[str] = []
    runs = kernel_runs(req, KERNEL_OF[req.command], only_problems(_problems(req, model), req.only), notes)
    all_opts = []
    for kernel, problems in runs:
        all_opts.append(RunOptions(
            kernel=kernel, space=load_space(kernel, req.space), gpu=gpu, problems=problems,
            batch_sizes=sorted(set(req.batch_sizes or [])), settings=settings,
            out_dir=out_dir(req, model.name, gpu.key), storage=req.storage,
            engines=req.engines, replay=req.replay, record=record_path(req.record, kernel, len(runs) > 1),
            baseline=req.baseline, compile_workers=req.compile_workers, measure_timeout=req.measure_timeout,
            recycle_after=req.recycle_after, prefix=req.study_prefix, gpus=gpu_list(req.gpus),
            run_info={"model": model.name, "model_source": model.source, "tp": req.tp, "ep": req.ep,
                      "dtype": req.dtype},
            quiet=req.quiet,
        ))
    if req.dry_run:
        for line in dict.fromkeys(notes):
            say(f"note: {line}")
        say("\n\n".join(plan_text(opts) for opts in all_opts))
        return []
    if not req.replay:
        from tuner.measure import require_gpu
        require_gpu(gpu.cuda_name, "a tuning run", "--dry-run shows the plan and --replay FILE tunes over a "
                    "recorded landscape (`tuner landscape synth` makes a SYNTHETIC one to try it)")
    done = []
    for opts in all_opts:
        kernel = opts.kernel
        results = run_tuning(opts)
        table = results_table(results, kernel.config_keys)
        if not table.empty:
            from tuner.report import run_source
            say(run_source(opts.out_dir))
            say(f"{kernel.description} [{kernel.source_label}]; config = " + " ".join(kernel.config_keys))
            say(table.to_string(index=False))
        if kernel.engine_hints:
            by_key = {p.key: p for p in opts.problems}
            for line in kernel.engine_hints([(by_key[k], rs) for k, rs in results.items()]):
                say(line)
        done.append((opts, results))
    return done


def _load_common(req: TuneRequest):
    """Everything the kernel commands share: model, GPU, search settings (and the
    command's defaults filled into the request)."""
    from tuner.gpus import get_gpu
    from tuner.models import load_model
    from tuner.search import default_settings

    req.dtype = req.dtype or DTYPES[req.command][0]
    if req.batch_sizes is None:
        req.batch_sizes = MLA_BATCH_SIZES if req.command == "mla" else DEFAULT_BATCH_SIZES
    if req.dtype not in DTYPES[req.command]:
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
    trials = req.trials or DEFAULT_TRIALS[req.command]
    # Batches as large as the configs compiled at once on a GPU; a replay compiles nothing.
    settings = default_settings(trials, sampler=req.sampler, seed=req.seed, patience=req.patience,
                                parallel=1 if req.replay else req.compile_workers)
    return model, gpu, settings


def _problems(req: TuneRequest, model) -> list:
    """The model's problems for the command, as one GPU runs them at --tp/--ep."""
    from tuner.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    if req.command == "gemm":
        return gemm_problems(model, req.tp, req.ep)
    if req.command == "moe":
        return moe_problems(model, req.tp, req.ep, req.dtype or DTYPES['moe'][0], req.routing, req.engines)
    problems, skipped = mla_problems(model, req.tp, req.contexts or DEFAULT_CONTEXTS, req.page_size)
    if skipped and req.contexts:
        log.warning("skipping contexts beyond %s's positions: %s", model.name, skipped)
    return problems


def kernel_runs(req, kernel_name: str, problems: list, notes: list) -> list:
    """[(kernel, its problems)]: the problems each kernel times. With engine kernels a
    problem several engines read (a GEMM shape) becomes one problem per engine, each timed
    on that engine's kernel and written to that engine's table only. `req`: a TuneRequest
    or anything with its kernel_source, replay, engines, engine_source and dry_run."""
    from tuner.kernel_sources import as_recorded, kernel_for, source_mode

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
    name = f"{req.command}-{model_name}-{gpu_key}-tp{req.tp}" + (f"-ep{req.ep}" if req.ep > 1 else "")
    return Path("runs") / name


def check_out_dir(out: Path) -> None:
    """Before the first write: --out must be a folder we can write, holding nothing of
    another program (a manifest.json that is not ours)."""
    from tuner.paths import writable_folder
    from tuner.results import MANIFEST, manifest_problem
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    ok, existing = writable_folder(out)
    if not ok:
        raise TunerError(f"cannot write to {existing} (--out {out}): permission denied or not a folder")
    manifest = out / MANIFEST
    if manifest.is_file():
        import json
        try:
            problem = manifest_problem(json.loads(manifest.read_text()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = f"unreadable ({e})"
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


def gpu_list(text: str | None) -> list[int]:
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
                    dry_run: bool = False, say: Callable[[str], None] = print) -> Path | None:
    """Install a results folder's tables where `engine` reads them (`tuner install`);
    returns the backup folder (None on a dry run). `say` gets what is (or would be) done."""
    from tuner import install as inst

    results = Path(results)
    if not results.is_dir():
        raise TunerError(f"results folder {results} not found")
    site = inst.find_site_packages(engine, site_packages)
    config_dir = Path(moe_config_dir) if moe_config_dir else None
    from tuner.gpus import get_gpu
    target = get_gpu(gpu).cuda_name if gpu else None
    copies, notes = inst.plan_install(results, engine, site, force, config_dir, target)
    extra = inst.plan_config_dir(site, engine, config_dir) if config_dir else []
    for note in notes:
        log.warning("%s", note)
    if extra:
        say(f"{'would copy' if dry_run else 'copying'} {len(extra)} shipped {engine} MoE tables "
            f"into {config_dir} (the variable hides the package's own)")
    for c in copies:
        say(f"{'would install' if dry_run else 'install'} {c.dest}")
    if dry_run:
        return None
    backup = inst.install(copies, engine, extra)
    say(f"{len(copies)} tables installed; backup in {backup} (`tuner install --restore --engine {engine}`)")
    if config_dir:
        say(f"export {inst.ENV_VARS[engine]}={config_dir.resolve()}")
    return backup
