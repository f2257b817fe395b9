"""`tuner drift`: does an installed (or given) table still beat the default config here?

Each table file is recognised by its name (the engines' naming rules, tuner/plan/engines.py),
its configs and the engines' default config are timed together on the present GPU and
software (or a replayed landscape), and every M gets a verdict. Two configs per M, not a
search: minutes, not hours.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import TunerError
from tuner.file_kinds import DRIFT_JSON
from tuner.jobs.requests import DriftRequest
from tuner.measure.measurers import Measurer
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.table_files import TableFile, find_tables

if TYPE_CHECKING:                  # pandas loads when a drift runs, not for `tuner --help`
    import pandas as pd

def measure_drift(tables: list[TableFile], measurer_for: "Measurers", noise: float = 0.02) -> pd.DataFrame:
    """measurer_for: Measurers (the kernel that times each engine's table, and its
    measurer). Per table and M: the table's config and the default config, timed in the
    same call."""
    from tuner.measure import ceilings
    from tuner.measure.noise import for_environment
    from tuner.plan.engines import lookup_nearest
    from tuner.plan.kernel_api import checked_config
    from tuner.plan.space import load_space
    from tuner.search.tied_choice import table_default
    roof = ceilings.load(measurer_for.gpu)
    for t in tables:                   # every entry checked before anything is timed
        kernel = measurer_for.kernel(t.problem.kernel, t.engine, t.problem.params)
        for key, entry in t.table.items():
            checked_config(kernel, entry, f"{t.path}: the entry for M={key}")
    rows = []
    for t in tables:
        kernel = measurer_for.kernel(t.problem.kernel, t.engine, t.problem.params)
        space = load_space(kernel, problems=[t.problem])
        measurer = measurer_for(kernel)
        for key in sorted(t.table, key=int):
            M = int(key)
            # equivalent forms (GROUP_SIZE_M folding) are one point of a landscape
            same = lambda c: space.canonical(t.problem.params, M, measurer_for.gpu, c)  # noqa: E731
            try:
                cfg = same(t.table[key])
                tied = lookup_nearest(t.tied_to.table, M) if t.tied_to is not None else None
                default = same(table_default(kernel, t.problem, M, tied))
            except (KeyError, TypeError, ValueError):
                raise TunerError(f"{t.path}: the entry for M={key} (or its tied table's) is not a config of "
                                 f"{', '.join(kernel.config_keys)}") from None
            mine, base = measurer.measure(t.problem, M, [cfg, default])
            # the engine times the table in its own process: within the between-process noise is a tie
            between = for_environment(measurer.environment())
            band = max(noise, mine.spread or 0, base.spread or 0, between.spread if between else 0)
            if mine.time_us is None:
                verdict = "fails"
            elif base.time_us is None:
                verdict = "wins"
            elif mine.time_us < base.time_us * (1 - band):
                verdict = "wins"
            elif mine.time_us > base.time_us * (1 + band):
                verdict = "loses"
            else:
                verdict = "same"
            rows.append({"table": str(t.path), "engine": t.engine, "kernel": kernel.name,
                         "default": "the up table's entry" if t.tied_to is not None else "the engine's default",
                         "kernel_source": kernel.source_label,
                         "problem": t.problem.key, "M": M, "table_us": mine.time_us, "default_us": base.time_us,
                         "speedup": (base.time_us / mine.time_us) if mine.time_us and base.time_us else None,
                         "floor_us": roof.floor_us(kernel.bytes_moved(t.problem.params, M),
                                                   kernel.flops(t.problem.params, M)),
                         "verdict": verdict, "error": mine.error, "default_error": base.error,
                         "failure": mine.kind if mine.time_us is None else None})
    import pandas as pd
    return pd.DataFrame(rows)


def policy_lines(measurers: "Measurers", paths: list[str]) -> str:
    """How this drift timed (the measurer's policy, or the replayed landscape's) and how the
    tables' own results were timed, where a results folder's manifest says."""
    from tuner.measure.policy import policy_text
    env = measurers.environment()
    lines = [f"timed: {policy_text(env.get('policy')) if env.get('policy') else 'as the landscape was recorded'}"]
    for p in paths:
        manifest = Path(p) / "manifest.json"
        if manifest.is_file():
            from tuner.errors import TunerError
            from tuner.reading import read_json_file
            try:
                data = read_json_file(manifest, "manifest")
            except TunerError:
                continue
            tuned = data.get("measurement") if isinstance(data, dict) else None
            lines += [f"tables of {p}", f"  were tuned: {policy_text(tuned if isinstance(tuned, dict) else None)}"]
    return "\n".join(lines)


class Measurers:
    """The kernel that times each engine's tables (the engine's own by default, as tuning
    does) and one measurer per kernel, made on first use: a replayed landscape or the GPU."""

    def __init__(self, gpu, replay: str | None = None, compile_workers: int = 8,
                 kernel_source: str | None = None, engine_source: list[str] | None = None, device: str = "cuda",
                 policy: dict | None = None):
        from tuner.measure.device import CpuDevice, CudaDevice, check_kind
        from tuner.plan.kernel_registry import source_mode
        self.gpu, self.replay, self.compile_workers = gpu, replay, compile_workers
        self.device = check_kind(device)
        self.label = (CpuDevice if device == "cpu" else CudaDevice).label
        self.mode = source_mode(kernel_source, replay)
        self.engine_source = engine_source
        self.policy = policy                 # how to time: --timing, --l2 (tuner/measure/policy.py)
        self._made: dict = {}

    def kernel(self, name: str, engine: str, params: dict | None = None) -> KernelSpec:
        """The kernel that times `engine`'s table of `name` (for a problem's `params`: the
        engine launcher's variant that runs it)."""
        from tuner.plan.kernel_registry import as_recorded, kernel_for
        return as_recorded(kernel_for(name, engine, self.mode, self.engine_source, load_code=not self.replay,
                                      params=params), self.replay)

    def __call__(self, kernel: KernelSpec) -> Measurer:
        key = (kernel.name, kernel.source, kernel.variant)       # an engine launcher's variant: a kernel of its own
        if key not in self._made:
            if self.replay:
                from tuner.measure.device import device_name
                from tuner.measure.measurers import ReplayMeasurer
                self._made[key] = ReplayMeasurer.from_file(self.replay, kernel, device_name(self.device, self.gpu))
            else:
                from tuner.measure.device import require
                from tuner.measure.isolation import isolated_gpu_measurer
                require(self.device, self.gpu, "re-timing tables", "--replay FILE re-times them from a "
                        "recorded landscape")
                self._made[key] = isolated_gpu_measurer(kernel, self.gpu.key, self.compile_workers,
                                                        device=self.device, policy=self.policy)
        return self._made[key]

    def environment(self) -> dict:
        return next((m.environment() for m in self._made.values()), {})

    def close(self) -> None:
        for m in self._made.values():
            m.close()


