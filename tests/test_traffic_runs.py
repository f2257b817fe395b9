"""Traffic-keyed tuning and judging on a CPU, over SYNTHETIC landscapes (tests/synthetic.py):
keys and budgets from a profile, the default kept where the tuned config does not beat it,
and the traffic-weighted figures of report, bench, drift and diff against a hand computation
from the manifest's and bench's own numbers."""

import hashlib
import json
import re

import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.plan.engines import lookup_nearest
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import StudyResult

KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}        # o_proj at TP8: 61 layers of DeepSeek-V3
COMMON = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
KEYS = [1, 4, 16, 20, 64, 256, 1024, 3072]                    # what choose_keys picks for PROFILE (asserted)
PROFILE = "M,weight\n16,3\n20,1\n64,1\n"                       # shares 0.6, 0.2, 0.2


def _default_point(land, M):
    cfg = load_space(KERNEL).canonical(P, M, get_gpu("H200"), KERNEL.default_config(P, M))
    return land.lookup(P, M)[tuple(cfg[k] for k in KERNEL.config_keys)]


def _flatten(src, dst, M, within=0.99):
    """A copy of a landscape where, at M, no config is more than 1 % faster than the default."""
    land = read_landscape(src, KERNEL)
    floor = _default_point(land, M).time_us * within
    w = LandscapeWriter(dst, KERNEL, land.header)
    for (key, m), pts in land.points.items():
        for cfg, p in pts.items():
            t = max(p.time_us, floor) if (m == M and p.time_us) else p.time_us
            w.write(land.problems[key], m, dict(zip(KERNEL.config_keys, cfg)), Point(t, p.error, p.spread))
    w.close()
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("traffic")
    land = d / "land.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [P], KEYS)
    flat = _flatten(land, d / "flat.jsonl", 64)
    csv = d / "traffic.csv"
    csv.write_text(PROFILE)
    base = ["gemm", *COMMON, "--only", "N=7168,K=2048", "--trials", "8", "--quiet"]
    assert main([*base, "--replay", str(flat), "--traffic", str(csv), "--out", str(d / "traffic")]) == 0
    assert main([*base, "--replay", str(flat), "--batch-sizes", "16", "64", "--out", str(d / "plain")]) == 0
    return d


def _table(run):
    manifest = json.loads((run / "manifest.json").read_text())
    [t] = manifest["tables"]
    return manifest, t


def test_keys_budgets_and_the_manifest_record(runs, capsys):
    manifest, t = _table(runs / "traffic")
    assert sorted(map(int, t["entries"])) == KEYS
    record = manifest["traffic"]
    assert record["sha256"] == hashlib.sha256(PROFILE.encode()).hexdigest()
    assert record["source"].endswith("traffic.csv") and record["buckets"]
    budgets = manifest["search"]["budgets"]
    assert sum(budgets.values()) == 8 * len(KEYS) and min(budgets.values()) >= 4
    assert budgets["16"] > budgets["20"] > budgets["1"] and budgets["1"] == budgets["3072"]
    for m, e in t["entries"].items():
        assert e["trials"] <= budgets[m]
    assert t["entries"]["16"]["trials"] > t["entries"]["1"]["trials"]
    # without a profile: today's manifest, no traffic, one budget
    plain, _ = _table(runs / "plain")
    assert "traffic" not in plain and "budgets" not in plain["search"]
    capsys.readouterr()
    assert main(["report", str(runs / "plain")]) == 0
    assert "traffic-weighted" not in capsys.readouterr().out


def test_no_served_m_snaps_to_a_config_tuned_far_away(runs):
    """At M=64 no config beats the default by more than 1 %: the table holds the default
    there, explicitly. Every served M runs an entry tuned within 2x of it, or the default."""
    manifest, t = _table(runs / "traffic")
    e64 = t["entries"]["64"]
    assert e64["kept_default"]["config"] is not None and "within the noise band" in e64["kept_default"]["why"]
    assert e64["config"] == e64["default_config"] and e64["numerics"]["status"] == "default"
    table = json.loads((runs / "traffic" / t["files"]["vllm"]).read_text())
    assert table["64"] == e64["default_config"]
    for m in (16, 20, 64):
        entry = lookup_nearest(table, m)
        key = next(int(k) for k, v in table.items() if v is entry)
        assert max(key / m, m / key) <= 2 or entry == t["entries"][str(key)]["default_config"]


def _expected(times_def, times_new, shares):
    return sum(shares[m] * times_def[m] for m in shares) / sum(shares[m] * times_new[m] for m in shares)


def test_report_weighs_by_traffic(runs, capsys):
    _, t = _table(runs / "traffic")
    e = {int(m): v for m, v in t["entries"].items()}
    # M=20 is its own key here; the profile's passes: 16 (0.6), 20 (0.2), 64 (0.2)
    shares = {16: 0.6, 20: 0.2, 64: 0.2}
    d = {m: e[m]["default_time_us"] for m in shares}
    x = {m: e[m]["time_us"] for m in shares}
    capsys.readouterr()
    assert main(["report", str(runs / "traffic")]) == 0                 # the profile from the manifest
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("*** SYNTHETIC")
    want = _expected(d, x, shares)
    assert f"traffic-weighted speedup over the default: {want:.2f}x" in out
    plain = re.search(r"Geometric-mean speedup over the engines' default config \(SYNTHETIC: not a measurement\): "
                      r"([\d.]+)x", out)
    assert plain and f"(plain geomean {plain.group(1)}x over {len(KEYS)} batch sizes)" in out
    # per pass: o_proj runs in all 61 layers of DeepSeek-V3
    base = 61 * sum(shares[m] * d[m] for m in shares)
    new = 61 * sum(shares[m] * x[m] for m in shares)
    line = next(ln for ln in out.splitlines() if ln.startswith("vllm, deepseek-v3: estimated"))
    assert f"default {base:.1f} us -> table {new:.1f} us" in line
    assert "not of end-to-end latency" in line and "SYNTHETIC" in line
    md = (runs / "traffic" / "report" / "report.md").read_text()
    assert "## Judged by traffic" in md and f"{want:.2f}x" in md


