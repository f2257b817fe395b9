"""`tuner bench`: every contender for each (problem, M), timed in one call, against the roofline.

Contenders, per problem and batch size M:
  default            the engine's launch with no table (the kernel's default config);
  shipped (<engine> reads)  the row each engine reads today at M (its installed package, or
                     --engine-source, or $TUNER_ENGINE_WHEELS), resolved as a tuning run's
                     incumbent is (tuner/pipeline/incumbents.py: SGLang's Triton fallback too);
  shipped <name>     each --baseline folder's table (the engines' shipped ones), its entry for M;
  tuned              our table (--tuned RUN_DIR), its entry for M (without one, a row says so);
  landscape best     the best config of a replayed or recorded landscape, where one covers it;
  reference          an implementation outside Triton where the device's software has one
                     (GEMM: torch._scaled_mm with block scales, DeepGEMM if importable).
Configs are timed together on one measurer (a GPU, or with --replay a landscape), so they
are comparable; the roofline floor is the larger of bytes / copy bandwidth and FLOPs / FP8
rate, from measured ceilings where bench/ceilings/<gpu>.json exists, else the datasheet.
Every time is labelled with where it came from. The references: tuner/jobs/bench_references.py;
what is written and printed: bench_output.py.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.jobs.bench_output import BenchRow, bench_header, bench_table, traffic_lines, write_outputs
from tuner.jobs.bench_references import reference_rows
from tuner.jobs.requests import BenchRequest
from tuner.measure.ceilings import Ceilings
from tuner.measure.provenance import short_label, time_source
from tuner.pipeline.command_problems import problem_builder, resolve_tp
from tuner.pipeline.planning import command_dtype, kernel_runs, only_problems
from tuner.pipeline.request import DTYPES
from tuner.plan.engines import DEFAULT_BATCH_SIZES, lookup_nearest
from tuner.plan.kernel_api import KernelSpec, config_dict, config_from_entry
from tuner.plan.problems import Problem


@dataclass
class Contender:
    name: str
    config: dict | None = None          # None: a reference implementation, not a config
    note: str = ""



def tuned_table(run_dir: Path, kernel: KernelSpec, problem: Problem) -> dict | None:
    """Our table for this problem, timed on this kernel source, from a run's manifest."""
    from tuner.emit.results import read_manifest
    for t in read_manifest(run_dir).get("tables", []):
        src = (t.get("kernel_source") or {}).get("source", "ours")
        if (t.get("kernel") == kernel.name and src == kernel.source
                and Problem(t["kernel"], t["problem"]).key == problem.key):
            table = {m: e["config"] for m, e in (t.get("entries") or {}).items() if e.get("config")}
            return table or None
    return None


def contenders(kernel: KernelSpec, gpu, problem: Problem, M: int, baselines: list[tuple[str, str]],
               tuned: Path | None, landscape=None, engine_reads: list | None = None) -> list[Contender]:
    """The configs (and references) to time for one problem and M: the default, the row each
    engine reads today (`engine_reads`: tuner.pipeline.incumbents.engine_tables), each
    --baseline folder's, ours (a `tuned` row without a config says why there is none)."""
    from tuner.pipeline.baselines import load_baseline_table
    from tuner.plan.space import load_space
    space = load_space(kernel, problems=[problem])
    # equivalent forms (GROUP_SIZE_M folding, clamped K tiles) are one point: the one timed
    same = lambda entry: space.canonical(problem.params, M, gpu, config_from_entry(kernel, entry))  # noqa: E731
    out = [Contender("default", same(kernel.default_config(problem.params, M)),
                     f"{kernel.source_label}'s launch with no table")]
    for t in engine_reads or []:
        out.append(Contender(f"shipped ({t.label} reads)", same(lookup_nearest(t.rows, M)), t.where))
    for label, folder in baselines:
        table = load_baseline_table(folder, kernel, gpu, problem)
        if table:
            out.append(Contender(f"shipped {label}", same(lookup_nearest(table, M))))
    table = tuned_table(tuned, kernel, problem) if tuned is not None else None
    out.append(Contender("tuned", same(lookup_nearest(table, M)) if table else None,
                         "" if table else f"no tuned table for this problem and kernel in --tuned {tuned}"
                         if tuned is not None else "no tuned table: give --tuned RUN_DIR"))
    if landscape is not None:
        best = landscape.best(problem.params, M)
        if best:
            out.append(Contender("landscape best", config_dict(kernel, best[0])))
    return out


def check_tables(kernel: KernelSpec, gpu, problems: list[Problem], baselines: list[tuple[str, str]],
                 tuned: Path | None) -> None:
    """Every entry of the shipped and tuned tables a bench reads, checked before anything is
    timed: a garbage table is one line, not a crash (or a run of strings) halfway through."""
    from tuner.pipeline.baselines import load_baseline_table
    from tuner.plan.kernel_api import checked_config, table_batch_size
    for problem in problems:
        tables = [(f"--baseline {folder}", load_baseline_table(folder, kernel, gpu, problem)) for _, folder in baselines]
        if tuned is not None:
            tables.append((f"--tuned {tuned}", tuned_table(tuned, kernel, problem)))
        for where, table in tables:
            for key, entry in (table or {}).items():
                at = f"{where}: the table for {problem.key}, entry {str(key)[:40]!r}"
                table_batch_size(key, at)
                checked_config(kernel, entry, at)