def traffic_lines(df: pd.DataFrame, tables: list[TableFile], profile, model, source: str,
                  tp: int | None = None, device: str | None = None, synthetic: bool = False) -> list[str]:
    """Drift judged by traffic: per table, the traffic-weighted speedup of the table over the
    default (each served M timed at the entry the engine would use) next to the plain
    geomean over its entries; per engine, with a model, the estimated kernel time per pass."""
    from tuner.measure.noise import for_device, speedup, within
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.traffic import geomean, speedup_text, step_estimate, step_text, weighted
    noise = for_device(device, synthetic)
    lines = [*profile.describe()]
    per_engine: dict[str, list] = {}
    missing = []
    for t in tables:
        part = df[df["table"] == str(t.path)]
        if part.empty:
            continue
        keys = [int(k) for k in t.table]
        default = {int(r.M): r.default_us for r in part.itertuples()}
        mine = {int(r.M): r.table_us for r in part.itertuples()}
        w = weighted(profile, (keys, default), (keys, mine))
        plain = geomean(part["speedup"])
        lines.append(f"{t.path.name} [{t.engine}]: {speedup_text(w, 'the default')}"
                     + (f" (within the {noise.describe()}: not a speed-up)"
                        if noise is not None and within(w.speedup, noise) else "")
                     + (f" (plain geomean {speedup(plain, noise)} over {len(part)} entries)" if plain else ""))
        if model is not None:
            count = get_kernel(t.problem.kernel).layers_per_pass
            layers = count(model, t.problem.params, tp) if count else None
            if layers is None:
                missing.append(t.path.name)
            else:
                per_engine.setdefault(t.engine, []).append((layers, (keys, default), (keys, mine)))
    if model is None:
        lines.append("estimated time per forward pass: give --model for the layer counts")
    for engine, rows in sorted(per_engine.items()):
        lines.append(f"{engine}, {model.name}: {step_text(step_estimate(profile, rows), source)}")
    if missing:
        lines.append(f"not in the per-pass estimate ({model.name} runs no such shape): {', '.join(missing)}")
    return lines


