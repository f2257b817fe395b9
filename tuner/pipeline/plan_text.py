"""The plan a dry run prints: what is tuned, on whose kernel, into which files, how many configs
survive pruning and the roofline floor per batch size. Light on purpose: a plan loads neither
Optuna, pandas, torch nor Triton (tests/test_api.py checks)."""

from __future__ import annotations

from tuner.measure import ceilings
from tuner.measure.environment import installed_version
from tuner.measure.policy import policy_text
from tuner.pipeline.run_plan import RunPlan, run_storage
from tuner.plan.engines import ENGINES, reading_note
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem
from tuner.search.budget import budget_lines, pruned_sizes
from tuner.search.settings import StudyResult
from tuner.search.stopping import CONFIDENCE
from tuner.search.storage_urls import shown


def plan_text(opts: RunPlan) -> str:
    k, gpu = opts.kernel, opts.gpu
    lines = [f"plan: {k.name} ({k.description}) on {gpu.cuda_name}",
             f"  {opts.run_info.get('model', '')}  " + "  ".join(
                 f"{key}={opts.run_info[key]}" for key in ("tp", "ep", "dtype") if key in opts.run_info),
             *([f"  precision: {opts.run_info['precision']}"] if opts.run_info.get("precision") else []),
             f"  kernel: {kernel_origin_text(k)}",
             f"  search space {opts.space.source}: {opts.space.size} configs before pruning; "
             f"keys {', '.join(k.config_keys)}",
             (f"  budget {opts.settings.budget} trials per batch size" if not opts.settings.budgets else
              f"  budget sized by the space: {opts.settings.sized} (--trials N fixes it)" if opts.settings.sized else
              f"  budget by traffic: {sum(opts.settings.budget_for(opts.problems[0], m) for m in opts.batch_sizes)} "
              f"trials per problem over {len(opts.batch_sizes)} batch sizes ({opts.settings.budget} each on average)")
             + f", sampler {opts.settings.sampler}",
             f"  stop: {stop_text(opts)}; the budget is a cap",
             *budget_lines(opts.settings, pruned_sizes(opts.space, opts.problems, opts.batch_sizes, gpu)),
             f"  timing: {timing_text(opts)}",
             f"  storage {shown(run_storage(opts))}",
             f"  output {opts.out_dir}/"]
    triton_version = installed_version("triton")
    roof = ceilings.load(gpu)
    lines.append(f"  roofline floor: the larger of (fewest bytes moved / copy bandwidth) and (FLOPs / FP8 matmul "
                 f"rate), from {roof.source} ({roof.copy_tb_s:g} TB/s, {roof.fp8_tflops:g} TFLOP/s); no config "
                 "runs much faster")
    if opts.warm is not None:
        lines += [f"  {line}" for line in opts.warm.describe(opts.settings.row_gain)]
    if k.warm_across and len(opts.problems) > 1:
        from tuner.search.warm_start import SHAPE_SEEDS
        lines.append(f"  and {SHAPE_SEEDS} seeds per study from the nearest {'/'.join(k.warm_across)} already tuned "
                     "in this run (its nearest batch size), besides that share")
    if opts.traffic is not None:
        lines += traffic_plan_lines(opts)
    for p in opts.problems:
        lines.append(f"problem {p.key}  ({', '.join(p.layers)})"
                     + (f"  [{k.measurement_note(p.params)}]" if k.measurement_note(p.params) else ""))
        for name, path in planned_files(opts, p, triton_version):
            lines.append(f"  {name:7s} {path}")
        sizes = [f"{m}:{len(opts.space.configs(p.params, m, gpu))}" for m in opts.ms_for(p)]
        lines.append("  configs after pruning, per M: " + " ".join(sizes))
        floor = [f"{m}:{roof.floor_us(k.bytes_moved(p.params, m), k.flops(p.params, m)):.1f}" for m in opts.ms_for(p)]
        lines.append("  roofline floor, us per M: " + " ".join(floor))
    # one study per (problem, M), however many engines' tables it writes (a GEMM's both engines')
    studies = {(p.key, m): (p, m) for p in opts.problems for m in opts.ms_for(p)}
    total = len(studies)
    most = sum(opts.settings.budget_for(p, m) for p, m in studies.values())
    if all(opts.ms_for(p) == list(opts.batch_sizes) for p in opts.problems):
        lines.append(f"{len({p.key for p in opts.problems})} problems x {len(opts.batch_sizes)} batch sizes = {total} studies, "
                     f"at most {most} measured configs")
    else:       # a replay's: the batch sizes its landscape times, per problem (above)
        lines.append(f"{len({p.key for p in opts.problems})} problems, {total} studies (the batch sizes the landscape times, per "
                     f"problem above), at most {most} measured configs")
    lines.append(expected_text(opts))
    lines += engine_reading_notes(k.table_kind, {e for p in opts.problems for e in p.engines},
                                  opts.problems[0].params if opts.problems else None)
    return "\n".join(lines)


