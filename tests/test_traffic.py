"""Traffic profiles (tuner/plan/traffic.py), on a CPU: the readers on dumps written in each engine's
metric names and bucket layout (tests/fixtures/traffic/, the versions in their first lines),
checked against the engines' own source where the wheels are at hand; key choice on a skewed
profile; the budget split; bad profiles."""

import ast
import json
import math
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from engine_loaders import wheel_dir

from tuner.cli import main
from tuner.errors import TunerError
from tuner.plan.engine_rules.vllm import VLLM_ITERATION_TOKENS_BUCKETS
from tuner.plan.engines import SERVING_METRICS, lookup_nearest
from tuner.plan.traffic import NEAR, TrafficProfile, choose_keys, key_coverage, load_profile, split_budget, weighted
from tuner.plan.traffic_profile import Bucket, Run
from tuner.search.runner import SearchSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traffic"
VLLM_DUMP = FIXTURES / "vllm-0.33.0-metrics.txt"
SGLANG_DUMP = FIXTURES / "sglang-0.5.23-metrics.txt"
TOTAL = 32300          # passes in the vLLM dump (its +Inf bucket)


def test_vllm_histogram_becomes_padded_m():
    p = load_profile(VLLM_DUMP, tp=8)
    s = p.served()
    assert sum(s.values()) == pytest.approx(1.0)
    # le=1: 300 passes of 1 token
    assert s[1] == pytest.approx(300 / TOTAL)
    # (1, 8]: 2000 passes spread over M 2..8, padded to 2, 4 (3, 4) and 8 (5..8)
    assert s[2] == pytest.approx(2000 / 7 / TOTAL)
    assert s[4] == pytest.approx(2000 * 2 / 7 / TOTAL)
    assert s[8] == pytest.approx(2000 * 4 / 7 / TOTAL)
    assert 3 not in s and 5 not in s
    # (16, 32]: 9000 passes, half padded to 24, half to 32
    assert s[24] == pytest.approx(4500 / TOTAL) and s[32] == pytest.approx(4500 / TOTAL)
    # (256, 512] padded by 16
    assert set(m for m in s if 256 < m <= 512) == set(range(272, 513, 16))
    # above 512 tokens vLLM runs unpadded: (512, 1024] is every M, evenly
    assert s[513] == pytest.approx(300 / 512 / TOTAL) and s[700] == pytest.approx(s[1024])
    assert max(s) == 8192
    assert "vLLM 0.33.0" in p.form and any("since the server started" in n for n in p.notes)


def test_two_vllm_scrapes_give_the_window_between_them(tmp_path):
    text = VLLM_DUMP.read_text()
    later = []
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_bucket"):
            head, value = line.rsplit(" ", 1)
            le = head.split('le="')[1].split('"')[0]
            extra = 100 if le == "1.0" else 1100        # 100 more passes at 1 token, 1000 more at 2..8
            line = f"{head} {float(value) + extra}"
        later.append(line)
    dump = tmp_path / "two.txt"
    dump.write_text(text + "\n".join(later) + "\n")
    s = load_profile(dump).served()
    assert s[1] == pytest.approx(100 / 1100) and s[8] == pytest.approx(1000 * 4 / 7 / 1100)
    assert set(s) == {1, 2, 4, 8}


def test_sglang_gauge_samples_and_counters():
    p = load_profile(SGLANG_DUMP, tp=8)
    s = p.served()
    # 1400 of 1600 passes (between the first and the last scrape) are decode, sampled at 64, 60
    # (padded to 64) and 120; the 200 prefill passes run 800000 tokens: 4000 on average
    assert s == pytest.approx({64: 0.875 * 2 / 3, 120: 0.875 / 3, 4000: 0.125})
    assert "SGLang 0.5.23" in p.form and any("no per-pass histogram" in n for n in p.notes)


