"""A table's row changes only for a real gain (issue 32, item 3; tuner/search/choice.py): the
search's best and the incumbent (the installed row, else the default) timed again in pairs,
interleaved in one call; the tuned config replaces the incumbent only when the pairs' median
gain is above --min-gain (default 2 %) and the pairs agree. Over a SYNTHETIC landscape whose
configs near-tie with the default (a cost model, labelled so; the gains are known)."""

import json

import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.measure.measurers import Measurement, ReplayMeasurer
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_tuple, table_entry
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.choice import paired_gain, verdict

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
M = 16


def near_ties(tmp_path, floor: float):
    """The synthetic landscape with every config at least `floor` x the default's time: the
    best gain over the default is 1/floor - 1."""
    src = tmp_path / "synth.jsonl"
    write_synthetic_landscape(src, KERNEL, load_space(KERNEL), GPU, [P], [M])
    land = read_landscape(src, KERNEL)
    default = load_space(KERNEL).canonical(P, M, GPU, KERNEL.default_config(P, M))
    d = land.lookup(P, M)[config_tuple(KERNEL, default)].time_us
    dst = tmp_path / f"ties-{floor}.jsonl"
    w = LandscapeWriter(dst, KERNEL, land.header)
    for cfg, p in land.lookup(P, M).items():
        t = None if p.time_us is None else (d if cfg == config_tuple(KERNEL, default) else max(p.time_us, d * floor))
        w.write(P, M, dict(zip(KERNEL.config_keys, cfg)), Point(t, p.error, p.spread))
    w.close()
    return dst, default


def run(tmp_path, land, out, *extra):
    assert main(["gemm", "--model", "deepseek-v3", "--tp", "8", "--only", "N=7168,K=2048", "--batch-sizes", str(M),
                 "--gpu", "H200", "--replay", str(land), "--trials", "16", "--kernel-source", "ours",
                 "--out", str(tmp_path / out), "--quiet", *extra]) == 0
    manifest = json.loads((tmp_path / out / "manifest.json").read_text())
    table = manifest["tables"][0]
    written = json.loads((tmp_path / out / table["files"]["vllm"]).read_text())
    return table["entries"][str(M)], written[str(M)]


def test_a_table_keeps_the_default_where_the_gain_is_under_the_threshold(tmp_path, capsys):
    land, default = near_ties(tmp_path, 0.99)          # the best config gains 1.0 % over the default
    entry, row = run(tmp_path, land, "ties")
    assert row == table_entry(KERNEL, default)          # the engine's table holds the default
    choice = entry["choice"]
    assert choice["kept"] == "default" and choice["incumbent"] == "default"
    assert 0.009 < choice["gain"] < 0.011 and choice["pairs"] == 4 and choice["spread"] == 0.0
    assert "not above --min-gain 2%" in choice["why"] and "spread 0.0% over 4 pairs" in choice["why"]
    assert config_tuple(KERNEL, choice["tuned"]) != config_tuple(KERNEL, default)   # the search did find it
    # the report says per M which row was kept and why
    capsys.readouterr()
    assert main(["report", str(tmp_path / "ties")]) == 0
    report = (tmp_path / "ties" / "report" / "report.md").read_text()
    assert "default: gain +1.0% (spread 0.0% over 4 pairs) is not above --min-gain 2%" in report
    # a lower threshold lets the same gain through
    entry, row = run(tmp_path, land, "low", "--min-gain", "0.005")
    assert entry["choice"]["kept"] == "tuned" and row != table_entry(KERNEL, default)
    assert "above --min-gain 0%" in entry["choice"]["why"] or "above --min-gain 1%" in entry["choice"]["why"]


def test_a_real_gain_replaces_the_default(tmp_path):
    land, default = near_ties(tmp_path, 0.5)            # configs up to 2x faster than the default
    entry, row = run(tmp_path, land, "gain")
    assert entry["choice"]["kept"] == "tuned" and entry["choice"]["gain"] > 0.5
    assert row == table_entry(KERNEL, entry["config"]) != table_entry(KERNEL, default)


