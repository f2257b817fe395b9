"""Search-space pruning rules, and the landscape file format."""

import gzip
import json

import pytest

from tuner.errors import TunerError
from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


def cfg(bm, bn, bk, g, w, s):
    return dict(zip(KERNEL.config_keys, (bm, bn, bk, g, w, s)))


def test_rules_prune_before_compiling():
    space = load_space(KERNEL)
    assert space.rejected_by(P, 64, GPU, cfg(64, 128, 256, 1, 4, 2)) == "block_k_divides_group"
    # 4 stages x (256 + 256) x 128 bytes = 256 KiB > 227 KiB
    assert space.rejected_by(P, 4096, GPU, cfg(256, 256, 128, 1, 8, 4)) == "shared_memory"
    assert space.rejected_by(P, 4096, GPU, cfg(256, 128, 128, 1, 4, 2)) == "accumulator_registers"
    assert space.rejected_by(P, 1, GPU, cfg(32, 128, 128, 1, 4, 2)) == "block_m_within_rows"
    assert space.rejected_by(P, 20, GPU, cfg(32, 128, 128, 1, 4, 2)) is None
    assert space.rejected_by(P, 4096, GPU, cfg(128, 128, 128, 8, 4, 3)) is None
    kept = space.configs(P, 4096, GPU)
    assert all(space.rejected_by(P, 4096, GPU, c) is None for c in kept)
    assert 0 < len(kept) < space.size


def test_group_size_equivalence_is_folded():
    space = load_space(KERNEL)
    # At M=100 with BLOCK_SIZE_M=64 there are 2 tiles of M: every GROUP_SIZE_M >= 2 walks
    # them alike, so only 1 and the smallest value >= 2 (4) remain.
    groups = {c["GROUP_SIZE_M"] for c in space.configs(P, 100, GPU) if c["BLOCK_SIZE_M"] == 64}
    assert groups == {1, 4}
    assert space.canonical(P, 100, GPU, cfg(64, 128, 128, 32, 4, 2))["GROUP_SIZE_M"] == 4
    assert space.canonical(P, 4096, GPU, cfg(64, 128, 128, 32, 4, 2))["GROUP_SIZE_M"] == 32