def run_drift(request: DriftRequest) -> int:
    from tuner.measure.failures import count_by_kind, summary
    from tuner.paths import atomic_write_json
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model

    gpu = get_gpu(request.gpu)
    if request.replay and not Path(request.replay).is_file():
        raise TunerError(f"landscape {request.replay} not found")
    if request.out:                 # before timing: only drift's rows are replaced there
        from tuner.paths import check_output
        check_output(Path(request.out), DRIFT_JSON)
    model = load_model(request.model) if request.model else None
    profile = None
    if request.traffic:
        from tuner.plan.traffic import load_profile
        profile = load_profile(request.traffic, request.tp)
    tables = find_tables(request.tables, model, request.routing)
    measurers = Measurers(gpu, request.replay, kernel_source=request.kernel_source, engine_source=request.engine_source,
                          device=request.device, policy={"timing": request.timing, "l2": request.l2})
    try:
        df = measure_drift(tables, measurers, request.noise)
    finally:
        measurers.close()
    from tuner.measure.provenance import banner
    print(banner(measurers.environment(), "replay" if request.replay else measurers.label))
    print(policy_lines(measurers, request.tables))
    for line in drift_table(df):
        print(line)
    losing = df[df["verdict"].isin(["loses", "fails"])]
    print(f"{len(losing)} of {len(df)} entries no longer beat the default" if len(losing)
          else f"all {len(df)} entries still win or tie")
    failed = count_by_kind(df["failure"])
    if failed:
        print(f"tables' configs that failed, by kind: {summary(failed)}")
    if profile is not None:
        from tuner.measure.provenance import is_synthetic, time_source
        env = measurers.environment()
        for line in traffic_lines(df, tables, profile, model, time_source(env, "replay" if request.replay else "gpu"),
                                  request.tp, env.get("device"), is_synthetic(env)):
            print(line)
    if request.out:
        atomic_write_json(Path(request.out), df.to_dict(orient="records"), kind=DRIFT_JSON)
    return 0


def drift_table(df) -> list[str]:
    """Drift rows for a terminal, within 120 columns: the table file each row re-times (the
    engine and the name's shape, the rest of the name said above), times to two decimals, a
    failed time as '-' with its reason."""
    from tuner.emit.run_table import fixed_width, name_legend, short_file

    def num(v):
        return f"{v:.2f}" if isinstance(v, float) and v == v else "-"
    rows = []
    for r in df.to_dict("records"):
        note = "; ".join(x for x in ((f"table: {r['error']}" if isinstance(r["error"], str) else ""),
                                     (f"default: {r['default_error']}" if isinstance(r["default_error"], str) else ""))
                         if x)
        rows.append([short_file({r["engine"]: r["table"]}), str(r["M"]), r["kernel_source"], num(r["table_us"]),
                     num(r["default_us"]), num(r["speedup"]), r["verdict"], note[:40]])
    legend = name_legend(list(zip(df["engine"], df["table"])))
    head = ["file: the table each row re-times", *([f"      named {legend}"] if legend else [])]
    return head + fixed_width(["file", "M", "kernel", "table_us", "default_us", "speedup", "verdict", "note"], rows,
                              left=(0, 2, 6, 7))