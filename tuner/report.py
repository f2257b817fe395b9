"""Reports over results folders: `tuner report RUN` and `tuner diff OLD NEW`.

Both print a table (pandas) and write a Markdown file with PNG plots (matplotlib): time
against M for each problem and the speedup, so a reader sees at once what got faster,
what got slower, and by how much.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tuner.errors import TunerError
from tuner.formatting import speedup_cell, time_cell
from tuner.paths import atomic_write_text
from tuner.problems import Problem
from tuner.provenance import TimeSource, from_manifest
from tuner.results import read_manifest


def _label(entry: dict) -> str:
    return f"{entry.get('kernel')} " + Problem(entry.get("kernel", ""), entry.get("problem") or {}).key


def manifest_frame(run: Path) -> pd.DataFrame:
    """One row per (table, M) of a results folder's manifest."""
    manifest = read_manifest(run)
    rows = []
    for t in manifest.get("tables", []):
        for m, e in (t.get("entries") or {}).items():
            cfg = e.get("config")
            rows.append({
                "problem": _label(t), "M": int(m),
                "config": " ".join(str(v) for v in cfg.values()) if cfg else "-",
                "time_us": e.get("time_us"), "spread": e.get("spread"),
                "default_us": e.get("default_time_us"), "default_error": e.get("default_error"),
                "speedup": e.get("speedup"),
                "trials": e.get("trials"), "numerics": (e.get("numerics") or {}).get("status"),
            })
    if not rows:
        raise TunerError(f"{run}/manifest.json lists no tuned entries")
    return pd.DataFrame(rows).sort_values(["problem", "M"]).reset_index(drop=True)


def run_source(run: Path) -> TimeSource:
    """Where a results folder's times came from (its manifest)."""
    return from_manifest(read_manifest(run))


def printable(df: pd.DataFrame) -> pd.DataFrame:
    """A report's rows as printed: two decimals, speedups as 1.23x, a default config
    without a time shown with the reason."""
    out = df.copy()
    out["time_us"] = [time_cell(t) for t in df["time_us"]]
    out["spread"] = [f"{s:.3f}" if s == s and s is not None else "-" for s in df["spread"]]
    out["default_us"] = [time_cell(t, e) for t, e in zip(df["default_us"], df["default_error"])]
    out["speedup"] = [speedup_cell(s) for s in df["speedup"]]
    return out.drop(columns=["default_error"])


