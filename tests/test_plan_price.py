"""A plan that prices itself (issue 48, item 2): the dry run prints the GPU time it expects from measured
costs (tuner/pipeline/price.py: the committed H200 run's start-up and seconds per trial and per study,
bench/results/H200-2026-11-27/costs.json; the configs a study measures under the stopping rule,
bench/results/search/stopping.json), and the README and the manual quote what it prints."""

import json
import re
from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--dry-run"]
TOTAL = re.compile(r"expected for the 2 plans: about (\d+\.\d) min of GPU on NVIDIA H200, (\d+) measured configs")


@pytest.fixture(scope="module")
def headline_plan():
    import contextlib
    import io
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.delenv("COLUMNS", raising=False)           # lines whole, as piped (tuner/textwidth.py)
        assert main(HEADLINE) == 0
    return out.getvalue()


def test_the_headlines_dry_run_prints_its_expected_gpu_time_per_engine_and_in_all(headline_plan):
    # before: no price at all
    total = TOTAL.search(headline_plan)
    assert total, headline_plan[-2000:]
    per_plan = re.findall(r"expected: about (\d+\.\d) min of GPU on NVIDIA H200, (\d+) measured configs", headline_plan)
    assert len(per_plan) == 2 and sum(int(n) for _, n in per_plan) == int(total.group(2))
    assert "bench/results/H200-2026-11-27/costs.json (vllm's start-up" in headline_plan
    assert "bench/results/H200-2026-11-27/costs.json (sglang's start-up" in headline_plan
    assert all(len(line) <= 120 for line in headline_plan.splitlines() if "expected" in line or "costs.json" in line)


def test_the_readme_and_the_manual_say_what_the_dry_run_prints(headline_plan):
    # before: the README said "32 measured configs each" and "about 11 minutes", from no output of the tool
    said = TOTAL.search(headline_plan).group(0)
    for page in (REPO / "README.md", REPO / "docs" / "tuning.md"):
        text = " ".join(page.read_text().split())
        assert said in text, f"{page.name} does not say: {said}"
        assert "32 measured configs" not in text and "about 11 minutes" not in text
    budgets = [int(b) for b in re.findall(r"\d+:\d+->(\d+)", headline_plan)]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"at most {min(budgets)} to {max(budgets)} measured configs" in readme


