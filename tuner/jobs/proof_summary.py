"""summary.md of a GPU proof folder: what ran, what it measured, where every number came from."""

from __future__ import annotations

from pathlib import Path


def _load(path: Path):
    """A JSON file of the proof's folder, within the bounds of tuner/reading.py; None when
    it is missing, unreadable or not JSON."""
    from tuner.errors import TunerError
    from tuner.reading import read_json_file
    if not path.is_file():
        return None
    try:
        return read_json_file(path)
    except TunerError:
        return None


def _last_line(path: Path) -> str:
    from tuner.reading import last_line
    return last_line(path) or "-"


def engine_vs_ours(rows: list[dict]) -> list[dict]:
    """Shipped tables timed on the engine's kernel and on ours: their ratio per entry, how
    far rankings taken on our kernel were from the engine's."""
    by: dict = {}
    for r in rows:
        if r.get("time_us") and str(r.get("contender", "")).startswith(("shipped", "default", "tuned")):
            by.setdefault((r["problem"], r["M"], r["contender"]), {})[r["kernel_source"]] = r["time_us"]
    out = []
    for (problem, M, contender), times in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        engines = {k: v for k, v in times.items() if k != "ours"}
        if "ours" in times and engines:
            for source, t in engines.items():
                out.append({"problem": problem, "M": M, "table": contender, "engine kernel": source,
                            "engine us": t, "ours us": times["ours"], "ours / engine": times["ours"] / t})
    return out


