"""`tuner bench`: every contender for each (problem, M), timed in one call, against the roofline.

Contenders, per problem and batch size M:
  default            the engine's launch with no table (the kernel's default config);
  shipped <name>     each --baseline folder's table (the engines' shipped ones), its entry for M;
  tuned              our table (--tuned RUN_DIR), its entry for M;
  landscape best     the best config of a replayed or recorded landscape, where one covers it;
  reference          an implementation outside Triton where the device's software has one
                     (GEMM: torch._scaled_mm with block scales, DeepGEMM if importable).
Configs are timed together on one measurer (a GPU, or with --replay a landscape), so they
are comparable; the roofline floor is the larger of bytes / copy bandwidth and FLOPs / FP8
rate, from measured ceilings where bench/ceilings/<gpu>.json exists, else the datasheet.
Every time is labelled with where it came from.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.commands.kernel_commands import problem_builder
from tuner.commands.options import (
    batch,
    context,
    device_option,
    page,
    parallel_options,
    positive,
    resolve_tp,
    trust_option,
    workers,
)
from tuner.errors import TunerError
from tuner.measure.ceilings import Ceilings
from tuner.measure.environment import now_iso, software_versions
from tuner.measure.provenance import banner, is_cpu_device, is_loud, is_synthetic, short_label, time_source
from tuner.paths import atomic_write_file, atomic_write_json, atomic_write_text
from tuner.pipeline.planning import command_dtype, kernel_runs, only_problems
from tuner.pipeline.request import DTYPES
from tuner.plan.engines import DEFAULT_BATCH_SIZES, ENGINE_NAMES, lookup_nearest
from tuner.plan.kernel_api import KernelSpec, config_dict, config_from_entry
from tuner.plan.problems import Problem


@dataclass
class Contender:
    name: str
    config: dict | None = None          # None: a reference implementation, not a config
    note: str = ""


@dataclass
class BenchRow:
    kernel_source: str
    problem: str
    M: int
    contender: str
    config: dict | None
    time_us: float | None
    spread: float | None
    floor_us: float
    source: str                          # where the time came from
    error: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def roofline_fraction(self) -> float | None:
        return self.floor_us / self.time_us if self.time_us else None

    def as_dict(self) -> dict:
        return {"kernel_source": self.kernel_source, "problem": self.problem, "M": self.M,
                "contender": self.contender, "config": self.config, "time_us": self.time_us,
                "spread": self.spread, "floor_us": self.floor_us, "roofline_fraction": self.roofline_fraction,
                "time_source": self.source, "error": self.error, **self.extra}


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
               tuned: Path | None, landscape=None) -> list[Contender]:
    """The configs (and references) to time for one problem and M."""
    from tuner.pipeline.baselines import load_baseline_table
    from tuner.plan.space import load_space
    space = load_space(kernel)
    # equivalent forms (GROUP_SIZE_M folding, clamped K tiles) are one point: the one timed
    same = lambda entry: space.canonical(problem.params, M, gpu, config_from_entry(kernel, entry))  # noqa: E731
    out = [Contender("default", same(kernel.default_config(problem.params, M)),
                     f"{kernel.source_label}'s launch with no table")]
    for label, folder in baselines:
        table = load_baseline_table(folder, kernel, gpu, problem)
        if table:
            out.append(Contender(f"shipped {label}", same(lookup_nearest(table, M))))
    if tuned is not None:
        table = tuned_table(tuned, kernel, problem)
        if table:
            out.append(Contender("tuned", same(lookup_nearest(table, M))))
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


# -- references outside Triton ------------------------------------------------------------
def reference_note(kernel: KernelSpec) -> str:
    """What exists outside Triton for this kernel, in words (also where nothing does)."""
    return {
        "fp8_gemm": "torch._scaled_mm with 1x128 / 128x128 block scales where the device's torch takes them; "
                    "DeepGEMM if importable",
        "fused_moe": "no fused-MoE op in torch; the engines' non-Triton MoE (DeepGEMM, FlashInfer CUTLASS) "
                     "need the engines installed and are not timed here",
        "mla_decode": "no MLA decode op in torch; FlashMLA / FlashAttention-MLA need their packages and are "
                      "not timed here",
    }.get(kernel.table_kind, "none known")


def gemm_reference_candidates() -> list[tuple[str, str, Callable[[dict], Callable[[], object]]]]:
    """[(family, variant, build(inputs) -> callable)]: block-FP8 GEMMs outside Triton. The
    scale layouts torch._scaled_mm takes differ between torch versions, so several are tried;
    per family the first that computes the right answer is timed."""
    import torch

    def scaled_mm(sa, sb):
        return lambda i: (lambda: torch._scaled_mm(i["A"], i["B"].t(), scale_a=sa(i), scale_b=sb(i),
                                                   out_dtype=torch.bfloat16))
    out = [("torch._scaled_mm", "As, Bs^T", scaled_mm(lambda i: i["As"], lambda i: i["Bs"].t())),
           ("torch._scaled_mm", "As column-major, Bs^T",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t())),
           ("torch._scaled_mm", "As column-major, Bs^T contiguous",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t().contiguous()))]
    try:
        import deep_gemm

        def deep(i):
            C = torch.empty((i["A"].shape[0], i["B"].shape[0]), dtype=torch.bfloat16, device=i["A"].device)
            return lambda: (deep_gemm.fp8_gemm_nt((i["A"], i["As"]), (i["B"], i["Bs"]), C), C)[1]
        out.append(("DeepGEMM", "fp8_gemm_nt", deep))
    except ImportError:
        pass
    return out


def check_reference(fn, inputs: dict, reference) -> str | None:
    """None when fn computes the GEMM right, else why not."""
    import torch
    try:
        got = fn().double()
    except Exception as e:  # noqa: BLE001 - an unsupported layout raises: that is the answer
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0][:160] if text else ''}"
    rel = (torch.linalg.vector_norm(got - reference) / torch.linalg.vector_norm(reference)).item()
    return None if rel <= 2e-2 else f"wrong result (relative error {rel:.2e})"


# -- the run --------------------------------------------------------------------------------
def bench_kernel(kernel: KernelSpec, problems: list[Problem], batch_sizes: dict, gpu, ceilings: Ceilings,
                 measurer, baselines, tuned, landscape, progress=print) -> list[BenchRow]:
    """All contenders of every (problem, M) of one kernel, timed on `measurer`."""
    rows: list[BenchRow] = []
    check_tables(kernel, gpu, problems, baselines, tuned)
    source = time_source(measurer.environment(), measurer.label)
    for problem in problems:
        for M in batch_sizes[problem.key]:
            floor = ceilings.floor_us(kernel.bytes_moved(problem.params, M), kernel.flops(problem.params, M))
            cands = contenders(kernel, gpu, problem, M, baselines, tuned, landscape)
            # one call: the configs are timed under the same conditions
            unique = {json.dumps(c.config, sort_keys=True): c.config for c in cands}
            times = dict(zip(unique, measurer.measure(problem, M, list(unique.values()))))
            mine = []
            for c in cands:
                m = times[json.dumps(c.config, sort_keys=True)]
                mine.append(BenchRow(kernel.source_label, problem.key, M, c.name, c.config, m.time_us, m.spread,
                                     floor, source, m.error))
            rows += mine + reference_rows(kernel, problem, M, floor, measurer)
            best = min((r for r in mine if r.time_us), key=lambda r: r.time_us or math.inf, default=None)
            progress(f"{kernel.source_label} {problem.key} M={M}: "
                     + (f"best {best.contender} {best.time_us:.2f} us ({short_label(measurer.environment())})"
                        if best else "nothing timed") + f" [{source}]")
    return rows


def reference_rows(kernel: KernelSpec, problem: Problem, M: int, floor: float, measurer) -> list[BenchRow]:
    """The references outside Triton for one (problem, M): timed in the measuring child
    (reference_timings), so that a reference that crashes or poisons its CUDA context takes
    down only that child; without a device (a replayed landscape), a note."""
    if kernel.table_kind != "fp8_gemm":
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         reference_note(kernel))]
    if not hasattr(measurer, "run_here"):
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         "needs a GPU (" + reference_note(kernel) + ")")]
    source = time_source(measurer.environment(), measurer.label)
    try:
        timed = measurer.run_here("tuner.commands.bench:reference_timings", problem, M)
    except RuntimeError as e:
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         f"not timed: {e}")]
    return [BenchRow(kernel.source_label, problem.key, M, r["contender"], None, r.get("time_us"), r.get("spread"),
                     floor, source if r.get("time_us") else "-", r.get("error")) for r in timed]


def reference_timings(measurer, problem: Problem, M: int) -> list[dict]:
    """In the measuring process (DeviceMeasurer.run_here): every block-FP8 GEMM outside
    Triton that computes this problem right, timed the device's way on the kernel's own
    input sets (CUDA graphs and events with the L2 flushed on a GPU; the wall clock on the
    CPU device). Per family, the first variant that computes the right answer is timed. A
    CUDA error that poisons the context stops the rest, each said in one line, and the
    measuring child is replaced after this call."""
    from tuner.measure.device_measurer import poisons_context
    from tuner.measure.timing import summarize
    kernel, device = measurer.kernel, measurer.device
    sets = [kernel.make_inputs(problem.params, M, device.tensor_device, seed) for seed in range(measurer.input_sets)]
    reference = kernel.reference(sets[0])
    out: list[dict] = []
    tried: dict[str, str | None] = {}
    lost = None
    for family, variant, build in gemm_reference_candidates():
        if family in tried and tried[family] is None:
            continue                               # this family already has a working variant
        if lost:
            tried[family] = (tried.get(family) or "") + f"{variant}: not run, {lost}; "
            continue
        why = check_reference(build(sets[0]), sets[0], reference)
        if why is None:
            try:
                t = summarize(device.time_runs([build(s) for s in sets], measurer.flush, measurer.reps))
            except Exception as e:  # noqa: BLE001 - a reference that runs once but not in a graph
                text = str(e).strip().splitlines()
                why = f"{type(e).__name__}: {text[0][:160] if text else ''}"
            else:
                tried[family] = None
                out.append({"contender": f"{family} ({variant})", "time_us": t.median_us, "spread": t.spread})
                continue
        tried[family] = (tried.get(family) or "") + f"{variant}: {why}; "
        if poisons_context(why):
            lost, measurer.poisoned = f"the CUDA context was lost ({why})", True
    out += [{"contender": family, "error": f"not usable here: {why.rstrip('; ')}"}
            for family, why in tried.items() if why]
    if not any(f == "DeepGEMM" for f, _, _ in gemm_reference_candidates()):
        out.append({"contender": "DeepGEMM", "error": "not importable here"})
    return out


def write_outputs(rows: list[BenchRow], out: Path, header: dict) -> tuple[Path, Path]:
    """bench-<device>-<date>.json, the same as Markdown, and a plot per problem."""
    device = str(header.get("device") or "unknown").replace(" ", "_")
    date = _dt.date.today().isoformat()
    stem = f"bench-{device}-{date}"
    data = {**header, "rows": [r.as_dict() for r in rows]}
    json_path = out / f"{stem}.json"
    atomic_write_json(json_path, data, indent=2, root=out)
    md_path = out / f"{stem}.md"
    atomic_write_text(md_path, markdown(rows, header, stem), root=out)
    return json_path, md_path


def markdown(rows: list[BenchRow], header: dict, stem: str) -> str:
    import pandas as pd

    from tuner.commands.report import markdown_table
    lines = [f"# Bench: {header.get('model')} on {header.get('device')}", "",
             str(header.get("banner")), "",
             f"Roofline floor: {header.get('ceilings')}. Versions: "
             + ", ".join(f"{k} {header.get(k)}" for k in ("torch", "triton", "driver", "cuda") if header.get(k)), ""]
    df = pd.DataFrame([r.as_dict() for r in rows])
    for i, ((src, problem), part) in enumerate(df.groupby(["kernel_source", "problem"], sort=False)):
        png = f"{stem}-{i}.png"
        plot(part, Path(header["out"]) / png, f"{problem} [{src}]", header.get("banner", ""), Path(header["out"]))
        table = part[["M", "contender", "time_us", "spread", "floor_us", "roofline_fraction", "error"]].copy()
        table["config"] = [" ".join(str(v) for v in c.values()) if isinstance(c, dict) else "-" for c in part["config"]]
        lines += [f"## {problem} [{src}]", "", f"![{problem}]({png})", "",
                  markdown_table(table, floatfmt=".3g"), ""]
    if header.get("traffic_lines"):
        lines += ["## Judged by traffic", "", *[f"- {line}" for line in header["traffic_lines"]], ""]
    notes = sorted({r.error for r in rows if r.contender.startswith(("reference", "torch", "DeepGEMM")) and r.error})
    if notes:
        lines += ["## References outside Triton", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines) + "\n"


def plot(part, path: Path, title: str, subtitle: str, root: Path | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    timed = part.dropna(subset=["time_us"])
    for name, g in timed.groupby("contender", sort=False):
        ax.plot(g["M"], g["time_us"], marker="o", label=name)
    floor = part.drop_duplicates("M")
    ax.plot(floor["M"], floor["floor_us"], linestyle="--", color="gray", label="roofline floor")
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("M (batch size)")
    ax.set_ylabel("time (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"{title}\n{subtitle}", fontsize=8, color="red" if is_loud(subtitle) else "black")
    fig.tight_layout()
    try:
        atomic_write_file(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"), root=root)
    finally:
        plt.close(fig)


def bench_header(measurers: list, gpu, ceilings: Ceilings, run_info: dict, out: Path) -> dict:
    env: dict = next((m.environment() for m in measurers), {}) or {}
    label = next((m.label for m in measurers), "")
    return {"format": "tuner-bench/1", "written": now_iso(), "out": str(out), **run_info,
            "gpu": gpu.key, "device": env.get("device") or gpu.cuda_name, "environment": env,
            **{k: env.get(k) for k in ("driver", "cuda", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz")},
            **{k: v for k, v in software_versions().items() if k not in env or not env.get(k)},
            **{k: env.get(k) for k in ("torch", "triton") if env.get(k)},
            "time_source": time_source(env, label), "synthetic": is_synthetic(env),
            "cpu_device": is_cpu_device(env),
            "banner": banner(env, label), "ceilings": ceilings.source,
            "ceiling_values": {"copy_tb_s": ceilings.copy_tb_s, "fp8_tflops": ceilings.fp8_tflops}}


def finite(x) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


# -- judged by traffic ---------------------------------------------------------------------------
def traffic_lines(rows: list[BenchRow], profile, model, problems: dict[str, Problem], source: str) -> list[str]:
    """A bench judged by traffic: per kernel and problem, each contender's traffic-weighted
    speedup over the default (and the tuned table's over each shipped one), next to the
    plain geomean; each served M is counted at the benched M nearest to it. With a model,
    per kernel and engine, the estimated kernel time per pass of the tuned and shipped
    tables against the default."""
    from tuner.plan.models import layers_per_pass
    from tuner.plan.traffic import geomean, speedup_text, step_estimate, step_text, weighted
    times: dict[tuple, dict[int, float | None]] = {}
    for r in rows:
        if r.config is not None:
            times.setdefault((r.kernel_source, r.problem, r.contender), {})[r.M] = r.time_us
    lines = [*profile.describe()]
    groups = sorted({(src, p) for src, p, _ in times})
    per_pass: dict[tuple, list] = {}

    def judged(keys, base, new, label, against):
        w = weighted(profile, (keys, base), (keys, new))
        plain = geomean([base[k] / new[k] for k in keys if base.get(k) and new.get(k)])
        return (f"{label}: {speedup_text(w, against)}"
                + (f" (plain geomean {plain:.2f}x over {len(keys)} batch sizes)" if plain else ""))

    for src, pkey in groups:
        base = times.get((src, pkey, "default"))
        if not base:
            continue
        keys = sorted(base)
        names = [c for s_, p_, c in times if (s_, p_) == (src, pkey) and c != "default"]
        for c in sorted(names):
            lines.append(judged(keys, base, times[(src, pkey, c)], f"{src} {pkey} {c}", "the default"))
            if c != "tuned" and c.startswith("shipped") and (src, pkey, "tuned") in times:
                lines.append(judged(keys, times[(src, pkey, c)], times[(src, pkey, "tuned")],
                                    f"{src} {pkey} tuned", f"{c}"))
        problem = problems.get(pkey)
        if model is not None and problem is not None:
            for engine in problem.engines:
                for c in names:
                    if c == "tuned" or c.startswith("shipped"):
                        per_pass.setdefault((src, engine, c), []).append(
                            (layers_per_pass(model, problem.layers), (keys, base), (keys, times[(src, pkey, c)])))
    if model is None:
        lines.append("estimated time per forward pass: give --model for the layer counts")
    for (src, engine, c), prs in sorted(per_pass.items()):
        lines.append(f"{src}, {engine}'s tables, {model.name}, {c}: "
                     + step_text(step_estimate(profile, prs), source, "default", c))
    return lines


def add_parser(sub, common) -> None:
    """`tuner bench` and its options."""
    bench = sub.add_parser("bench", help="time every contender per batch size against the roofline",
                           description="Per problem and M: the engine's default config, each shipped table "
                           "(--baseline), our tuned table (--tuned), a landscape's best, and a reference outside "
                           "Triton where one exists, timed together, with their spread and their fraction of the "
                           "roofline. Writes bench-<device>-<date>.json, a Markdown report and a plot per problem.")
    bench.add_argument("--model", required=True)
    bench.add_argument("--gpu", required=True)
    bench.add_argument("--kernel", required=True, choices=("moe", "gemm", "mla"))
    parallel_options(bench)
    bench.add_argument("--dtype", default=None, help="moe: fp8_w8a8 or bf16 (default: the checkpoint's own); "
                       "gemm: fp8_w8a8")
    bench.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    bench.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None,
                       help="default: the engines' grid (mla: 32 64 128)")
    bench.add_argument("--contexts", type=context, nargs="+", metavar="TOKENS", default=None,
                       help="mla: context buckets (default 4096 8192 32768)")
    bench.add_argument("--page-size", type=page, default=64, help="mla: KV cache page size")
    bench.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=list(ENGINE_NAMES))
    bench.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                       help="bench only the problems whose key holds one of these texts")
    bench.add_argument("--tuned", default=None, metavar="RUN_DIR", help="one of our results folders")
    bench.add_argument("--baseline", nargs="+", default=None, metavar="DIR",
                       help="folders of shipped tables, e.g. ../shared/baselines/vllm-0.33.0")
    bench.add_argument("--replay", default=None, metavar="FILE", help="time from a landscape (no GPU)")
    bench.add_argument("--kernel-source", nargs="+", choices=("engine", "ours"), default=["engine"],
                       help="whose kernels time the configs; several side by side (default: engine)")
    bench.add_argument("--engine-source", nargs="+", metavar="PATH", default=None)
    trust_option(bench)
    bench.add_argument("--ceilings", default=None, metavar="FILE",
                       help="measured ceilings (default bench/ceilings/<gpu>.json, else datasheet figures)")
    bench.add_argument("--compile-workers", type=workers, default=min(16, os.cpu_count() or 1))
    bench.add_argument("--measure-timeout", type=positive, default=120, metavar="S",
                       help="seconds one config may take before it counts as hung (default 120)")
    device_option(bench)
    bench.add_argument("--out", required=True, metavar="DIR")
    bench.add_argument("--traffic", default=None, metavar="FILE",
                       help="a traffic profile (a vLLM/SGLang /metrics dump, or a CSV/JSON of M,weight): bench at the "
                       "keys it chooses (unless --batch-sizes) and print the traffic-weighted speedups")
    bench.add_argument("--quiet", action="store_true")


def run(args) -> int:
    import copy

    from tuner.measure import ceilings as ceilings_mod
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model

    if args.dtype is not None and args.dtype not in DTYPES[args.kernel]:
        raise TunerError(f"--dtype {args.dtype} is not supported by `tuner bench --kernel {args.kernel}`")
    if args.kernel == "mla":
        args.contexts = args.contexts or [4096, 8192, 32768]
    gpu = get_gpu(args.gpu)
    model = load_model(args.model)
    resolve_tp(args, model, gpu, say=(lambda line: None) if args.quiet else print)
    profile = None
    if args.traffic:
        from tuner.plan.traffic import choose_keys, load_profile
        if args.kernel == "mla":
            raise TunerError("--traffic applies to `tuner bench --kernel gemm|moe` (M = tokens per forward pass)")
        profile = load_profile(args.traffic, args.tp)
        args.batch_sizes = args.batch_sizes or choose_keys(profile).keys
    batch_sizes = sorted(set(args.batch_sizes or ([32, 64, 128] if args.kernel == "mla" else DEFAULT_BATCH_SIZES)))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    if args.replay and not Path(args.replay).is_file():
        raise TunerError(f"landscape {args.replay} not found")
    for folder in args.baseline or []:
        if not Path(folder).is_dir():
            raise TunerError(f"--baseline {folder} is not a folder")
    tuned = Path(args.tuned) if args.tuned else None
    if tuned is not None and not (tuned / "manifest.json").is_file():
        raise TunerError(f"--tuned {tuned} holds no manifest.json: not one of our results folders")
    args.dtype = command_dtype(args.kernel, model, args.dtype)
    from tuner.measure.device import device_name
    ceilings = ceilings_mod.load(gpu, args.ceilings, device_name(args.device, gpu) if not args.replay else None)
    kernel_name, make_problems = problem_builder(args, args.kernel)
    problems = only_problems(make_problems(model), args.only)
    baselines = [(Path(d).name, d) for d in args.baseline or []]
    if not args.replay:
        from tuner.measure.device import require
        require(args.device, gpu, "a bench", "--replay FILE benches a recorded landscape")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    from tuner.paths import remove_stale_temporaries
    remove_stale_temporaries(out)           # what a killed bench's writes left (no live writer holds them)
    rows: list = []
    measurers: list = []
    notes: list[str] = []
    benched: dict = {}
    try:
        modes = list(dict.fromkeys(args.kernel_source))
        if args.replay:
            from tuner.plan.kernel_registry import source_mode
            recorded = source_mode(None, args.replay)
            if len(modes) > 1:
                say(f"note: a landscape holds one kernel's timings: benching {recorded}'s only")
            modes = [recorded if m == "engine" else m for m in modes[:1]]
        for mode in modes:
            ns = copy.copy(args)
            ns.kernel_source, ns.dry_run = mode, False
            for kernel, probs in kernel_runs(ns, kernel_name, problems, notes):
                measurer = bench_measurer(args, kernel, gpu)
                measurers.append(measurer)
                landscape = getattr(measurer, "landscape", None)
                ms = {}
                for p in probs:
                    covered = [m for m in batch_sizes if landscape is None or landscape.lookup(p.params, m)]
                    if len(covered) < len(batch_sizes):
                        say(f"note: {p.key}: the landscape lacks M={','.join(str(m) for m in batch_sizes if m not in covered)}")
                    ms[p.key] = covered
                rows += bench_kernel(kernel, probs, ms, gpu, ceilings, measurer, baselines, tuned,
                                               landscape, progress=say)
                benched.update({p.key: p for p in probs})
        header = bench_header(measurers, gpu, ceilings, {"model": model.name, "tp": args.tp, "ep": args.ep,
                                                                    "kernel": kernel_name}, out)
        if profile is not None:
            header["traffic"] = profile.as_manifest()
            header["traffic_lines"] = traffic_lines(rows, profile, model, benched, header["time_source"])
        json_path, md_path = write_outputs(rows, out, header)
    finally:
        for m in measurers:
            m.close()
    if not rows:
        raise TunerError("nothing was benched: no problem and batch size is covered")
    print(header["banner"])
    for line in bench_table([r.as_dict() for r in rows]):
        print(line)
    for line in header.get("traffic_lines") or []:
        print(line)
    print(f"roofline: {ceilings.source}; results: {json_path} and {md_path}")
    return 0


def bench_table(rows: list[dict]) -> list[str]:
    """The bench rows for a terminal, within 120 columns: each problem by what tells it from the
    others (what all share said above)."""
    from tuner.emit.run_table import distinguishing, fixed_width
    short, common = distinguishing(list(dict.fromkeys(r["problem"] for r in rows)))
    table = [[r["kernel_source"], short[r["problem"]], str(r["M"]), str(r["contender"]),
              f"{r['time_us']:.3g}" if isinstance(r["time_us"], float) and r["time_us"] == r["time_us"] else "-",
              f"{r['roofline_fraction']:.0%}" if isinstance(r["roofline_fraction"], float)
              and r["roofline_fraction"] == r["roofline_fraction"] else "-",
              r["error"][:40] if isinstance(r["error"], str) else ""] for r in rows]
    head = [f"problem: {common} and" if common else "problem:"]
    return head + fixed_width(["kernel", "problem", "M", "contender", "time_us", "of_roofline", "note"], table,
                              left=(0, 1, 3, 6))


def bench_measurer(args, kernel, gpu):
    if args.replay:
        from tuner.measure.device import device_name
        from tuner.measure.measurers import ReplayMeasurer
        return ReplayMeasurer.from_file(args.replay, kernel, device_name(args.device, gpu))
    from tuner.measure.isolation import isolated_gpu_measurer
    return isolated_gpu_measurer(kernel, gpu.key, args.compile_workers, args.measure_timeout, device=args.device)
