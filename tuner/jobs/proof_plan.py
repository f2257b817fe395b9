"""The GPU run's time plan, from what the first GPU run measured (NVIDIA H200, 2026-11-27).

One device command of at most 10 minutes: environment and ceilings, smoke, validation (what is
new of its full list), then one window of tuning for whatever time is left. Each step's box is
what that step took in the H200 run (bench/results/H200-2026-11-27/: steps.json, the journals,
validate/kernels.json) times its margin, at least FLOOR_S: a step that finishes early leaves its
time to the window. The first two steps on a fresh machine (CUDA's start, cold caches, the first
compiles) get COLD_MARGIN, and the environment's box counts the work `tuner ceilings` added since
that run. Validation's box is the start-up of its two commands and the cases it will run (those
bench/validated.json does not hold as passed under the same identity, and one canary per kernel
source: tuner/jobs/proof_validation.py) at the H200 run's measured seconds per case. A step out
of time is stopped (SIGTERM, then SIGKILL after STOP_GRACE_S) and keeps what it wrote. The boxes
must fit within --minutes (else refused: refuse_unfit).

The window's work list (tuner/jobs/proof_work.py), by expected value from the coverage map:
DeepSeek-V3's fused-MoE tables of every deployment on the GPU, those that run the engine's default
config first, then fallbacks, then shipped tables; then both engines' GEMM tables (every TP8
shape), MLA decode, landscapes; what the committed state (tuned/NVIDIA_H200/manifest.json) already
holds is not redone. `tuner proof --plan` prints the boxes, each item with its deployment and
status, and how much of that list a window finishes at the H200 run's measured cost per study and
each command's start-up (`Measured`, read from the committed files).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.jobs import proof_work
from tuner.jobs.proof_work import Work
from tuner.paths import REPO_ROOT

CALLS = {"gpu": ("environment", "smoke", "validate", "window"), "local": ("report", "sampler")}
STEPS = tuple(s for steps in CALLS.values() for s in steps)
MEASURED_RUN = REPO_ROOT / "bench" / "results" / "H200-2026-11-27"
TUNED_STATE = REPO_ROOT / "tuned" / "NVIDIA_H200"      # the committed DeepSeek-V3 H200 state the window continues
MARGIN = 1.3                  # a step's box: its measured time times this (another machine, another cold start)
COLD_MARGIN = 1.6             # ... for the first steps on a fresh machine (CUDA's start, cold caches, first compiles)
FLOOR_S = 15.0                # ... and at least this
STOP_GRACE_S = 20.0           # a step out of time: SIGTERM, then SIGKILL this much later
WINDOW_MINUTES_SHOWN = 12.0   # the plan also shows what a window this long finishes
DEVICE_MINUTES = 9.0          # the device command's --minutes (its timeout_s: bench/README.md)
LOCAL_SHARES = {"report": 0.3, "sampler": 0.7}


@dataclass(frozen=True)
class Measured:
    """What the H200 run took, read from its committed files."""
    where: str
    environment_s: float
    smoke_s: float
    validate_s_per_case: float      # the proof's validate: its seconds but its start-up over the cases it finished
    vllm_s_per_study: float         # tune-vllm's seconds but its start-up over its batch sizes
    sglang_s_per_study: float       # tune-sglang's seconds but its start-up over its studies (up and _down)
    mla_s_per_study: float          # extra/mla-partial: its trials' span over its studies
    gemm_s_per_study: float         # estimated: the landscape step's seconds per timed config x 32 trials
    command_start_s: float = 0.0    # a measuring command's start-up: its start to its first trial (smoke, tune-vllm)

    def per_study(self) -> dict[str, float]:
        """Seconds a study costs, by what the work list calls it (proof_work.Work)."""
        return {"vllm": self.vllm_s_per_study, "sglang": self.sglang_s_per_study, "gemm": self.gemm_s_per_study,
                "mla": self.mla_s_per_study}


def _json(path: Path):
    from tuner.reading import read_json_file
    return read_json_file(path, "the H200 run's ")


def _trial_span_s(journal: Path) -> float:
    """Seconds from the first trial's start to the last one's end in an Optuna journal."""
    from tuner.reading import text_lines
    first = last = None
    for _, line in text_lines(journal, "the H200 run's journal "):
        rec = json.loads(line)
        for key in ("datetime_start", "datetime_complete"):
            if rec.get(key):
                t = _dt.datetime.fromisoformat(rec[key])
                first, last = min(first or t, t), max(last or t, t)
    return (last - first).total_seconds() if first and last else 0.0


def _first_trial_start(journal: Path) -> _dt.datetime:
    """When the first trial of an Optuna journal started."""
    from tuner.reading import text_lines
    for _, line in text_lines(journal, "the H200 run's journal "):
        start = json.loads(line).get("datetime_start")
        if start:
            return _dt.datetime.fromisoformat(start)
    raise ValueError(f"{journal} holds no started trial")


def command_start_s(run: Path) -> float:
    """A measuring command's start-up on the GPU (Python, imports, the plan, the storage, the
    seeds: from its start to its first trial), the mean of the H200 run's smoke and tune-vllm,
    the commands of its first call (whose starts are environment.json's time plus the seconds of
    the steps before them, steps.json)."""
    steps = _json(run / "steps.json")["steps"]
    t0 = _dt.datetime.fromisoformat(_json(run / "environment.json")["written"])
    before = {s["name"]: sum(x["seconds"] for x in steps[:i]) for i, s in enumerate(steps)}
    firsts = {"smoke": _first_trial_start(run / "runs" / "smoke" / "studies.journal"),
              "tune-vllm": _first_trial_start(run / "tuned" / "moe" / "studies.journal")}
    starts = [(first - t0).total_seconds() - before[name] for name, first in firsts.items()]
    return sum(starts) / len(starts)


def measured(run: Path = MEASURED_RUN) -> Measured:
    steps = {s["name"]: s for s in _json(run / "steps.json")["steps"]}
    validated = len(_json(run / "validate" / "kernels.json")["cases"])
    tuned = _json(run / "tuned" / "moe" / "manifest.json")["tables"]

    def studies(engine: str) -> int:
        return sum(len(t["entries"]) for t in tuned if engine in t.get("files", {}))
    mla = _json(run / "extra" / "mla-partial" / "manifest.json")["tables"]
    record = _json(run / "runs" / "record-gemm" / "manifest.json")["tables"]
    trials = sum(e.get("trials") or 0 for t in record for e in t["entries"].values())
    from tuner.reading import text_lines
    points = sum(1 for _ in text_lines(run / "landscapes" / "gemm.jsonl.gz", "the H200 run's landscape ")) - 1
    env = _json(run / "environment.json")
    date = str(_json(run / "ceilings.json").get("measured", ""))[:10]
    start = command_start_s(run)
    return Measured(
        where=f"{env.get('device')}, {date} ({run.relative_to(REPO_ROOT) if run.is_relative_to(REPO_ROOT) else run})",
        environment_s=steps["environment"]["seconds"], smoke_s=steps["smoke"]["seconds"],
        validate_s_per_case=(steps["validate"]["seconds"] - start) / validated,
        vllm_s_per_study=(steps["tune-vllm"]["seconds"] - start) / studies("vllm"),
        sglang_s_per_study=(steps["tune-sglang"]["seconds"] - start) / studies("sglang"),
        mla_s_per_study=_trial_span_s(run / "extra" / "mla-partial" / "studies.journal")
        / sum(len(t["entries"]) for t in mla),
        gemm_s_per_study=steps["landscapes"]["seconds"] / (points + trials) * 32, command_start_s=start)


def validation_cases(model: str = "deepseek-v3", tp: int = 8) -> dict[str, int]:
    """The full validation list's cases: the engines' kernels (their MoE layer and the GEMM
    shapes benched, default configs at 2 batch sizes, each engine's shipped MoE tables at
    them), then ours on every problem of the model (MLA decode included) at 2 batch sizes."""
    from tuner.jobs.proof_steps import GEMM_SHAPES
    from tuner.jobs.proof_validation import precision_case_problems
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, load_model, mla_problems, moe_problems
    m = load_model(model)
    moe = {e: moe_problems(m, tp, 1, "fp8_w8a8", engines=[e]) for e in ("vllm", "sglang")}
    engines = sum(2 * len(ps) for ps in moe.values())                  # default configs, M = 1, 256
    engines += sum(2 * len(ps) for ps in moe.values())                 # their shipped tables at the same M
    engines += 2 * len(GEMM_SHAPES) * 2                                # both engines' GEMM kernels
    engines += sum(len(precision_case_problems(m, tp, e)) for e in ("vllm", "sglang"))   # one M each (issue 52)
    ours = 2 * (len(moe_problems(m, tp, 1, "fp8_w8a8")) + len(gemm_problems(m, tp))
                + min(2, len(mla_problems(m, tp, DEFAULT_CONTEXTS, 64)[0])))
    return {"engines": engines, "ours": ours}


def work_list(cost: Measured, state: Path = TUNED_STATE, model: str = "deepseek-v3", tp: int = 8,
              gpu=None, engine_source: list[str] | None = None) -> tuple[list[Work], list[str]]:
    """The work on this GPU still to do, in the window's order (by expected value from the
    coverage map: tuner/jobs/proof_work.py), less what the state's manifest holds, each
    item one command (its start-up counted once); with the lines on what the order could not know."""
    from tuner.plan.gpus import get_gpu
    return proof_work.work_list(model, gpu or get_gpu("H200"), state, cost.per_study(), tp, engine_source,
                                start_s=cost.command_start_s)


def finished_in(work: list[Work], seconds: float) -> list[tuple[Work, int]]:
    """(item, studies finished) of a window of `seconds`, the items in order."""
    out = []
    for w in work:
        if not w.studies:
            out.append((w, 0))
            continue
        left = seconds - w.start_s                  # the command starts before its first study
        n = 0 if left <= 0 else min(w.studies, int(left // w.s_per_study)) if w.s_per_study > 0 else w.studies
        out.append((w, n))
        seconds = max(0.0, left - n * w.s_per_study)
    return out


@dataclass(frozen=True)
class ValidationPlan:
    """What the validate step will run of its full list (tuner/jobs/proof_validation.py)."""
    cases: int                   # the full list
    run: int                     # new or changed cases and the canaries: what the call runs
    canaries: int
    commands: int                # scripts/validate_kernels.py runs (the engines', ours)
    note: str


def last_gpu_versions(gpu_key: str) -> dict | None:
    """The torch and Triton of the latest committed GPU run on this GPU (bench/results/<gpu>-*/):
    what the plan takes the GPU machine to have."""
    for run in sorted(REPO_ROOT.glob(f"bench/results/{gpu_key}-*/environment.json"), reverse=True):
        env = _json(run)
        if env.get("device_kind", "cuda") == "cuda" and env.get("torch") and env.get("triton"):
            return {"torch": env["torch"], "triton": env["triton"], "from": run.parent.name}
    return None


def validation_identities(gpu_key: str = "H200") -> tuple[list[dict] | None, int, str]:
    """(the identities of the validate step's cases on the GPU `gpu_key`, in run order, or None
    when they cannot be known here; its commands; why not, or where torch and Triton came from).
    The full list is proof_steps.validation_runs' with the engines' code here (.engine-src/,
    installed, or $TUNER_ENGINE_WHEELS); the GPU's torch and Triton are the latest committed
    run's (last_gpu_versions)."""
    from tuner.jobs import proof_validation as pv
    from tuner.jobs.proof_steps import ProofSteps, default_baselines, default_engine_source
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    gpu = get_gpu(gpu_key)
    steps = ProofSteps(REPO_ROOT / "runs" / "plan", gpu, DEVICE_MINUTES, "cuda", default_engine_source(),
                       default_baselines())
    runs = steps.validation_runs()
    versions = last_gpu_versions(gpu.key)
    missing = sorted({"vllm", "sglang"} - set(steps.available_engines()))
    if missing:
        return None, 2, f"{' and '.join(missing)}'s code is not here (.engine-src/, installed, $TUNER_ENGINE_WHEELS)"
    if not steps.shipped_moe_tables():
        # A GPU call carries them (.baselines/; missing_inputs refuses it without): planned without
        # them, their cases would drop out of the count and the plan would promise a shorter step.
        return None, len(runs), "the engines' shipped tables are not here (.baselines/, ../shared/baselines)"
    if versions is None:
        return None, len(runs), f"no committed {gpu.key} run says the GPU machine's torch and Triton"
    on = {"device": gpu.cuda_name, "torch": versions["torch"], "triton": versions["triton"]}
    model = load_model(steps.model())
    idents = [pv.case_identity(k, p, M, c, lb, on) for r in runs
              for _, k, work in pv.groups(r["sources"], model, steps.profile.tp, r["only"], r["batch_sizes"],
                                          r["tables"], steps.engine_source, log=lambda _: None)
              for p, M, c, lb in work]
    return idents, len(runs), (f"{versions['from']} with this code, torch {versions['torch']}, "
                               f"Triton {versions['triton']}")