def test_bad_space_files(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("params: {BLOCK_SIZE_M: [16]}\n")
    with pytest.raises(TunerError, match="missing BLOCK_SIZE_N"):
        load_space(KERNEL, f)
    f.write_text("params: {BLOCK_SIZE_M: [16], BLOCK_SIZE_N: [64], BLOCK_SIZE_K: [128], GROUP_SIZE_M: [1],"
                 " num_warps: [4], num_stages: [2]}\nconstraints: {magic: {}}\n")
    with pytest.raises(TunerError, match="unknown constraint 'magic'"):
        load_space(KERNEL, f)


def test_landscape_round_trip_gz_and_resume(tmp_path):
    path = tmp_path / "l.jsonl.gz"
    header = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200"}
    w = LandscapeWriter(path, KERNEL, header)
    w.write(P, 16, cfg(16, 64, 128, 1, 4, 3), Point(12.5, None, 0.02))
    w._f.close()                     # a run killed here leaves only the .partial file
    assert not path.exists() and w.partial.exists()
    with open(w.partial, "a") as f:
        f.write('{"problem": {"N": 71')   # and a line cut off mid-write
    w2 = LandscapeWriter(path, KERNEL, header)
    assert w2.has(P, 16, cfg(16, 64, 128, 1, 4, 3))
    w2.write(P, 16, cfg(32, 64, 128, 1, 4, 3), Point(None, "out of resources"))
    w2.close()
    assert not w2.partial.exists()
    with gzip.open(path, "rt") as f:
        assert json.loads(f.readline())["format"] == "tuner-landscape/1"
    land = read_landscape(path, KERNEL)
    pts = land.lookup(P, 16)
    assert len(pts) == 2
    assert land.best(P, 16) == ((16, 64, 128, 1, 4, 3), 12.5)
    # problem keys may come in any order in the file
    assert land.lookup({"K": 2048, "block_shape": [128, 128], "N": 7168}, 16) is pts



def test_two_recordings_into_one_file_are_refused_not_interleaved(tmp_path):
    """A second recording into FILE while one runs is refused (one line), whether the first
    wrote FILE.partial afresh or continued a killed run's (rewriting it: a new file under the
    same name); the first goes on and its file is whole."""
    path = tmp_path / "l.jsonl"
    header = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200"}
    for continued in (False, True):
        if continued:                               # a killed run's partial, its last line cut off
            w0 = LandscapeWriter(path, KERNEL, header)
            w0.write(P, 16, cfg(16, 64, 128, 1, 4, 3), Point(12.5, None, 0.02))
            w0._f.write('{"problem": {"N": 71')
            w0._f.close()
        w = LandscapeWriter(path, KERNEL, header)
        assert w.has(P, 16, cfg(16, 64, 128, 1, 4, 3)) == continued
        before = w.partial.read_text()
        with pytest.raises(TunerError, match="being recorded by another run"):
            LandscapeWriter(path, KERNEL, header)
        assert w.partial.read_text() == before      # the refused run wrote nothing
        w.write(P, 16, cfg(32, 64, 128, 1, 4, 3), Point(14.0, None, 0.02))
        w.close()
        land = read_landscape(path, KERNEL)
        assert len(land.lookup(P, 16)) == 1 + continued
        path.unlink()


def test_a_partial_whose_header_a_kill_cut_is_written_afresh(tmp_path):
    """A recording killed before its header line was whole leaves a FILE.partial without one:
    the next recording writes the header again instead of appending after the cut bytes."""
    path = tmp_path / "l.jsonl"
    header = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200"}
    (tmp_path / "l.jsonl.partial").write_text('{"format": "tuner-landscape/1", "ker')
    w = LandscapeWriter(path, KERNEL, header)
    w.write(P, 16, cfg(16, 64, 128, 1, 4, 3), Point(12.5, None, 0.02))
    w.close()
    assert json.loads(path.read_text().splitlines()[0]) == header
    assert read_landscape(path, KERNEL).best(P, 16) == ((16, 64, 128, 1, 4, 3), 12.5)


def test_a_fifo_where_a_partial_goes_is_refused_not_waited_on(tmp_path):
    """A FIFO at FILE.partial (planted between any check by name and the open) is refused in
    one line; the open does not wait for a reader."""
    import os

    from tuner.paths import open_for_append
    fifo = tmp_path / "l.jsonl.partial"
    os.mkfifo(fifo)
    with pytest.raises(TunerError, match="not a regular file"):
        open_for_append(fifo)
    with pytest.raises(TunerError, match="not a file of ours"):
        LandscapeWriter(tmp_path / "l.jsonl", KERNEL, {"format": "tuner-landscape/1", "kernel": "fp8_gemm",
                                                        "device": "NVIDIA H200"})

def test_search_efficiency_counts_trials_to_the_best(tmp_path):
    # SYNTHETIC landscape; checks the bookkeeping of the offline study, not any sampler's merit.
    from synthetic import write_synthetic_landscape

    from tuner.search.offline import search_efficiency, summary_table
    path = tmp_path / "l.jsonl"
    space = load_space(KERNEL)
    write_synthetic_landscape(path, KERNEL, space, GPU, [P], [1])
    land = read_landscape(path, KERNEL)
    n = len(land.lookup(P, 1))
    runs = search_efficiency(land, space, GPU, budget=n, seeds=1,
                             variants=[("random", "random", False), ("tpe+seeds", "tpe", True)])
    assert len(runs) == 2
    for r in runs:
        # with a budget as large as the grid, every config is tried: the best is reached
        assert r.to_1pct is not None and 1 <= r.to_3pct <= r.to_1pct <= n
    table = summary_table(runs, n)
    assert list(table["sampler"]) == ["random", "tpe+seeds"]


def test_synth_writes_each_point_once_under_the_running_triton(tmp_path, capsys):
    """`landscape synth` and `landscape info` count the same points (no seed written twice)
    and the header names the Triton that is running."""
    import triton

    from tuner.cli import main
    out = tmp_path / "s.jsonl"
    assert main(["landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--batch-sizes", "1", "64", "--out", str(out)]) == 0
    wrote = int(capsys.readouterr().out.split()[1])
    assert main(["landscape", "info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"{wrote} points" in info.splitlines()[-1] and f"triton {triton.__version__}," in info
    lines = out.read_text().splitlines()[1:]
    keys = [json.dumps([json.loads(x)["problem"], json.loads(x)["M"], json.loads(x)["config"]], sort_keys=True)
            for x in lines]
    assert len(keys) == len(set(keys)) == wrote


def test_pruning_once_per_problem_keeps_every_batch_sizes_answer():
    """configs() works out the rules that do not read M once per problem (a plan counts 18
    batch sizes): for every kernel, engine space and M its configs are the ones no rule
    rejects, checked rule by rule at that M."""
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.models import gemm_problems, load_model, mla_problems, moe_problems
    model, gpu = load_model("deepseek-v3"), get_gpu("H200")
    cases = [(get_kernel("fp8_gemm"), [p.params for p in gemm_problems(model, 8)][:3]),
             (get_kernel("fp8_gemm", "sglang", load_code=False), [p.params for p in gemm_problems(model, 8)][:2]),
             (get_kernel("fused_moe", "vllm", load_code=False), [moe_problems(model, 8, 1, "fp8_w8a8")[0].params]),
             (get_kernel("fused_moe", "sglang", load_code=False), [p.params for p in moe_problems(model, 8, 1, "fp8_w8a8",
                                                                                               engines=["sglang"])]),
             (get_kernel("mla_decode"), [p.params for p in mla_problems(model, 8, [1024, 65536], 64)[0]])]
    for kernel, problems in cases:
        space = load_space(kernel)
        for params in problems:
            for M in (1, 16, 64, 1024):
                every = [c for c in space.all_configs() if space.rejected_by(params, M, gpu, c) is None]
                assert space.configs(params, M, gpu) == every, (kernel.source_label, params, M)


def test_a_problem_and_batch_size_asked_again_is_not_pruned_again(monkeypatch):
    """A plan's text, its budget and the run ask configs() for the same (problem, M): the rules
    run once per (problem, M) (a dry run of DeepSeek-V3's GEMMs at 18 batch sizes asked each
    three times: 13.5 s of CPU, 6.1 s since), and what is asked again is the same answer, a list
    of its own."""
    from tuner.plan import space as space_module
    from tuner.plan.models import gemm_problems, load_model
    gpu, kernel = get_gpu("H200"), get_kernel("fp8_gemm", "sglang", load_code=False)
    space = load_space(kernel)
    params = gemm_problems(load_model("deepseek-v3"), 8)[0].params
    calls = {"n": 0}
    for name, fn in list(space_module.RULES.items()):
        def counted(ctx, opts, cfg, fn=fn):
            calls["n"] += 1
            return fn(ctx, opts, cfg)
        monkeypatch.setitem(space_module.RULES, name, counted)
    first = space.configs(params, 16, gpu)
    after_first = calls["n"]
    again = space.configs(params, 16, gpu)
    assert after_first > 0 and calls["n"] == after_first
    assert again == first and again is not first
    again.clear()                                   # a caller's list is its own
    assert space.configs(params, 16, gpu) == first
    other = space.configs(params, 64, gpu)           # another M is pruned by its own rules
    assert calls["n"] > after_first and other != first
