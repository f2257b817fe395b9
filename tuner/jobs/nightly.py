"""`tuner nightly configs/nightly.yaml`: keep a set of tables fresh.

For each job of the YAML, a night:
  1. compares the environment (device, driver, torch, Triton) with the last night's;
  2. if it is the same, checks drift: do last night's tables still beat the default config?
  3. retunes when there is no table yet, the environment changed, or a table lost;
  4. keeps, per M (and per tied group of tables), the previous config where the new one is
     not faster beyond noise, both timed now, in the same call;
  5. writes the tables, a diff against the previous run, and installs where configured.
The night's folder is named by its date, so a night started again after a crash resumes
from the studies its runs already stored. Exit status: 0 fine, 3 a table regressed (the
environment made it slower than last night beyond noise), 1 a job failed.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path

from tuner.errors import TunerError
from tuner.file_kinds import NIGHT_JSON, NIGHT_MD
from tuner.jobs.nightly_slot import slot_fields_ok
from tuner.jobs.requests import NightlyRequest
from tuner.measure.environment import nvml_index, nvml_snapshot, software_versions
from tuner.paths import atomic_write_json, atomic_write_text, replaceable
from tuner.plan.engines import ENGINE_NAMES

ENV_KEYS = ("device", "driver", "torch", "triton")
COMMANDS = {"gemm", "moe", "mla"}
EXIT_OK, EXIT_FAILED, EXIT_REGRESSED = 0, 1, 3


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")      # a job's or a night's folder name


def load_config(path: Path) -> dict:
    from tuner.reading import read_yaml_file
    cfg = read_yaml_file(path)
    if not isinstance(cfg, dict) or not isinstance(cfg.get("jobs"), list) or not cfg["jobs"]:
        raise TunerError(f"{path} needs a non-empty 'jobs' list")
    if not isinstance(cfg.get("runs_dir", ""), str):
        raise TunerError(f"{path}: runs_dir must be a folder name, not {cfg['runs_dir']!r}")
    noise = cfg.get("noise", 0.02)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise TunerError(f"{path}: noise must be a number from 0 up to 1 (0.02 is 2%), not {noise!r}")
    names = set()
    for i, job in enumerate(cfg["jobs"]):
        if not isinstance(job, dict):
            raise TunerError(f"{path}: job {i + 1} is not a mapping")
        for key in ("name", "kernel", "model", "gpu"):
            if not job.get(key):
                raise TunerError(f"{path}: job {i + 1} lacks {key!r}")
        if not isinstance(job["kernel"], str) or job["kernel"] not in COMMANDS:
            raise TunerError(f"{path}: job {job['name']!r}: kernel must be one of {', '.join(sorted(COMMANDS))}")
        if not NAME.fullmatch(str(job["name"])):
            raise TunerError(f"{path}: job name {job['name']!r} must be letters, digits, '.', '_' or '-' "
                             "(it names the job's folder)")
        if job["name"] in names:
            raise TunerError(f"{path}: two jobs are named {job['name']!r}")
        names.add(job["name"])
        unknown = sorted(map(str, set(job) - JOB_KEYS))
        if unknown:             # a misspelt option would run the job with its default, silently
            raise TunerError(f"{path}: job {job['name']!r}: unknown key {unknown[0]!r}; a job takes "
                             f"{', '.join(JOB_KEY_ORDER)}")
        install = job.get("install")
        if install is not None and not (isinstance(install, dict) and install.get("engine") in ENGINE_NAMES):
            raise TunerError(f"{path}: job {job['name']!r}: install must be a mapping with engine: vllm or sglang")
        sources = job.get("engine_source")
        if sources is not None:             # a path or a list of them, as --engine-source takes
            sources = sources if isinstance(sources, list) else [sources]
            if not all(isinstance(s, str) and s for s in sources):
                raise TunerError(f"{path}: job {job['name']!r}: engine_source must be a path or a list of paths")
            job["engine_source"] = sources
        for key in ("model", "gpu", "replay", "site_packages", "moe_config_dir", "traffic"):
            value = job.get(key, (install or {}).get(key))
            if value is not None and not isinstance(value, (str, int, float)):
                raise TunerError(f"{path}: job {job['name']!r}: {key} must be a name or a path, not {value!r}")
    return cfg


def read_state(path: Path) -> dict:
    """The nightly state (each job's last run and its environment), checked: a file that a
    crash or a hand cut short, or that holds anything else, is one line naming it."""
    from tuner.reading import read_json_file
    if not path.is_file():
        if path.exists():
            raise TunerError(f"nightly state {path} is not a file")
        return {}
    hint = "; fix it, or move it aside to retune every job from scratch"
    state = read_json_file(path, "nightly state ", hint)
    if not isinstance(state, dict):
        raise TunerError(f"nightly state {path} is not a JSON object of jobs{hint}")
    for name, entry in state.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("run"), str)
                and isinstance(entry.get("environment"), dict)):
            raise TunerError(f"nightly state {path}: job {name!r} must hold \"run\" (a folder) and "
                             f"\"environment\" (an object){hint}")
        if not isinstance(entry.get("unfinished", False), bool) or not isinstance(entry.get("baseline", ""), str):
            raise TunerError(f"nightly state {path}: job {name!r}: \"unfinished\" must be true or false and "
                             f"\"baseline\" a folder{hint}")
        if entry.get("unfinished") and not _a_nights_job_folder(Path(entry["run"]), path.parent):
            # the night continues an unfinished retune in its folder: only one of its own nights' (a state
            # naming any other folder would have it write its run there)
            raise TunerError(f"nightly state {path}: job {name!r}'s unfinished run {entry['run']} is no job folder "
                             f"of a night in {path.parent}{hint}")
        if not slot_fields_ok(entry):
            raise TunerError(f"nightly state {path}: job {name!r}: \"turn\" must be a whole number from 0 and "
                             f"\"needs_s\" seconds from 0{hint}")
        outcome = entry.get("outcome", {})        # goes into the night's report again: scalars, one line each
        if not (isinstance(outcome, dict) and isinstance(entry.get("night", ""), str)
                and outcome.get("status", "fresh") in OUTCOMES and all(
                    v is None or isinstance(v, (int, float)) or (isinstance(v, str) and v.isprintable())
                    for v in outcome.values())):
            raise TunerError(f"nightly state {path}: job {name!r}: \"outcome\" must be an object of a night's "
                             f"job result and \"night\" a night's name{hint}")
    return state


OUTCOMES = ("fresh", "same", "improved", "regressed")      # a job's finished retune, kept in the state


def _a_nights_job_folder(run: Path, runs_dir: Path) -> bool:
    """Whether `run` is RUNS_DIR/<night>/<job>, as a night writes a job's run (links followed)."""
    return Path(os.path.realpath(run)).parent.parent == Path(os.path.realpath(runs_dir))


# The job keys that are options of the tuning run, as `tuner gemm|moe|mla` names them.
JOB_OPTIONS = ("tp", "ep", "per_rank", "dtype", "trials", "replay", "routing", "sampler", "kernel_source", "traffic",
               "page_size")
JOB_LIST_OPTIONS = ("batch_sizes", "contexts", "engine_source")
JOB_KEY_ORDER = ("name", "kernel", "model", "gpu", *JOB_OPTIONS, *JOB_LIST_OPTIONS, "install")
JOB_KEYS = set(JOB_KEY_ORDER)


def job_request(job: dict, out: Path, baseline: Path | None = None, minutes: float | None = None):
    """The tuning run of a job; `baseline` (the last run) seeds every study with the
    configs in use, so the retune starts from what it must beat; `minutes`: its window."""
    from tuner.pipeline.request import TuneRequest
    options = {k: job[k] for k in JOB_OPTIONS if job.get(k) is not None}
    options.update({k: list(job[k]) if isinstance(job[k], (list, tuple)) else [job[k]]
                    for k in JOB_LIST_OPTIONS if job.get(k)})
    for key in ("replay", "traffic"):
        if key in options:
            options[key] = str(options[key])
    return TuneRequest(command=job["kernel"], model=str(job["model"]), gpu=str(job["gpu"]), out=str(out),
                       quiet=True, baseline=str(baseline) if baseline is not None else None,
                       synthetic=bool(job.get("synthetic")), minutes=minutes, **options)


def check_jobs(cfg: dict, path: Path) -> None:
    """Every job's inputs, before the night writes anything: its options as a tuning run
    takes them, its GPU and model, its landscape and traffic profile. A bad one is one line
    naming the job (a night half written and then refused is what this prevents)."""
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    from tuner.plan.traffic import load_profile
    for job in cfg["jobs"]:
        try:
            req = job_request(job, Path("."))          # checked as it is made
            get_gpu(req.gpu)
            load_model(req.model)
            if req.replay and not Path(req.replay).is_file():
                raise TunerError(f"landscape {req.replay} not found")
            if req.traffic:
                load_profile(req.traffic, tp=req.tp)
        except TunerError as e:
            raise TunerError(f"{path}: job {job['name']!r}: {e} (nothing was run)") from None
        except TypeError as e:          # a key of the job that no tuning run takes
            raise TunerError(f"{path}: job {job['name']!r}: {e} (nothing was run)") from None


def environment_now(job: dict) -> dict:
    """What the timings of this job would be taken on: the landscape's header when it
    replays, this machine otherwise."""
    if job.get("replay"):
        from tuner.measure.landscape import read_header
        h = read_header(job["replay"])
        return {k: h.get(k) for k in ENV_KEYS}
    if job.get("synthetic"):
        from tuner.jobs.nightly_modes import SYNTHETIC_DEVICE
        return {**dict.fromkeys(ENV_KEYS), "device": SYNTHETIC_DEVICE}
    env = {**software_versions(), **nvml_snapshot(nvml_index(0))}
    try:
        import torch
        env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        env["device"] = None
    return {k: env.get(k) for k in ENV_KEYS}


def run_job(job: dict, night_dir: Path, state: dict, noise: float, log, window=None, jobs_left: int = 1,
            first: bool = False) -> dict:
    from tuner.jobs.drift import Measurers, measure_drift
    from tuner.jobs.install import install_results
    from tuner.jobs.report import write_diff
    from tuner.pipeline.tune import tune
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    from tuner.plan.table_files import find_tables

    name = job["name"]
    prev = state.get(name)
    env = environment_now(job)
    begun = _begun(prev, env)
    if begun is not None and prev is not None:  # a window before this one left the job's retune unfinished
        prev = {"run": prev["baseline"], "environment": prev["environment"]} if prev.get("baseline") else None
    prev_run = Path(prev["run"]) if prev and Path(prev["run"], "manifest.json").is_file() else None
    changed = prev_run is None or prev is None or any(prev["environment"].get(k) != env.get(k) for k in ENV_KEYS)
    drifted = False
    if prev_run is not None and not changed and begun is None:
        from tuner.jobs.nightly_modes import run_landscape
        measurers = Measurers(get_gpu(job["gpu"]), run_landscape(job, prev_run), kernel_source=job.get("kernel_source"),
                              engine_source=job.get("engine_source"))
        try:
            model = load_model(job["model"]) if job["kernel"] == "moe" else None
            df = measure_drift(find_tables([str(prev_run)], model, job.get("routing", "uniform")), measurers, noise)
        finally:
            measurers.close()
        drifted = bool((df["verdict"].isin(["loses", "fails"])).any())
    if prev_run is not None and not changed and not drifted and begun is None:
        earlier = _retuned_this_night(prev, night_dir)
        if earlier is not None:     # this night ran before (its report unwritten, say): its outcome, not "unchanged"
            log(f"{name}: retuned earlier this night ({earlier['status']}) into {prev_run}")
            return earlier
        log(f"{name}: environment unchanged and every table still wins: kept {prev_run}")
        return {"job": name, "status": "unchanged", "run": str(prev_run)}
    why = "first run" if prev_run is None else ("environment changed" if changed else "a table lost to the default")
    out = night_dir / name
    if begun is not None:
        why, out = f"continuing the retune begun in {begun}", begun
    minutes = None
    turn = None
    if window is not None:
        # the job's share of the night's slot (tuner/jobs/nightly_slot.py)
        from tuner.jobs.nightly_slot import needs_of, next_turn, share
        given = share(window, jobs_left, needs_of(state.get(name)) if begun is not None else 0.0, first)
        if given.short:
            log(f"{name}: waiting: {given.short}; the next night takes it first")
            return {"job": name, "status": "waiting", "why": f"{why}; {given.short}"}
        minutes, turn = given.seconds / 60, next_turn(state)
    log(f"{name}: retuning ({why}) into {out}")
    left: dict = {}
    try:
        done = tune(job_request(job, out, prev_run, minutes), left=left)
    except TunerError as e:
        raise TunerError(f"{name}: the tuning run failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - one job's bug must not stop the other jobs
        from tuner.errors import os_error_line
        said = os_error_line(e)         # a full disk, say: its words, not an internal error
        if said is not None:
            raise TunerError(f"{name}: the tuning run failed: {said}") from None
        if os.environ.get("TUNER_DEBUG"):
            raise
        raise TunerError(f"{name}: the tuning run failed: internal error: {type(e).__name__}: {e}") from None
    from tuner.search.outcomes import untimed_line
    untimed = untimed_line(done)
    if untimed:                 # its tables lack those batch sizes: not a night that went fine
        raise TunerError(f"{name}: {untimed}")
    result = {"job": name, "run": str(out), "why": why}
    if left.get("studies"):
        # its tables hold what was tuned (the incumbent elsewhere); the next window goes on with it
        state[name] = {"run": str(out), "environment": env, "unfinished": True, "turn": turn,
                       "needs_s": left.get("needs_s", 0.0),
                       **({"baseline": str(prev_run)} if prev_run is not None else {})}
        if left.get("stalled"):
            log(f"{name}: its share of the slot ({minutes or 0:.2f} min) made no progress: it needs about "
                f"{left.get('needs_s', 0):.0f} s (its start-up and next step, measured)")
        log(f"{name}: {left['studies']} studies left for the next window (tuner nightly --minutes)")
        return {**result, "status": "partial", "left": left["studies"]}
    if prev_run is None:
        result["status"] = "fresh"
    else:
        from tuner.jobs.nightly_keep import keep_better
        result["kept_previous"] = keep_better(prev_run, out, job, noise)
        diff, md = write_diff(prev_run, out, out / "diff", noise, force=True)
        slower, faster = int((diff["verdict"] == "slower").sum()), int((diff["verdict"] == "faster").sum())
        result.update({"faster": faster, "slower": slower, "diff": str(md),
                       "status": "regressed" if slower else ("improved" if faster else "same")})
    if job.get("install") and job.get("synthetic"):      # the real reason, not a missing engine's
        log(f"{name}: not installed: its tables are SYNTHETIC (a cost model's times), never installed")
        result["installed"] = False
    elif job.get("install"):
        inst = job["install"]
        try:
            install_results(out, inst["engine"], inst.get("site_packages") and str(inst["site_packages"]),
                                inst.get("moe_config_dir") and str(inst["moe_config_dir"]))
            result["installed"] = True
        except Exception as e:  # noqa: BLE001 - the tables are tuned either way; say why they stay here
            if os.environ.get("TUNER_DEBUG") and not isinstance(e, TunerError):
                raise
            log(f"{name}: not installed: {e}")
            result["installed"] = False
    # the outcome kept with the state: a rerun of this night after its report failed to be written reports it
    state[name] = {"run": str(out), "environment": env, "night": night_dir.name, "outcome": result,
                   **({"turn": turn} if turn is not None else {})}
    return result


def _retuned_this_night(prev: dict | None, night_dir: Path) -> dict | None:
    """The outcome the state keeps of the job's retune in this very night (None: another night's)."""
    outcome = (prev or {}).get("outcome")
    if prev is None or prev.get("night") != night_dir.name or not outcome or outcome.get("run") != prev["run"]:
        return None
    # its diff is in its run's folder: this night's, or the night that began a retune this night finished
    if outcome.get("diff") and not Path(str(outcome["diff"])).is_relative_to(prev["run"]):
        return None
    return outcome


def _begun(prev: dict | None, env: dict) -> Path | None:
    """The run folder of a retune an earlier window left unfinished, to continue (None: none, or
    one timed on another environment, whose studies are not this machine's: retuned afresh)."""
    if not prev or not prev.get("unfinished") or not Path(prev["run"]).is_dir():
        return None
    if any(prev["environment"].get(k) != env.get(k) for k in ENV_KEYS):
        return None
    return Path(prev["run"])


def run_night(config_path: Path, night: str | None = None, log=print, dry_run: bool = False,
              synthetic: bool = False, minutes: float | None = None, began: float | None = None) -> int:
    from tuner.jobs import nightly_modes
    from tuner.paths import check_writable
    cfg = load_config(config_path)
    runs_dir = Path(cfg.get("runs_dir") or "runs/nightly")
    if synthetic:
        cfg["jobs"] = [nightly_modes.synthetic_job(job) for job in cfg["jobs"]]
        runs_dir = nightly_modes.synthetic_runs_dir(runs_dir)
    noise = float(cfg.get("noise", 0.02))
    night = night or _dt.date.today().isoformat()
    if not NAME.fullmatch(night) or night in ("state.json",):
        raise TunerError(f"--night {night!r} must be a plain folder name (letters, digits, '.', '_' or '-'): "
                         f"the night's folder goes in {runs_dir}")
    night_dir = runs_dir / night
    state_path = runs_dir / "state.json"
    state = read_state(state_path)
    check_jobs(cfg, config_path)
    from tuner.jobs.nightly_order import ordered_jobs
    cfg["jobs"] = ordered_jobs(cfg, log)          # `order: value`: by expected value from the coverage map
    if dry_run:
        return nightly_modes.plan_night(cfg, config_path, runs_dir, night, state, job_request, say=log,
                                        minutes=minutes, begun_of=lambda job, prev: _begun(prev, environment_now(job)))
    nightly_modes.require_devices(cfg, config_path)
    check_writable(runs_dir, "runs_dir")
    with one_night_at_a_time(runs_dir):
        state = read_state(state_path)        # as the night that held the lock left it
        return _run_jobs(cfg, runs_dir, night, night_dir, state_path, state, noise, log, minutes, began)


def one_night_at_a_time(runs_dir: Path):
    """Hold runs_dir/.nightly.lock (an flock the kernel drops when the night ends, kill -9
    included) for the night: a second night on the same runs_dir would read the state before
    the first writes it and write its own over it, losing the first's jobs. It is refused in
    one line instead, with nothing written (the lock file is there already)."""
    import contextlib
    import fcntl

    from tuner.paths import make_folder, open_for_append

    @contextlib.contextmanager
    def held():
        make_folder(runs_dir)
        with open_for_append(runs_dir / ".nightly.lock", runs_dir) as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TunerError(f"another tuner nightly is running on {runs_dir} (it holds "
                                 f"{runs_dir / '.nightly.lock'}); run this one when it is done") from None
            yield
    return held()


def _run_jobs(cfg: dict, runs_dir: Path, night: str, night_dir: Path, state_path: Path, state: dict, noise: float,
              log, minutes: float | None = None, began: float | None = None) -> int:
    from tuner.paths import make_folder
    from tuner.search.window import Window
    window = Window(minutes, began=began) if minutes is not None else None
    make_folder(night_dir, runs_dir)          # inside runs_dir, through no link
    for path, kind in ((night_dir / "report.md", NIGHT_MD), (night_dir / "summary.json", NIGHT_JSON)):
        replaceable(path, kind)               # before the jobs: the night's own files only (file_kinds.py)
    results = []
    jobs = cfg["jobs"]
    if window is not None:          # a slot: the jobs in turn (tuner/jobs/nightly_slot.py)
        from tuner.jobs.nightly_slot import job_order
        jobs = job_order(jobs, state)
    for i, job in enumerate(jobs):
        try:
            results.append(run_job(job, night_dir, state, noise, log, window, len(jobs) - i, i == 0))
        except TunerError as e:
            log(f"{job['name']}: FAILED: {e}")
            results.append({"job": job["name"], "status": "failed", "error": str(e)})
        atomic_write_json(state_path, state, root=runs_dir)     # a later job's crash keeps this one's state
    order = [j["name"] for j in cfg["jobs"]]
    results.sort(key=lambda r: order.index(r["job"]))       # the report in the YAML's order
    lines = [f"# Nightly retune {night}", "", "| job | status | details |", "| --- | --- | --- |"]
    for r in results:
        details = r.get("error") or ", ".join(f"{k} {r[k]}" for k in ("why", "faster", "slower", "kept_previous")
                                             if k in r)
        # a retune begun in an earlier night's window wrote its diff there: linked from here all the same
        link = f" ([diff]({os.path.relpath(r['diff'], night_dir)}))" if r.get("diff") else ""
        lines.append(f"| {r['job']} | {r['status']} | {details}{link} |")
    atomic_write_text(night_dir / "report.md", "\n".join(lines) + "\n", root=runs_dir, kind=NIGHT_MD)
    atomic_write_json(night_dir / "summary.json", results, root=runs_dir, kind=NIGHT_JSON)
    log(f"night {night}: " + ", ".join(f"{r['job']} {r['status']}" for r in results) + f"; report {night_dir / 'report.md'}")
    if window is not None:
        from tuner.jobs.nightly_slot import slot_short_line
        short = slot_short_line(minutes or 0.0, [state.get(r["job"]) for r in results], results)
        if short:
            log(short)
    if any(r["status"] == "failed" for r in results):
        return EXIT_FAILED
    if any(r["status"] == "regressed" for r in results):
        return EXIT_REGRESSED
    return EXIT_OK




def run_nightly(request: NightlyRequest) -> int:
    """`tuner nightly` (tuner.api.nightly): one night, its lines printed as they come."""
    return run_night(Path(request.config), request.night, log=lambda line: print(line, flush=True),
                     dry_run=request.dry_run, synthetic=request.synthetic, minutes=request.minutes,
                     began=request.started)