def stop_text(opts: RunPlan) -> str:
    """When a study stops before its budget (tuner/search/stopping.py)."""
    from tuner.measure.noise import threshold_text
    s = opts.settings
    if s.patience and not s.patience_share:
        return f"after {s.patience} measured trials without a {s.min_gain:.1%} gain (--patience)"
    return (f"when no config it has not measured is {1 - CONFIDENCE:.0%} likely to change the table (a gain above "
            f"{threshold_text(s.row_gain)})")


def expected_text(opts: RunPlan) -> str:
    """What the plan is expected to cost on its GPU, from measured costs (tuner/pipeline/price.py)."""
    from tuner.pipeline.price import RESULTS, plan_price, price_line
    price = plan_price(opts)
    if price is None:
        return (f"  expected: not priced (no measured costs of a GPU run on {opts.gpu.key} under "
                f"{RESULTS.relative_to(RESULTS.parents[1])}/*/costs.json)")
    line = price_line(price, opts)
    if opts.request.replay or getattr(opts.request, "synthetic", False):
        # the price says what the plan would cost measured on its GPU; a replay spends none (found by a new-user pass)
        line += "\n    a replay measures nothing and spends no GPU time: that is what measuring this plan would take"
    return line


def traffic_plan_lines(opts: RunPlan) -> list[str]:
    """The keys a traffic profile chose, what each serves, and its budget (the plan)."""
    from tuner.plan.traffic import key_coverage
    profile = opts.traffic
    if profile is None:
        return []
    lines = [f"  {line}" for line in profile.describe()]
    lines.append("  keys (by the engines' nearest-key rule: the served M each key's entry runs, their share of the "
                 "forward passes, trials):")
    for c in key_coverage(opts.batch_sizes, profile):
        budget = opts.settings.budget_for(opts.problems[0], c.key) if opts.problems else opts.settings.budget
        lines.append(f"    {c.text()}; {budget} trials")
    lines.append("  where a tuned config does not beat the default beyond noise (2% or its spread), the table gets "
                 "the default")
    return lines


def engine_reading_notes(table_kind: str, engines, params: dict | None = None) -> list[str]:
    """What makes each engine read tables of this kind (of the precision of `params`) on Hopper
    (tuner/plan/engines.py)."""
    notes = [(e, reading_note(e, table_kind, params)) for e in sorted(engines) if e in ENGINES]
    return [f"when {ENGINES[e].facts_for} reads these tables on Hopper: {note}" for e, note in notes if note]


def timing_text(opts: RunPlan) -> str:
    """How the plan's times are taken: a dry run of --synthetic has no landscape to replay yet,
    and must not claim the GPU's timing."""
    if opts.request.synthetic:
        return "none: a SYNTHETIC cost model gives every time (no kernel runs)"
    return "replayed: as the landscape was recorded" if opts.replay else policy_text(opts.policy or None)


def kernel_origin_text(kernel: KernelSpec) -> str:
    """Whose code times the tables, its version and where it was read from, in words."""
    if kernel.source == "ours":
        return f"ours (kernels/, tuner {kernel.source_version}, code {kernel.code_version})"
    if not kernel.origin:
        return (f"{kernel.source_label} (code not loaded: timings come from a landscape, or none were taken; the "
                f"launcher supports {kernel.source} {', '.join(kernel.notes.get('launcher_supports', []))})")
    supported = ", ".join(kernel.notes.get("launcher_supports", []))
    launched = kernel.notes.get("launched_as")
    how = (f"supported: launched as {launched}" + (" (same wrappers)" if launched != kernel.source_version else "")
           if launched else "not checked")
    files = kernel.notes.get("engine_files")
    if files:
        from tuner.plan.kernel_sources import imported_files_text
        imports = "; " + imported_files_text(files)
    else:
        imports = ""
    return (f"{kernel.source_label} ({how}; the launcher supports {kernel.source} {supported}), read from "
            f"{kernel.origin} (code {kernel.code_version}){imports}")


def planned_files(opts: RunPlan, p: Problem, triton_version: str) -> list[tuple[str, str]]:
    """(who reads it, relative path) of each file a problem's results go to."""
    k = opts.kernel
    if k.emit_table is not None:
        m = opts.batch_sizes[0]
        stand_in = StudyResult(p, m, k.default_config(p.params, m), None, None, {}, None, 0, "plan")
        _, file_of = k.emit_table([(p, [stand_in])], opts.gpu.cuda_name)
        return [("tuner", file_of[p.key])]
    return [(name, ENGINES[name].table_relpath(k.table_kind, p.params, opts.gpu.cuda_name, triton_version))
            for name in opts.engines if name in p.engines]
