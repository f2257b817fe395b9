"""`tuner coverage`'s output: the map as a table within 120 columns (engine versions that read the
same thing on one line), as JSON (one object per row), as a picture (models x deployments
coloured by status, one panel per engine), and the lines that say where tuning pays: per GPU,
how many of the fused-MoE tables the newest engines read by default run their default config,
a fallback or a shipped table, next to the gains the committed GPU runs measured."""

from __future__ import annotations

from pathlib import Path

from tuner.emit.coverage import STATUSES, CoverageMap, Row
from tuner.emit.coverage_sources import Gain
from tuner.emit.run_table import fixed_width

FORMAT = "tuner-coverage/1"
COLOURS = {"default": "#d62728", "fallback": "#ff7f0e", "shipped": "#1f77b4", "tuned": "#2ca02c"}
NOT_READ = "#d9d9d9"          # a table the engine's default backend does not read
LEGEND = ("status: default = no table, the engine's default config runs; fallback = another Triton folder's copy, "
          "another GPU's table, the up table for a _down, or keys far from M; shipped = the engine's table for this "
          "GPU; tuned = ours (tuned/, or installed by tuner). EP: expert parallelism with data-parallel attention, "
          "one rank's shapes. read: yes by default, or only with the engine's backend flag. gain: tuned vs the "
          "default config / vs the shipped table, as a committed GPU run measured.")


def _versions(rows: list[Row]) -> str:
    vs = list(dict.fromkeys(r.engine_version for r in rows))
    return vs[0] if len(vs) == 1 else f"{vs[0]}-{vs[-1]}"


def _dtype(dtype: str) -> str:
    return dtype.removesuffix("_w8a8")


def _table(r: Row) -> str:
    shape = ",".join(f"{k}={r.problem[k]}" for k in ("E", "N") if k in r.problem) if r.kernel == "fused_moe" else \
        ",".join(f"{k}={r.problem[k]}" for k in ("N", "K"))
    return f"{r.part} {shape}"


def _gain(g: Gain | None) -> str:
    if g is None:
        return "-"
    return "/".join(f"{v:.2f}x" if v else "-" for v in (g.default, g.shipped))


def ordered(rows: list[Row]) -> list[Row]:
    """Rows by model and GPU, then deployment and dtype as the map lists them, the fused-MoE
    tables before the GEMMs, each engine's versions together (oldest first)."""
    from tuner.plan.kernel_sources import version_key
    first: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        first.setdefault((r.model, r.gpu, r.served, r.dtype), i)
        first.setdefault((r.model, r.gpu, r.served, r.dtype, r.engine, r.problem_key), i)
    return sorted(rows, key=lambda r: (r.model, r.gpu, first[(r.model, r.gpu, r.served, r.dtype)],
                                       r.kernel != "fused_moe",
                                       first[(r.model, r.gpu, r.served, r.dtype, r.engine, r.problem_key)],
                                       version_key(r.engine_version)))


def _same(a: Row, b: Row) -> bool:
    """Two versions of one engine that read one table of one deployment alike."""
    return (a.model, a.gpu, a.served, a.dtype, a.engine, a.problem_key, a.status, a.short, a.read_by_default, a.gain,
            a.k_shared_with) == (b.model, b.gpu, b.served, b.dtype, b.engine, b.problem_key, b.status, b.short,
                                 b.read_by_default, b.gain, b.k_shared_with)


def _groups(rows: list[Row], each_gemm: bool) -> list[list[Row]]:
    """Consecutive rows to show as one line: versions read alike; unless `each_gemm`, a
    deployment's GEMM tables of one engine's versions that read them alike, together."""
    out: list[list[Row]] = []
    for r in rows:
        last = out[-1] if out else None
        if last and _same(last[-1], r):
            last.append(r)
        elif last and not each_gemm and r.kernel == last[0].kernel == "fp8_gemm" and \
                (r.model, r.gpu, r.served, r.dtype, r.engine) == (last[0].model, last[0].gpu, last[0].served,
                                                                 last[0].dtype, last[0].engine):
            last.append(r)
        else:
            out.append([r])
    if each_gemm:
        return out
    merged: list[list[Row]] = []        # GEMM groups of consecutive versions with the same statuses, merged
    for g in out:
        prev = merged[-1] if merged else None
        if prev and g[0].kernel == prev[0].kernel == "fp8_gemm" and _gemm_key(prev) == _gemm_key(g) \
                and (g[0].model, g[0].gpu, g[0].served, g[0].dtype, g[0].engine) == \
                (prev[0].model, prev[0].gpu, prev[0].served, prev[0].dtype, prev[0].engine):
            prev += g
        else:
            merged.append(g)
    return merged


def _gemm_key(rows: list[Row]) -> list:
    versions = list(dict.fromkeys(r.engine_version for r in rows))
    per = [sorted((r.problem_key, r.status, r.short) for r in rows if r.engine_version == v) for v in versions]
    return per[0] if all(p == per[0] for p in per) else [versions]


