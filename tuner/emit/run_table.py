"""A run's closing table as a person reads it: within 120 columns, each row naming the table
file it goes to (by what tells the files apart: the engine and the shape; the rest of the name,
the same for every file, said once above), times to two decimals, a default without a time
shown with why; the line above it saying where the times came from (`run_source`). Also the
plain fixed-width formatter the other tables of times use."""

from __future__ import annotations

import re
from pathlib import Path

WIDTH = 120


def run_source(run: Path) -> str:
    """Where a results folder's times came from, in one line (loud when SYNTHETIC or from the
    CPU device)."""
    from tuner.emit.results import read_manifest
    from tuner.measure.provenance import banner
    manifest = read_manifest(run)
    env: dict = next((t.get("environment") for t in manifest.get("tables", []) if t.get("environment")), {}) or {}
    measured = manifest.get("measured_by") or next((t.get("measured") for t in manifest.get("tables", [])), "")
    return banner(env, measured)


def _shape(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1].removesuffix(".json")
    return name.removesuffix("_down").partition(",device_name=")[0] + (" _down" if name.endswith("_down") else "")


def short_file(files: dict[str, str]) -> str:
    """'sglang E=257,N=256 _down' for {sglang: sglang/fused_moe/configs/triton_3_6_0/E=257,N=256,
    device_name=..._down.json}: the engines and the file name's shape part ('vllm+sglang
    N=7168,K=2048' for one shape in both engines' tables)."""
    by_shape: dict[str, list[str]] = {}
    for engine, rel in files.items():
        by_shape.setdefault(_shape(rel), []).append(engine)
    return ", ".join(f"{'+'.join(engines)} {shape}" for shape, engines in by_shape.items())


def name_legend(files: list[tuple[str, str]]) -> str:
    """'<shape>,device_name=NVIDIA_H200,dtype=....json': what every file name holds after its
    shape, when that is one text for all ('' when not), of `files` [(engine, path)]. Engines space
    block_shape=[...] their own way (vLLM [128,128], SGLang [128, 128]): where both are there,
    the other form is said with its engine ('(sglang: [128, 128])')."""
    rests: dict[str, set] = {}
    for engine, path in files:
        rest = re.sub(r"_down$", "", path.rsplit("/", 1)[-1].removesuffix(".json")).partition(",device_name=")[2]
        rests.setdefault(rest, set()).add(engine)
    squeezed = {r.replace(" ", "") for r in rests}
    if len(squeezed) != 1 or "" in squeezed:
        return ""
    if len(rests) == 1:
        return f"<shape>,device_name={next(iter(rests))}.json"
    spaced = {m: engines for r, engines in rests.items() for m in re.findall(r"\[[^\]]* [^\]]*\]", r)}
    return f"<shape>,device_name={squeezed.pop()}.json" + (
        " (" + "; ".join(f"{'/'.join(sorted(e))}: {m}" for m, e in sorted(spaced.items())) + ")" if spaced else "")


def where_lines(out_dir, files: list[tuple[str, str]]) -> list[str]:
    """Where a run's tables are, under its folder: one form for all engines when they share it
    (OUT/<engine>/fp8_gemm/), else each engine's folder on a line below (SGLang's MoE tables sit
    in configs/triton_X_Y_Z/), in the engines' order."""
    from tuner.plan.engines import ENGINE_NAMES
    by_engine = {engine: rel.rsplit("/", 1)[0] if "/" in rel else "" for engine, rel in files}
    forms = {folder.replace(engine, "<engine>", 1) for engine, folder in by_engine.items()}
    if len(forms) <= 1:
        return [f"file: the table each row goes to, in {out_dir}/{forms.pop() + '/' if forms else ''}"]
    order = sorted(by_engine, key=lambda e: (ENGINE_NAMES.index(e) if e in ENGINE_NAMES else len(ENGINE_NAMES), e))
    return [f"file: the table each row goes to, under {out_dir}/:", "      " + ", ".join(f"{by_engine[e]}/" for e in order)]