def _plot(path: Path, title: str, series: dict[str, tuple[list, list]], ratio: tuple[str, list, list],
          source: TimeSource | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, (xs, ys) in series.items():
        ax1.plot(xs, ys, marker="o", label=name)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax1.xaxis, ax1.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain if axis is ax1.yaxis else NullFormatter())
    ax1.set_xlabel("M (batch size)")
    ax1.set_ylabel("time (us)")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    name, xs, ys = ratio
    ax2.bar([str(x) for x in xs], ys, color=["tab:green" if y >= 1 else "tab:red" for y in ys])
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_xlabel("M (batch size)")
    ax2.set_ylabel(name)
    ax2.tick_params(axis="x", labelrotation=60)
    fig.suptitle(title + (f"\ntimes: {source.short()}" if source else ""), fontsize=9,
                 color="tab:red" if source and source.synthetic else "black")
    fig.tight_layout()
    if source and source.synthetic:
        # across both panels, so that no crop of the picture loses it
        fig.text(0.5, 0.5, "SYNTHETIC - not measured", fontsize=30, color="tab:red", alpha=0.25,
                 ha="center", va="center", rotation=20)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0 and not math.isnan(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def headline(df: pd.DataFrame, source: TimeSource, bold: bool = False) -> str | None:
    """The geometric-mean speedup over the default config, with where the times came from."""
    g = _geomean(df["speedup"])
    if not g:
        return None
    value = f"**{g:.2f}x**" if bold else f"{g:.2f}x"
    return (f"Geometric-mean speedup over the engines' default config: {value} over "
            f"{df['speedup'].notna().sum()} batch sizes"
            + (" (SYNTHETIC times: no speedup was measured)" if source.synthetic
               else f" ({source.line()})"))


def write_report(run: Path, out: Path | None = None) -> tuple[pd.DataFrame, Path]:
    run = Path(run)
    df = manifest_frame(run)
    source = run_source(run)
    out = Path(out) if out else run / "report" / "report.md"
    lines = [f"# Tuning report: {run}", "", *(f"**{line}**" for line in source.banner() if set(line) != {"!"}), ""]
    if headline(df, source):
        lines += [headline(df, source, bold=True), ""]
    failed = df[df["default_us"].isna() & df["default_error"].notna()]
    if not failed.empty:
        lines += [f"The default config has no time at {len(failed)} batch sizes (reason in the default_us "
                  "column); they have no speedup.", ""]
    for i, (problem, part) in enumerate(df.groupby("problem", sort=True)):
        png = out.parent / f"plot-{i}.png"
        timed = part.dropna(subset=["time_us"])
        series = {"tuned": (list(timed["M"]), list(timed["time_us"]))}
        with_default = part.dropna(subset=["default_us"])
        if not with_default.empty:
            series["default config"] = (list(with_default["M"]), list(with_default["default_us"]))
        sp = part.dropna(subset=["speedup"])
        _plot(png, problem, series, ("speedup over default", list(sp["M"]), list(sp["speedup"])), source)
        lines += [f"## {problem}", "", f"![{problem}]({png.name})", "",
                  markdown_table(printable(part).drop(columns=["problem"])), ""]
    atomic_write_text(out, "\n".join(lines) + "\n")
    return df, out


def diff_frame(old: Path, new: Path, noise: float = 0.02) -> pd.DataFrame:
    a = manifest_frame(old)[["problem", "M", "config", "time_us", "spread"]]
    b = manifest_frame(new)[["problem", "M", "config", "time_us", "spread"]]
    df = a.merge(b, on=["problem", "M"], how="outer", suffixes=("_old", "_new"))
    df["change_pct"] = (df["time_us_new"] / df["time_us_old"] - 1.0) * 100.0
    # beyond noise: more than the larger of the two spreads and `noise`
    band = df[["spread_old", "spread_new"]].fillna(0).max(axis=1).clip(lower=noise) * 100.0

    def verdict(row, limit):
        if pd.isna(row["time_us_old"]):
            return "new"
        if pd.isna(row["time_us_new"]):
            return "dropped"
        if row["change_pct"] < -limit:
            return "faster"
        if row["change_pct"] > limit:
            return "slower"
        return "same"

    df["verdict"] = [verdict(r, lim) for (_, r), lim in zip(df.iterrows(), band)]
    return df.sort_values(["problem", "M"]).reset_index(drop=True)


def diff_sources(old: Path, new: Path) -> list[str]:
    """Lines saying where each run's times came from; a warning when they differ."""
    a, b = run_source(old), run_source(new)
    if a == b:
        return a.banner()
    lines = [f"OLD {a.line()}", f"NEW {b.line()}",
             "warning: the two runs' times come from different sources; a change may be the source's, not the tables'"]
    if a.synthetic or b.synthetic:
        rule = "!" * 100
        lines = [rule, *lines, rule]
    return lines


def _diff_marker(old: Path, new: Path) -> str:
    return f"<!-- tuner diff: old={Path(old).resolve()} new={Path(new).resolve()} -->"


def check_diff(old: Path, new: Path, out_dir: Path, df: pd.DataFrame, force: bool = False) -> None:
    """Refuse, unless forced, a diff of runs with nothing in common, and a diff that would
    overwrite the report of another pair of runs."""
    both = df.dropna(subset=["time_us_old", "time_us_new"])
    if both.empty and not force:
        raise TunerError(f"{old} and {new} have no (problem, M) in common: they are not two runs of one "
                         "tuning job, so there is nothing to compare (--force writes the report anyway)")
    md = Path(out_dir) / "diff.md"
    if md.is_file() and not force:
        first = md.read_text().split("\n", 1)[0]
        if first != _diff_marker(old, new):
            raise TunerError(f"{md} holds another comparison ({first.removeprefix('<!-- tuner diff: ').removesuffix(' -->')}); "
                             "give --out DIR for this one, or --force to overwrite it")


def write_diff(old: Path, new: Path, out_dir: Path, noise: float = 0.02,
               force: bool = False) -> tuple[pd.DataFrame, Path]:
    df = diff_frame(old, new, noise)
    check_diff(old, new, out_dir, df, force)
    out = Path(out_dir) / "diff.md"
    counts = df["verdict"].value_counts().to_dict()
    # plots carry the new run's source, or the old one's where that one is synthetic
    plot_source = next((src for src in (run_source(old), run_source(new)) if src.synthetic), run_source(new))
    lines = [_diff_marker(old, new), f"# {new} against {old}", "",
             *(f"**{line}**" for line in diff_sources(old, new) if set(line) != {"!"}), "",
             f"**{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower**, "
             f"{counts.get('same', 0)} within noise, {counts.get('new', 0)} new, {counts.get('dropped', 0)} dropped "
             f"(noise band: the larger spread, at least {noise * 100:.0f}%).", ""]
    worst = df[df["verdict"] == "slower"].sort_values("change_pct", ascending=False)
    if not worst.empty:
        lines += ["Slower:", ""] + [f"- {r.problem} M={r.M}: {r.time_us_old:.2f} -> {r.time_us_new:.2f} us "
                                    f"({r.change_pct:+.1f}%)" for r in worst.itertuples()] + [""]
    for i, (problem, part) in enumerate(df.groupby("problem", sort=True)):
        png = out.parent / f"diff-{i}.png"
        both = part.dropna(subset=["time_us_old", "time_us_new"])
        _plot(png, problem,
              {"old": (list(part.dropna(subset=["time_us_old"])["M"]), list(part["time_us_old"].dropna())),
               "new": (list(part.dropna(subset=["time_us_new"])["M"]), list(part["time_us_new"].dropna()))},
              ("speedup new/old", list(both["M"]), list(both["time_us_old"] / both["time_us_new"])),
              plot_source)
        table = part.drop(columns=["problem"])
        lines += [f"## {problem}", "", f"![{problem}]({png.name})", "",
                  markdown_table(table, floatfmt=".2f"), ""]
    atomic_write_text(out, "\n".join(lines) + "\n")
    return df, out


def markdown_table(df: pd.DataFrame, **kw) -> str:
    """A Markdown table (pandas needs the tabulate package for that); else a code block."""
    try:
        return df.to_markdown(index=False, **kw)
    except ImportError:
        return "```\n" + df.to_string(index=False) + "\n```"