def validation_plan(gpu_key: str = "H200", ledger: Path | None = None, everything: bool = False) -> ValidationPlan:
    """The validate step's cases on the GPU `gpu_key` (validation_identities) less those the
    ledger records as passed under the same identity, but one canary per kernel source.
    `everything`: every case runs (a rehearsal: the ledger records GPU cases only)."""
    from tuner.jobs import proof_validation as pv
    full = sum(validation_cases().values())
    if everything:
        return ValidationPlan(full, full, 3, 2, "every case (a rehearsal)")
    idents, commands, where = validation_identities(gpu_key)
    if idents is None:
        return ValidationPlan(full, full, 3, commands, f"every case counted as new: {where}")
    decided = pv.decide(idents, pv.read_ledger(ledger or pv.LEDGER))
    recorded = decided.count(pv.RECORDED)
    return ValidationPlan(len(idents), len(idents) - recorded, decided.count(pv.CANARY), commands,
                          f"{recorded} not run again: passed on {where}")


def environment_added_s() -> float:
    """What `tuner ceilings` does since the H200 run took 7 s: the clocks warmed before the
    copy and the FP8 rate (WARMUP_S each), a suspect figure's longer warm-up (RETRY_WARMUP_S),
    and its copy measured again (the 3 sizes x 3 methods, 20 replays of at most 2 GiB at
    4 TB/s: under 1 s)."""
    from tuner.measure.ceiling_checks import RETRY_WARMUP_S, WARMUP_S
    return 2 * WARMUP_S + RETRY_WARMUP_S + 1.0


