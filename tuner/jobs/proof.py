"""`tuner proof`: the GPU run, one device command of at most 10 minutes, and a local part.

GPU time is rare (a lent machine, 15 minutes of device time for a task, one command at most 10
minutes, a machine start 1-2 minutes), so the GPU run is one command whose every minute becomes
tables (bench/README.md):

  gpu      environment   GPU, driver, clocks, versions; `tuner ceilings`
           smoke         one MoE config (vLLM's, M=16) through the isolated measurer with compile
                         workers (`tuner moe --trials 1`); when nothing is timed the call stops
                         there, saying the first failure
           validate      scripts/validate_kernels.py, the full list: the engines' kernels and each
                         engine's shipped MoE tables, then ours on every problem (MLA decode too)
           window        whatever time is left, continuing the committed state (tuned/<device>/):
                         both engines' MoE tables at the engines' batch-size grid, both engines'
                         GEMM tables, MLA decode, then a landscape (tuner/jobs/proof_steps.py)
  local    report        `tuner report` of the state folder's tables
           sampler       the sampler study over the recorded landscapes
Each step's box comes from what it took in the H200 run of 2026-11-27 (tuner/jobs/proof_plan.py);
every step runs as child processes, is stopped when out of time (keeping what it measured), says
what it timed and the first failure when it timed nothing (tuner/jobs/proof_outcomes.py),
and writes into the output folder before the next starts. With `--bundle DIR` (the device
tool's $OUT) a tarball of the folder and summary.md are rewritten after every step and whenever
a table or landscape lands, so a call that is cut still returns what it measured;
scripts/commit_gpu_proof.sh unpacks it and commits it. With `--device cpu` the same steps run
on the CPU device (tuner/measure/device.py, every timed run held to CUDA-graph capture's rules)
with a tiny model: the rehearsal CI runs, so that the GPU run runs code CI ran; its times are
labelled CPU DEVICE everywhere.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.file_kinds import LOG, PROOF_BUNDLE, PROOF_ENV, PROOF_MD, PROOF_STEPS
from tuner.jobs.proof_outcomes import step_outcome
from tuner.jobs.proof_plan import CALLS, STEPS, STOP_GRACE_S, time_box  # noqa: F401 - STOP_GRACE_S: shared
from tuner.jobs.proof_steps import Command, ProofSteps, _last_line, default_baselines, default_engine_source
from tuner.jobs.requests import ProofRequest
from tuner.measure.process_tree import child_of_this_process, stop_group
from tuner.paths import REPO_ROOT, atomic_write_file, atomic_write_json, atomic_write_text, make_folder, open_for_append
from tuner.plan.gpus import GpuSpec

BUNDLE_EVERY_S = 10.0        # while a step runs: look this often for a new table to bundle
WINDOW_CLOSE_S = 15.0        # a window command told --minutes: this much before its box ends
STOPPED_BY_SMOKE = "not run: the smoke test timed no config"


@dataclass
class StepResult:
    name: str
    status: str                          # ok, failed, out of time, skipped
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


@dataclass
class Proof(ProofSteps):
    """The proof's orchestration: its steps (ProofSteps) in order within their time boxes, what
    they measured kept, summarized and bundled after each."""
    results: list[StepResult] = field(default_factory=list)
    _bundled_at: float = 0.0

    # -- running commands inside a time box --------------------------------------------
    def run(self, commands: list[Command], seconds: float) -> StepResult:
        """Run the commands in order within `seconds`; each writes its own log. While one
        runs, whatever it finishes (a table, a landscape) is bundled as it lands."""
        t0 = time.monotonic()
        detail, status = [], "ok"
        for c in commands:
            left = seconds - (time.monotonic() - t0)
            if left <= 1:
                detail.append(f"{c.label}: not started, out of time")
                status = "out of time"
                continue
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
            argv = c.argv
            floor = self.progress_floor_s() if c.window else 0.0
            if c.window and left - WINDOW_CLOSE_S < floor:
                # a tuning command given less than one command takes here to time its first config
                # (the smoke) ends having measured nothing, and says so with exit 1: not started
                detail.append(f"{c.label}: not started, {left:.0f}s left, less than a command takes here "
                              f"to time its first config and close ({floor + WINDOW_CLOSE_S:.0f}s)")
                status = "out of time"
                continue
            if c.window:
                # the tuning command stops itself on time (writing every table it has rows for)
                # before the box's SIGTERM; a margin for its closing writes
                argv = [*argv, "--minutes", f"{max(0.1, (left - WINDOW_CLOSE_S) / 60):.2f}"]
            started = time.monotonic()
            with open_for_append(self.out / c.log, self.out, truncate=True, kind=LOG) as f:
                f.write(f"$ {' '.join(argv)}\n")
                f.flush()
                # its own process group: a timeout stops it and its children (the measuring
                # child and its compile workers die with it: tuner/measure/process_tree.py); and it
                # is sent SIGTERM when this process dies, kill -9 included, so no step runs
                # on outside its time box
                proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                                        start_new_session=True, preexec_fn=child_of_this_process(signal.SIGTERM))
                try:
                    rc = self._wait(proc, started + left)
                except BaseException:            # SIGTERM or Ctrl-C of the proof: the step stops too
                    stop_group(proc)
                    raise
            took = time.monotonic() - started
            stray = leftovers(proc.pid)
            if stray:                      # never on a GPU the next step needs: say so, and end them
                detail.append(f"{c.label}: {len(stray)} of its processes outlived it (killed)")
                status = "failed"
            if rc is None:
                detail.append(f"{c.label}: out of time after {took:.0f}s (kept what it wrote; log {c.log})")
                status = "out of time" if status == "ok" else status
            elif rc != 0:
                # its last line says why (a tuning command's: the studies that timed nothing, the first failure)
                detail.append(f"{c.label}: failed, exit {rc} after {took:.0f}s (log {c.log}): "
                              f"{_last_line(self.out / c.log)}")
                status = "failed"
            else:
                detail.append(f"{c.label}: ok in {took:.0f}s")
        return StepResult("", status, time.monotonic() - t0, detail)

    def progress_floor_s(self) -> float:
        """What a window command needs before its first config is timed, on this machine: the
        smoke's seconds (its start-up and one config through the measuring path) when this proof
        ran it, in this call or an earlier one into the same folder; 0 when it did not."""
        smoke = [r for r in self.results if r.name == "smoke" and r.status == "ok"]
        return smoke[-1].seconds if smoke else 0.0

    def _wait(self, proc: subprocess.Popen, deadline: float) -> int | None:
        """The command's exit status, or None when it ran out of time (then stopped: SIGTERM,
        which it answers by keeping what it has, then SIGKILL)."""
        while True:
            left = deadline - time.monotonic()
            try:
                return proc.wait(timeout=max(0.1, min(left, BUNDLE_EVERY_S)))
            except subprocess.TimeoutExpired:
                if left > BUNDLE_EVERY_S:
                    self.bundle_if_changed()
                    continue
            break
        stop_group(proc)
        return None

    # -- the whole proof ---------------------------------------------------------------
    def keep_partial_landscapes(self) -> list[str]:
        """A recording stopped by its time box leaves FILE.partial: keep it, gzipped."""
        kept = []
        for partial in (self.out / "landscapes").glob("*.partial"):
            target = partial.with_name(partial.name[: -len(".partial")])
            target = target if target.name.endswith(".gz") else target.with_name(target.name + ".gz")
            target = target.with_name(target.name.replace(".jsonl.gz", ".partial.jsonl.gz"))
            if partial.is_symlink() or not partial.is_file():
                continue

            def fill(tmp: Path, partial: Path = partial) -> None:
                with open(partial, "rb") as src, gzip.open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            atomic_write_file(target, fill, root=self.out)
            partial.unlink()
            kept.append(target.name)
        return kept

    def previous_results(self) -> list[StepResult]:
        """Steps an earlier call into the same folder ran (the proof is split over calls);
        a steps.json that is not a proof's is one line, not a crash."""
        from tuner.reading import read_json_file
        path = self.out / "steps.json"
        if not path.exists():
            return []
        data = read_json_file(path, "the proof's ", "; give another --out, or move it aside")
        steps = data.get("steps") if isinstance(data, dict) else None
        out = []
        for r in steps if isinstance(steps, list) else [None]:
            if not (isinstance(r, dict) and r.get("name") in STEPS and isinstance(r.get("status"), str)
                    and isinstance(r.get("seconds", 0.0), (int, float)) and isinstance(r.get("detail", []), list)
                    and all(isinstance(d, str) for d in r.get("detail", []))):
                raise TunerError(f"{path} is not a proof's record of its steps; give another --out, or move it aside")
            out.append(StepResult(r["name"], r["status"], float(r.get("seconds", 0.0)), list(r.get("detail", []))))
        return out

    def execute(self, steps: list[str] | tuple[str, ...], log=print) -> int:
        """Run `steps` (in the proof's order) within --minutes; earlier calls' results are
        kept beside them. 0 when none failed, 1 otherwise."""
        make_folder(self.out)
        budget = self.minutes * 60.0
        t0 = time.monotonic()
        order = [s for s in STEPS if s in steps]
        previous = self.previous_results()
        self.results = [r for r in previous if r.name not in order]
        boxes = self.boxes()
        builders = self.builders()
        stopped = None
        for i, name in enumerate(order):
            left = budget - (time.monotonic() - t0)
            seconds = time_box(order, i, left, boxes)    # tuner/jobs/proof_plan.py
            if stopped:
                result = StepResult(name, "skipped", 0.0, [stopped])
            else:
                log(f"[proof] {name}: up to {seconds:.0f}s")
                started = time.monotonic()
                try:
                    commands = builders[name]()
                except TunerError as e:
                    result = StepResult(name, "failed", 0.0, [str(e)])
                else:
                    try:
                        result = self.run(commands, seconds) if commands else StepResult(name, "skipped", 0.0,
                                                                                           ["nothing to do"])
                    except KeyboardInterrupt:        # SIGTERM or Ctrl-C: the step (stopped) is said, then we go
                        self.results.append(StepResult(name, "interrupted", time.monotonic() - started,
                                                       ["stopped by a signal; run the proof again to redo it"]))
                        self.write_summary(time.monotonic() - t0)
                        self.write_bundle(log)
                        raise
            result.name = name
            if name == "window":
                if self.window_note:
                    result.detail.insert(0, self.window_note)
                result.detail += [f"kept the partial landscape {k}" for k in self.keep_partial_landscapes()]
            outcome = step_outcome(self.out, name) if result.status not in ("skipped",) else None
            if outcome is not None and outcome.line():
                result.detail.append(outcome.line() or "")
                if not outcome.timed and result.status == "ok":
                    result.status = "failed"        # a step that timed nothing failed, whatever its exit status
            if name == "smoke":
                stopped = self.smoke_verdict(result)
            self.results.append(result)
            for line in result.detail:
                log(f"[proof]   {line}")
            log(f"[proof] {name}: {result.status} ({result.seconds:.0f}s)")
            self.write_summary(time.monotonic() - t0)            # after every step: nothing is lost
            self.write_bundle(log)
        log(f"[proof] summary: {self.out / 'summary.md'}")
        if self.bundle is not None and set(order) & set(CALLS["gpu"]):
            log(f"[proof] next, here: bash scripts/commit_gpu_proof.sh <files_at>/{self.bundle_name()}")
        return 1 if any(r.status == "failed" for r in self.results if r.name in order) else 0

    def smoke_verdict(self, result: StepResult) -> str | None:
        """Why the rest of the call is not run (None: it is). A smoke test that finished and
        timed no config says the GPU path is broken: the call stops there, with the first
        failure. One cut by its box (out of time) proves nothing: the call goes on, and
        validation and the window say whether the path works."""
        if result.status == "skipped":
            return None
        why = self.smoke_timed()
        if not why:
            return None
        if result.status == "out of time":
            result.detail.append(f"the smoke test was cut by its box before it timed a config ({why}); "
                                 "the call goes on")
            return None
        result.status = "failed"
        result.detail.append(f"the smoke test failed: {why}; the rest of this call is not run")
        return f"{STOPPED_BY_SMOKE} ({why})"

    def boxes(self) -> dict[str, float]:
        """Each device step's box, from the H200 run's measured times (tuner/jobs/proof_plan.py)."""
        from tuner.jobs.proof_plan import boxes_for
        return boxes_for(self.minutes, self.rehearsal, "H200")

    def write_summary(self, elapsed: float) -> None:
        from tuner.jobs.proof_summary import summary_markdown
        atomic_write_json(self.out / "steps.json", {"device": self.device, "minutes": self.minutes,
                                                    "elapsed_s": elapsed, "gpu": self.gpu.key,
                                                    "steps": [r.__dict__ for r in self.results]}, indent=2,
                          root=self.out, kind=PROOF_STEPS)
        atomic_write_text(self.out / "summary.md", summary_markdown(self.out, self.results, self.device, elapsed),
                          root=self.out, kind=PROOF_MD)

    # -- what comes back from a device call ---------------------------------------------
    def check_outputs(self) -> None:
        """Before the first step: in the folders the user named (--out, --bundle), only the proof's
        own files are replaced (tuner/file_kinds.py); its logs are checked as each is opened."""
        from tuner.paths import replaceable
        targets = [(self.out / "summary.md", PROOF_MD, "--out"), (self.out / "environment.json", PROOF_ENV, "--out")]
        if self.bundle is not None:
            targets += [(self.bundle / self.bundle_name(), PROOF_BUNDLE, "--bundle"),
                        (self.bundle / "summary.md", PROOF_MD, "--bundle")]
        for path, kind, option in targets:
            replaceable(path, kind, f"{option} {path.parent}: {path.name}")

    def bundle_name(self) -> str:
        return f"proof-{self.out.name}.tar.gz"

    def arcname(self) -> str:
        """The tarball's top folder: where bench/README.md says to unpack it (the repository
        root) puts the folder back at bench/results/<name>/."""
        return f"bench/results/{self.out.name}"

    def write_bundle(self, log=None) -> Path | None:
        """The output folder as one tarball (top folder bench/results/<name>) and summary.md,
        into --bundle, each written whole (renamed into place)."""
        if self.bundle is None:
            return None
        target = self.bundle / self.bundle_name()

        def fill(tmp: Path) -> None:
            with tarfile.open(tmp, "w:gz") as tar:        # links are stored as links, never followed
                tar.add(self.out, arcname=self.arcname(), filter=_no_temporaries)
        atomic_write_file(target, fill, root=self.bundle, kind=PROOF_BUNDLE)
        if (self.out / "summary.md").is_file():
            from tuner.reading import read_text
            atomic_write_text(self.bundle / "summary.md", read_text(self.out / "summary.md"), root=self.bundle,
                              kind=PROOF_MD)
        self._bundled_at = time.time()
        size = target.stat().st_size
        if log and size > 12 << 20:
            log(f"[proof] warning: {target.name} is {size >> 20} MiB; the device tool returns 16 MiB per file")
        return target

    def bundle_if_changed(self) -> None:
        """Bundle again when a table, manifest or landscape changed since the last bundle."""
        if self.bundle is None:
            return
        newest = 0.0
        for path in self.out.rglob("*"):
            if path.suffix in (".json", ".gz", ".partial", ".md") and path.is_file():
                newest = max(newest, path.stat().st_mtime)
        if newest > self._bundled_at:
            self.write_bundle()


