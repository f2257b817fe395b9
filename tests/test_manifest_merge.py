"""A results folder's manifest keeps one entry per table file: two engines' tables of one
problem timed on the same kernel (ours, where no engine's code is here) are two entries, and a
later run replaces only the files it rewrote."""

import json

from tuner.emit.results import update_manifest


def _entry(engines, rows, source="ours", problem=None):
    return {"kernel": "fp8_gemm", "kernel_source": {"source": source}, "problem": problem or {"N": 256, "K": 256},
            "files": {e: f"{e}/fp8_gemm/N=256,K=256.json" for e in engines},
            "entries": {m: {"time_us": t} for m, t in rows.items()}}


def _tables(tmp_path):
    return [{**t, "entries": {m: e["time_us"] for m, e in t["entries"].items()}}
            for t in json.loads((tmp_path / "manifest.json").read_text())["tables"]]


def test_each_engines_table_of_one_problem_keeps_its_entry(tmp_path):
    update_manifest(tmp_path, {}, [_entry(["vllm"], {"1": 1})])
    update_manifest(tmp_path, {}, [_entry(["sglang"], {"1": 2})])
    assert [(list(t["files"]), t["entries"]) for t in _tables(tmp_path)] == [(["vllm"], {"1": 1}),
                                                                          (["sglang"], {"1": 2})]
    update_manifest(tmp_path, {}, [_entry(["vllm"], {"1": 3})])          # rewrites vLLM's table only
    assert [(list(t["files"]), t["entries"]) for t in _tables(tmp_path)] == [(["vllm"], {"1": 3}),
                                                                          (["sglang"], {"1": 2})]
    update_manifest(tmp_path, {}, [_entry(["vllm", "sglang"], {"1": 4})])  # both at once: one entry
    assert [(sorted(t["files"]), t["entries"]) for t in _tables(tmp_path)] == [(["sglang", "vllm"], {"1": 4})]
    update_manifest(tmp_path, {}, [_entry(["sglang"], {"1": 5})])        # the old entry keeps vLLM's file
    assert [(sorted(t["files"]), t["entries"]) for t in _tables(tmp_path)] == [(["vllm"], {"1": 4}),
                                                                          (["sglang"], {"1": 5})]
    update_manifest(tmp_path, {}, [_entry(["vllm"], {"1": 6}, source="vllm")])  # another kernel: its own entry
    assert len(_tables(tmp_path)) == 3
