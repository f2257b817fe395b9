"""scripts/search_benchmark.py's plumbing: a kernel_tuner cache converted into a landscape
of another project's kernel, and the benchmark run over it. The cache here is a made-up
FORMAT FIXTURE of a few points (not a measurement, never a judge of the search: that is
tests/test_search_real.py on a real landscape)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.landscape import read_header, read_landscape
from tuner.measure.landscape_kernel import landscape_kernel, landscape_space

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("search_benchmark", REPO / "scripts" / "search_benchmark.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench          # its dataclasses look their module up there
spec.loader.exec_module(bench)


def fixture_cache():
    cache = {}
    for a in (16, 32, 64):
        for b in (1, 2, 4):
            for c in (0, 1):
                t = 10.0 + abs(a - 32) / 8 + b + c / 3 if (a, b) != (64, 4) else "RuntimeFailedConfig"
                cache[f"{a},{b},{c},7"] = {"A": a, "B": b, "S": c, "K": 7, "time": t}
    return {"device_name": "Fixture GPU", "kernel_name": "fixture", "problem_size": [64, 64],
            "tune_params_keys": ["A", "B", "S", "K"], "tune_params": {"A": [16, 32, 64], "B": [1, 2, 4],
                                                                        "S": [0, 1], "K": [7]}, "cache": cache}


def test_a_kernel_tuner_cache_becomes_a_landscape_with_its_origin(tmp_path):
    source = bench.Source("someone/hub", "c0ffee", "cache/fixture.json", "a format fixture", {"S": 1},
                          {"A": 32, "B": 2, "S": 1}, "a fixture's license")
    path = bench.convert_cache(fixture_cache(), "fixture-s1", source, tmp_path)
    header = read_header(path)
    assert header["config_keys"] == ["A", "B"]                 # K is constant, S fixed by the slice
    assert header["origin"]["commit"] == "c0ffee" and header["origin"]["slice"] == {"S": 1}
    assert header["origin"]["fixed"] == {"K": 7} and header["default_config"] == {"A": 32, "B": 2}
    assert header["origin"]["repository"] == "https://github.com/someone/hub"
    assert header["origin"]["license"] == "a fixture's license" and "sdist" not in header["origin"]
    kernel = landscape_kernel(header)
    land = read_landscape(path, kernel)
    params = next(iter(land.problems.values()))
    pts = land.lookup(params, 64)
    assert len(pts) == 9 and pts[(64, 4)].time_us is None and pts[(64, 4)].kind == "runtime"
    assert pts[(32, 1)].time_us == round((10.0 + 1 + 1 / 3) * 1000, 4)      # ms -> us
    assert landscape_space(kernel, header).choices == {"A": [16, 32, 64], "B": [1, 2, 4]}
    assert kernel.default_config(params, 64) == {"A": 32, "B": 2}


def test_the_benchmark_runs_every_variant_and_prints_the_targets(tmp_path):
    source = bench.Source("someone/hub", "c0ffee", "cache/fixture.json", "a format fixture", None,
                          {"A": 32, "B": 2, "S": 0}, "a fixture's license")
    bench.convert_cache(fixture_cache(), "fixture", source, tmp_path)
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "search_benchmark.py"), "run", "--landscapes",
                          str(tmp_path), "--seeds", "2", "--variants", "ours48", "ours", "random", "--out",
                          str(tmp_path / "r.md")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "r.md").read_text()
    assert report.strip() == out.stdout.strip()
    assert "Command: `python scripts/search_benchmark.py run --landscapes" in report
    assert "| fixture | 3 | 18 | ours |" in report and "| fixture | 3 | 18 | random |" in report
    assert "- fixture: " in report and "beats random at 48" in report
    assert "from https://github.com/someone/hub cache/fixture.json @ c0ffee" in report
    # 18 configs, 2 failing: every run reaches the best within the grid
    rows = [ln for ln in report.splitlines() if ln.startswith("| 100 |")]
    assert len(rows) == 3 and all(ln.split("|")[3].strip() == "1.000" for ln in rows)
    assert json.loads(json.dumps(report))          # plain text


def test_no_landscapes_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "search_benchmark.py"), "run", "--landscapes",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "no real landscapes found" in out.stderr


def test_an_sdist_that_is_not_the_published_one_is_refused(tmp_path):
    source = bench.SOURCES["convolution-rtx2080ti"]
    project, version = source.pypi
    with pytest.raises(bench.TunerError, match=r"not found \(.ci/run downloads it: pip download --no-deps"):
        bench.sdist_path(source, tmp_path, download=False)
    (tmp_path / f"{project}-{version}.tar.gz").write_bytes(b"not the sdist on PyPI")
    with pytest.raises(bench.TunerError, match=f"not the {source.commit} of {project} {version} on PyPI"):
        bench.sdist_path(source, tmp_path, download=False)