def fixed_width(headers: list[str], rows: list[list[str]], left: tuple[int, ...] = (0,)) -> list[str]:
    """Columns two spaces apart, the `left` ones left-aligned, the others right-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def run_table_lines(results: dict, keys: tuple[str, ...], files: dict[str, dict[str, str]], out_dir,
                    threshold: float | None = None, unwritten: dict[str, tuple[dict, str]] | None = None) -> list[str]:
    """The closing table of a run: `results` {problem key: [StudyResult]}, `files` {problem key:
    {engine: relative path}} (from the manifest), `unwritten` {problem key: ({engine: the path
    its table would have}, why it is not written)} (a tied table the same as its partner: its
    rows are labelled as that file, marked `*`, and why is said once)."""
    kept = any(r.kept_default for rs in results.values() for r in rs)
    # the row kept (tuned, installed, default) and why, where any row is not the tuned config
    chosen = any((r.choice or {}).get("kept", "tuned") != "tuned" for rs in results.values() for r in rs)
    if chosen:
        from tuner.search.choice import choice_short
    from tuner.measure.noise import speedup, threshold_text, within
    noise = getattr(threshold, "noise", None)          # the paired check's threshold knows the device's noise
    rows = []
    unwritten = {k: v for k, v in (unwritten or {}).items() if k in results and not files.get(k)}
    labels = distinct_labels({pkey: short_file(files.get(pkey) or {}) or (
        short_file(unwritten[pkey][0]) + "*" if pkey in unwritten else "(not written)") for pkey in results})
    labels, shape = _one_long_shape(labels, {short_file(files.get(pkey) or {}) for pkey in results})
    for pkey, rs in results.items():
        label = labels[pkey]
        for r in sorted(rs, key=lambda r: r.M):
            rows.append([
                label, str(r.M), " ".join(f"{r.config[k]}" for k in keys) if r.config else "-",
                f"{r.time_us:.2f}" if r.time_us else "-",
                f"{r.default_time_us:.2f}" if r.default_time_us else f"- ({r.default_error or 'not timed'})"[:24],
                speedup(r.speedup, noise, compact=True) if r.speedup else "-", str(r.trials), r.numerics.get("status", "-"),
                *([_kept_text(r)] if kept else []),
                *([choice_short(r.choice)] if chosen else []),
            ])
    written = [(engine, rel) for key, fs in files.items() if key in results for engine, rel in fs.items()]
    legend = name_legend(written)
    where = where_lines(out_dir, written)
    if legend:
        where.append(f"      named {legend}")
    if shape:
        where.append(f"      <shape>: {shape}")
    for why in sorted({why for _, why in unwritten.values()}):
        where.append(f"*: not written: {why}")
    if chosen:
        min_gain = next((r.choice["min_gain"] for rs in results.values() for r in rs
                         if r.choice and r.choice.get("min_gain") is not None), None)
        # two lines: the noise's wording alone runs 70 columns
        where.append("row: tuned, or the incumbent kept where the tuned config's paired gain (shown) is not above")
        # every row "(same)" records no min_gain: the run's own threshold still says it (it said "--min-gain" bare)
        shown = threshold if threshold is not None else min_gain
        where.append("     " + (threshold_text(shown) if shown is not None else "--min-gain"))
        if any(choice_short(r.choice).endswith(" pair") for rs in results.values() for r in rs):
            where.append("row ... pair: tables tied together (one BLOCK_SIZE_M) are kept or replaced together, "
                         "by the pair's gain")
        if any(choice_short(r.choice).endswith(" (same)") for rs in results.values() for r in rs):
            where.append("row (same): the search's best is the incumbent's config itself: no pair to time")
    if noise is not None and any(within(r.speedup, noise) for rs in results.values() for r in rs):
        # the figure's source on a line of its own: a path can be any length
        where.append(f"speedup ~: within the {noise.spread:.1%} between processes on {noise.device}: not a speed-up")
        where.append(f"     (the noise as recorded in {noise.source})")
    headers = ["file", "M", "config", "time_us", "default_us", "speedup", "trials", "numerics",
               *(["table"] if kept else []), *(["row"] if chosen else [])]
    return where + fixed_width(headers, rows, left=(0, 2, 7, 8, 9)) + _pair_lines(results, labels)


def _pair_lines(results: dict, labels: dict[str, str]) -> list[str]:
    """Why a tied table's row kept with its partner as the incumbent pair shows a speedup other
    than 1.00x: its default_us is its own study's default (which follows the partner's tuned
    config), not the config of the pair kept."""
    from tuner.textwidth import factor
    by_label: dict[str, list[int]] = {}
    for pkey, rs in results.items():
        for r in rs:
            c = r.choice or {}
            # a row whose speedup shows as 1.00x needs no word of why it is not (found by a new-user pass)
            if c.get("tied_with") and c.get("kept", "tuned") != "tuned" and r.config != r.default_config \
                    and r.time_us and r.default_time_us and r.speedup and factor(r.speedup) != "1.00x":
                by_label.setdefault(labels[pkey], []).append(r.M)
    # one line each: a terminal fits it (tuner/textwidth.py), a pipe keeps it whole
    return [f"{label} at M={','.join(map(str, sorted(ms)))}: the row is the incumbent pair's, kept with the table it "
            "is tied to; its default_us times this table's own default, which follows that table's tuned config, "
            "not the pair kept: hence a speedup other than 1.00x" for label, ms in by_label.items()]


LONG_SHAPE = 32      # a file column wider than this, one shape for every row: said once above the table


def _one_long_shape(labels: dict[str, str], bases: set[str]) -> tuple[dict[str, str], str]:
    """Where every row goes to one table whose shape is long (MLA decode's heads=16,kv_lora_rank=512,
    qk_rope_dim=64,page_size=64: rows of 129 columns, 155 with a context, wrapped on a 120-column
    terminal), its rows keep the engine and what tells them apart, and the shape is said once."""
    base = next(iter(bases)) if len(bases) == 1 else ""
    engine, _, shape = base.partition(" ")
    if len(base) <= LONG_SHAPE or not shape or not all(v.startswith(base) for v in labels.values()):
        return labels, ""
    return {k: engine + v[len(base):] for k, v in labels.items()}, shape


def distinct_labels(labels: dict[str, str]) -> dict[str, str]:
    """Each problem's row label, with what tells it apart where problems share one file (MLA
    decode: one table, a problem per context): the problem key's parts the others lack."""
    by_label: dict[str, list[str]] = {}
    for pkey, label in labels.items():
        by_label.setdefault(label, []).append(pkey)
    out = dict(labels)
    for label, pkeys in by_label.items():
        if len(pkeys) < 2:
            continue
        parts = {k: re.split(r",(?![^\[]*\])", k) for k in pkeys}      # (a comma in [..] is a value's)
        common = set.intersection(*(set(v) for v in parts.values()))
        for k in pkeys:
            own = ",".join(p for p in parts[k] if p not in common)
            out[k] = f"{label} {own}" if own else label
    return out