def test_csv_and_json_forms_agree(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("# comment\nM,weight\n16,3\n64,1\n16,1\n")
    js = tmp_path / "t.json"
    js.write_text(json.dumps({"16": 4, "64": 1}))
    pairs = tmp_path / "p.json"
    pairs.write_text(json.dumps([[16, 4], [64, 1.0]]))
    for f in (csv, js, pairs):
        assert load_profile(f).served() == pytest.approx({16: 0.8, 64: 0.2})


@pytest.mark.parametrize("content, says", [
    ("", "empty"),
    ("M,weight\n", "no `M,weight` rows"),
    ("16,0\n64,0\n", "holds no traffic"),
    ("16,-1\n", "negative"),
    ("16,nan\n", "not finite"),
    ("0,1\n", "whole number"),
    ("16.5,1\n", "whole number"),
    ("M,weight\n1e3,x\n", "not a number"),
    ("size,1\n", "no `M,weight` rows"),
    ("16,1,2\n", "expected `M,weight`"),
    ("{\"16\": true}", "not a weight"),
    ("[1, 2]", "expected"),
    ("# TYPE foo counter\nfoo 1\n", "without any engine's metrics"),
    ("vllm:iteration_tokens_total_bucket{le=\"1.0\"} 5\n", "no le=\"+Inf\" bucket"),
    ("vllm:iteration_tokens_total_bucket{le=\"1.0\"} 5\nvllm:iteration_tokens_total_bucket{le=\"+Inf\"} 3\n",
     "not cumulative"),
    ("vllm:iteration_tokens_total_bucket{le=\"+Inf\",model_name=\"a\"} 0\n", "no forward passes"),
    ("vllm:iteration_tokens_total_bucket{le=1} 5\n", "cannot read the labels"),
    ("vllm:x 1\nsglang:y 2\n", "mixes the metrics"),
    ("sglang:num_queue_reqs 3\n", "no forward passes"),
])
def test_bad_profiles_are_one_line(tmp_path, content, says):
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(TunerError, match=None) as e:
        load_profile(f)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_bounded_reading(tmp_path, monkeypatch):
    from tuner.plan import traffic
    f = tmp_path / "long.csv"
    f.write_text("16," + "1" * 100 + "\n")
    monkeypatch.setattr(traffic, "MAX_LINE", 50)
    with pytest.raises(TunerError, match="a line of 103 characters"):
        load_profile(f)
    monkeypatch.setattr(traffic, "MAX_BYTES", 10)
    with pytest.raises(TunerError, match="at most"):
        load_profile(f)
    (tmp_path / "bin").write_bytes(b"16,1\0")
    with pytest.raises(TunerError, match="not text"):
        load_profile(tmp_path / "bin")
    with pytest.raises(TunerError, match="not found"):
        load_profile(tmp_path / "nothing.csv")


def test_a_bad_profile_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("16,-3\n")
    for argv in (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--dry-run", "--traffic", str(bad)],
                 ["report", str(tmp_path), "--traffic", str(bad)],
                 ["mla", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--dry-run", "--traffic",
                  str(FIXTURES / "vllm-0.33.0-metrics.txt")]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def _bucket_of(profile: TrafficProfile, m: int):
    return next(b for b in profile.buckets if b.lo <= m <= b.hi)


@pytest.mark.parametrize("dump", [VLLM_DUMP, SGLANG_DUMP])
def test_keys_serve_every_m_from_inside_its_bucket(dump):
    """Skewed traffic (most passes at 16-64 tokens): by the engines' own nearest-key rule
    (tuner.plan.engines.lookup_nearest), every served M gets a key within its bucket and within
    NEAR (so far within 2x) of it; keys without traffic (guards) leave no grid M more than 2x
    from a key."""
    profile = load_profile(dump, tp=8)
    plan = choose_keys(profile)
    table = {str(k): {"key": k} for k in plan.keys}
    for m, share in profile.served().items():
        key = lookup_nearest(table, m)["key"]
        b = _bucket_of(profile, m)
        assert b.lo <= key <= b.hi, (m, key, b.label)
        assert max(key / m, m / key) <= NEAR
    for g in [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]:
        key = lookup_nearest(table, g)["key"]
        assert max(key / g, g / key) <= 2.0
    cov = {c.key: c for c in plan.coverage}
    assert sum(c.share for c in plan.coverage) == pytest.approx(1.0)
    assert all(cov[g].share == 0 for g in plan.guards)
    # the heaviest keys are where the traffic is
    heavy = max(plan.coverage, key=lambda c: c.share)
    assert 16 <= heavy.key <= 64 or dump is SGLANG_DUMP


def test_key_coverage_follows_table_order():
    """Ties go to the earlier key in the file: in a table written 32 then 16, M=24 is 32's."""
    profile = TrafficProfile("x", "0" * 64, "test", [Bucket("M=24", [Run(24, 24, 1.0)])], [])
    assert [c.share for c in key_coverage([32, 16], profile)] == [1.0, 0.0]
    assert [c.share for c in key_coverage([16, 32], profile)] == [1.0, 0.0]
    assert key_coverage([16, 32], profile)[0].ratio == pytest.approx(1.5)


def test_budget_split_by_traffic():
    shares = {1: 0.0, 16: 0.5, 32: 0.3, 64: 0.2}
    b = split_budget(shares, 32)
    assert sum(b.values()) == 4 * 32                         # the same total as 32 per key
    assert min(b.values()) >= 8 and b[1] == 8                # floor: a quarter of 32
    rest = 4 * 32 - 4 * 8
    for k, s in shares.items():
        assert abs(b[k] - (8 + rest * s)) < 1                 # proportional beyond the floor
    assert b[16] > b[32] > b[64] > b[1]
    small = split_budget(shares, 3)
    assert sum(small.values()) == 12 and min(small.values()) >= 3
    assert split_budget({5: 1.0}, 10, floor=10) == {5: 10}


def test_per_m_budgets_and_old_plans():
    """SearchSettings keeps budgets per batch size; a plan stored before them still loads."""
    from tuner.plan.problems import Problem
    p = Problem("fp8_gemm", {"N": 1, "K": 1})
    s = SearchSettings(budget=32, patience=10, budgets={"16": 96, "64": 8})
    assert (s.budget_for(p, 16), s.budget_for(p, 64), s.budget_for(p, 128)) == (96, 8, 32)
    assert s.patience_for(p, 16) == 30 and s.patience_for(p, 64) == 10
    old = {"budget": 48, "patience": 16, "min_gain": 0.005, "top_k": 3, "batch": 8, "sampler": "tpe", "seed": 0}
    assert SearchSettings(**old).budget_for(p, 7) == 48


def test_weighted_counts_each_served_m_at_its_serving_key():
    profile = TrafficProfile("x", "0" * 64, "test", [Bucket("M", [Run(16, 16, 0.6), Run(20, 20, 0.2),
                                                                  Run(64, 64, 0.2)])], [])
    w = weighted(profile, ([16, 64], {16: 10.0, 64: 40.0}), ([16, 64], {16: 5.0, 64: 40.0}))
    assert w.speedup == pytest.approx((0.8 * 10 + 0.2 * 40) / (0.8 * 5 + 0.2 * 40)) and w.covered == 1.0
    # another key set: only the M both serve from the same key are compared
    w = weighted(profile, ([16, 64], {16: 10.0, 64: 40.0}), ([20, 64], {20: 5.0, 64: 20.0}))
    assert w.covered == pytest.approx(0.2) and w.speedup == pytest.approx(2.0)


def _source(wheel_glob: str, rel: str) -> str:
    d = wheel_dir()
    if d is None:
        pytest.skip("needs the engines' wheels (TUNER_ENGINE_WHEELS; .ci/run sets it)")
    with zipfile.ZipFile(next(d.glob(wheel_glob))) as z:
        return z.read(rel).decode()


def _function(source: str, name: str, namespace: dict):
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), name, "exec"), namespace)
            return namespace[name]
    raise AssertionError(f"{name} is gone from the engine's source")