# -- the run --------------------------------------------------------------------------------
def shipped_reads(kernel: KernelSpec, problems: list[Problem], gpu, engines: list[str],
                  engine_source: list[str] | None) -> dict[str, list]:
    """{problem key: [EngineTable]}: the table each engine reads today for each problem, as
    a tuning run's incumbent is resolved (tuner/pipeline/incumbents.py)."""
    if kernel.emit_table is not None:
        return {}                          # our own format: no engine reads it
    from tuner.pipeline.incumbents import engine_tables
    found: dict = {}
    return {p.key: engine_tables(kernel, p, gpu, engines, engine_source, found) for p in problems}


def bench_kernel(kernel: KernelSpec, problems: list[Problem], batch_sizes: dict, gpu, ceilings: Ceilings,
                 measurer, baselines, tuned, landscape, progress=print, engines: list[str] | None = None,
                 engine_source: list[str] | None = None) -> list[BenchRow]:
    """All contenders of every (problem, M) of one kernel, timed on `measurer`."""
    rows: list[BenchRow] = []
    check_tables(kernel, gpu, problems, baselines, tuned)
    reads = shipped_reads(kernel, problems, gpu, engines or [], engine_source)
    source = time_source(measurer.environment(), measurer.label)
    for problem in problems:
        for M in batch_sizes[problem.key]:
            nbytes, flops = kernel.bytes_moved(problem.params, M), kernel.flops(problem.params, M)
            floor = ceilings.floor_us(nbytes, flops)
            cands = contenders(kernel, gpu, problem, M, baselines, tuned, landscape, reads.get(problem.key))
            # one call: the configs are timed under the same conditions
            unique = {json.dumps(c.config, sort_keys=True): c.config for c in cands if c.config is not None}
            times = dict(zip(unique, measurer.measure(problem, M, list(unique.values()))))
            mine = []
            for c in cands:
                if c.config is None:                  # a contender with nothing to time: why, in its row
                    mine.append(BenchRow(kernel.source_label, problem.key, M, c.name, None, None, None, floor,
                                         "-", c.note))
                    continue
                m = times[json.dumps(c.config, sort_keys=True)]
                mine.append(BenchRow(kernel.source_label, problem.key, M, c.name, c.config, m.time_us, m.spread,
                                     floor, source, m.error))
            for row in (here := mine + reference_rows(kernel, problem, M, floor, measurer)):
                row.roofline = (nbytes, flops, ceilings)     # a time beating the floor: which figure is wrong
            rows += here
            best = min((r for r in mine if r.time_us), key=lambda r: r.time_us or math.inf, default=None)
            progress(f"{kernel.source_label} {problem.key} M={M}: "
                     + (f"best {best.contender} {best.time_us:.2f} us ({short_label(measurer.environment())})"
                        if best else "nothing timed") + f" [{source}]")
    return rows