def _kept_text(r) -> str:
    """What a traffic-keyed table holds at M: the tuned config, or the default and why."""
    if not r.kept_default:
        return "tuned"
    t = r.kept_default.get("time_us")
    return f"default (tuned {t:.2f} us: within noise)" if t else "default"


def _parts(key: str) -> list[str]:
    return re.split(r",(?![^\[]*\])", key)          # not inside block_shape=[128,128]


def distinguishing(keys: list[str]) -> tuple[dict[str, str], str]:
    """({problem key: the parts that tell it from the others}, the parts all share): problem
    keys short enough for a table column, the rest said once."""
    parts = {k: _parts(k) for k in keys}
    common = set.intersection(*(set(p) for p in parts.values())) if parts else set()
    if len(parts) == 1:
        common = set()
    short = {k: ",".join(x for x in p if x not in common) or k for k, p in parts.items()}
    first = next(iter(parts.values()), [])
    return short, ",".join(x for x in first if x in common)


def written_files(opts) -> dict[str, dict[str, str]]:
    """{problem key: {engine: the file its table went to}} of a run, from its manifest."""
    from tuner.emit.results import read_manifest
    from tuner.errors import TunerError
    from tuner.plan.problems import Problem
    try:
        manifest = read_manifest(opts.out_dir)
    except TunerError:
        return {}
    return {Problem(t["kernel"], t["problem"]).key: dict(t.get("files") or {}) for t in manifest.get("tables", [])
            if t.get("kernel") == opts.kernel.name}


def unwritten_files(opts) -> dict[str, tuple[dict[str, str], str]]:
    """{problem key: ({engine: the file its table would be}, why it is not)} of a run's tied tables
    the manifest says were not written (a `_down` table the same as its up table: the engines
    that read the one it is tied to read that one for it)."""
    from tuner.emit.results import read_manifest
    from tuner.errors import TunerError
    from tuner.plan.problems import Problem
    try:
        manifest = read_manifest(opts.out_dir)
    except TunerError:
        return {}
    out = {}
    for t in manifest.get("tables", []):
        if t.get("kernel") == opts.kernel.name and (found := unwritten_table(manifest, t, opts.gpu.cuda_name)):
            out[Problem(t["kernel"], t["problem"]).key] = found
    return out


def unwritten_table(manifest: dict, entry: dict, cuda_name: str) -> tuple[dict[str, str], str] | None:
    """({engine: the file it would be}, why it is not) of a manifest's table entry that was not
    written for being the same as the table it is tied to (None for any other)."""
    from tuner.plan.engines import ENGINES
    from tuner.plan.problems import Problem
    if not isinstance(entry.get("not_written"), str):
        return None
    partner = next((dict(t.get("files") or {}) for t in manifest.get("tables", [])
                    if t.get("kernel") == entry.get("kernel") and isinstance(t.get("problem"), dict)
                    and Problem(t["kernel"], t["problem"]).key == entry.get("tied_to")), None)
    if not partner:
        return None
    triton = str((entry.get("environment") or {}).get("triton") or "")
    files = {}
    for engine, rel in partner.items():
        kind = str(rel).split("/")[1] if str(rel).count("/") >= 2 else ""
        if engine in ENGINES and kind:
            try:
                files[engine] = ENGINES[engine].table_relpath(kind, entry["problem"], cuda_name, triton)
            except (KeyError, TypeError, ValueError):
                continue                 # a hand-edited entry: no name for it
    return (files, f"the same configs as {short_file(partner)} at every M: the engine reads that table for it") \
        if files else None
