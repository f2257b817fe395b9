"""A bench's verdict: at each batch size, which contender ran fastest on this GPU, and, weighted
over the batch sizes, which backend flag each engine should run with the expected gain.

Contenders are a bench's rows (tuner/jobs/bench.py): the engine's Triton kernel with a config
(tuned, a shipped table, the default), and what runs instead of it (cuBLASLt via
torch._scaled_mm, DeepGEMM or the engine's CUTLASS path where importable). Whether the tables
matter at all is the engine's backend choice: the flag that makes its Triton kernel run, and
what runs without it, are data (tuner/plan/engine_rules/, `triton_flags`), checked against the
wheels' source; nothing here asks which engine it is.
"""

from __future__ import annotations

import textwrap
from typing import Iterable

from tuner.plan.engines import ENGINES
from tuner.textwidth import factor

# the engine's Triton kernel with a config: ours, a shipped table's, the default, a landscape's best
TRITON_CONTENDERS = ("tuned", "shipped", "default", "landscape best")


def is_triton(contender: str) -> bool:
    return contender == "tuned" or contender.startswith(TRITON_CONTENDERS[1:])


def is_triton_row(row: dict) -> bool:
    """A row of the Triton kernel with a config (a bench row with a config is one, whatever its
    contender's name); the others are what runs instead of it (references)."""
    return isinstance(row.get("config"), dict) or is_triton(str(row.get("contender")))


def per_m(rows: Iterable[dict]) -> list[dict]:
    """One verdict per (kernel source, problem, M): the fastest contender, the best Triton one
    and the best other one (None where none was timed)."""
    groups: dict[tuple, list[tuple[float, str, bool]]] = {}
    for r in rows:
        t = r.get("time_us")
        key = (r["kernel_source"], r["problem"], int(r["M"]))
        groups.setdefault(key, [])
        if isinstance(t, (int, float)) and t > 0:        # a contender not timed gives no verdict
            groups[key].append((float(t), str(r["contender"]), is_triton_row(r)))
    out = []
    for (src, problem, M), timed in groups.items():
        triton = min((x for x in timed if x[2]), default=None)
        other = min((x for x in timed if not x[2]), default=None)
        best = min(timed, default=None)
        out.append({"kernel_source": src, "problem": problem, "M": M,
                    "fastest": best[1] if best else None, "time_us": best[0] if best else None,
                    "best_triton": triton[1] if triton else None, "triton_us": triton[0] if triton else None,
                    "best_other": other[1] if other else None, "other_us": other[0] if other else None})
    return out


def nearest_weights(ms: list[int], served: dict[int, float] | None) -> dict[int, float]:
    """Each benched M's weight: the served batch sizes' shares, each counted at the benched M
    nearest to it; without a profile every benched M alike."""
    if not ms:
        return {}
    if not served:
        return {m: 1.0 / len(ms) for m in ms}
    out = {m: 0.0 for m in ms}
    for m, w in served.items():
        out[min(ms, key=lambda b: (abs(b - m), b))] += w
    return out


def short(contender: str | None) -> str:
    """A contender's name without its variant's detail ('torch._scaled_mm (As column-major, Bs^T)')."""
    return (contender or "-").split(" (")[0]


def verdict_lines(rows: list[dict], table_kind: str, served: dict[int, float] | None = None,
                  width: int | None = None) -> list[str]:
    """Per problem, the fastest contender at each M; then per engine and problem the flag to run:
    the best Triton config against the best other contender, weighted over M. Lines fit `width`
    (default: the terminal's, at most 120; whole when piped, as every command's)."""
    from tuner.emit.run_table import distinguishing
    from tuner.textwidth import output_width
    columns = output_width()
    width = width or (min(120, columns) if columns else 1 << 30)
    verdicts = per_m(rows)
    lines: list[str] = []
    weighting = "by the traffic profile" if served else "each benched M alike"
    names, common = distinguishing(list(dict.fromkeys(v["problem"] for v in verdicts)))
    if common:
        lines += textwrap.wrap(f"verdict ({common}):", width)
    groups: dict[tuple[str, str], list[dict]] = {}        # grouped once: a scan per group was quadratic
    for v in verdicts:
        groups.setdefault((v["kernel_source"], v["problem"]), []).append(v)
    for (src, problem), group in groups.items():
        mine = sorted(group, key=lambda v: v["M"])
        if not any(v["time_us"] for v in mine):      # every contender failed: nothing to judge by
            lines += textwrap.wrap(f"{src} {names[problem]}: nothing timed (every contender failed): no verdict",
                                   width, subsequent_indent="    ")
            continue
        per = ", ".join(f"M={v['M']} {short(v['fastest'])}" for v in mine)
        lines += textwrap.wrap(f"{src} {names[problem]}: fastest {per}", width, subsequent_indent="    ")
        engine = ENGINES.get(src.split()[0])
        flag = engine.triton_flags.get(table_kind) if engine else None
        if engine is None or flag is None:
            continue
        both = [v for v in mine if v["triton_us"] and v["other_us"]]
        w = nearest_weights([v["M"] for v in mine], served)
        choice = engine.hopper_backends.get(table_kind)
        triton = sum(w[v["M"]] * v["triton_us"] for v in both)
        other = sum(w[v["M"]] * v["other_us"] for v in both)
        if both and not (triton > 0 and other > 0):     # the traffic falls on M's not timed both ways
            said = f"no M timed both ways carries traffic: {flag.flag} cannot be judged here"
        elif not both:
            said = (f"runs its Triton kernel by default ({flag.default}): the tables are read, no flag needed"
                    if choice is not None and choice.by_default else
                    f"only its Triton kernel was timed: {flag.flag} cannot be judged here (without it "
                    f"{engine.name} runs {flag.default})")
        else:
            others = "/".join(sorted({short(v["best_other"]) for v in both}))
            ms = ",".join(str(v["M"]) for v in both)
            said = (f"run {flag.flag}: the best Triton config is {factor(other / triton)} faster than {others} "
                    f"(weighted {weighting}, M={ms}); without it {engine.name} runs {flag.default}"
                    if triton < other else
                    f"keep the default ({flag.default}), no {flag.flag}: {others} is {factor(triton / other)} "
                    f"faster than the best Triton config (weighted {weighting}, M={ms}); the tables matter only "
                    f"with {flag.flag}")
        lines += textwrap.wrap(f"  {engine.name}: {said}", width, subsequent_indent="    ")
    if any(v["other_us"] for v in verdicts):
        lines += textwrap.wrap("note: an engine's default backend is timed only where a contender names it; "
                               "torch._scaled_mm (cuBLASLt, 128x128 block scales) stands in for the others", width)
    return lines
