"""The committed H200 run's benches, recomputed with the corrected copy ceiling (issue 39): the
times are the GPU's, unchanged; no fraction above 1; the files are what scripts/recompute_roofline.py
writes from the as-measured JSONs."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "bench" / "results" / "H200-2026-11-27"
PAIRS = [(p, p.with_name(p.name.replace(".as-measured.json", ".json")))
         for p in sorted(RUN.rglob("bench-*.as-measured.json"))]


def test_the_recomputed_benches_keep_the_gpus_times_and_no_fraction_passes_one():
    assert len(PAIRS) == 2
    ceilings = json.loads((ROOT / "bench" / "ceilings" / "H200.json").read_text())
    for measured, recomputed in PAIRS:
        old, new = json.loads(measured.read_text()), json.loads(recomputed.read_text())
        assert old["ceiling_values"]["copy_tb_s"] < 2.8                       # the 345 MHz figure
        assert new["ceiling_values"]["copy_tb_s"] == ceilings["copy_tb_s"]
        assert len(old["rows"]) == len(new["rows"])
        assert sum(b["floor_us"] < a["floor_us"] for a, b in zip(old["rows"], new["rows"])) > len(old["rows"]) / 2
        for a, b in zip(old["rows"], new["rows"]):
            for key in ("kernel_source", "problem", "M", "contender", "config", "time_us", "spread", "error"):
                assert a[key] == b[key], (measured, key)
            assert b["roofline_fraction"] is None or 0 < b["roofline_fraction"] <= 1.0
            if a["time_us"]:
                assert b["roofline_fraction"] is not None          # none above 1: no figure is still wrong
                assert b["floor_us"] <= a["floor_us"]             # a faster copy: lower floors (bound by bytes)
    summary = (RUN / "summary.md").read_text()
    fractions = [float(line.rsplit("|", 2)[1]) for line in summary.split("Fastest contender")[1].splitlines()
                 if line.startswith("| sglang") or line.startswith("| vllm")]
    assert len(fractions) == 15 and max(fractions) <= 1.0


def test_the_recompute_is_reproducible():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "recompute_roofline.py"), str(RUN), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