def device_boxes(cost: Measured, validation: ValidationPlan) -> dict[str, float]:
    """Seconds each step of the device command may take at most (the window: the rest)."""
    def box(seconds: float, margin: float = MARGIN) -> float:
        return max(FLOOR_S, seconds * margin)
    return {"environment": box(cost.environment_s + environment_added_s(), COLD_MARGIN),
            "smoke": box(cost.smoke_s, COLD_MARGIN),
            "validate": box(expected_validate_s(cost, validation))}


def expected_validate_s(cost: Measured, validation: ValidationPlan) -> float:
    return validation.commands * cost.command_start_s + validation.run * cost.validate_s_per_case


def boxes_for(minutes: float, rehearsal: bool, gpu_key: str = "H200") -> dict[str, float]:
    """The device steps' boxes of a call: the GPU's; a rehearsal's (Triton's interpreter is no
    GPU) keep the GPU's proportions to its --minutes (the GPU's are for DEVICE_MINUTES), its
    validation every case."""
    boxes = device_boxes(measured(), validation_plan(gpu_key, everything=rehearsal))
    scale = minutes / DEVICE_MINUTES if rehearsal else 1.0
    return {k: v * scale for k, v in boxes.items()}


def refuse_unfit(order: list[str], minutes: float, boxes: dict[str, float]) -> None:
    """A call whose device steps' boxes do not fit within --minutes is refused (one line)."""
    steps = [n for n in order if n in boxes]
    need = sum(boxes[n] for n in steps)
    if steps and need > minutes * 60:
        parts = ", ".join(f"{n} {boxes[n]:.0f}" for n in steps)
        raise TunerError(f"--minutes {minutes:g} ({minutes * 60:.0f} s) cannot hold the boxes of {' '.join(steps)} "
                         f"({need:.0f} s: {parts}); give --minutes {-(-need // 6) / 10:g} or more, or fewer --steps")


