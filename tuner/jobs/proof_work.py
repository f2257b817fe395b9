"""The GPU run's work list (`tuner proof`'s window): what to tune, most valuable first, from the
coverage map (tuner/emit/coverage.py): the fused-MoE tables of the model's deployments on this
GPU, each engine's (at the version the proof runs) as `tuner coverage` finds it today: a table
that runs the engine's default config first, then a fallback's, then a shipped one's, by the
gain the committed GPU runs measured for that status (tuned vs the default config; tuned vs
what the engine read); tables the engine's default backend does not read after those it does.
Then the rest of the model's TP8 work: both engines' GEMM tables, MLA decode. Studies finished
in the state folder (its manifest) are not redone; an item whose studies are all done is
dropped. Each item becomes one tuning command of the window (tuner/jobs/proof_steps.py),
its tables going into the state folder, which the commit puts under tuned/ (there `tuner
coverage` shows them as tuned)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from tuner.emit.coverage import STATUSES
from tuner.emit.coverage_report import KINDS
from tuner.errors import TunerError


@dataclass(frozen=True)
class Work:
    """One item of the window's work list: one tuning command, its studies left and their cost."""
    name: str                        # "MoE vllm", "GEMM sglang", "MLA"
    studies: int
    s_per_study: float
    cost_from: str
    kind: str = "moe"                # the tuning command: moe, gemm, mla
    engine: str | None = None
    tp: int = 8
    ep: int = 1
    dtype: str = "fp8_w8a8"
    status: str = ""                 # what the engine runs today for its tables (coverage), "" where not mapped
    gain: float | None = None        # the gain expected over that (what the committed runs measured for it)
    read_by_default: bool = True
    files: tuple[str, ...] = ()      # the table files the engine reads for it
    start_s: float = 0.0             # its command's start-up (paid once, when it has studies left)

    @property
    def seconds(self) -> float:
        return self.studies * self.s_per_study + (self.start_s if self.studies else 0.0)

    @property
    def deployment(self) -> str:
        return f"TP{self.tp}" + (f" EP{self.ep}" if self.ep > 1 else "") + f" {self.dtype.removesuffix('_w8a8')}"

    @property
    def label(self) -> str:
        return f"{self.name} {self.deployment}" if self.kind == "moe" else self.name


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def done_rows(state: Path) -> dict[tuple[str, str, str], int]:
    """{(kernel, engine, problem): batch sizes tuned} of the state folder's manifest."""
    from tuner.reading import read_json_file
    path = state / "manifest.json"
    tables = read_json_file(path, "the state's ").get("tables", []) if path.is_file() else []
    out: dict[tuple[str, str, str], int] = {}
    for t in tables if isinstance(tables, list) else []:
        if not isinstance(t, dict) or not isinstance(t.get("problem"), dict):
            continue
        for engine in (t.get("files") or {}) or ([t["kernel_source"]["source"]] if t.get("not_written") else []):
            key = (str(t.get("kernel")), engine, _key(t["problem"]))
            out[key] = out.get(key, 0) + len(t.get("entries") or {})
    return out


def moe_coverage(model_name: str, gpu, engine_source: list[str] | None, dtypes: tuple[str, ...] | None):
    """(the fused-MoE rows of `model_name` on `gpu` at the engine versions the proof runs, a line
    for each engine whose tables are not at hand)."""
    from tuner.emit.coverage import coverage_map
    from tuner.emit.coverage_sources import measured_gains
    from tuner.emit.engine_tables import locate_installation
    from tuner.plan.engines import ENGINE_NAMES
    from tuner.plan.models import load_model
    installs, notes = [], []
    for engine in ENGINE_NAMES:
        inst = None
        # the proof's engine sources (on the GPU machine: .engine-src/, extracted with the
        # tables), else the installed engine or its wheel ($TUNER_ENGINE_WHEELS)
        for sources in ([engine_source] if engine_source else []) + [None]:
            try:
                inst = locate_installation(engine, engine_source=sources)
                break
            except TunerError:
                continue
        if inst is None or inst.files is None:
            notes.append(f"{engine}'s tables are not at hand (no install, wheel or folder extracted with them): "
                         "its items keep the deployments' order")
            continue
        installs.append(inst)
    rows = coverage_map([(model_name, load_model(model_name))], [gpu], installs, [], measured_gains(),
                        ("fused_moe",)).rows if installs else []
    return [r for r in rows if dtypes is None or r.dtype in dtypes], notes


