"""One kernel's run: check its inputs, make the measurer (a replayed landscape, or the GPU or
CPU device in a child process, recording a landscape on request), store the plan, run the
studies here (tuner/pipeline/studies.py) or in one `tuner worker` process per GPU, then write
the tables and manifest from what the storage holds (tuner/pipeline/emission.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from optuna.storages import BaseStorage

from tuner.errors import TunerError
from tuner.measure.environment import now_iso
from tuner.measure.landscape import Landscape, LandscapeWriter, landscape_source
from tuner.measure.measurers import Measurer, RecordingMeasurer, ReplayMeasurer
from tuner.measure.policy import check_replay_policy, replay_policy
from tuner.paths import remove_stale_temporaries
from tuner.pipeline.baselines import check_baselines
from tuner.pipeline.emission import collect
from tuner.pipeline.replay_coverage import replay_coverage
from tuner.pipeline.run_plan import RunPlan, run_storage
from tuner.pipeline.stored_plans import check_plan, open_run_storage, save_plan, storage_exists
from tuner.pipeline.studies import time_unit, tune_all
from tuner.progress import Progress
from tuner.search.settings import StudyResult
from tuner.search.storage_urls import shown
from tuner.search.window import Window, WindowClosed, measuring_in


def run_tuning(opts: RunPlan, window: Window | None = None) -> dict[str, list[StudyResult]]:
    """Tune every (problem, M) (here, or in one worker process per GPU), then write the
    tables and the manifest from what the storage holds; returns the results. With a window
    (--minutes) the studies go by value until its time is up (tuner/pipeline/windows.py)."""
    progress = Progress(len(opts.problems) * len(opts.batch_sizes), enabled=not opts.quiet, unit=time_unit(opts))
    progress.interpreted = opts.device == "cpu" and not opts.replay
    t0 = opts.started if opts.started is not None else time.monotonic()   # planning, a synthetic landscape: counted
    # Every input is checked before the first write: the shipped tables to beat, the landscape.
    check_baselines(opts)
    # What a killed run's atomic writes left (those no live writer holds: tuner/paths.py).
    remove_stale_temporaries(opts.out_dir)
    # A storage that is there already may hold another plan: refused before anything is written
    # (a --record landscape, the storage itself).
    storage = open_run_storage(opts) if storage_exists(opts) else None
    if storage is not None:
        check_plan(storage, opts)
    if len(opts.gpus) > 1 and not opts.replay and window is not None:
        raise TunerError("--minutes runs on one GPU: give --gpus one GPU, or no --minutes")
    if len(opts.gpus) > 1 and not opts.replay:
        from tuner.search.identity import CPU_DEVICE, GPU
        opts.times = CPU_DEVICE if opts.device == "cpu" else GPU
        storage = storage or open_run_storage(opts)
        save_plan(storage, opts)
        _say_notes(opts, progress)
        run_gpu_workers(opts, progress)
    else:
        with window.alarm() if window else contextlib.nullcontext():
            try:
                with measuring_in(window, starting=True):
                    measurer = make_measurer(opts, progress)    # checks a landscape before anything is written
            except WindowClosed:
                progress.note("the window closed while the measuring worker started: nothing measured")
                if storage is None:
                    return {}
            else:
                storage = _tune_here(opts, storage, measurer, progress, window)
    results = collect(opts, storage)
    ended = "the window closed" if window is not None and window.closed else "done"
    from tuner.emit.results import MANIFEST
    # what is there to read: the tables, or (no study finished yet) only the trials in the storage
    where = (f"tables and manifest in {opts.out_dir}/" if (opts.out_dir / MANIFEST).is_file() else
             f"no table written yet (no row tuned yet); the trials measured are kept in {shown(run_storage(opts))}")
    progress.note(f"{ended} in {time.monotonic() - t0:.0f}s; {where}")
    return results


def _tune_here(opts: RunPlan, storage: BaseStorage | None, measurer: Measurer, progress: Progress,
               window: Window | None) -> BaseStorage:
    """The studies against this process's measurer (closed after); returns the storage."""
    from tuner.search.identity import times_of
    opts.times = times_of(measurer)
    try:
        if isinstance(measurer, ReplayMeasurer):
            opts.problems, opts.plan_ms = replay_coverage(opts, measurer, progress.note)
            progress.total = max(1, sum(len(v) for v in opts.plan_ms.values()))
        storage = storage or open_run_storage(opts)
        save_plan(storage, opts)
        _say_notes(opts, progress)
        tune_all(opts, storage, measurer, progress, after_study=lambda: collect(opts, storage, quiet=True),
                 window=window)
    finally:
        measurer.close()
    return storage


def work(opts: RunPlan, storage: BaseStorage, quiet: bool = False) -> None:
    """A worker's share of a stored run (`tuner worker`, or one started per GPU by
    run_gpu_workers): the plan's studies against this machine's measurer, shared with every
    other worker on the storage."""
    progress = Progress(sum(len(opts.ms_for(p)) for p in opts.problems), enabled=not quiet, unit=time_unit(opts))
    measurer = make_measurer(opts, progress)
    try:
        tune_all(opts, storage, measurer, progress)
    finally:
        measurer.close()


def make_measurer(opts: RunPlan, progress: Progress) -> Measurer:
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
                                            policy=opts.policy or None, on_wait=progress.waiting)
    if not opts.record:
        return gpu_m
    try:
        env = gpu_m.environment()
        header = {"format": "tuner-landscape/1", "kernel": opts.kernel.name, **landscape_source(opts.kernel),
                  "device": env["device"], **({"device_kind": "cpu"} if opts.device == "cpu" else {}),
                  "triton": env.get("triton"), "torch": env.get("torch"), "cuda": env.get("cuda"),
                  "driver": env.get("driver"), "space": opts.space.version, "recorded": now_iso(),
                  **({"policy": env["policy"]} if env.get("policy") else {})}
        writer = LandscapeWriter(opts.record, opts.kernel, header)
    except BaseException:
        gpu_m.close()      # its children go with a refusal (another run recording into the file)
        raise
    land = Landscape(header, opts.kernel, str(opts.record))
    grid = lambda p, m: opts.space.configs(p.params, m, opts.gpu)  # noqa: E731
    return RecordingMeasurer(gpu_m, writer, land, grid, progress=progress.note)


def _say_notes(opts: RunPlan, progress: Progress) -> None:
    """The run's own lines (the deployment its --tp is for), said once it has passed every check:
    a refusal stays one line."""
    for line in opts.notes:
        progress.note(f"tuner: {line}")


def run_gpu_workers(opts: RunPlan, progress: Progress) -> None:
    """One `tuner worker` process per GPU, all on the run's storage; wait for them."""
    url = run_storage(opts)
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
