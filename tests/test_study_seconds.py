"""bench/results/study-seconds.md states what scripts/study_seconds.py computes from the H200
run's committed files: where its tuning commands' seconds went, and what its studies' first
batches waited for compiles."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "results" / "H200-2026-11-27"


def _script():
    spec = importlib.util.spec_from_file_location("study_seconds", REPO / "scripts" / "study_seconds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_states_the_scripts_figures():
    s = _script()
    doc = (REPO / "bench" / "results" / "study-seconds.md").read_text()
    for row in s.rows(RUN):
        cells = [row[0], *(f"{v:.1f}" for v in row[1:8]), *(str(int(v)) for v in row[8:])]
        assert "| " + " | ".join(cells) + " |" in doc, cells
    total = s.rows(RUN)[-1]
    assert f"Of {total[1]:.1f} s: start-up {total[2] / total[1]:.0%}, compile waits {total[3] / total[1]:.0%}" in doc
    journal = RUN / "tuned" / "moe" / "studies.journal"
    firsts = [w for e in ("@vllm:", "@sglang:") for w in s.first_batch_waits(journal, lambda n, e=e: e in n)]
    assert f"waited {sum(firsts):.1f} s for compiles ({len(firsts)} studies; {max(firsts):.1f} s" in doc


def test_the_breakdown_adds_up_and_compile_waits_lead():
    """Every second of each command is in one column (the batches' gaps included), and on the
    H200 the compile waits are the largest part: what compile-ahead goes after."""
    for row in _script().rows(RUN)[:-1]:
        assert abs(sum(row[2:8]) - row[1]) < 0.5, row
    total = _script().rows(RUN)[-1]
    assert total[3] == max(total[2:8])