def expected_gains(rows) -> dict[str, float | None]:
    """The gain tuning is expected to bring over each status, from the committed runs: over the
    default config, every measured table's (tuned vs default); over a fallback or a shipped
    table, the measured tables of that status (tuned vs what the engine read)."""
    from tuner.emit.coverage_sources import Gain
    measured = [r for r in rows if r.gain is not None]
    out: dict[str, float | None] = {"default": Gain.geomean([x for r in measured for x in r.gain.vs_default])}
    for status in ("fallback", "shipped"):
        out[status] = Gain.geomean([x for r in measured if r.status == status for x in r.gain.vs_shipped])
    return out


def moe_items(rows, done: dict, grid: int, cost: dict[str, float], unmapped: list[tuple]) -> list[Work]:
    """One item per deployment and engine, ordered by expected value (see the module docstring);
    `unmapped`: (tp, ep, dtype, engine, its problems) of the engines whose tables are not at
    hand, after the others in the deployments' order."""
    gains = expected_gains(rows)
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.served.tp, r.served.ep, r.dtype, r.engine), []).append(r)
    items = []
    for (tp, ep, dtype, engine), rs in groups.items():
        status = min((r.status for r in rs), key=STATUSES.index)
        left = sum(max(0, grid - done.get(("fused_moe", engine, _key(r.problem)), 0)) for r in rs)
        items.append(Work(f"MoE {engine}", left, cost.get(engine, 0.0), "measured", "moe", engine, tp, ep, dtype,
                          status, gains.get(status), any(r.read_by_default for r in rs), tuple(r.file for r in rs)))
    for tp, ep, dtype, engine, problems in unmapped:
        left = sum(max(0, grid - done.get(("fused_moe", engine, _key(p.params)), 0)) for p in problems)
        items.append(Work(f"MoE {engine}", left, cost.get(engine, 0.0), "measured", "moe", engine, tp, ep, dtype,
                          "unmapped"))
    order = {id(w): i for i, w in enumerate(items)}
    kinds = {(r.served.tp, r.served.ep): KINDS.index(r.served.kind) for r in rows}
    dtypes = list(dict.fromkeys(r.dtype for r in rows))          # the checkpoint's own first
    rank = [*STATUSES, "unmapped"]
    # equal value: one node's deployment, then two nodes', then EP's; the checkpoint's own precision first
    items.sort(key=lambda w: (not w.read_by_default, -(w.gain or 0.0), rank.index(w.status),
                              kinds.get((w.tp, w.ep), 0), dtypes.index(w.dtype) if w.dtype in dtypes else 0,
                              order[id(w)]))
    return [w for w in items if w.studies > 0]


def work_list(model_name: str, gpu, state: Path, cost: dict[str, float], tp: int = 8,
              engine_source: list[str] | None = None, dtypes: tuple[str, ...] | None = None,
              gemm_only: tuple[str, ...] = (), start_s: float = 0.0) -> tuple[list[Work], list[str]]:
    """(the window's items in order, lines on what the order could not know). `cost`: seconds a
    study of each kind ("vllm", "sglang": their MoE studies; "gemm", "mla"); `start_s`: a
    command's start-up (each item is one command)."""
    from tuner.plan.deployment import served_deployments
    from tuner.plan.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES
    from tuner.plan.kernel_registry import batch_grid
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, load_model, mla_problems, moe_problems
    from tuner.plan.precision import served_dtypes
    model = load_model(model_name)
    done = done_rows(state)
    grid = len(DEFAULT_BATCH_SIZES)
    rows, notes = moe_coverage(model_name, gpu, engine_source, dtypes)
    mapped = {r.engine for r in rows}
    unmapped = [(served.tp, served.ep, dtype, engine, moe_problems(model, served.tp, served.ep, dtype, engines=[engine]))
                for dtype in served_dtypes(model) if dtypes is None or dtype in dtypes
                for served in served_deployments(model, gpu, dtype)[0] if model.is_moe
                for engine in ENGINE_NAMES if engine not in mapped]
    items = moe_items(rows, done, grid, cost, unmapped)
    gemm = [p for p in gemm_problems(model, tp) if not gemm_only or any(o in p.key for o in gemm_only)] \
        if model.weight_block_size else []
    for engine in ENGINE_NAMES:
        left = sum(max(0, grid - done.get(("fp8_gemm", engine, _key(p.params)), 0)) for p in gemm)
        if left:
            items.append(Work(f"GEMM {engine}", left, cost.get("gemm", 0.0), "estimated", "gemm", engine, tp))
    if model.is_mla:
        mla = mla_problems(model, tp, DEFAULT_CONTEXTS, 64)[0]
        left = sum(max(0, len(batch_grid("mla_decode")) - done.get(("mla_decode", "tuner", _key(p.params)), 0))
                   for p in mla)
        if left:
            items.append(Work("MLA", left, cost.get("mla", 0.0), "measured", "mla", None, tp))
    return [dataclasses.replace(w, start_s=start_s) for w in items], notes