def test_bench_weighs_by_traffic(runs, tmp_path, capsys):
    out = tmp_path / "bench"
    capsys.readouterr()
    assert main(["bench", *COMMON, "--kernel", "gemm", "--only", "N=7168,K=2048", "--batch-sizes", "16", "64",
                 "--replay", str(runs / "flat.jsonl"), "--tuned", str(runs / "traffic"),
                 "--traffic", str(runs / "traffic.csv"), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(next(out.glob("*.json")).read_text())["rows"]
    t = {(r["contender"], r["M"]): r["time_us"] for r in rows if r["config"]}
    # benched at 16 and 64 only: M=20 counts at 16 (the benched M nearest to it)
    shares = {16: 0.8, 64: 0.2}
    want = _expected({m: t[("default", m)] for m in shares}, {m: t[("tuned", m)] for m in shares}, shares)
    assert f"tuned: traffic-weighted speedup over the default: {want:.2f}x" in printed
    assert printed.splitlines()[0].startswith("*** SYNTHETIC")
    assert "estimated time of these kernels per forward pass" in printed


def test_drift_weighs_by_traffic(runs, tmp_path, capsys):
    rows_file = tmp_path / "rows.json"
    capsys.readouterr()
    assert main(["drift", str(runs / "traffic"), *COMMON, "--replay", str(runs / "flat.jsonl"),
                 "--traffic", str(runs / "traffic.csv"), "--out", str(rows_file)]) == 0
    printed = capsys.readouterr().out
    rows = [r for r in json.loads(rows_file.read_text()) if r["engine"] == "vllm"]
    shares = {16: 0.6, 20: 0.2, 64: 0.2}
    by_m = {r["M"]: r for r in rows}
    want = _expected({m: by_m[m]["default_us"] for m in shares}, {m: by_m[m]["table_us"] for m in shares}, shares)
    line = next(ln for ln in printed.splitlines() if "block_shape=[128,128].json [vllm]" in ln)
    assert f"traffic-weighted speedup over the default: {want:.2f}x" in line
    assert f"default {61 * sum(shares[m] * by_m[m]['default_us'] for m in shares):.1f} us" in printed
    assert printed.splitlines()[0].startswith("*** SYNTHETIC")


def test_diff_compares_where_both_tables_serve_from_the_same_key(runs, capsys):
    capsys.readouterr()
    assert main(["diff", str(runs / "plain"), str(runs / "traffic"), "--out", str(runs / "d")]) == 0
    out = capsys.readouterr().out
    _, old = _table(runs / "plain")
    _, new = _table(runs / "traffic")
    # the plain table (keys 16, 64) serves M=20 from 16, the traffic one from 20: 20 is left out
    shares = {16: 0.6, 64: 0.2}
    want = _expected({m: old["entries"][str(m)]["time_us"] for m in shares},
                     {m: new["entries"][str(m)]["time_us"] for m in shares}, shares)
    assert f"new traffic-weighted speedup over old: {want:.2f}x; over the 80% of passes" in out
    assert "## Judged by traffic" in (runs / "d" / "diff.md").read_text()


def test_tied_tables_keep_the_default_together():
    """SGLang's up and _down tables: the default is written only where neither beats its
    default; the _down entry is then the up default (what SGLang runs without a _down entry)."""
    from tuner.emit.results import prefer_defaults
    kernel = get_kernel("fused_moe")
    params = {"E": 8, "N": 128, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": [128, 128]}
    up = Problem("fused_moe", {**params, "part": "up"})
    down = Problem("fused_moe", {**params, "part": "down"}, tied_to=up.key, tied_keys=("BLOCK_SIZE_M",))
    tuned = {**kernel.default_config(params, 16), "BLOCK_SIZE_N": 32}

    def result(problem, M, t, d, default=None):
        return StudyResult(problem, M, tuned, t, 0.01, default or kernel.default_config(params, M), d, 8, "budget",
                           {"status": "passed"})

    ups = [result(up, 16, 9.9, 10.0), result(up, 64, 9.9, 10.0)]
    downs = [result(down, 16, 9.95, 10.0, tuned), result(down, 64, 5.0, 10.0, tuned)]
    new_up, new_down = prefer_defaults(kernel, [up, down], [ups, downs])
    assert new_up[0].config == kernel.default_config(params, 16) and new_up[0].time_us == 10.0
    assert new_down[0].config["BLOCK_SIZE_M"] == new_up[0].config["BLOCK_SIZE_M"]
    assert new_down[0].kept_default and new_down[0].time_us is None      # the up default was not timed for down
    assert new_up[1] is ups[1] and new_down[1] is downs[1]              # down gains 2x at 64: both kept