def leftovers(sid: int, grace_s: float = 5.0) -> list[int]:
    """Processes of a finished command's session still alive after `grace_s` (a resource
    tracker takes a moment to notice its clients are gone); they are killed."""
    from tuner.measure.process_tree import members
    deadline = time.monotonic() + grace_s
    while (alive := members(sid=sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return alive


def _no_temporaries(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = Path(info.name).name
    return None if name.endswith(".tmp") or name.startswith(".tmp") else info


def default_out(gpu: GpuSpec, device: str) -> Path:
    date = _dt.date.today().isoformat()
    if device == "cpu":                  # a rehearsal never writes under bench/results/
        return REPO_ROOT / "runs" / f"proof-cpu-device-{gpu.key}-{date}"
    return REPO_ROOT / "bench" / "results" / f"{gpu.key}-{date}"


def engine_sources(given: list[str] | None) -> list[str] | None:
    """The engines' code (and tables) the proof runs: --engine-source, else .engine-src/'s folders."""
    return [os.path.abspath(e) for e in given] if given else default_engine_source()


def steps_of(call: str | None, steps: list[str] | None) -> list[str]:
    """The steps a call runs (`--call gpu|local`), or those named (`--steps`); default all."""
    if call and steps:
        raise TunerError("give --call or --steps, not both")
    if call:
        return list(CALLS[call])
    return list(steps or STEPS)


def run_proof(request: ProofRequest) -> int:
    from tuner.measure.device import require
    from tuner.plan.gpus import get_gpu
    gpu = get_gpu(request.gpu)
    if not 0 < request.minutes <= 24 * 60:            # NaN fails this too
        raise TunerError(f"--minutes must be more than 0 and at most a day, not {request.minutes}")
    steps = steps_of(request.call, request.steps)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise TunerError(f"--steps {' '.join(unknown)}: not a step; the steps are {' '.join(STEPS)}")
    if request.plan:
        from tuner.jobs.proof_plan import plan_lines
        for call in CALLS:
            chosen = [s for s in CALLS[call] if s in steps]
            if chosen:
                print("\n".join(plan_lines(chosen, request.minutes, request.device, gpu=gpu,
                                            engine_source=engine_sources(request.engine_source))))
        return 0
    if any(s not in CALLS["local"] for s in steps):
        from tuner.jobs.proof_plan import boxes_for, refuse_unfit
        refuse_unfit([s for s in STEPS if s in steps], request.minutes, boxes_for(request.minutes, request.device == "cpu"))
        if request.device == "cuda" and set(steps) & {"smoke", "validate", "window"}:
            missing = ProofSteps(Path("."), gpu, request.minutes, request.device, default_engine_source()
                                 if not request.engine_source else [os.path.abspath(e) for e in request.engine_source],
                                 Path(request.baselines) if request.baselines else default_baselines()).missing_inputs()
            if missing:
                from tuner.jobs.proof_steps import MAKE_INPUTS
                raise TunerError(f"missing {', '.join(missing)}: {MAKE_INPUTS}")
        require(request.device, gpu, "the GPU proof", "--device cpu rehearses it on the CPU device")
    # absolute before anything runs: the steps run from the repository root, where a relative
    # --out would land in the checkout instead of where the user stands
    out = Path(os.path.abspath(request.out)) if request.out else default_out(gpu, request.device)
    from tuner.paths import check_writable
    # both before the first step: a step's results that cannot be bundled would be lost
    check_writable(out, "--out")
    if request.bundle:
        check_writable(Path(request.bundle), "--bundle")
    baselines = Path(request.baselines) if request.baselines else default_baselines()
    if request.baselines and not Path(request.baselines).is_dir():
        raise TunerError(f"--baselines {baselines} is not a folder")
    engine_source = [os.path.abspath(e) for e in request.engine_source] if request.engine_source else None
    proof = Proof(out, gpu, request.minutes, request.device, engine_source or default_engine_source(),
                          Path(os.path.abspath(baselines)) if baselines else None,
                          Path(os.path.abspath(request.bundle)) if request.bundle else None)
    proof.check_outputs()
    return proof.execute(steps, log=lambda line: print(line, flush=True))