def time_box(order: list[str], i: int, left: float, boxes: dict[str, float] | None = None) -> float:
    """Seconds step order[i] may take when `left` seconds of its call remain: its measured box
    (the window: all that is left; the local steps: their share)."""
    name = order[i]
    if name in LOCAL_SHARES:
        later = sum(LOCAL_SHARES[n] for n in order[i:] if n in LOCAL_SHARES)
        return max(0.0, left * LOCAL_SHARES[name] / later) if later else max(0.0, left)
    if name == "window" or boxes is None or name not in boxes:
        return max(0.0, left)
    return max(0.0, min(left, boxes[name]))


def plan_lines(steps: list[str], minutes: float, device: str, cost: Measured | None = None,
               state: Path = TUNED_STATE, gpu_key: str = "H200", ledger: Path | None = None, gpu=None,
               engine_source: list[str] | None = None) -> list[str]:
    """What `tuner proof --plan` prints: each step's box (from the measured times), what the
    window gets, its work list on `gpu` (each item with its deployment and what the engine runs
    for it today) and how much of it the window and a 12-minute window finish.
    Boxes that do not fit within --minutes are refused (refuse_unfit)."""
    order = [s for s in STEPS if s in steps]
    if not set(order) - set(LOCAL_SHARES):
        return [f"time plan of {' '.join(order)} within --minutes {minutes:g}, here (no GPU): shares "
                + ", ".join(f"{n} {LOCAL_SHARES[n]:g}" for n in order) + " of the time"]
    cost = cost or measured()
    rehearsal = device == "cpu"
    validation = validation_plan(gpu_key, ledger, everything=rehearsal)
    scale = minutes / DEVICE_MINUTES if rehearsal else 1.0
    boxes = {k: v * scale for k, v in device_boxes(cost, validation).items()}
    refuse_unfit(order, minutes, boxes)
    expect = {"environment": cost.environment_s, "smoke": cost.smoke_s,
              "validate": expected_validate_s(cost, validation)}
    where = (f"the CPU device (a rehearsal; the GPU's boxes x{scale:.2g}: --minutes {minutes:g} of "
             f"{DEVICE_MINUTES:g})" if rehearsal else "the GPU")
    lines = [f"time plan of {' '.join(order)} within --minutes {minutes:g} on {where}:",
             f"  boxes: the times measured on {cost.where}, x{MARGIN:g},",
             f"         the first two steps on a fresh machine x{COLD_MARGIN:g}; at least {FLOOR_S:.0f} s"]
    left = worst = minutes * 60.0
    for name in order:
        if name == "window":
            lines.append(f"  window       {max(0.0, worst):6.0f} s at least (every step using its whole box); "
                         f"about {max(0.0, left):.0f} s at the measured times")
        elif name in boxes:
            if name == "validate":
                what = (f"{expect[name]:.0f} s expected: {validation.run} of {validation.cases} cases "
                        f"({validation.canaries} canaries) x {cost.validate_s_per_case:.1f} s + "
                        f"{validation.commands} starts x {cost.command_start_s:.1f} s")
            elif name == "environment":
                what = (f"it took {expect[name]:.0f} s; `tuner ceilings` does up to {environment_added_s():.0f} s "
                        "more since")
            else:
                what = f"it took {expect[name]:.0f} s"
            lines.append(f"  {name:12s} {boxes[name]:6.0f} s box; {what}")
            worst -= boxes[name]
            left -= expect[name] * scale
    if "validate" in order:
        lines.append(f"  validate: {validation.note}")
    lines.append(f"  a stopped step adds at most {STOP_GRACE_S:.0f} s")
    if "window" in order:
        from tuner.plan.gpus import get_gpu
        from tuner.textwidth import fit_line
        gpu = gpu or get_gpu(gpu_key)
        work, notes = work_list(cost, state, gpu=gpu, engine_source=engine_source)
        lines.append(f"work list (deepseek-v3 on the {gpu.key}, less what {_rel(state)} holds), by expected value from "
                     "`tuner coverage`: status, what the engine runs today; expected, the gain the committed runs "
                     "measured over that; flag: read only with the engine's backend flag; at the cost per study "
                     "measured (est.: estimated),")
        lines.append(f"  each item one command: its start-up ({cost.command_start_s:.1f} s) counted once")
        wide = max([len(w.deployment) for w in work if w.kind == "moe"] + [8])
        for w in work:
            where = w.deployment if w.kind == "moe" else "TP8 every shape" if w.kind == "gemm" else "TP8 every context"
            today = (f"  {w.status:8s} " + (f"{w.gain:.3g}x expected" if w.gain else "not measured")
                     + ("" if w.read_by_default else ", flag")) if w.kind == "moe" else ""
            lines.append(f"  {w.name:11s} {where:{max(wide, 17)}s} {w.studies:4d} studies x {w.s_per_study:5.1f} s = "
                         f"{w.seconds:5.0f} s{' est.' if w.cost_from == 'estimated' else ''}{today}")
        lines.append("  landscapes  with what is left")
        lines += [f"  note: {n}" for n in notes]
        for label, seconds in (("this run's window", max(0.0, left)),
                               (f"a {WINDOW_MINUTES_SHOWN:g}-minute window", WINDOW_MINUTES_SHOWN * 60)):
            got = finished_in(work, seconds)
            lines.append(f"{label} ({seconds:.0f} s) finishes: "
                         + ", ".join(f"{w.label} {n}/{w.studies}" for w, n in got if n or w is got[0][0]))
            lines.append("  left: " + ", ".join(f"{w.label} {w.studies - n}" for w, n in got if w.studies > n))
        lines = [part for line in lines for part in fit_line(line, 120)]
    return lines


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
