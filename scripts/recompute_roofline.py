"""Recompute the roofline of a committed GPU run's benches with a corrected ceiling: the times
stay, the floors and fractions change (issue 39: the first H200 run's `tuner ceilings` took its
copy at 2.72 TB/s with a 345 MHz SM clock; a warm plain copy did 4.27, bench/ceilings/H200.json).

    python scripts/recompute_roofline.py bench/results/H200-2026-11-27 [--ceilings FILE] [--check]

Input: each `bench-*.as-measured.json` under the run folder (the bench JSON as the GPU wrote it,
never changed). Output beside it: `bench-*.json` and `.md` (and the plots) rewritten through
`tuner bench`'s own writers, every floor from the kernel's byte and FLOP counts and the new
ceilings, every fraction judged by tuner/measure/roofline.py (none above 1: the figure at fault is
named), and the "Bench" sections of the run's summary.md rebuilt the same way. Each row's times
are copied, never recomputed; before writing, the floors the GPU wrote are rebuilt from the old
ceilings to check that the byte and FLOP counts are the ones it used. Rerunning gives the same
files. --check: write nothing, exit 1 if the committed files differ from what this would write.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUFFIX = ".as-measured.json"
SUMMARY_NOTE = ("(Recomputed by scripts/recompute_roofline.py: the floors and fractions below use copy {copy:.3g} "
                "TB/s and FP8 {fp8:.4g} TFLOP/s ({ceilings}, {source}); the times are the GPU's. The Ceilings "
                "section above is what the proof's `tuner ceilings` measured, its copy with the SM clock at 345 MHz.)")


def problems_by_key(model_name: str, tp: int, ep: int) -> dict:
    from tuner.plan.models import gemm_problems, load_model, moe_problems
    model = load_model(model_name)
    found = {p.key: p for p in gemm_problems(model, tp, ep)}
    for routing in ("uniform", "zipf"):
        found.update({p.key: p for p in moe_problems(model, tp, ep, "fp8_w8a8", routing)})
    return found


def recompute(src: Path, ceilings_path: Path | None) -> tuple[dict, list]:
    """(the new JSON, its BenchRows) from an as-measured bench JSON."""
    from tuner.jobs.bench_output import BenchRow
    from tuner.measure import ceilings as ceilings_mod
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel
    data = json.loads(src.read_text())
    gpu = get_gpu(data["gpu"])
    new = ceilings_mod.load(gpu, ceilings_path)
    old = data["ceiling_values"]
    problems = problems_by_key(data["model"], data["tp"], data["ep"])
    kernel = get_kernel(data["kernel"])                  # the byte and FLOP counts: the same for every source
    known = ("kernel_source", "problem", "M", "contender", "config", "time_us", "spread", "floor_us",
             "roofline_fraction", "roofline_error", "roofline_wrong", "time_source", "error")
    rows = []
    for r in data["rows"]:
        params = problems[r["problem"]].params
        nbytes, flops = kernel.bytes_moved(params, r["M"]), kernel.flops(params, r["M"])
        was = max(nbytes / (old["copy_tb_s"] * 1e6), flops / (old["fp8_tflops"] * 1e6))
        if abs(was - r["floor_us"]) > 1e-9 * r["floor_us"]:
            raise SystemExit(f"{src}: {r['problem']} M={r['M']}: the floor written ({r['floor_us']}) is not "
                             f"this kernel's counts over the old ceilings ({was}): refusing to recompute")
        rows.append(BenchRow(r["kernel_source"], r["problem"], r["M"], r["contender"], r["config"], r["time_us"],
                             r["spread"], new.floor_us(nbytes, flops), r["time_source"], r["error"],
                             {k: v for k, v in r.items() if k not in known}, roofline=(nbytes, flops, new)))
    header = {k: v for k, v in data.items() if k != "rows"}
    header["ceilings"] = new.source
    header["ceiling_values"] = {"copy_tb_s": new.copy_tb_s, "fp8_tflops": new.fp8_tflops}
    header["recomputed"] = {"by": "scripts/recompute_roofline.py", "from": src.name,
                            "ceilings": str(ceilings_path or f"bench/ceilings/{gpu.key}.json"),
                            "ceiling_values_as_measured": old,
                            "what": "floor_us, roofline_fraction, roofline_error; the times are the GPU's"}
    out = {**header, "rows": [r.as_dict() for r in rows]}
    for a, b in zip(data["rows"], out["rows"]):
        assert all(a[k] == b[k] for k in ("M", "contender", "time_us", "spread", "error", "config")), (a, b)
    return out, rows


def write(src: Path, data: dict, rows: list, dest: Path) -> dict[str, str]:
    """The JSON and Markdown (and plots) `tuner bench` would write, into `dest`; {name: text}."""
    from tuner.jobs.bench_output import markdown
    stem = src.name[: -len(SUFFIX)]
    header = {k: v for k, v in data.items() if k != "rows"}
    md = markdown(rows, {**header, "out": str(dest)}, stem)
    return {f"{stem}.json": json.dumps(data, indent=2) + "\n", f"{stem}.md": md}


def summary_sections(run: Path, benches: dict[Path, dict]) -> str:
    """summary.md with its "## Bench" sections rebuilt from the recomputed JSONs."""
    from tuner.jobs.proof_summary import summary_markdown
    text = (run / "summary.md").read_text()
    for path, data in benches.items():
        kind = path.parent.name
        head = f"## Bench {kind}\n"
        if head not in text:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "bench" / kind).mkdir(parents=True)
            (Path(tmp) / "bench" / kind / path.name).write_text(json.dumps(data))
            fresh = summary_markdown(Path(tmp), [], "cuda", 0.0)
        section = fresh[fresh.index(head):]
        values = data["ceiling_values"]
        note = SUMMARY_NOTE.format(source=data["ceilings"], ceilings=data["recomputed"]["ceilings"],
                                   copy=values["copy_tb_s"], fp8=values["fp8_tflops"])
        section = section.replace("\nFastest contender", f"\n{note}\n\nFastest contender", 1)
        start = text.index(head)
        end = text.find("\n## ", start + len(head))
        text = text[:start] + section.rstrip("\n") + "\n" + (text[end:] if end >= 0 else "")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--ceilings", type=Path, default=None, help="default bench/ceilings/<gpu>.json")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ")
    args = ap.parse_args(argv)
    sources = sorted(args.run.rglob(f"bench-*{SUFFIX}"))
    if not sources:
        print(f"no bench-*{SUFFIX} under {args.run}", file=sys.stderr)
        return 2
    differ, recomputed = [], {}
    from tuner.paths import atomic_write_text
    for src in sources:
        data, rows = recompute(src, args.ceilings)
        with tempfile.TemporaryDirectory() as tmp:
            files = write(src, data, rows, src.parent if not args.check else Path(tmp))
        for name, text in files.items():
            path = src.parent / name
            if not path.is_file() or path.read_text() != text:
                differ.append(path)
                if not args.check:
                    atomic_write_text(path, text)
        recomputed[src.parent / (src.name[: -len(SUFFIX)] + ".json")] = data
    summary = args.run / "summary.md"
    if summary.is_file():
        text = summary_sections(args.run, recomputed)
        if summary.read_text() != text:
            differ.append(summary)
            if not args.check:
                atomic_write_text(summary, text)
    for path in differ:
        print(f"{'differs' if args.check else 'rewrote'}: {path}")
    return 1 if args.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
