"""Reports over results folders: `tuner report RUN` and `tuner diff OLD NEW`.

Both print tables (pandas; one per engine table file, within 120 columns, the config's keys
named) and write a Markdown file with PNG plots (matplotlib): time against M for each
problem and the speedup, coloured by verdict and titled with where the times came from, so
a reader sees at once what got faster, what got slower, by how much, and in which file.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.emit.run_table import run_source
from tuner.errors import TunerError
from tuner.file_kinds import DIFF_MD, PLOT, PLOT_METADATA, REPORT_MD
from tuner.jobs.report_traffic import geomean, label, number
from tuner.jobs.requests import DiffRequest, ReportRequest
from tuner.measure import failures
from tuner.measure.provenance import is_loud
from tuner.paths import Kind, atomic_write_file, atomic_write_text, check_output, check_writable, replaceable

if TYPE_CHECKING:                  # pandas loads when a report runs, not for `tuner --help`
    import pandas as pd


def read_manifest(run: Path) -> dict:
    """tuner.emit.results' reader, imported on first use: that module brings Optuna, which
    `tuner --help` (it builds this module's parsers) does not need."""
    from tuner.emit.results import read_manifest as read
    return read(run)


WIDTH = 120        # terminal tables stay within this many columns


def _files(entry: dict, manifest: dict | None = None) -> tuple[str, str]:
    """(engines, files) a manifest table was written to: 'vllm', 'vllm: E=...json' (one
    line per engine; our kernel times one table for both engines' files); a tied table not
    written (the same as the one it is tied to) by the file it would be, and why it is not."""
    files = entry.get("files") or {}
    if not files:
        source = (entry.get("kernel_source") or {}).get("source", "ours")
        unwritten = _unwritten(entry, manifest)
        if unwritten is not None:
            would, why = unwritten
            return ", ".join(would), "\n".join([*(f"{engine}: {Path(f).name} (not written)" for engine, f in
                                                 would.items()), f"  not written: {why}"])
        return source, f"{source}: (no file)"
    return ", ".join(files), "\n".join(f"{engine}: {Path(str(f)).name}" for engine, f in files.items())


def _unwritten(entry: dict, manifest: dict | None) -> tuple[dict[str, str], str] | None:
    from tuner.emit.run_table import unwritten_table
    from tuner.plan.gpus import get_gpu
    if manifest is None or not entry.get("not_written"):
        return None
    try:
        cuda_name = get_gpu(str(manifest.get("gpu"))).cuda_name
    except TunerError:
        return None
    return unwritten_table(manifest, entry, cuda_name)


def manifest_frame(run: Path) -> pd.DataFrame:
    """One row per (table, M) of a results folder's manifest, with the engine and file it
    belongs to and its config's keys (the legend of the config column)."""
    manifest = read_manifest(run)
    rows = []
    for t in manifest.get("tables", []):
        engine, file = _files(t, manifest)
        for m, e in (t.get("entries") or {}).items():
            cfg = e.get("config")
            rows.append({
                "engine": engine, "file": file, "legend": " ".join(cfg) if cfg else "",
                "problem": label(t), "M": int(m),
                "config": " ".join(str(v) for v in cfg.values()) if cfg else "-",
                # manifests written before times were checked may hold NaN or Infinity: no number
                "time_us": number(e.get("time_us")), "spread": number(e.get("spread")),
                "default_us": number(e.get("default_time_us")), "speedup": number(e.get("speedup")),
                "default_error": e.get("default_error") if isinstance(e.get("default_error"), str) else None,
                "trials": e.get("trials"), "numerics": (e.get("numerics") or {}).get("status"),
                "failures": failures.summary(e.get("failures") or {}),
                # which config the row holds and why (tuner/search/choice.py): tuned, installed or default
                "row": choice_text(e.get("choice")) if e.get("choice") else "",
            })
    if not rows:
        raise TunerError(f"{run}/manifest.json lists no tuned entries")
    import pandas as pd
    df = pd.DataFrame(rows).sort_values(["engine", "file", "problem", "M"]).reset_index(drop=True)
    # every row of a table names its config's keys (the first tuned entry's)
    df["legend"] = df.groupby(["engine", "file", "problem"])["legend"].transform(lambda v: max(v, key=len))
    return df


def _columns() -> int | None:
    """The terminal's columns (at most WIDTH), None when piped: whole lines then, as every
    command prints them (tuner/textwidth.py)."""
    from tuner.textwidth import output_width
    columns = output_width()
    return min(WIDTH, columns) if columns else None


def _fit(text: str, width: int | None = None) -> str:
    width = width or _columns()
    return text if width is None or len(text) <= width else text[: width - 3] + "..."


def _wrapped(prefix: str, text: str, width: int | None = None) -> list[str]:
    """`prefix text` over as many lines as it takes, broken at commas, each within width (one
    line when piped)."""
    width = width or _columns()
    if width is None:
        return [prefix + text]
    lines, line = [], prefix
    for part in text.split(","):
        piece = part if line == prefix else "," + part
        if len(line) + len(piece) > width and line != prefix:
            lines.append(line + ",")
            line = " " * len(prefix) + part
        else:
            line += piece
    return lines + [_fit(line, width)]


def shown_cells(df: pd.DataFrame, columns: list[str], floatfmt: str = ".2f") -> pd.DataFrame:
    """`columns` of `df` as text: numbers formatted, a missing one '-', never NaN; a missing
    default time with its reason, as the run's closing table says it ('- (synthetic failure)')."""
    def cell(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return format(v, floatfmt) if isinstance(v, float) else str(v)
    out = df[columns].astype(object).apply(lambda col: col.map(cell))
    if "default_us" in columns and "default_error" in df:
        out["default_us"] = [f"- ({why})" if text == "-" and isinstance(why, str) else text
                             for text, why in zip(out["default_us"], df["default_error"])]
    return out


def table_sections(df: pd.DataFrame, columns: list[str]) -> list[str]:
    """A terminal view of a report or diff frame: per engine table file, a heading (engine,
    file, problem, the config legend) and its rows, every line within WIDTH columns."""
    out: list[str] = []
    for (engine, file, problem), part in df.groupby(["engine", "file", "problem"], sort=True):
        out += [_fit(line) for line in file.splitlines()]
        out += _wrapped("  problem ", problem)
        legend = part["legend"].iloc[0] if "legend" in part else ""
        if legend:
            out.append(_fit(f"  config = {legend}"))
        shown = shown_cells(part, columns).to_string(index=False).splitlines()
        out += [_fit("  " + line) for line in shown]
        out.append("")
    return out


def failures_by_kind(run: Path) -> dict[str, int]:
    """Failed configs of every study in a results folder, by kind (manifests written
    before kinds were recorded count none)."""
    totals: Counter = Counter()
    for t in read_manifest(run).get("tables", []):
        for e in (t.get("entries") or {}).values():
            totals.update({k: int(n) for k, n in (e.get("failures") or {}).items()})
    return failures.count_by_kind(k for k, n in totals.items() for _ in range(n))


def _plot(path: Path, title: str, series: dict[str, tuple[list, list]], ratio: tuple[str, list, list],
          source: str, colours: list[str] | None = None, root: Path | None = None, kind: Kind | None = None) -> None:
    """Time against M (log-log) and a bar per M of the ratio, coloured by verdict (given, or
    green for a gain and red for a loss), titled with the problem and where the times came
    from (red when SYNTHETIC)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.4))
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
    ax2.bar([str(x) for x in xs], ys, color=colours or ["tab:green" if y >= 1 else "tab:red" for y in ys])
    if colours:
        from matplotlib.patches import Patch
        used = [v for v, c in VERDICT_COLOURS.items() if c in colours]
        ax2.legend(handles=[Patch(color=VERDICT_COLOURS[v], label=v) for v in used], fontsize=7)
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_xlabel("M (batch size)")
    ax2.set_ylabel(name)
    ax2.tick_params(axis="x", labelrotation=60)
    fig.suptitle(f"{title}\n{source}" if source else title, fontsize=8,
                 color="red" if is_loud(source) else "black")
    fig.tight_layout()
    try:
        atomic_write_file(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png", metadata=PLOT_METADATA),
                          root=root, kind=kind)
    finally:
        plt.close(fig)


def check_outputs(md: Path, md_kind: Kind, plots: list[Path], option: str) -> Kind | None:
    """Before the first write: the Markdown and every plot beside it may be written there. A
    path the user named (`option`) holds only files of the kind written (tuner/file_kinds.py);
    inside a results folder of ours (no option) only no folder, device or link is replaced.
    Returns the plots' kind for the writer."""
    if not option:
        check_writable(md, "", folder=False)
        for png in plots:
            replaceable(png)
        return None
    check_output(md, md_kind, option)
    for png in plots:
        replaceable(png, PLOT, f"{option} {md.parent}: {png.name}")
    return PLOT


def choice_text(choice: dict) -> str:
    from tuner.search.choice import choice_text as text
    return text(choice)


def policy_text(policy) -> str:
    from tuner.measure.policy import policy_text as text
    return text(policy if isinstance(policy, dict) else None)


def write_report(run: Path, out: Path | None = None,
                 traffic_lines: list[str] | None = None) -> tuple[pd.DataFrame, Path]:
    run = Path(run)
    df = manifest_frame(run)
    source = run_source(run)
    # the report and its plots stay inside the run (or the folder of --out), through no link
    given = out is not None
    out, root = (Path(out), Path(out).parent) if out else (run / "report" / "report.md", run)
    problems = sorted(df["problem"].unique())
    plot_kind = check_outputs(out, REPORT_MD, [out.parent / f"plot-{i}.png" for i in range(len(problems))],
                              "--out" if given else "")
    manifest = read_manifest(run)
    lines = [f"# Tuning report: {run}", "", source, "",
             f"Measurement: {policy_text(manifest.get('measurement'))}."
             + (f" Routing recorded from {manifest['routing'].get('file')} ({manifest['routing'].get('what')})."
                if isinstance(manifest.get("routing"), dict) else ""), ""]
    g = geomean(df["speedup"])
    if g:
        where = " (SYNTHETIC: not a measurement)" if "SYNTHETIC" in source else \
            " (CPU DEVICE: not a GPU's times)" if is_loud(source) else ""
        from tuner.measure.noise import for_environment, speedup
        lines += [f"Geometric-mean speedup over the engines' default config{where}: "
                  f"**{speedup(g, for_environment(manifest.get('environment')))}** "
                  f"over {df['speedup'].notna().sum()} batch sizes.", ""]
    if traffic_lines:
        lines += ["## Judged by traffic", "", *[f"- {line}" for line in traffic_lines], ""]
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
        head = "; ".join(part["file"].iloc[0].splitlines())
        _plot(png, f"{head}\n{problem}", series, ("speedup over default", list(sp["M"]), list(sp["speedup"])),
              source, root=root, kind=plot_kind)
        lines += [f"## {head}", "", f"Problem `{problem}`; config = {part['legend'].iloc[0] or '-'}", "",
                  f"![{problem}]({png.name})", "",
                  markdown_table(shown_cells(part, [c for c in part.columns if c not in (
                      "problem", "engine", "file", "legend", "default_error")])), ""]
    atomic_write_text(out, "\n".join(lines) + "\n", root=root, kind=REPORT_MD if given else None)
    return df, out


def diff_frame(old: Path, new: Path, noise: float = 0.02) -> pd.DataFrame:
    import pandas as pd
    cols = ["engine", "file", "legend", "problem", "M", "config", "time_us", "spread"]
    a, b = manifest_frame(old)[cols], manifest_frame(new)[cols]
    df = a.merge(b, on=["problem", "M"], how="outer", suffixes=("_old", "_new"))
    for key in ("engine", "file", "legend"):       # as the new run names them, else the old
        df[key] = df[f"{key}_new"].fillna(df[f"{key}_old"])
        df = df.drop(columns=[f"{key}_old", f"{key}_new"])
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
    return df.sort_values(["engine", "file", "problem", "M"]).reset_index(drop=True)


VERDICT_COLOURS = {"faster": "tab:green", "slower": "tab:red", "same": "tab:gray", "new": "tab:blue",
                   "dropped": "tab:orange"}


def write_diff(old: Path, new: Path, out_dir: Path, noise: float = 0.02,
               force: bool = False, traffic_lines: list[str] | None = None) -> tuple[pd.DataFrame, Path]:
    """Compare two runs; refused (unless forced) when they share no (problem, M), or when
    out_dir holds the diff against another run."""
    df = diff_frame(old, new, noise)
    out = Path(out_dir) / "diff.md"
    # NEW/diff stays inside NEW; a given --out is its own root (no link below it is followed)
    default = Path(out_dir) == Path(new) / "diff"
    root = Path(new) if default else Path(out_dir)
    check_writable(out_dir, "" if default else "--out")
    plot_kind = check_outputs(out, DIFF_MD, [out.parent / f"diff-{i}.png" for i in range(df["problem"].nunique())],
                              "" if default else "--out")
    if not force and not ((df["verdict"] != "new") & (df["verdict"] != "dropped")).any():
        raise TunerError(f"{old} and {new} have no (problem, M) in common: they are unrelated runs "
                         "(--force compares them anyway)")
    if not force and out.is_file():
        from tuner.reading import first_line
        first = first_line(out, "the diff ").rstrip("\n")
        if first != f"# {new} against {old}":
            raise TunerError(f"{out} holds another comparison ({first.lstrip('# ')}); give --out, or --force "
                             "to replace it")
    counts = df["verdict"].value_counts().to_dict()
    lines = [f"# {new} against {old}", "", f"Old run: {run_source(old)}", "", f"New run: {run_source(new)}", "",
             f"**{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower**, "
             f"{counts.get('same', 0)} within noise, {counts.get('new', 0)} new, {counts.get('dropped', 0)} dropped "
             f"(noise band: the larger spread, at least {noise * 100:.0f}%).", ""]
    if traffic_lines:
        lines += ["## Judged by traffic", "", *[f"- {line}" for line in traffic_lines], ""]
    worst = df[df["verdict"] == "slower"].sort_values("change_pct", ascending=False)
    if not worst.empty:
        lines += ["Slower:", ""] + [f"- {r.problem} M={r.M}: {r.time_us_old:.2f} -> {r.time_us_new:.2f} us "
                                    f"({r.change_pct:+.1f}%)" for r in worst.itertuples()] + [""]
    sources = f"old: {run_source(old)}\nnew: {run_source(new)}"
    for i, (problem, part) in enumerate(df.groupby("problem", sort=True)):
        png = out.parent / f"diff-{i}.png"
        both = part.dropna(subset=["time_us_old", "time_us_new"])
        head = "; ".join(part["file"].iloc[0].splitlines())
        _plot(png, f"{head}\n{problem}",
              {"old": (list(part.dropna(subset=["time_us_old"])["M"]), list(part["time_us_old"].dropna())),
               "new": (list(part.dropna(subset=["time_us_new"])["M"]), list(part["time_us_new"].dropna()))},
              ("speedup new/old", list(both["M"]), list(both["time_us_old"] / both["time_us_new"])), sources,
              colours=[VERDICT_COLOURS[v] for v in both["verdict"]], root=root, kind=plot_kind)
        table = part.drop(columns=["problem", "engine", "file", "legend"])
        lines += [f"## {head}", "", f"Problem `{problem}`; config = {part['legend'].iloc[0] or '-'}", "",
                  f"![{problem}]({png.name})", "", markdown_table(table, floatfmt=".2f"), ""]
    atomic_write_text(out, "\n".join(lines) + "\n", root=root, kind=None if default else DIFF_MD)
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


def bench_verdict(path: Path) -> list[str]:
    """`tuner report BENCH.json`: a bench's verdict per M and the backend flag to run
    (tuner/emit/verdict.py), from the file checked on read (tuner/jobs/bench_file.py)."""
    from tuner.emit.verdict import verdict_lines
    from tuner.jobs.bench_file import read_bench
    bench = read_bench(path)
    if not any(r["time_us"] is not None for r in bench.rows):
        raise TunerError(f"bench file {path}: none of its {len(bench.rows)} rows has a time (every contender failed "
                         "or was not timed): no verdict to give")
    return [bench.banner, *verdict_lines(bench.rows, bench.kernel)]


def run_report(request: ReportRequest) -> int:
    from tuner.jobs.report import table_sections, write_report
    if Path(request.run).is_file():
        for line in bench_verdict(Path(request.run)):
            print(line)
        return 0
    from tuner.jobs.report_traffic import run_model, run_traffic, traffic_report_lines
    run = Path(request.run)
    read_manifest(run)                      # not a results folder: one line, before the profile's
    profile = run_traffic([run], request.traffic)
    traffic = traffic_report_lines(run, profile, run_model([run], request.model)) if profile else None
    df, path = write_report(run, Path(request.out) if request.out else None, traffic)
    source = run_source(Path(request.run))
    print(source)
    for line in table_sections(df, ["M", "config", "time_us", "default_us", "speedup", "trials", "numerics",
                                    "failures"]):
        print(line)
    from tuner.jobs.report import geomean
    g = geomean(df["speedup"])
    if g:
        from tuner.measure.noise import for_environment, speedup
        noise = for_environment(read_manifest(run).get("environment"))
        print(f"Geometric-mean speedup over the engines' default config"
              f"{' (SYNTHETIC: not a measurement)' if 'SYNTHETIC' in source else ''}"
              f"{' (CPU DEVICE: not a GPU time)' if 'CPU DEVICE' in source else ''}: {speedup(g, noise)}")
    for line in traffic or []:
        print(line)
    print(f"report: {path}")
    return 0


def run_diff(request: DiffRequest) -> int:
    from tuner.jobs.report import write_diff
    out = Path(request.out) if request.out else Path(request.new) / "diff"
    from tuner.jobs.report_traffic import run_model, run_traffic, traffic_diff_lines
    runs = [Path(request.new), Path(request.old)]
    for run in runs:
        read_manifest(run)                  # not a results folder: one line, before the profile's
    profile = run_traffic(runs, request.traffic)
    traffic = traffic_diff_lines(Path(request.old), Path(request.new), profile, run_model(runs, request.model)) \
        if profile else None
    df, path = write_diff(Path(request.old), Path(request.new), out, request.noise, request.force, traffic)
    sources = run_source(Path(request.old)), run_source(Path(request.new))
    print(f"old: {sources[0]}")
    print(f"new: {sources[1]}")
    if sources[0] != sources[1]:
        print("warning: the two runs' times come from different sources: a change may be the source's, not the tables'")
    from tuner.jobs.report import table_sections
    for line in table_sections(df, ["M", "config_old", "config_new", "time_us_old", "time_us_new", "change_pct",
                                    "verdict"]):
        print(line)
    for line in traffic or []:
        print(line)
    counts = df["verdict"].value_counts().to_dict()
    print(f"{counts.get('faster', 0)} faster, {counts.get('slower', 0)} slower, {counts.get('same', 0)} same; "
          f"report: {path}")
    return 0
