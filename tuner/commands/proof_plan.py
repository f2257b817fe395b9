"""The GPU run's time plan, from what the first GPU run measured (NVIDIA H200, 2026-11-27).

One device command of at most 10 minutes: environment and ceilings, smoke, validation (its
full list), then one window of tuning for whatever time is left (tuner/commands/proof_window.py).
Each step's box is what that step took in the H200 run (bench/results/H200-2026-11-27/:
steps.json, validate/kernels.json) times MARGIN, at least FLOOR_S: a step that finishes early
leaves its time to the window. Validation's box is its full list (the engines' kernels and
shipped tables, then ours on every DeepSeek-V3 TP8 problem, MLA decode included) at the H200
run's measured seconds per case. A step out of time is stopped (SIGTERM, then SIGKILL after
STOP_GRACE_S) and keeps what it wrote.

The window's work list, in order: both engines' MoE tables at the engines' full batch-size
grid, then both engines' GEMM tables (every DeepSeek-V3 TP8 shape), then MLA decode, then
landscapes; what the committed state (tuned/NVIDIA_H200/manifest.json) already holds is not
redone. `tuner proof --plan` prints the boxes and how much of that list a window finishes at
the H200 run's measured cost per study (`Measured`, read from the committed files).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

from tuner.commands import proof_work
from tuner.commands.proof_work import Work
from tuner.paths import REPO_ROOT

CALLS = {"gpu": ("environment", "smoke", "validate", "window"), "local": ("report", "sampler")}
STEPS = tuple(s for steps in CALLS.values() for s in steps)
MEASURED_RUN = REPO_ROOT / "bench" / "results" / "H200-2026-11-27"
TUNED_STATE = REPO_ROOT / "tuned" / "NVIDIA_H200"      # the committed DeepSeek-V3 H200 state the window continues
MARGIN = 1.3                  # a step's box: its measured time times this (another machine, another cold start)
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
    validate_s_per_case: float      # the proof's validate: its seconds over the cases it finished
    vllm_s_per_study: float         # tune-vllm's seconds over its batch sizes
    sglang_s_per_study: float       # tune-sglang's seconds over its studies (up and _down)
    mla_s_per_study: float          # extra/mla-partial: its trials' span over its studies
    gemm_s_per_study: float         # estimated: the landscape step's seconds per timed config x 32 trials

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
    return Measured(
        where=f"{env.get('device')}, {date} ({run.relative_to(REPO_ROOT) if run.is_relative_to(REPO_ROOT) else run})",
        environment_s=steps["environment"]["seconds"], smoke_s=steps["smoke"]["seconds"],
        validate_s_per_case=steps["validate"]["seconds"] / validated,
        vllm_s_per_study=steps["tune-vllm"]["seconds"] / studies("vllm"),
        sglang_s_per_study=steps["tune-sglang"]["seconds"] / studies("sglang"),
        mla_s_per_study=_trial_span_s(run / "extra" / "mla-partial" / "studies.journal")
        / sum(len(t["entries"]) for t in mla),
        gemm_s_per_study=steps["landscapes"]["seconds"] / (points + trials) * 32)


def validation_cases(model: str = "deepseek-v3", tp: int = 8) -> dict[str, int]:
    """The full validation list's cases: the engines' kernels (their MoE layer and the GEMM
    shapes benched, default configs at 2 batch sizes, each engine's shipped MoE tables at
    them), then ours on every problem of the model (MLA decode included) at 2 batch sizes."""
    from tuner.commands.proof_steps import GEMM_SHAPES
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, load_model, mla_problems, moe_problems
    m = load_model(model)
    moe = {e: moe_problems(m, tp, 1, "fp8_w8a8", engines=[e]) for e in ("vllm", "sglang")}
    engines = sum(2 * len(ps) for ps in moe.values())                  # default configs, M = 1, 256
    engines += sum(2 * len(ps) for ps in moe.values())                 # their shipped tables at the same M
    engines += 2 * len(GEMM_SHAPES) * 2                                # both engines' GEMM kernels
    ours = 2 * (len(moe_problems(m, tp, 1, "fp8_w8a8")) + len(gemm_problems(m, tp))
                + min(2, len(mla_problems(m, tp, DEFAULT_CONTEXTS, 64)[0])))
    return {"engines": engines, "ours": ours}


def work_list(cost: Measured, state: Path = TUNED_STATE, model: str = "deepseek-v3", tp: int = 8,
              gpu=None, engine_source: list[str] | None = None) -> tuple[list[Work], list[str]]:
    """The work on this GPU still to do, in the window's order (by expected value from the
    coverage map: tuner/commands/proof_work.py), less what the state's manifest holds; with
    the lines on what the order could not know."""
    from tuner.plan.gpus import get_gpu
    return proof_work.work_list(model, gpu or get_gpu("H200"), state, cost.per_study(), tp, engine_source)


def finished_in(work: list[Work], seconds: float) -> list[tuple[Work, int]]:
    """(item, studies finished) of a window of `seconds`, the items in order."""
    out = []
    for w in work:
        n = min(w.studies, int(max(0.0, seconds) // w.s_per_study)) if w.s_per_study > 0 else w.studies
        out.append((w, n))
        seconds -= n * w.s_per_study
    return out


def device_boxes(cost: Measured, cases: dict[str, int]) -> dict[str, float]:
    """Seconds each step of the device command may take at most (the window: the rest)."""
    def box(seconds: float) -> float:
        return max(FLOOR_S, seconds * MARGIN)
    return {"environment": box(cost.environment_s), "smoke": box(cost.smoke_s),
            "validate": box(cost.validate_s_per_case * sum(cases.values()))}


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
               state: Path = TUNED_STATE, gpu=None, engine_source: list[str] | None = None) -> list[str]:
    """What `tuner proof --plan` prints: each step's box (from the measured times), what the
    window gets, its work list (each item with its deployment and what the engine runs for it
    today) and how much of it the window and a 12-minute window finish."""
    cost = cost or measured()
    cases = validation_cases()
    boxes = device_boxes(cost, cases)
    expect = {"environment": cost.environment_s, "smoke": cost.smoke_s,
              "validate": cost.validate_s_per_case * sum(cases.values())}
    order = [s for s in STEPS if s in steps]
    if not set(order) - set(LOCAL_SHARES):
        return [f"time plan of {' '.join(order)} within --minutes {minutes:g}, here (no GPU): shares "
                + ", ".join(f"{n} {LOCAL_SHARES[n]:g}" for n in order) + " of the time"]
    where = "the CPU device (a rehearsal; boxes as on the GPU)" if device == "cpu" else "the GPU"
    lines = [f"time plan of {' '.join(order)} within --minutes {minutes:g} on {where}:",
             f"  boxes: the times measured on {cost.where}, x{MARGIN:g}, at least {FLOOR_S:.0f} s"]
    left = worst = minutes * 60.0
    for name in order:
        if name == "window":
            lines.append(f"  window       {max(0.0, worst):6.0f} s at least (every step using its whole box); "
                         f"about {max(0.0, left):.0f} s at the measured times")
        elif name in boxes:
            lines.append(f"  {name:12s} {boxes[name]:6.0f} s box; " + (
                f"{expect[name]:.0f} s expected: {cases['engines']} + {cases['ours']} cases at the "
                f"{cost.validate_s_per_case:.1f} s a case measured" if name == "validate" else
                f"it took {expect[name]:.0f} s"))
            worst -= boxes[name]
            left -= expect[name]
    lines.append(f"  a stopped step adds at most {STOP_GRACE_S:.0f} s")
    if "window" in order:
        from tuner.plan.gpus import get_gpu
        from tuner.textwidth import fit_line
        gpu = gpu or get_gpu("H200")
        work, notes = work_list(cost, state, gpu=gpu, engine_source=engine_source)
        lines.append(f"work list (deepseek-v3 on the {gpu.key}, less what {_rel(state)} holds), by expected value from "
                     "`tuner coverage`: status, what the engine runs today; expected, the gain the committed runs "
                     "measured over that; flag: read only with the engine's backend flag; at the cost per study "
                     "measured (est.: estimated):")
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
