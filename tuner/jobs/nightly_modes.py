"""`tuner nightly --dry-run` and `--synthetic`: a night that can be tried without a GPU.

--dry-run: every job's plan (what the night would compare, retune and write), nothing written
  and nothing measured; it refuses what the night would refuse before its first job.
--synthetic: every job that names no landscape of its own is timed on a SYNTHETIC one its run
  makes (the cost model, `tuner gemm|moe|mla --synthetic`), and the night's drift check and
  kept-config comparison replay that run's landscape. Such nights go to RUNS_DIR-synthetic, so
  that a real night never compares its tables with made-up times.
Without either, a job that times on a GPU needs one: the night refuses up front, writing nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

SYNTHETIC_DEVICE = "SYNTHETIC cost model"


def synthetic_job(job: dict) -> dict:
    """The job as a --synthetic night runs it (unchanged when it replays its own landscape)."""
    return job if job.get("replay") else {**job, "synthetic": True}


def synthetic_runs_dir(runs_dir: Path) -> Path:
    """RUNS_DIR-synthetic, beside RUNS_DIR: a runs_dir naming no folder of its own ('.', '/',
    '..') has no such neighbour, and is refused in one line."""
    from tuner.errors import TunerError
    if runs_dir.name in ("", ".", ".."):
        raise TunerError(f"runs_dir {str(runs_dir)!r} names no folder of its own, and a --synthetic night goes to "
                         "a folder beside it (RUNS_DIR-synthetic): give runs_dir a folder's name, such as runs/nightly")
    return runs_dir.with_name(runs_dir.name + "-synthetic")


def run_landscape(job: dict, run: Path) -> str | None:
    """The landscape a job's times replay from in `run`: its own, or the SYNTHETIC one its
    run made (None: the job times on the GPU)."""
    if job.get("replay") or not job.get("synthetic"):
        return job.get("replay")
    from tuner.pipeline.request import KERNEL_OF
    return str(run / f"synthetic-{KERNEL_OF[job['kernel']]}.jsonl.gz")


def require_devices(cfg: dict, path: Path) -> None:
    """Before anything is written: every job that times on a GPU finds its GPU (one line
    naming the job otherwise, and what can be done without one)."""
    from tuner.errors import TunerError
    from tuner.measure.device import require_gpu
    from tuner.plan.gpus import get_gpu
    for job in cfg["jobs"]:
        if job.get("replay") or job.get("synthetic"):
            continue
        try:
            require_gpu(get_gpu(str(job["gpu"])).cuda_name, "its run", "try --dry-run or --synthetic")
        except TunerError as e:
            raise TunerError(f"job {job['name']!r}: {e}") from None


def plan_night(cfg: dict, path: Path, runs_dir: Path, night: str, state: dict, job_request,
               say=print, minutes: float | None = None, begun_of=None) -> int:
    """What `tuner nightly --dry-run` prints: each job's plan, then the files the night would
    write (with --minutes, the slot: the jobs' turn, their shares, each job's studies left and first).
    Writes nothing. `job_request` and `begun_of(job, state entry)` (the folder of a retune an earlier
    window began, that the night continues) are nightly's own (passed in: nightly imports this module,
    so importing it back would be a cycle)."""
    from tuner.pipeline.tune import tune
    night_dir = runs_dir / night
    say(f"dry run of the night {night} of {path}: nothing is measured or written")
    jobs, shares = cfg["jobs"], dict[str, float]()
    if minutes is not None:
        from tuner.jobs.nightly_slot import slot_lines
        jobs, shares = slot_lines(jobs, state, minutes, say)
    for job in jobs:
        name = job["name"]
        prev = state.get(name)
        out = night_dir / name
        begun = None
        if prev and prev.get("unfinished"):
            # as the night decides (tuner/jobs/nightly.py run_job): the retune an earlier window began,
            # continued in its folder where the environment is the same, against the run before it
            begun = begun_of(job, prev) if begun_of is not None else None
            out = begun or out
            prev = {"run": prev["baseline"]} if prev.get("baseline") else None
        prev_run = Path(prev["run"]) if prev and Path(prev["run"], "manifest.json").is_file() else None
        times = ("SYNTHETIC landscape made by its run" if job.get("synthetic") and not job.get("replay")
                 else f"landscape {job['replay']}" if job.get("replay") else f"the GPU ({job['gpu']})")
        say("")
        say(f"job {name}: tuner {job['kernel']} --model {job['model']} --gpu {job['gpu']}, timed on {times}")
        if begun is not None:
            say(f"  continues the retune an earlier window began in {begun}"
                + (f", against {prev_run}" if prev_run is not None else ""))
        elif prev_run is None:
            say(f"  first run: tunes every table into {out}")
        else:
            say(f"  compares the environment with {prev_run}'s and checks its tables' drift; retunes into "
                f"{out} if either changed, keeping each previous config not beaten beyond noise")
        if job.get("install"):
            say(f"  then installs the tables for {job['install']['engine']}")
        req = dataclasses.replace(job_request(job, out, prev_run, shares.get(name)), dry_run=True, quiet=False)
        tune(req, say=lambda line: say("\n".join("  " + ln if ln else ln for ln in str(line).splitlines())))
    say("")
    say(f"the night would write {night_dir}/ (each job's folder, report.md, summary.json) and {runs_dir / 'state.json'}")
    return 0
