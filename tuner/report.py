"""Reports over results folders: `tuner report RUN` and `tuner diff OLD NEW`.

Both print a table (pandas) and write a Markdown file with PNG plots (matplotlib): time
against M for each problem and the speedup, so a reader sees at once what got faster,
what got slower, and by how much.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pandas as pd

from tuner import failures
from tuner.errors import TunerError
from tuner.paths import atomic_write_text
from tuner.problems import Problem
from tuner.provenance import is_loud
from tuner.results import read_manifest


def _label(entry: dict) -> str:
    return f"{entry.get('kernel')} " + Problem(entry.get("kernel", ""), entry.get("problem") or {}).key


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else None


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
                # manifests written before times were checked may hold NaN or Infinity: no number
                "time_us": _number(e.get("time_us")), "spread": _number(e.get("spread")),
                "default_us": _number(e.get("default_time_us")), "speedup": _number(e.get("speedup")),
                "trials": e.get("trials"), "numerics": (e.get("numerics") or {}).get("status"),
                "failures": failures.summary(e.get("failures") or {}),
            })
    if not rows:
        raise TunerError(f"{run}/manifest.json lists no tuned entries")
    return pd.DataFrame(rows).sort_values(["problem", "M"]).reset_index(drop=True)


def failures_by_kind(run: Path) -> dict[str, int]:
    """Failed configs of every study in a results folder, by kind (manifests written
    before kinds were recorded count none)."""
    totals: Counter = Counter()
    for t in read_manifest(run).get("tables", []):
        for e in (t.get("entries") or {}).values():
            totals.update({k: int(n) for k, n in (e.get("failures") or {}).items()})
    return failures.count_by_kind(k for k, n in totals.items() for _ in range(n))


def _plot(path: Path, title: str, series: dict[str, tuple[list, list]], ratio: tuple[str, list, list],
          source: str = "") -> None:
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
    fig.suptitle(f"{title}\n{source}" if source else title, fontsize=9,
                 color="red" if is_loud(source) else "black")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0 and not math.isnan(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def run_source(run: Path) -> str:
    """Where a results folder's times came from, in one line (loud when SYNTHETIC or from the
    CPU device)."""
    from tuner.provenance import banner
    manifest = read_manifest(run)
    env: dict = next((t.get("environment") for t in manifest.get("tables", []) if t.get("environment")), {}) or {}
    measured = manifest.get("measured_by") or next((t.get("measured") for t in manifest.get("tables", [])), "")
    return banner(env, measured)


def write_report(run: Path, out: Path | None = None) -> tuple[pd.DataFrame, Path]:
    run = Path(run)
    df = manifest_frame(run)
    source = run_source(run)
    out = Path(out) if out else run / "report" / "report.md"
    lines = [f"# Tuning report: {run}", "", source, ""]
    g = _geomean(df["speedup"])
    if g:
        where = " (SYNTHETIC: not a measurement)" if "SYNTHETIC" in source else \
            " (CPU DEVICE: not a GPU's times)" if is_loud(source) else ""
        lines += [f"Geometric-mean speedup over the engines' default config{where}: **{g:.2f}x** "
                  f"over {df['speedup'].notna().sum()} batch sizes.", ""]
    failed = failures_by_kind(run)
    if failed:
        lines += [f"Failed configs by kind: {failures.summary(failed)} "
                  f"({sum(failed.values())} over {len(df)} studies).", ""]
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
                  markdown_table(part.drop(columns=["problem"])), ""]
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


def write_diff(old: Path, new: Path, out_dir: Path, noise: float = 0.02,
               force: bool = False) -> tuple[pd.DataFrame, Path]:
    """Compare two runs; refused (unless forced) when they share no (problem, M), or when
    out_dir holds the diff against another run."""
    df = diff_frame(old, new, noise)
    out = Path(out_dir) / "diff.md"
    if not force and not ((df["verdict"] != "new") & (df["verdict"] != "dropped")).any():
        raise TunerError(f"{old} and {new} have no (problem, M) in common: they are unrelated runs "
                         "(--force compares them anyway)")
    if not force and out.is_file():
        first = out.read_text().split("\n", 1)[0]
        if first != f"# {new} against {old}":
            raise TunerError(f"{out} holds another comparison ({first.lstrip('# ')}); give --out, or --force "
                             "to replace it")
    counts = df["verdict"].value_counts().to_dict()
    lines = [f"# {new} against {old}", "", f"Old run: {run_source(old)}", "", f"New run: {run_source(new)}", "",
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
              ("speedup new/old", list(both["M"]), list(both["time_us_old"] / both["time_us_new"])))
        table = part.drop(columns=["problem"])
        lines += [f"## {problem}", "", f"![{problem}]({png.name})", "",
                  markdown_table(table, floatfmt=".2f"), ""]
    atomic_write_text(out, "\n".join(lines) + "\n")
    return df, out


def markdown_table(df: pd.DataFrame, floatfmt: str = ".2f") -> str:
    """A Markdown table of a frame: numbers formatted, missing values as '-'."""
    def cell(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        if isinstance(v, float):
            return format(v, floatfmt)
        return str(v).replace("|", "\\|").replace("\n", " ")
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])