def _line(group: list[Row]) -> list[str]:
    r = group[0]
    if r.kernel == "fp8_gemm" and len({x.problem_key for x in group}) > 1:
        counts = {s: len({x.problem_key for x in group if x.status == s}) for s in STATUSES}
        shapes = len({x.problem_key for x in group})
        return [r.served.label, _dtype(r.dtype), f"{r.engine} {_versions(group)}", f"gemm x{shapes} shapes",
                "yes" if r.read_by_default else "flag", "", ", ".join(f"{n} {s}" for s, n in counts.items() if n), "-"]
    note = r.short + (("; " if r.short else "") + "K shared: " + ", ".join(r.k_shared_with) if r.k_shared else "")
    return [r.served.label, _dtype(r.dtype), f"{r.engine} {_versions(group)}", _table(r),
            "yes" if r.read_by_default else "flag", r.status, note[:WHY], _gain(r.gain)]


WHY = 30                    # the why column's width in the table (the JSON has it whole)


def table_lines(cmap: CoverageMap, each_gemm: bool = False) -> list[str]:
    """The map, one block per model and GPU; each line a table, the engine versions that read
    it alike on one line; a deployment's GEMM tables (read only with a backend flag) counted on
    one line by status unless `each_gemm`; then the commands that tune what runs no table of
    its own at the newest versions."""
    from tuner.textwidth import fit_line
    newest = _newest(cmap)
    lines: list[str] = []
    blocks: dict[tuple[str, str], list[Row]] = {}
    for r in ordered(cmap.rows):
        blocks.setdefault((r.model, r.gpu), []).append(r)
    for (model, gpu), rows in blocks.items():
        hidden = next((r.problem.get("K") for r in rows if r.kernel == "fused_moe"), None)
        lines.append("")
        lines.append(f"{model} on {gpu}" + (f" (the experts' K={hidden})" if hidden else ""))
        cells = [_line(g) for g in _groups(rows, each_gemm)]
        table = fixed_width(["deploy", "dtype", "engine", "table", "read", "status", "why", "gain"], cells,
                            left=(0, 1, 2, 3, 4, 5, 6))
        lines += ["  " + ln for ln in table]
        commands = list(dict.fromkeys(r.command for r in rows if r.status in ("default", "fallback")
                                      and r.read_by_default and newest.get(r.engine) == r.engine_version))
        if commands:
            lines.append("  tune what runs no table of its own (" + ", ".join(f"{e} {v}" for e, v in newest.items())
                         + "):")
            lines += [f"    {c}" for c in commands]
    out = []
    for line in lines:
        out += fit_line(line, 120)
    return out


def head_lines(cmap: CoverageMap, models: int, gpus: int) -> list[str]:
    """What the map covers and where the engines' tables were read from."""
    by: dict[str, list] = {}
    for i in cmap.installations:
        by.setdefault(i.engine, []).append(i)
    parts = [f"{e} {_versions_of(v)}" for e, v in by.items()]
    folders = {str(Path(i.origin.removeprefix("wheel ")).parent) for i in cmap.installations
               if i.origin.startswith("wheel ")}
    where = f"wheels in {', '.join(sorted(folders))}" if folders and all(
        i.origin.startswith("wheel ") for i in cmap.installations) else "; ".join(
        f"{i.label}: {i.origin}" for i in cmap.installations)
    tri = cmap.installations[0]
    return [f"tuner coverage: {_counted(models, 'model')} x {_counted(gpus, 'GPU')}; {', '.join(parts)} ({where}); "
            f"Triton {tri.triton} ({tri.triton_origin})", LEGEND]


