#!/usr/bin/env python3
"""Does seeding an MLA study with the best configs of the nearest context already tuned in the
run (KernelSpec.warm_across, tuner/search/warm_start.py) find the best sooner?

    python scripts/warm_context_check.py [--seeds 10] [--trials 24] [--out FILE]

Replays a SYNTHETIC MLA landscape (`tuner landscape synth`: a cost model, not a GPU; no MLA
landscape of a GPU covers several contexts) through `tuner mla --replay`, seeds 0..N-1, with and
without the warm start across contexts, and prints per (context, M) the measured trials until
one is within 2 % of the landscape's best there (median and worst seed; a study that never got
there counts as budget + 1). The first context has no neighbour: it is the same either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONTEXTS = (512, 1024, 2048, 4096, 8192)
BATCHES = (1, 4, 16, 64)
WITHIN = 0.02
BASE = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]


def trials_to_best(storage_path: Path, land) -> dict[tuple[int, int], int]:
    """{(context, M): measured trials until one within WITHIN of the best (budget + 1: never)}."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tuner.search.storage import counts
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    out = {}
    for (key, M), pts in land.points.items():
        name = f"mla_decode:{key}:M={M}"
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue
        best = min(p.time_us for p in pts.values() if p.time_us is not None)
        measured = [tr for tr in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number) if counts(tr)]
        hit = next((i for i, tr in enumerate(measured, 1) if tr.value is not None and tr.value <= best * (1 + WITHIN)),
                   len(measured) + 1)
        context = int(key.rsplit("context=", 1)[1].split(",")[0])
        out[(context, M)] = hit
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--out", default=None, help="also write the table to this Markdown file")
    args = ap.parse_args()

    import kernels.mla_decode_spec as mla
    from tuner.cli import main as tuner
    from tuner.measure.landscape import read_landscape
    from tuner.plan.kernel_registry import get_kernel, ours

    with_it = mla.SPEC
    tmp = Path(tempfile.mkdtemp(prefix="warm-context-"))
    land_path = tmp / "mla-synthetic.jsonl.gz"
    ctx = [str(c) for c in CONTEXTS]
    ms = [str(m) for m in BATCHES]
    assert tuner(["landscape", "synth", "--kernel", "mla", *BASE, "--contexts", *ctx, "--batch-sizes", *ms,
                  "--out", str(land_path)]) == 0
    land = read_landscape(land_path, get_kernel("mla_decode"))
    hits: dict[str, dict[tuple[int, int], list[int]]] = {"without": {}, "with": {}}
    for mode in ("without", "with"):
        mla.SPEC = with_it if mode == "with" else dataclasses.replace(with_it, warm_across=())
        ours.cache_clear()                   # the registry reads the spec again
        for seed in range(args.seeds):
            out = tmp / f"{mode}-{seed}"
            assert tuner(["mla", *BASE, "--replay", str(land_path), "--contexts", *ctx, "--batch-sizes", *ms,
                          "--trials", str(args.trials), "--seed", str(seed), "--out", str(out), "--quiet"]) == 0
            for k, v in trials_to_best(out / "studies.journal", land).items():
                hits[mode].setdefault(k, []).append(v)
    mla.SPEC = with_it
    lines = [f"SYNTHETIC MLA landscape (tuner landscape synth, H200 cost model; no GPU), DeepSeek-V3 TP8, "
             f"--trials {args.trials}, seeds 0-{args.seeds - 1}: measured trials to within 2 % of the best, "
             "median [worst]", "", "| context | M | without | with |", "|---|---|---|---|"]
    for key in sorted(hits["without"]):
        a, b = hits["without"][key], hits["with"].get(key, [])
        lines.append(f"| {key[0]} | {key[1]} | {statistics.median(a):g} [{max(a)}] | "
                     f"{statistics.median(b):g} [{max(b)}] |")
    later = [k for k in hits["without"] if k[0] != CONTEXTS[0]]
    for mode in ("without", "with"):
        meds = [statistics.median(hits[mode][k]) for k in later]
        worst = [max(hits[mode][k]) for k in later]
        lines.append(f"\n{mode}, contexts after the first ({len(later)} studies): mean of the medians "
                     f"{statistics.mean(meds):.2f}, mean of the worst {statistics.mean(worst):.2f}, "
                     f"within 12 trials at the worst seed {sum(w <= 12 for w in worst)}/{len(later)}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
