#!/usr/bin/env python3
"""The search benchmark's held-out check: tuning and checking sets apart, with 95 % intervals.

    python scripts/search_sets.py --raw before=A.json after=B.json ref=C.json [--split bench/search_split.yaml]

Each --raw is what `scripts/search_benchmark.py run --save` wrote (per landscape and variant,
every run's ratio of the best time found to the landscape's best at 16, 32, 48 and 100
measured configs), under a label: the code it ran ("before", "after"), or "ref" for the
references (plain Optuna TPE, random), which no change of ours touches. The split
(bench/search_split.yaml) says which landscapes the search may be tuned on and which are
held out. For each set and label it prints the default search at --trials 48 (variant
ours48) and --trials 100 (ours) against plain TPE at the same numbers of trials: the mean
ratio over the set's landscapes (each weighted alike), a 95 % interval from the runs'
spread within each landscape, and the difference to plain TPE with its interval
("worse" when the whole interval lies above 0). Then the rule of issue 43: a change that
wins on one set and loses significantly on the other is not the default.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = {48: "ours48", 100: "ours"}           # the default search's run at each budget
REFS = ("plain-tpe", "random")


def read_split(path: Path) -> dict[str, list[str]]:
    """tuning: [...], checking: [...] from the split file (a two-list YAML read without a YAML parser
    so that the script needs nothing but the standard library)."""
    sets: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        text = line.split("#")[0].rstrip()
        if not text:
            continue
        if not text.startswith(" ") and text.endswith(":"):
            current = text[:-1]
            sets[current] = []
        elif text.strip().startswith("- ") and current:
            sets[current].append(text.strip()[2:].strip())
    if set(sets) != {"tuning", "checking"} or set(sets["tuning"]) & set(sets["checking"]):
        raise SystemExit(f"search_sets: error: {path} must hold two disjoint lists, tuning and checking")
    return sets


def _stats(xs: list[float]) -> tuple[float, float, int]:
    """mean, variance of the mean, runs (an inf, a run that timed nothing, is left out)."""
    f = [x for x in xs if math.isfinite(x)]
    if not f:
        return math.nan, math.nan, 0
    return statistics.fmean(f), (statistics.variance(f) / len(f) if len(f) > 1 else 0.0), len(f)


def set_rows(raw: dict[str, dict], names: list[str], label: str, ref: dict) -> list[dict]:
    """Per budget: the default's and plain TPE's mean over the landscapes, 95 % intervals, difference."""
    rows = []
    for n, variant in DEFAULT.items():
        ours, tpe, lands = [], [], []
        for land in names:
            mine = raw.get(land, {}).get(variant)
            theirs = ref.get(land, {}).get("plain-tpe")
            if mine and theirs:
                ours.append(_stats(mine["ratios"][str(n)]))
                tpe.append(_stats(theirs["ratios"][str(n)]))
                lands.append(land)
        if not lands:
            continue
        k = len(lands)
        m_o, m_t = sum(s[0] for s in ours) / k, sum(s[0] for s in tpe) / k
        v_o, v_t = sum(s[1] for s in ours) / k ** 2, sum(s[1] for s in tpe) / k ** 2
        diff, ci = m_o - m_t, 1.96 * math.sqrt(v_o + v_t)
        rows.append({"trials": n, "landscapes": k, "runs": sum(s[2] for s in ours),
                     f"default ({label})": f"{m_o:.3f} +- {1.96 * math.sqrt(v_o):.3f}",
                     "plain TPE": f"{m_t:.3f} +- {1.96 * math.sqrt(v_t):.3f}",
                     "difference": f"{diff:+.3f} +- {ci:.3f}",
                     "verdict": "worse" if diff - ci > 0 else "better" if diff + ci < 0 else "level"})
    return rows


def landscape_rows(raws: dict[str, dict], names: list[str], ref: dict) -> list[dict]:
    rows = []
    for land in names:
        for n, variant in DEFAULT.items():
            row: dict = {"landscape": land, "trials": n}
            for label, raw in raws.items():
                s = _stats(raw.get(land, {}).get(variant, {}).get("ratios", {}).get(str(n), []))
                row[label] = f"{s[0]:.3f} +- {1.96 * math.sqrt(s[1]):.3f}" if s[2] else "-"
            for r in REFS:
                s = _stats(ref.get(land, {}).get(r, {}).get("ratios", {}).get(str(n), []))
                row[r] = f"{s[0]:.3f} +- {1.96 * math.sqrt(s[1]):.3f}" if s[2] else "-"
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    if not rows:
        return "(no runs)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def report(raws: dict[str, dict], ref: dict, split: dict[str, list[str]]) -> str:
    out = []
    verdicts: dict[str, dict[str, set]] = {}
    for which in ("tuning", "checking"):
        names = split[which]
        out.append(f"\n## The {which} set ({len(names)} landscapes)\n")
        for label, raw in raws.items():
            rows = set_rows(raw, names, label, ref)
            verdicts.setdefault(label, {})[which] = {r["verdict"] for r in rows}
            out.append(table(rows))
        families = sorted({n.split("-")[0] for n in names})
        out.append(f"\nPer kernel ({', '.join(families)}): the same, over the set's landscapes of that kernel\n")
        out.append(table([{"kernel": f, "code": label, **{("default" if k.startswith("default") else k): v
                                                           for k, v in r.items()}}
                          for f in families for label, raw in raws.items()
                          for r in set_rows(raw, [n for n in names if n.split("-")[0] == f], label, ref)]))
        out.append("\nPer landscape: mean ratio to the best +- 95 % interval\n")
        out.append(table(landscape_rows(raws, names, ref)))
    rule = ["", "## The rule: no default that wins on one set and loses significantly on the other", ""]
    for label, v in verdicts.items():
        lost = [w for w in ("tuning", "checking") if "worse" in v.get(w, set())]
        unjudged = [w for w in ("tuning", "checking") if not v.get(w)]
        rule.append(f"- {label}: " + (f"significantly worse than plain TPE on the {' and '.join(lost)} set"
                                       if lost else f"no runs against plain TPE on the {' and '.join(unjudged)} set"
                                       if unjudged else "no worse than plain TPE on either set (48 and 100 trials)"))
    return "\n".join(out + rule) + "\n"


def merge_into(into: dict, data: dict) -> dict:
    """Add one --save file's runs: a (landscape, variant) already there gets these runs too (other seeds,
    run with --first-seed)."""
    for land, variants in data.items():
        for variant, entry in variants.items():
            have = into.setdefault(land, {}).get(variant)
            if have is None:
                into[land][variant] = {**entry, "ratios": {n: list(r) for n, r in entry["ratios"].items()}}
            else:
                for n, r in entry["ratios"].items():
                    have["ratios"].setdefault(n, []).extend(r)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", nargs="+", required=True, metavar="LABEL=PATH")
    ap.add_argument("--split", default=str(REPO / "bench" / "search_split.yaml"))
    ap.add_argument("--out", help="also write the report here (Markdown)")
    args = ap.parse_args()
    raws: dict[str, dict] = {}
    ref: dict = {}
    for item in args.raw:
        label, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            print(f"search_sets: error: --raw {item}: give LABEL=PATH of a file search_benchmark.py --save wrote",
                  file=sys.stderr)
            return 2
        merge_into(ref if label == "ref" else raws.setdefault(label, {}), json.loads(Path(path).read_text()))
    text = report(raws, ref, read_split(Path(args.split)))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
