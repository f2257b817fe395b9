"""What `tuner bench` writes and prints: its rows, the JSON and Markdown with their header
(where every time came from), the plots, the terminal table, and the figures judged by a
traffic profile."""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path

from tuner.file_kinds import BENCH_JSON, BENCH_MD, PLOT, PLOT_METADATA
from tuner.measure.ceilings import Ceilings
from tuner.measure.environment import now_iso, software_versions
from tuner.measure.provenance import banner, is_cpu_device, is_loud, is_synthetic, time_source
from tuner.measure.roofline import Judged, judge, judge_row
from tuner.paths import atomic_write_file, atomic_write_json, atomic_write_text, replaceable
from tuner.plan.problems import Problem


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
    # what the floor was made of (set by bench_kernel): which figure is wrong when a time beats it
    roofline: tuple[float, float, Ceilings] | None = None       # (bytes moved, FLOPs, ceilings)

    def judged(self) -> Judged:
        if self.roofline is None:
            return judge_row({"floor_us": self.floor_us, "time_us": self.time_us, "spread": self.spread})
        nbytes, flops, c = self.roofline
        return judge(self.time_us, self.spread, nbytes, flops, c.copy_tb_s, c.fp8_tflops, c.datasheet_copy_tb_s,
                     c.datasheet_fp8_tflops)

    @property
    def roofline_fraction(self) -> float | None:
        return self.judged().fraction

    def as_dict(self) -> dict:
        j = self.judged()
        return {"kernel_source": self.kernel_source, "problem": self.problem, "M": self.M,
                "contender": self.contender, "config": self.config, "time_us": self.time_us,
                "spread": self.spread, "floor_us": self.floor_us, "roofline_fraction": j.fraction,
                "roofline_error": j.error, "roofline_wrong": j.wrong, "time_source": self.source, "error": self.error, **self.extra}



def write_outputs(rows: list[BenchRow], out: Path, header: dict) -> tuple[Path, Path]:
    """bench-<device>-<date>.json, the same as Markdown, and a plot per problem."""
    device = str(header.get("device") or "unknown").replace(" ", "_")
    date = _dt.date.today().isoformat()
    stem = f"bench-{device}-{date}"
    data = {**header, "rows": [r.as_dict() for r in rows]}
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    # every file checked before the first is written: in the folder the user named, only files of
    # the kind written are replaced (tuner/file_kinds.py)
    groups = len({(r.kernel_source, r.problem) for r in rows})
    for path, kind in ((json_path, BENCH_JSON), (md_path, BENCH_MD),
                       *((out / f"{stem}-{i}.png", PLOT) for i in range(groups))):
        replaceable(path, kind, f"--out {out}: {path.name}")
    atomic_write_json(json_path, data, indent=2, root=out, kind=BENCH_JSON)
    atomic_write_text(md_path, markdown(rows, header, stem), root=out, kind=BENCH_MD)
    return json_path, md_path


def check_out(out: Path) -> None:
    """Before benching: --out is a folder (or will be), and what bench writes there (bench-*.json,
    .md, .png, named for the device and today) replaces only files of those kinds: one line now,
    not after the GPU's time is spent (write_outputs checks the very names again)."""
    from tuner.paths import check_writable
    check_writable(out, "--out")
    if not out.is_dir():
        return
    date = _dt.date.today().isoformat()
    for pattern, kind in ((f"bench-*-{date}.json", BENCH_JSON), (f"bench-*-{date}.md", BENCH_MD),
                          (f"bench-*-{date}-*.png", PLOT)):
        for path in sorted(out.glob(pattern)):
            replaceable(path, kind, f"--out {out}: {path.name}")


def markdown(rows: list[BenchRow], header: dict, stem: str) -> str:
    import pandas as pd

    from tuner.jobs.report import markdown_table
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
    if header.get("verdict_lines"):
        lines += ["## Verdict: the fastest contender per M, and the backend flag to run", "", "```",
                  *header["verdict_lines"], "```", ""]
    wrong = [r for r in rows if r.judged().error]
    if wrong:
        lines += ["## Faster than the roofline floor: a figure is wrong", "",
                  "No fraction is given for these rows (a fraction above 1 is a bug, not a result):", ""]
        lines += [f"- {r.kernel_source} {r.problem} M={r.M} {r.contender}: {r.time_us:.3g} us, "
                  f"{r.judged().error}" for r in wrong] + [""]
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
        atomic_write_file(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png", metadata=PLOT_METADATA),
                          root=root, kind=PLOT)
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
def traffic_lines(rows: list[BenchRow], profile, model, problems: dict[str, Problem], source: str,
                  noise=None) -> list[str]:
    """A bench judged by traffic: per kernel and problem, each contender's traffic-weighted
    speedup over the default (and the tuned table's over each shipped one), next to the
    plain geomean; each served M is counted at the benched M nearest to it. With a model,
    per kernel and engine, the estimated kernel time per pass of the tuned and shipped
    tables against the default."""
    from tuner.measure.noise import within
    from tuner.plan.layers import layers_per_pass
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
        from tuner.measure.noise import speedup
        said = (f" (within the {noise.describe()}: not a speed-up)"
                if noise is not None and within(w.speedup, noise) else "")
        return (f"{label}: {speedup_text(w, against)}{said}"
                + (f" (plain geomean {speedup(plain, noise)} over {len(keys)} batch sizes)" if plain else ""))

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


def bench_table(rows: list[dict]) -> list[str]:
    """The bench rows for a terminal, within 120 columns: each problem by what tells it from the
    others (what all share said above); a note longer than its column is a numbered note in the
    row, said in full under the table (never cut mid-word)."""
    from tuner.emit.run_table import distinguishing, fixed_width
    short, common = distinguishing(list(dict.fromkeys(r["problem"] for r in rows)))
    notes: dict[str, str] = {}          # {a long note: its mark}

    def note(r: dict) -> str:
        text = (r["error"] if isinstance(r["error"], str) else
                f"beat its floor: {r['roofline_wrong']} wrong" if r.get("roofline_error") else "")
        if len(text) <= NOTE_WIDTH:
            return text
        return notes.setdefault(text, f"note {len(notes) + 1}")

    table = [[r["kernel_source"], short[r["problem"]], str(r["M"]), str(r["contender"]),
              f"{r['time_us']:.3g}" if isinstance(r["time_us"], float) and r["time_us"] == r["time_us"] else "-",
              f"{r['roofline_fraction']:.0%}" if isinstance(r["roofline_fraction"], float)
              and r["roofline_fraction"] == r["roofline_fraction"] else "-", note(r)]
             for r in rows]
    below = [f"{mark}: {text}" for text, mark in notes.items()]
    if len(short) == 1:              # one problem: said once above, not in every row
        return [f"problem: {next(iter(short))}"] + fixed_width(
            ["kernel", "M", "contender", "time_us", "of_roofline", "note"], [r[:1] + r[2:] for r in table],
            left=(0, 2, 5)) + below
    head = [f"all problems: {common}"] if common else []
    return head + fixed_width(["kernel", "problem", "M", "contender", "time_us", "of_roofline", "note"], table,
                              left=(0, 1, 3, 6)) + below


NOTE_WIDTH = 40          # the note column's width: a longer note is said under the table