def _counted(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _versions_of(insts: list) -> str:
    vs = [i.version for i in insts]
    return vs[0] if len(vs) == 1 else f"{vs[0]}-{vs[-1]}"


def _newest(cmap: CoverageMap) -> dict[str, str]:
    from tuner.plan.kernel_sources import version_key
    newest: dict[str, str] = {}
    for inst in cmap.installations:
        if inst.engine not in newest or version_key(inst.version) > version_key(newest[inst.engine]):
            newest[inst.engine] = inst.version
    return newest


def pays_lines(cmap: CoverageMap) -> list[str]:
    """Where tuning pays, per GPU: of the fused-MoE tables the newest engine versions read by
    default for these deployments, how many run the default config, a fallback, a shipped
    table or ours; and what the committed GPU runs measured tuned vs default and vs shipped."""
    newest = _newest(cmap)
    current = [r for r in cmap.rows if r.kernel == "fused_moe" and r.read_by_default
               and newest.get(r.engine) == r.engine_version]
    if not current:
        return []
    engines = ", ".join(f"{e} {v}" for e, v in newest.items())
    models = len({r.model for r in current})
    every = len({r.model for r in cmap.rows})
    # the header counts every model mapped; a model whose deployments read no fused-MoE table by default
    # (a dense one) is not among these: said, so the two counts do not contradict each other
    of = f" of the {every}" if every != models else ""
    lines = [f"where tuning pays: the fused-MoE tables {engines} read by default for the deployments of "
             f"{_counted(models, 'model')}{of}"]
    for gpu in dict.fromkeys(r.gpu for r in current):
        rows = [r for r in current if r.gpu == gpu]
        counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
        lines.append(f"  {gpu}: {counts['default']} of {len(rows)} run the engine's default config, "
                     f"{counts['fallback']} a fallback, {counts['shipped']} a shipped table, {counts['tuned']} ours")
    gains = {r.gain for r in cmap.rows if r.gain is not None and newest.get(r.engine) == r.engine_version}
    if gains:
        vs_default = Gain.geomean([x for g in gains for x in g.vs_default])
        vs_shipped = Gain.geomean([x for g in gains for x in g.vs_shipped])
        cells = sum(len(g.vs_default) for g in gains)
        runs = ", ".join(sorted({g.run for g in gains}))
        lines.append(f"  measured ({runs}, {cells} cells): tuned vs the default config {vs_default:.2f}x, tuned vs "
                     f"the shipped table {vs_shipped:.3f}x (geometric means)")
    return lines


def summary_lines(cmap: CoverageMap) -> list[str]:
    counts = {s: sum(r.status == s for r in cmap.rows) for s in STATUSES}
    engines = ", ".join(f"{i.label}" for i in cmap.installations)
    return [f"{len(cmap.rows)} tables ({', '.join(f'{n} {s}' for s, n in counts.items())}) over {engines}; "
            f"{sum(r.k_shared for r in cmap.rows)} read by models of another K"]


def as_json(cmap: CoverageMap) -> dict:
    return {"format": FORMAT, "engines": [{"engine": i.engine, "version": i.version, "source": i.origin,
                                           "triton": i.triton, "triton_from": i.triton_origin}
                                          for i in cmap.installations],
            "notes": cmap.notes, "where_tuning_pays": pays_lines(cmap), "rows": [r.as_dict() for r in cmap.rows]}


# -- the picture ---------------------------------------------------------------------------------
def _cell(rows: list[Row]) -> tuple[str, bool]:
    """A deployment's colour in one engine's panel: its least tuned fused-MoE table read by
    default (or NOT_READ when the engine's default backend reads none), and whether one of its
    files is read by models of another K."""
    read = [r for r in rows if r.read_by_default]
    shared = any(r.k_shared for r in rows)
    if not read:
        return NOT_READ, shared
    return COLOURS[min((r.status for r in read), key=STATUSES.index)], shared


KINDS = ("one node", "two nodes", "EP")


def plot(cmap: CoverageMap, path: Path) -> Path:
    """Models x deployments (GPU, one node / two nodes / EP, dtype) coloured by status, each cell
    naming its parallelism, one panel per engine at its newest version; written whole, a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    from tuner.file_kinds import PLOT, PLOT_METADATA
    from tuner.paths import atomic_write_file
    newest = _newest(cmap)
    rows = [r for r in cmap.rows if r.kernel == "fused_moe" and newest.get(r.engine) == r.engine_version]
    models = list(dict.fromkeys(r.model for r in rows))
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    columns = sorted({(r.gpu, r.served.kind, r.dtype) for r in rows},
                     key=lambda c: (list(dict.fromkeys(r.gpu for r in rows)).index(c[0]), KINDS.index(c[1]),
                                    dtypes.index(c[2])))
    engines = list(newest)
    fig, axes = plt.subplots(len(engines), 1, figsize=(max(7.0, 0.55 * len(columns) + 2.5),
                                                       0.8 + len(engines) * (0.42 * len(models) + 1.5)), squeeze=False)
    for ax, engine in zip(axes[:, 0], engines):
        grid = [[(1.0, 1.0, 1.0)] * len(columns) for _ in models]
        for i, model in enumerate(models):
            for j, col in enumerate(columns):
                here = [r for r in rows if r.engine == engine and r.model == model
                        and (r.gpu, r.served.kind, r.dtype) == col]
                if here:
                    colour, shared = _cell(here)
                    grid[i][j] = to_rgb(colour)
                    text = here[0].served.label.replace(" ", "\n") + ("\nK" if shared else "")
                    ax.text(j, i, text, ha="center", va="center", fontsize=5.5,
                            color="black" if colour in (NOT_READ, COLOURS["fallback"]) else "white")
        ax.imshow(grid, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(models)), models, fontsize=7)
        ax.set_xticks(range(len(columns)), [f"{g} {k} {_dtype(t)}" for g, k, t in columns], rotation=60,
                      ha="right", fontsize=6)
        ax.set_xticks([x - 0.5 for x in range(1, len(columns))], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(models))], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
        triton = next(i.triton for i in cmap.installations if i.engine == engine)
        ax.set_title(f"{engine} {newest[engine]}, Triton {triton}: the fused-MoE tables each deployment reads "
                     "(the least tuned of a deployment's)", fontsize=7)
    handles = [Patch(color=c, label=s) for s, c in COLOURS.items()] + [
        Patch(color=NOT_READ, label="not read by default (another backend)")]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=6.5, frameon=False)
    fig.text(0.01, 0.005, "made by `tuner coverage --plot`; K: a file that models of another K read too", fontsize=5.5)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    try:
        # marked as ours (Software: tuner): the next --plot replaces it, and no other PNG
        atomic_write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", metadata=PLOT_METADATA),
                          kind=PLOT)
    finally:
        plt.close(fig)
    return path