@pytest.mark.ci_variables
def test_vllm_facts_match_its_source():
    """The metric, its default buckets (the fixture's) and the padding, from vLLM 0.33.0's wheel."""
    buckets = _source("vllm-0.33.0-*.whl", "vllm/v1/metrics/buckets.py")
    tree = ast.parse(buckets)
    value = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign)
                 and getattr(n.target, "id", "") == "ITERATION_TOKENS_BUCKETS")
    assert tuple(ast.literal_eval(value)) == VLLM_ITERATION_TOKENS_BUCKETS
    fixture_les = [line.split('le="')[1].split('"')[0] for line in VLLM_DUMP.read_text().splitlines()
                   if line.startswith("vllm:iteration_tokens_total_bucket")]
    assert [float(x) for x in fixture_les[:-1]] == [float(b) for b in VLLM_ITERATION_TOKENS_BUCKETS]
    loggers = _source("vllm-0.33.0-*.whl", "vllm/v1/metrics/loggers.py")
    assert f'name="{SERVING_METRICS["vllm"].tokens_histogram}"' in loggers
    # the dispatcher's padding table, run on our capture sizes, pads as our profile does
    dispatcher = _source("vllm-0.33.0-*.whl", "vllm/v1/cudagraph_dispatcher.py")
    fn = _function(dispatcher, "_compute_bs_to_padded_graph_size", {})
    sizes = SERVING_METRICS["vllm"].graph_sizes(8)
    me = SimpleNamespace(compilation_config=SimpleNamespace(max_cudagraph_capture_size=max(sizes),
                                                            cudagraph_capture_sizes=sizes, compile_sizes=[]),
                         vllm_config=SimpleNamespace())
    fn(me)
    from tuner.plan.traffic_metrics import _pad_runs
    for m in range(1, max(sizes) + 1):
        [run] = _pad_runs(m, m, 1.0, sizes)
        assert run.first == me._bs_to_padded_graph_size[m], m
    # the default sizes: 1 2 4, by 8 below 256, by 16 from 256 up to the largest (512 on an H100/H200)
    config = "".join(_source("vllm-0.33.0-*.whl", "vllm/config/vllm.py").split())
    for text in ("iforiin[1,2,4]ifi<=max_cudagraph_capture_size", "range(8,min(max_cudagraph_capture_size+1,256),8)",
                 "range(256,max_cudagraph_capture_size+1,16)", "1024ifcurrent_platform.is_device_capability_family(100)"
                 "else512", "min(max_num_seqs*decode_query_len*2,default_max_graph_size)"):
        assert text in config, text


