"""`tuner bench` over the H200's recorded landscape (issue 50, item 4): every row once (the
landscape was recorded on vLLM's kernel and the GEMM shape is read by both engines: it used to be
benched once per engine, every row twice, in the terminal, the JSON and the Markdown), and no
verdict from contenders that were not timed (the landscape's best is a Triton config: it used to
be taken for another backend, and the verdict advised against --linear-backend triton)."""

import collections
import json
from pathlib import Path

from tuner.cli import main
from tuner.emit.verdict import per_m

REPO = Path(__file__).resolve().parents[1]
LANDSCAPE = REPO / "landscapes/NVIDIA_H200/fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"


def test_the_recorded_landscapes_bench_has_each_row_once_and_no_untimed_verdict(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--replay", str(LANDSCAPE), "--batch-sizes", "1", "16", "--out", str(out)]) == 0
    said, err = capsys.readouterr()
    data = json.loads(next(out.glob("bench-*.json")).read_text())
    keys = [(r["kernel_source"], r["problem"], r["M"], r["contender"]) for r in data["rows"]]
    assert keys and not [k for k, n in collections.Counter(keys).items() if n > 1], keys
    assert {(k[2], k[3]) for k in keys} >= {(1, "default"), (1, "landscape best"), (16, "landscape best")}
    table = [line for line in said.splitlines() if line.startswith("vllm 0.33.0  ")]
    assert len(table) == len(keys) == len(set(table))
    assert "problem: N=7168,K=2048,block_shape=[128,128]" in said.splitlines()     # one problem: said once
    md = [line for line in next(out.glob("bench-*.md")).read_text().splitlines() if line.startswith("| 1")
          or line.startswith("| 16")]
    assert len(md) == len(keys) == len(set(md))
    notes = [line for line in said.splitlines() if "the landscape lacks" in line]
    assert len(notes) == len(set(notes))
    # only Triton configs were timed (the reference needs a GPU): no backend verdict either way
    verdict = " ".join(data["verdict_lines"])
    assert "only its Triton kernel was timed" in verdict
    assert "keep the default" not in verdict and "faster than the best Triton config" not in verdict


def test_a_landscapes_best_is_a_triton_config_and_an_untimed_contender_no_verdict():
    rows = [{"kernel_source": "vllm 0.33.0", "problem": "p", "M": 1, "contender": "default", "config": {"a": 1},
             "time_us": 30.0},
            {"kernel_source": "vllm 0.33.0", "problem": "p", "M": 1, "contender": "landscape best",
             "config": {"a": 2}, "time_us": 13.0},
            {"kernel_source": "vllm 0.33.0", "problem": "p", "M": 1, "contender": "reference", "config": None,
             "time_us": None}]
    v = per_m(rows)[0]
    assert v["best_triton"] == "landscape best" and v["triton_us"] == 13.0 and v["best_other"] is None