def run_bench(request: BenchRequest) -> int:
    import copy

    from tuner.measure import ceilings as ceilings_mod
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model

    if request.dtype is not None and request.dtype not in DTYPES[request.kernel]:
        raise TunerError(f"--dtype {request.dtype} is not supported by `tuner bench --kernel {request.kernel}`")
    if request.kernel == "mla":
        request.contexts = request.contexts or [4096, 8192, 32768]
    gpu = get_gpu(request.gpu)
    model = load_model(request.model)
    resolve_tp(request, model, gpu, say=(lambda line: None) if request.quiet else print)
    profile = None
    if request.traffic:
        from tuner.plan.traffic import choose_keys, load_profile
        if request.kernel == "mla":
            raise TunerError("--traffic applies to `tuner bench --kernel gemm|moe` (M = tokens per forward pass)")
        profile = load_profile(request.traffic, request.tp)
        request.batch_sizes = request.batch_sizes or choose_keys(profile).keys
    batch_sizes = sorted(set(request.batch_sizes or ([32, 64, 128] if request.kernel == "mla" else DEFAULT_BATCH_SIZES)))
    out = Path(request.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    from tuner.jobs.bench_output import check_out
    check_out(out)
    if request.replay and not Path(request.replay).is_file():
        raise TunerError(f"landscape {request.replay} not found")
    for folder in request.baseline or []:
        if not Path(folder).is_dir():
            raise TunerError(f"--baseline {folder} is not a folder")
    tuned = Path(request.tuned) if request.tuned else None
    if tuned is not None and not (tuned / "manifest.json").is_file():
        raise TunerError(f"--tuned {tuned} holds no manifest.json: not one of our results folders")
    request.dtype = command_dtype(request.kernel, model, request.dtype)
    from tuner.measure.device import device_name
    ceilings = ceilings_mod.load(gpu, request.ceilings, device_name(request.device, gpu) if not request.replay else None)
    kernel_name, make_problems = problem_builder(request, request.kernel)
    problems = only_problems(make_problems(model), request.only)
    baselines = [(Path(d).name, d) for d in request.baseline or []]
    if not request.replay:
        from tuner.measure.device import require
        require(request.device, gpu, "a bench", "--replay FILE benches a recorded landscape")
    say = (lambda line: None) if request.quiet else (lambda line: print(line, flush=True))
    from tuner.paths import remove_stale_temporaries
    remove_stale_temporaries(out)           # what a killed bench's writes left (no live writer holds them)
    rows: list = []
    measurers: list = []
    notes: list[str] = []
    benched: dict = {}
    try:
        modes = list(dict.fromkeys(request.kernel_source))
        if request.replay:
            from tuner.plan.kernel_registry import source_mode
            recorded = source_mode(None, request.replay)
            if len(modes) > 1:
                say(f"note: a landscape holds one kernel's timings: benching {recorded}'s only")
            modes = [recorded if m == "engine" else m for m in modes[:1]]
        for mode in modes:
            ns: Any = copy.copy(request)          # one kernel source at a time: what kernel_runs reads
            ns.kernel_source, ns.dry_run = mode, False
            for kernel, probs in kernel_runs(ns, kernel_name, problems, notes):
                probs = one_per_key(probs)
                measurer = bench_measurer(request, kernel, gpu)
                measurers.append(measurer)
                landscape = getattr(measurer, "landscape", None)
                ms = {p.key: [m for m in batch_sizes if landscape is None or landscape.lookup(p.params, m)]
                      for p in probs}
                if landscape is not None and not any(ms.values()):     # one line, as `tuner moe --replay` says it
                    raise TunerError(f"landscape {request.replay} covers none of the planned problems and batch "
                                     "sizes")
                for p in probs:
                    if len(ms[p.key]) < len(batch_sizes):
                        say(f"note: {p.key}: the landscape lacks "
                            f"M={','.join(str(m) for m in batch_sizes if m not in ms[p.key])}")
                rows += bench_kernel(kernel, probs, ms, gpu, ceilings, measurer, baselines, tuned,
                                     landscape, progress=say, engines=request.engines, engine_source=request.engine_source)
                benched.update({p.key: p for p in probs})
        if not rows:                # nothing to write: no half-made JSON, no Markdown of nothing
            raise TunerError("nothing was benched: no problem and batch size is covered")
        header = bench_header(measurers, gpu, ceilings, {"model": model.name, "tp": request.tp, "ep": request.ep,
                                                                    "kernel": kernel_name}, out)
        if profile is not None:
            header["traffic"] = profile.as_manifest()
            from tuner.measure.noise import for_environment
            header["traffic_lines"] = traffic_lines(rows, profile, model, benched, header["time_source"],
                                                    for_environment(header))
        from tuner.emit.verdict import verdict_lines
        header["verdict_lines"] = verdict_lines([r.as_dict() for r in rows], kernel_name,
                                                profile.served() if profile is not None else None)
        day = sorted(out.glob(f"bench-*-{_dt.date.today().isoformat()}.json")) if out.is_dir() else []
        json_path, md_path = write_outputs(rows, out, header)
    finally:
        for m in measurers:
            m.close()
    print(header["banner"])
    for line in bench_table([r.as_dict() for r in rows]):
        print(line)
    for line in header.get("traffic_lines") or []:
        print(line)
    for line in header.get("verdict_lines") or []:
        print(line)
    print(f"roofline: {ceilings.source}; results: {json_path} and {md_path}"
          # one bench a device and day: a second run that day replaces the first's files (said, not silent)
          + (" (replacing today's earlier bench there, and its plots)" if json_path in day else ""))
    return 0


def one_per_key(problems: list[Problem]) -> list[Problem]:
    """Each problem once: a kernel that times several engines' tables of one shape (a landscape
    recorded on one engine's kernel, replayed for both engines' GEMM tables) gets that shape
    once per engine; benched once, its rows are one set (the engines that read it merged)."""
    import dataclasses
    out: dict[str, Problem] = {}
    for p in problems:
        q = out.get(p.key)
        out[p.key] = p if q is None else dataclasses.replace(q, engines=tuple(dict.fromkeys((*q.engines, *p.engines))))
    return list(out.values())


def bench_measurer(args, kernel, gpu):
    if args.replay:
        from tuner.measure.device import device_name
        from tuner.measure.measurers import ReplayMeasurer
        return ReplayMeasurer.from_file(args.replay, kernel, device_name(args.device, gpu))
    from tuner.measure.isolation import isolated_gpu_measurer
    return isolated_gpu_measurer(kernel, gpu.key, args.compile_workers, args.measure_timeout, device=args.device)