def test_the_price_is_the_measured_costs_times_the_configs_a_study_measures(tmp_path, monkeypatch):
    """Made-up costs in a results folder: each study of the plan costs its expected trials at the seconds per
    trial of its batch size (between the measured ones, by log M), then the mean close; the run its start-up."""
    import tuner.pipeline.price as price
    from tuner.pipeline.planning import plan_runs
    from tuner.pipeline.request import TuneRequest
    run = tmp_path / "results" / "H200-2030-01-01"
    run.mkdir(parents=True)
    studies = [{"problem": "p", "M": 1, "trials": 10, "trial_s": 10.0, "close_s": 1.0},
               {"problem": "p", "M": 4, "trials": 10, "trial_s": 30.0, "close_s": 3.0}]
    (run / "costs.json").write_text(json.dumps({"format": "tuner-costs/1", "gpu": "H200", "sources": {
        "ours": {"startup_s": 20.0, "close_s": 2.0, "studies": studies}}}))
    stopping = tmp_path / "stopping.json"
    stopping.write_text(json.dumps({"headline": {"trials": 35, "studies": [{}] * 5}}))     # 7 a study
    monkeypatch.setattr(price, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(price, "STOPPING", stopping)
    req = TuneRequest(command="gemm", model="deepseek-v3", gpu="H200", tp=8, only=["N=7168,K=2048"],
                      batch_sizes=[1, 2, 4, 8], kernel_source="ours", trials=5, dry_run=True)
    (opts,) = plan_runs(req, say=lambda _: None)
    got = price.plan_price(opts)
    # M=1: 1 s a trial, M=2: 2 s (half-way in log M), M=4 and beyond: 3 s; 5 trials each (the cap, under 7)
    assert got is not None and got.trials == 20 and got.cap == 20 and not got.pooled
    assert got.seconds == pytest.approx(20.0 + 5 * (1 + 2 + 3 + 3) + 4 * 2.0)
    monkeypatch.setattr(price, "STOPPING", tmp_path / "none.json")
    assert price.plan_price(opts) is None


H200_GEMM = REPO / "landscapes" / "NVIDIA_H200" / "fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"


def test_a_replays_dry_run_plans_and_prices_what_its_landscape_times_each_study_once(monkeypatch, capsys):
    """`--replay LAND --dry-run` plans what the run will tune: the problems and batch sizes the landscape times
    (the H200 GEMM landscape: N=7168,K=2048 at M=1 and 16 of DeepSeek-V3's eight TP8 GEMMs), each (problem,
    M) once though two engines' tables share it. Before: all 8 problems x 18 batch sizes listed and priced,
    the shared problem twice (252 studies, 78.6 min), where the run tunes 2 studies."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(H200_GEMM),
                 "--minutes", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    problems = re.findall(r"^problem (\S+)", out, re.M)
    assert set(problems) == {"N=7168,K=2048,block_shape=[128,128]"}, problems
    assert re.findall(r"configs after pruning, per M: (.*)", out) == ["1:32 16:32"] * len(problems)
    assert "1 problems, 2 studies (the batch sizes the landscape times" in out
    planned = re.search(r"expected: about \d+\.\d min of GPU on NVIDIA H200, (\d+) measured configs \(at most (\d+)\)",
                        out)
    assert planned and int(planned.group(2)) == 2 * 24, out[-1500:]    # two studies' caps, not four
    assert "a replay measures nothing and spends no GPU time: that is what measuring" in out   # the price is a GPU run's
    assert "fp8_gemm: 0 of 2 studies finished; left 2" in out
    first = re.search(r"first: (.*)", out).group(1).split("; ")
    assert first == ["N=7168,K=2048,block_shape=[128,128] M=1", "N=7168,K=2048,block_shape=[128,128] M=16"]
    skips = re.findall(r"^note: skip (\S+): the landscape has no timings for it", out, re.M)
    assert len(skips) == len(set(skips)) == 7, skips                  # each problem said once


def test_a_landscape_recorded_on_one_engines_kernel_writes_that_engines_tables_only(tmp_path, monkeypatch, capsys):
    """The H200 GEMM landscape was recorded on vLLM's kernel: replayed, it times vLLM's table, and SGLang's (whose
    kernel differs: SWAP_AB, SPLIT_K) is not written from it, as --kernel-source vllm says ("that engine's kernel,
    its tables only"). Before: the run wrote sglang/fp8_gemm/N=7168,K=2048,...json timed on vLLM's kernel, counted
    its progress to [4/2] and left vLLM's rows out of the closing table."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)      # the landscape alone (no shipped tables' seeds)
    out = tmp_path / "run"
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(H200_GEMM),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "was recorded on vllm's kernel: it times vllm's tables only; sglang's are not written" in text
    written = sorted(p.relative_to(out).parts[0] for p in out.rglob("*.json") if p.name != "manifest.json")
    assert written == ["vllm"], written
    tables = json.loads((out / "manifest.json").read_text())["tables"]
    assert [sorted(t["files"]) for t in tables] == [["vllm"]]
    progress = re.findall(r"^\[(\d+)/(\d+)\]", text, re.M)
    assert progress == [("1", "2"), ("2", "2")], progress
    rows = re.findall(r"^(\w+) N=7168,K=2048 +(\d+) ", printed.out, re.M)
    assert rows == [("vllm", "1"), ("vllm", "16")], printed.out[-1500:]
    # the batch sizes were the landscape's, not the command's: the advice says so
    assert "the landscape replayed times no others" in text and "leave --batch-sizes out" not in text
    # asked for SGLang's tables alone, the landscape times none: one line
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(H200_GEMM),
                 "--engines", "sglang", "--out", str(tmp_path / "sg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was recorded on vllm's kernel, which times none of the tables asked for" in err[0], err
