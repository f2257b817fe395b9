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
GEMM_ENGINES = ("vllm", "sglang")


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


@dataclass(frozen=True)
class Work:
    """One item of the window's work list: its studies left and what each costs."""
    name: str
    studies: int
    s_per_study: float
    cost_from: str

    @property
    def seconds(self) -> float:
        return self.studies * self.s_per_study


def validation_cases(model: str = "deepseek-v3", tp: int = 8) -> dict[str, int]:
    """The full validation list's cases: the engines' kernels (their MoE layer and the GEMM
    shapes benched, default configs at 2 batch sizes, each engine's shipped MoE tables at
    them), then ours on every problem of the model (MLA decode included) at 2 batch sizes."""
    from tuner.commands.proof_steps import GEMM_SHAPES, precision_case_problems
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


def work_list(cost: Measured, state: Path = TUNED_STATE, model: str = "deepseek-v3", tp: int = 8) -> list[Work]:
    """The DeepSeek-V3 TP8 work on the H200 still to do, in the window's order, less what the
    committed state's manifest holds."""
    from tuner.plan.engines import DEFAULT_BATCH_SIZES
    from tuner.plan.kernel_registry import batch_grid
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, load_model, mla_problems, moe_problems
    m = load_model(model)
    tables = _json(state / "manifest.json")["tables"] if (state / "manifest.json").is_file() else []

    def done(kernel: str, engine: str) -> int:
        return sum(len(t.get("entries") or {}) for t in tables
                   if t.get("kernel") == kernel and engine in (t.get("files") or {}))
    grid = len(DEFAULT_BATCH_SIZES)
    moe = {e: len(moe_problems(m, tp, 1, "fp8_w8a8", engines=[e])) for e in ("vllm", "sglang")}
    gemm = len(gemm_problems(m, tp))
    mla = len(mla_problems(m, tp, DEFAULT_CONTEXTS, 64)[0]) * len(batch_grid("mla_decode"))
    return [
        Work("MoE vllm", moe["vllm"] * grid - done("fused_moe", "vllm"), cost.vllm_s_per_study, "measured"),
        Work("MoE sglang", moe["sglang"] * grid - done("fused_moe", "sglang"), cost.sglang_s_per_study, "measured"),
        *(Work(f"GEMM {e}", gemm * grid - done("fp8_gemm", e), cost.gemm_s_per_study, "estimated")
          for e in GEMM_ENGINES),
        Work("MLA", mla - done("mla_decode", "tuner"), cost.mla_s_per_study, "measured"),
    ]


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
               state: Path = TUNED_STATE) -> list[str]:
    """What `tuner proof --plan` prints: each step's box (from the measured times), what the
    window gets, and how much of the DeepSeek-V3 H200 work it and a 12-minute window finish."""
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
        work = work_list(cost, state)
        lines.append(f"work list (DeepSeek-V3 TP8 on the H200, less what {_rel(state)} holds), at the cost per "
                     "study measured:")
        for w in work:
            lines.append(f"  {w.name:11s} {w.studies:4d} studies x {w.s_per_study:5.1f} s = {w.seconds:6.0f} s "
                         f"({w.cost_from})")
        lines.append("  landscapes  with what is left")
        for label, seconds in (("this run's window", max(0.0, left)),
                               (f"a {WINDOW_MINUTES_SHOWN:g}-minute window", WINDOW_MINUTES_SHOWN * 60)):
            got = finished_in(work, seconds)
            lines.append(f"{label} ({seconds:.0f} s) finishes: "
                         + ", ".join(f"{w.name} {n}/{w.studies}" for w, n in got if n or w is got[0][0]))
            lines.append("  left: " + ", ".join(f"{w.name} {w.studies - n}" for w, n in got if w.studies > n))
    return lines


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
