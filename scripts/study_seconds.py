#!/usr/bin/env python3
"""Where a GPU run's tuning seconds went, from its own files: each measuring command's start-up,
its batches (the sampler's asks, the measurement, the tells written), the time between its
studies (a study's close: the finalists re-timed, the numerics check, the row's paired choice;
the next one's open) and its close, per command of a proof folder.

    python3 scripts/study_seconds.py bench/results/H200-2026-11-27 [--markdown]

Read from steps.json (each step's seconds), environment.json (when the first call started), the
manifests' written times and the studies' journals (each trial's start and end: a batch's trials
are asked together and told together). Inside a batch's measurement the split into compile waits
and timing is an estimate, said as such: the study's fastest batch per config is taken as timing
alone (its configs were built already), the rest of each batch as waiting for compile workers.
Runs that record compiles' wait seconds (DeviceMeasurer: compiles.wait_s) say it directly.
"""

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _t(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


@dataclass
class Batch:
    study: str
    asked: list = field(default_factory=list)       # trial start times
    told: list = field(default_factory=list)        # trial end times

    @property
    def measure_s(self) -> float:
        return min(self.told) - max(self.asked) if self.told else 0.0


def batches(journal: Path, keep=lambda study: True) -> list[Batch]:
    """The journal's batches in order (of the studies `keep` takes): trials asked together, then
    told together."""
    from tuner.reading import text_lines
    names: list[str] = []
    study_of: dict[int, int] = {}
    events = []
    for _, line in text_lines(journal, "a journal "):
        rec = json.loads(line)
        op = rec["op_code"]
        if op == 0:
            names.append(rec["study_name"])
        elif op == 4:
            study_of[len(study_of)] = rec["study_id"]
            if rec.get("datetime_start"):
                events.append((_t(rec["datetime_start"]), "ask", rec["study_id"]))
        elif op == 6:
            sid = study_of[rec["trial_id"]]
            if rec.get("datetime_start"):
                events.append((_t(rec["datetime_start"]), "ask", sid))
            if rec.get("datetime_complete"):
                events.append((_t(rec["datetime_complete"]), "tell", sid))
    out: list[Batch] = []
    for t, kind, sid in sorted(events):
        cur = out[-1] if out else None
        if cur is None or cur.study != names[sid] or (kind == "ask" and cur.told):
            cur = Batch(names[sid])
            out.append(cur)
        (cur.asked if kind == "ask" else cur.told).append(t)
    return [b for b in out if b.told and keep(b.study)]


def first_batch_waits(journal: Path, keep=lambda study: True, fast: float | None = None) -> list[float]:
    """The estimated compile wait of each study's first batch but the command's first (its
    seeds: what building the next study's seeds ahead can save), in the studies' order."""
    bs = batches(journal, keep)
    fast = fast_per_config(bs) if fast is None else fast
    firsts: dict[str, Batch] = {}
    for b in bs:
        firsts.setdefault(b.study, b)
    return [max(0.0, b.measure_s - len(b.told) * fast) for b in list(firsts.values())[1:]]


@dataclass
class Seconds:
    command: str
    seconds: float
    start_s: float
    compile_wait_s: float          # estimated (see the module's doc)
    timing_s: float
    sampler_storage_s: float       # the asks' and tells' spans and the gaps between a study's batches
    between_studies_s: float
    close_s: float
    studies: int
    trials: int


def fast_per_config(bs: list[Batch]) -> float:
    """Seconds a config's timing takes when it waits for no compile: the median per config of
    the batches within 3x the fastest batch's per config."""
    per = sorted(b.measure_s / len(b.told) for b in bs)
    fast = [v for v in per if v <= 3 * per[0]]
    return fast[len(fast) // 2]


def split(command: str, journal: Path, start: float, seconds: float, keep=lambda study: True,
          fast: float | None = None) -> Seconds:
    """`fast`: a config's timing alone (fast_per_config of the command's batches unless given);
    a study's timing per config is its own fastest batch's, at most twice that (a study whose
    every batch waited for compiles: M=1024's larger blocks)."""
    bs = batches(journal, keep)
    fast = fast_per_config(bs) if fast is None else fast
    by_study: dict[str, list[Batch]] = {}
    for b in bs:
        by_study.setdefault(b.study, []).append(b)
    timing = wait = sampler = between = 0.0
    for study, own in by_study.items():
        per_config = min(2 * fast, min(b.measure_s / len(b.told) for b in own))
        for i, b in enumerate(own):
            t = per_config * len(b.told)
            timing += t
            wait += max(0.0, b.measure_s - t)
            sampler += (max(b.asked) - min(b.asked)) + (max(b.told) - min(b.told))
            if i:
                sampler += min(b.asked) - max(own[i - 1].told)
    order = list(by_study)
    for prev, nxt in zip(order, order[1:]):
        between += min(by_study[nxt][0].asked) - max(by_study[prev][-1].told)
    first, last = min(bs[0].asked), max(bs[-1].told)
    return Seconds(command, seconds, first - start, wait, timing, sampler, between, start + seconds - last,
                   len(by_study), sum(len(b.told) for b in bs))


def proof_seconds(run: Path) -> list[Seconds]:
    """The H200 run's measuring commands: the smoke and tune-vllm (call 1: their starts from
    environment.json's time and the seconds of the steps before them) and tune-sglang (call 2:
    it ended when it wrote the tuned manifest)."""
    steps = json.loads((run / "steps.json").read_text())["steps"]
    secs = {s["name"]: s["seconds"] for s in steps}
    t0 = _t(json.loads((run / "environment.json").read_text())["written"])
    before = {s["name"]: sum(x["seconds"] for x in steps[:i]) for i, s in enumerate(steps)}
    end_sglang = _t(json.loads((run / "tuned" / "moe" / "manifest.json").read_text())["written"])
    journal = run / "tuned" / "moe" / "studies.journal"            # both engines' studies
    vllm = fast_per_config(batches(journal, lambda s: "@vllm:" in s))
    # the smoke's one config is vLLM's kernel on the same machine: its timing alone as tune-vllm's
    return [split("smoke", run / "runs" / "smoke" / "studies.journal", t0 + before["smoke"], secs["smoke"],
                  fast=vllm),
            split("tune-vllm", journal, t0 + before["tune-vllm"], secs["tune-vllm"], lambda s: "@vllm:" in s),
            split("tune-sglang", journal, end_sglang - secs["tune-sglang"], secs["tune-sglang"],
                  lambda s: "@sglang:" in s)]


COLUMNS = ("command", "seconds", "start-up", "compile waits (est.)", "timing (est.)", "sampler + storage",
           "between studies", "close", "studies", "trials")


def rows(run: Path) -> list[list]:
    out = []
    for s in proof_seconds(run):
        out.append([s.command, s.seconds, s.start_s, s.compile_wait_s, s.timing_s, s.sampler_storage_s,
                    s.between_studies_s, s.close_s, s.studies, s.trials])
    total = [sum(r[i] for r in out) for i in range(1, len(COLUMNS))]
    out.append(["all three", *total])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    args = ap.parse_args()
    table = rows(Path(args.run))
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for r in table:
        cells = [r[0], *(f"{v:.1f}" for v in r[1:8]), *(str(int(v)) for v in r[8:])]
        print("| " + " | ".join(cells) + " |")
    journal = Path(args.run) / "tuned" / "moe" / "studies.journal"
    firsts = [w for engine in ("@vllm:", "@sglang:")
              for w in first_batch_waits(journal, lambda s, engine=engine: engine in s)]
    print(f"\nthe first batches (the seeds) of the tune steps' studies but each command's first waited "
          f"{sum(firsts):.1f} s for compiles ({len(firsts)} studies: {', '.join(f'{w:.1f}' for w in firsts)})")
    total = table[-1]
    print(f"\nof {total[1]:.1f} s: start-up {total[2] / total[1]:.0%}, compile waits {total[3] / total[1]:.0%}, "
          f"timing {total[4] / total[1]:.0%}, sampler and storage {total[5] / total[1]:.0%}, between studies "
          f"{total[6] / total[1]:.0%}, close {total[7] / total[1]:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