def summary_markdown(out: Path, results: list, device: str, elapsed: float) -> str:
    import pandas as pd

    from tuner.jobs.report import markdown_table
    env = _load(out / "environment.json") or {}
    lines = ["# GPU proof", ""]
    if device == "cpu":
        lines += ["*** REHEARSAL ON THE CPU DEVICE: no GPU; every time below is a wall-clock time of Triton's "
                  "interpreter on a CPU (CPU DEVICE) and means nothing about any GPU ***", ""]
    lines += [f"Device {env.get('device', 'none')}, driver {env.get('driver', '-')}, torch {env.get('torch')}, "
              f"Triton {env.get('triton')}, CUDA {env.get('cuda')}; written {env.get('written')}; "
              f"{elapsed / 60:.1f} minutes so far.", ""]
    lines += ["## Steps", "", markdown_table(pd.DataFrame(
        [{"step": r.name, "status": r.status, "seconds": round(r.seconds), "details": "; ".join(r.detail)}
         for r in results])), ""]
    ceil = _load(out / "ceilings.json")
    if ceil:
        from tuner.measure.ceilings import summary_lines
        where = "the CPU DEVICE, not a GPU" if ceil.get("device_kind") == "cpu" else "the GPU"
        lines += [f"## Ceilings (measured on {where})", ""] + [f"- {s}" for s in summary_lines(ceil)] + [""]
    from tuner.jobs.proof_outcomes import validation_files
    vals = [(f, v) for f in validation_files(out) if isinstance(v := _load(f), dict)]
    checks = sorted((out / "validate").glob("check-*.txt")) if (out / "validate").is_dir() else []
    if vals or checks:
        lines += ["## Kernels against the float64 reference", ""]
        for f, val in vals:
            everything = val.get("cases", [])
            # recorded: passed before on this GPU model with the same Triton, torch and code, not run again
            recorded = [c for c in everything if c.get("recorded")]
            cases = [c for c in everything if not c.get("recorded")]
            # a case fails its numerics or its timing: either is a failure of the kernel on this device
            bad = [c for c in cases if c["numerics"]["status"] != "passed" or not c.get("time_us")]
            where = next((c.get("time_source") for c in cases if c.get("time_source")), "-")
            shipped = sorted({c["case"] for c in everything if str(c.get("case", "")).startswith("shipped ")})
            lines.append(f"- validate_kernels ({f.name}): {len(cases) - len(bad)} passed, {len(bad)} failed "
                         f"({sum(not c.get('time_us') for c in cases)} not timed; default configs"
                         + (f" and {len(shipped)} shipped tables" if shipped else "") + f"; times: {where})"
                         + (f"; {len(recorded)} recorded as passed before ({', '.join(sorted({c['recorded'] for c in recorded}))}"
                            "; same GPU model, Triton, torch and code): not run again" if recorded else ""))
            lines += [f"  - FAILED [{c['kernel_source']}] {c['kernel']} {c['problem']} M={c['M']} "
                      f"({c.get('case', 'default')}): "
                      + (f"not timed: {c.get('error')}" if not c.get("time_us") else str(c["numerics"].get("detail")))
                      for c in bad]
        lines += [f"- tuner check {p.stem[len('check-'):]}: {_last_line(p)}" for p in checks]
        lines.append("")
    lands = sorted((out / "landscapes").glob("*.gz")) if (out / "landscapes").is_dir() else []
    if lands:
        from tuner.measure.landscape import describe, read_header, read_landscape
        from tuner.plan.kernel_registry import get_kernel
        lines += ["## Landscapes", ""]
        for land in lands:
            try:
                h = read_header(land)
                src = h.get("kernel_source", "ours")
                kernel = get_kernel(h["kernel"]) if src == "ours" else get_kernel(h["kernel"], src, load_code=False)
                lines += ["```", *describe(read_landscape(land, kernel)), "```"]
            except Exception as e:  # noqa: BLE001 - a broken landscape is reported, not fatal
                lines.append(f"- {land.name}: unreadable ({e})")
        lines.append("")
    smoke = _load(out / "runs" / "smoke" / "manifest.json")
    if smoke:
        from tuner.emit.run_table import run_source
        entries = [(t, m, e) for t in smoke.get("tables", []) for m, e in (t.get("entries") or {}).items()]
        lines += ["## Smoke test", "", run_source(out / "runs" / "smoke"), ""]
        lines += [f"- {(t.get('kernel_source') or {}).get('source')} M={m}: "
                  + (f"{x['time_us']:.2f} us" if x.get("time_us") else
                     f"no time ({x.get('failures')}; first failure: {x.get('first_failure') or '-'})")
                  for t, m, x in entries] + [""]
    state = next(iter(sorted(out.glob("tuned/*/manifest.json"))), None)
    tuned = _load(state) if state else None
    if state and tuned:
        from tuner.emit.run_table import run_source
        n = sum(len(t.get("entries", {})) for t in tuned.get("tables", []))
        tunes = [r for r in results if r.name == "window"]
        rel = state.parent.relative_to(out)
        lines += ["## Tables (every window so far)", "", run_source(state.parent), "",
                  f"{len(tuned.get('tables', []))} tables, {n} entries ("
                  + "; ".join(f"{r.name} {r.status}, {r.seconds / 60:.1f} minutes" for r in tunes)
                  + f"). Report: {rel}/report/report.md", ""]
        from tuner.measure.noise import for_environment, speedup
        noise = for_environment(tuned.get("environment") or env)
        for t in tuned.get("tables", []):
            who = (t.get("kernel_source") or {}).get("source", "ours")
            for m, entry in sorted((t.get("entries") or {}).items(), key=lambda kv: int(kv[0])):
                speed = f", {speedup(entry['speedup'], noise)} the default" if entry.get("speedup") else ""
                lines.append(f"- [{who}] {', '.join(t.get('files', {}).values()) or t['problem']} M={m}: "
                             + (f"{entry['time_us']:.2f} us{speed}, numerics "
                                f"{entry.get('numerics', {}).get('status')}" if entry.get("time_us") else
                                "no config" + (f" (first failure: {entry['first_failure']})"
                                               if entry.get("first_failure") else "")))
        lines.append("")
    for bench in sorted((out / "bench").glob("*/bench-*.json")) if (out / "bench").is_dir() else []:
        data = _load(bench) or {}
        rows = data.get("rows", [])
        lines += [f"## Bench {bench.parent.name}", "", str(data.get("banner", "")), "",
                  f"Roofline: {data.get('ceilings')}. Full tables and plots: {bench.relative_to(out).with_suffix('.md')}", ""]
        df = pd.DataFrame(rows)
        if not df.empty and "time_us" in df:
            from tuner.measure.roofline import judge_row
            best = df.dropna(subset=["time_us"]).sort_values("time_us").groupby(
                ["kernel_source", "problem", "M"], sort=False).head(1)
            best = best.sort_values(["kernel_source", "problem", "M"])
            # a fraction above 1 is a bug, not a result: none is printed, the figure at fault is named
            judged = [judge_row(r) for r in best.to_dict("records")]
            best = best.assign(roofline_fraction=[j.fraction for j in judged])
            lines += ["Fastest contender per problem and M:", "",
                      markdown_table(best[["kernel_source", "problem", "M", "contender", "time_us", "roofline_fraction"]],
                                     floatfmt=".3g"), ""]
            wrong = [(r, j) for r, j in zip(best.to_dict("records"), judged) if j.error]
            if wrong:
                lines += ["Faster than the roofline floor (no fraction given: a figure is wrong):", ""]
                lines += [f"- {r['kernel_source']} {r['problem']} M={r['M']} {r['contender']}: {j.error}"
                          for r, j in wrong] + [""]
        ratio = engine_vs_ours(rows)
        if ratio:
            lines += ["The same tables on the engine's kernel and on ours (ours / engine: how far rankings taken "
                      "on our kernel were off):", "", markdown_table(pd.DataFrame(ratio), floatfmt=".3g"), ""]
    from tuner.errors import TunerError
    from tuner.reading import read_text
    for md in sorted((out / "sampler").glob("*.md")) if (out / "sampler").is_dir() else []:
        try:
            text = read_text(md)
        except TunerError:
            continue
        body = text.split("\n", 1)[1] if text.startswith("$ ") else text
        lines += [f"## Sampler study: {md.stem}", "", body.strip(), ""]
    return "\n".join(lines) + "\n"