class Alternating(ReplayMeasurer):
    """The landscape's times, each call's configs timed `factors[i % len]` times slower in turn:
    the drift between two back-to-back runs on a device, which pairing must see through."""

    def __init__(self, landscape, factors):
        super().__init__(landscape)
        self.factors, self.calls = factors, []

    def measure(self, problem, M, configs):
        self.calls.append(len(configs))
        out = super().measure(problem, M, configs)
        return [Measurement(m.time_us * self.factors[i % len(self.factors)], m.spread) for i, m in enumerate(out)]


@pytest.mark.parametrize("factors,kept", [
    ((1.0, 1.0), False),                    # a steady 1 % gain: under 2 %
    ((1.0, 1.05), True),                    # the incumbent always 5 % slower in its slot: a real 6 % gain
    # a median gain of 4.5 %, but two of the four pairs say the incumbent was faster: they disagree
    ((1.0, 0.9, 1.0, 0.98, 1.0, 1.089, 1.0, 1.109), False),
])
def test_paired_interleaved_retiming_decides(tmp_path, factors, kept):
    land, default = near_ties(tmp_path, 0.99)
    landscape = read_landscape(land, KERNEL)
    best = min((p.time_us, c) for c, p in landscape.lookup(P, M).items() if p.time_us)[1]
    m = Alternating(landscape, factors)
    g = paired_gain(m, Problem("fp8_gemm", P), M, dict(zip(KERNEL.config_keys, best)), default)
    assert m.calls == [8]                   # one call: tuned, incumbent, tuned, incumbent, ...
    assert verdict(g, 0.02)[0] is kept, (g, verdict(g, 0.02))
    if len(factors) == 8:
        assert g.gain > 0.02 and "not in most pairs" in verdict(g, 0.02)[1]


def test_report_drift_and_audit_show_the_measurement_policy(tmp_path, capsys):
    """The policy goes with the results: the report's header, drift's (its own timing and the
    tables' tuning), and audit's line per table that tuner installed."""
    land, default = near_ties(tmp_path, 0.5)
    run(tmp_path, land, "res")
    manifest = json.loads((tmp_path / "res" / "manifest.json").read_text())
    assert manifest["measurement"]["timing"] == "unknown"          # a replay: the landscape does not say
    assert main(["report", str(tmp_path / "res")]) == 0
    report = (tmp_path / "res" / "report" / "report.md").read_text()
    assert "Measurement: as the replayed landscape was recorded (it does not say how)." in report
    capsys.readouterr()
    assert main(["drift", str(tmp_path / "res"), "--gpu", "H200", "--replay", str(land), "--kernel-source", "ours"]) == 0
    out = capsys.readouterr().out
    assert "timed: as the landscape was recorded" in out
    assert f"tables of {tmp_path / 'res'}\n  were tuned: as the replayed landscape was recorded" in out
    # audit: a table tuner installed says how it was timed (from the install's record)
    from types import SimpleNamespace

    from tuner.commands.audit import policy_lines
    from tuner.emit import install
    dest = tmp_path / "site" / "t.json"
    dest.parent.mkdir()
    dest.write_text("{}")
    copy = install.Copy(dest, dest, "t", dest.parent, "fp8_gemm", times={16: 5.0},
                        timed_on={"device": "NVIDIA H200", "timing": "eager", "l2": "warm", "routing": None})
    install.install([copy], "vllm")
    ka = SimpleNamespace(resolved=SimpleNamespace(found=True), where=str(dest))
    other = SimpleNamespace(resolved=SimpleNamespace(found=True), where=str(tmp_path / "shipped.json"))
    lines = policy_lines(SimpleNamespace(kernels=[ka, other]), "vllm")
    assert lines[0] == ("measurement of t.json: eager launches, L2 warm, clocks unlocked on NVIDIA H200 (installed by "
                        "tuner)")
    assert lines[1].startswith("measurement of shipped.json: not recorded")