@pytest.mark.ci_variables
def test_sglang_facts_match_its_source():
    """The metrics, the decode capture sizes and the padding, from SGLang 0.5.23's wheel."""
    collector = _source("sglang-0.5.23-*.whl", "sglang/srt/observability/metrics_collector.py")
    m = SERVING_METRICS["sglang"]
    for name in (m.batch_gauge, m.passes_counter, m.tokens_counter):
        assert f'name="{name}"' in collector
    for mode in m.decode_pass_modes + m.prefill_pass_modes + m.decode_token_modes + m.prefill_token_modes:
        assert f'"{mode}"' in collector
    assert "iteration_tokens" not in collector and "tokens_per_forward" not in collector   # no histogram
    hook = _source("sglang-0.5.23-*.whl", "sglang/srt/arg_groups/cuda_graph_hook.py")
    args = SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=None)
    gen = _function(hook, "generate_decode_cuda_graph_batch_sizes", {"resolving_view": lambda a: a, "Any": object})
    assert sorted(gen(args, 512)) == m.graph_sizes(8)
    assert sorted(gen(args, 256)) == m.graph_sizes(2)
    runner = _source("sglang-0.5.23-*.whl", "sglang/srt/model_executor/runner/base_cuda_graph_runner.py")
    import bisect
    pad = _function(runner, "_pad_to_bucket", {"bisect": bisect, "Sequence": list})
    from tuner.plan.traffic_metrics import _pad_runs
    sizes = m.graph_sizes(8)
    for b in range(1, 513):
        assert _pad_runs(b, b, 1.0, sizes)[0].first == pad(b, sizes)


def test_profile_round_trips_through_the_manifest():
    p = load_profile(VLLM_DUMP)
    q = TrafficProfile.from_manifest(json.loads(json.dumps(p.as_manifest())))
    assert q.sha256 == p.sha256 and q.served() == pytest.approx(p.served())
    for bad in ({}, {"format": "tuner-traffic/1"}, {**p.as_manifest(), "buckets": [{"label": "x", "runs": [[0, 1, 1]]}]}):
        with pytest.raises(TunerError, match="not readable"):
            TrafficProfile.from_manifest(bad)
    ms, ws = q.arrays()
    assert np.all(np.diff(ms) > 0) and math.isclose(ws.sum(), 1.0)


def test_a_tables_layers_per_pass_are_those_of_the_problem_the_plan_runs():
    """The weight drift gives a table in a forward pass (KernelSpec.layers_per_pass, from the
    table's problem alone) is what the plan's own problem for it says (its layer names times
    the layers holding each), for every GEMM shape and MoE table DeepSeek-V3 runs at TP8."""
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.layers import layers_per_pass
    from tuner.plan.models import gemm_problems, load_model, moe_problems
    model = load_model("deepseek-v3")
    problems = gemm_problems(model, 8) + moe_problems(model, 8, 1, "fp8_w8a8")
    assert {p.kernel for p in problems} == {"fp8_gemm", "fused_moe"}
    for p in problems:
        count = get_kernel(p.kernel).layers_per_pass
        assert count(model, p.params, 8) == layers_per_pass(model, p.layers) > 0, p.key
    # without --tp, a shape is found at the first TP that runs it; one the model never runs has no count
    gemm = get_kernel("fp8_gemm").layers_per_pass
    shape = {"N": 7168, "K": 2048, "block_shape": [128, 128]}     # TP1: shared experts' down_proj; TP8: o_proj
    assert (gemm(model, shape, None), gemm(model, shape, 1), gemm(model, shape, 8)) == (58, 58, 61)
    assert gemm(model, {"N": 1000, "K": 1000, "block_shape": [128, 128]}, None) is None
