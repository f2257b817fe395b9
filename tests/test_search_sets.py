"""The search benchmark's held-out check (scripts/search_sets.py, bench/search_split.yaml): the split
names every published landscape once, and the report judges a variant against plain TPE on each set
apart, "worse" only when the whole 95 % interval of the difference lies above 0. The runs here are
made-up ratios (a FORMAT FIXTURE, not a measurement)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_split_names_every_published_landscape_in_one_set():
    split = _load("search_sets").read_split(REPO / "bench" / "search_split.yaml")
    names = split["tuning"] + split["checking"]
    assert sorted(names) == sorted(_load("search_benchmark").SOURCES) and len(set(names)) == len(names)
    assert {"pnpoly-rtx2080ti", "dedispersion-w7800"} <= set(split["checking"])


def _raw(mean_48, mean_100, variants=("ours48", "ours")):
    spread = [-0.01, 0.0, 0.01, 0.0, 0.0]
    return {v: {"grid": 10, "params": 2, "ratios": {"48": [mean_48 + d for d in spread],
                                                    "100": [mean_100 + d for d in spread]}} for v in variants}


def test_a_variant_significantly_worse_on_the_held_out_set_is_flagged(tmp_path):
    split = tmp_path / "split.yaml"
    split.write_text("tuning:\n  - a\nchecking:\n  - b\n")
    ref = {"a": _raw(1.10, 1.05, ("plain-tpe",)), "b": _raw(1.10, 1.05, ("plain-tpe",))}
    after = {"a": _raw(1.02, 1.01), "b": _raw(1.30, 1.20)}       # wins where tuned, loses where held out
    level = {"a": _raw(1.10, 1.05), "b": _raw(1.10, 1.05)}
    for name, data in (("ref", ref), ("after", after), ("level", level)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "search_sets.py"), "--split", str(split), "--raw",
                        *(f"{n}={tmp_path / n}.json" for n in ("ref", "after", "level"))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tuning, checking = r.stdout.split("## The checking set")[0], r.stdout.split("## The checking set")[1]
    assert "| better |" in tuning and "| worse |" not in tuning
    assert "| worse |" in checking.split("Per landscape")[0]
    assert "- after: significantly worse than plain TPE on the checking set" in r.stdout
    assert "- level: no worse than plain TPE on either set" in r.stdout
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "search_sets.py"), "--raw", "x=/nonexistent"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_runs_of_other_seeds_add_to_a_landscapes_runs():
    merge_into = _load("search_sets").merge_into
    merged = merge_into({}, {"a": _raw(1.1, 1.0, ("ours",))})
    merge_into(merged, {"a": _raw(1.2, 1.0, ("ours",)), "b": _raw(1.0, 1.0, ("ours",))})
    assert len(merged["a"]["ours"]["ratios"]["48"]) == 10 and len(merged["b"]["ours"]["ratios"]["48"]) == 5
