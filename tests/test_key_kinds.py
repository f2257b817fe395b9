"""Keys as the kernel sees them (tuner/plan/key_kinds.py, tuner/search/surrogate.py): each key's
kind declared in a space file or implied by its values, and the Gaussian-process sampler's
encoding by kind, judged on a SYNTHETIC landscape shaped like Kernel Tuner's convolution on an
AMD MI250X (issue 43: every block size that is not a power of two 11-16x slower there)."""

import gzip
import json
import math

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.measure.landscape import read_header, read_landscape
from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.key_kinds import checked_kinds, implied_kind, resolved_kinds
from tuner.plan.space import load_space
from tuner.search.offline import benchmark_traces
from tuner.search.runner import default_settings
from tuner.search.surrogate import _features


@pytest.mark.parametrize("values, kind", [
    ([0, 1], "category"), ([1, 2], "category"), ([0, 1, 2, 3], "category"),
    ([16, 32, 64, 128, 256], "log"), ([1, 2, 4, 8], "log"),
    ([16, 32, 48, 64, 80], "ordered"), ([1, 2, 3, 4], "ordered"), ([2, 3, 4, 5], "ordered")])
def test_a_keys_values_imply_its_kind(values, kind):
    assert implied_kind(values) == kind


def test_a_space_file_declares_kinds_and_bad_declarations_are_refused(tmp_path):
    kernel = get_kernel("fp8_gemm")
    src = load_space(kernel)
    text = ("kernel: fp8_gemm\nparams:\n" + "".join(f"  {k}: {v}\n" for k, v in src.choices.items())
            + "kinds:\n  num_stages: category\n")
    (tmp_path / "s.yaml").write_text(text)
    space = load_space(kernel, tmp_path / "s.yaml")
    assert space.kinds == {"num_stages": "category"}
    assert space.key_kinds["num_stages"] == "category" and space.key_kinds["BLOCK_SIZE_M"] == "log"
    (tmp_path / "plain.yaml").write_text(text.split("kinds:")[0])
    # kinds steer the model, not what a config measures: a study keeps its identity
    assert space.version == load_space(kernel, tmp_path / "plain.yaml").version
    for bad, says in (("  nope: log\n", "not a config key"), ("  num_stages: smooth\n", "is not one of")):
        (tmp_path / "b.yaml").write_text(text.replace("  num_stages: category\n", bad))
        with pytest.raises(TunerError, match=says):
            load_space(kernel, tmp_path / "b.yaml")
    with pytest.raises(TunerError, match="log scale"):
        checked_kinds({"flag": "log"}, {"flag": [0, 1]}, "here")
    assert resolved_kinds({"a": [0, 1, 2]}, {"a": "ordered"}) == {"a": "ordered"}


def test_the_model_encodes_each_key_by_its_kind():
    cands = np.array([[16, 0, 1], [48, 1, 2], [64, 2, 4]])
    x, groups = _features(cands, [[16, 32, 48, 64], [0, 1, 2], [1, 2, 4]], ["ordered", "category", "log"])
    # ordered: log2 of the value, then its alignment (64 better aligned than 48 = 16 * 3, as aligned as 16)
    assert x[:, 0] == pytest.approx([0, math.log2(3) / 2, 1])
    assert x[2, 1] > x[0, 1] == x[1, 1]
    # category: one column per value, no value between two others; log: log2 scaled
    assert [len(g) for g in groups] == [1, 1, 3, 1]
    assert np.linalg.norm(x[0, 2:5] - x[1, 2:5]) == pytest.approx(np.linalg.norm(x[0, 2:5] - x[2, 2:5])) == 1
    assert x[:, 5] == pytest.approx([0, 0.5, 1])


# -- the MI250X-like case: a synthetic landscape ---------------------------------------------------
BSX = list(range(16, 257, 16))


def _time_us(bsx: int, bsy: int, tx: int, pad: int) -> float:
    """Smooth in every key with its best at (64, 4, 2, 1), and 12x slower for a block size
    that is not a power of two (as on the MI250X); a fixed ripple of +-2 % keeps ties out."""
    smooth = (1 + 0.5 * math.log2(bsx / 64) ** 2) * (1 + 0.15 * math.log2(bsy / 4) ** 2) \
        * (1 + 0.2 * (tx - 2) ** 2) * (1.0 if pad else 1.08)
    ripple = 1 + 0.02 * math.sin(bsx * 7.1 + bsy * 3.3 + tx * 1.7 + pad)
    return round(100.0 * smooth * ripple * (1 if bsx & (bsx - 1) == 0 else 12), 4)


@pytest.fixture(scope="module")
def mi250x_like(tmp_path_factory):
    keys = ["block_size_x", "block_size_y", "tile_size_x", "use_padding"]
    params = {"block_size_x": BSX, "block_size_y": [1, 2, 4, 8, 16], "tile_size_x": [1, 2, 3, 4],
              "use_padding": [0, 1]}
    header = {"format": "tuner-landscape/1", "kernel": "convolution-synthetic", "device": "synthetic MI250X-like",
              "synthetic": "issue 43: non-power-of-two block sizes 12x slower, as on the MI250X",
              "config_keys": keys, "problem_keys": ["problem_size"], "params": params,
              "default_config": {"block_size_x": 16, "block_size_y": 16, "tile_size_x": 1, "use_padding": 1},
              "measured_on_gpu": False}
    path = tmp_path_factory.mktemp("mi250x") / "conv.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for bsx in BSX:
            for bsy in params["block_size_y"]:
                for tx in params["tile_size_x"]:
                    for pad in (0, 1):
                        cfg = dict(zip(keys, (bsx, bsy, tx, pad)))
                        f.write(json.dumps({"problem": {"problem_size": 4096}, "M": 4096, "config": cfg,
                                            "time_us": _time_us(bsx, bsy, tx, pad)}) + "\n")
    head = read_header(path)
    kernel = landscape_kernel(head)
    return read_landscape(path, kernel), landscape_space(kernel, head), landscape_gpu(head)


SEEDS, BUDGET = range(6), 40


def _found(land, variant, settings_for=None):
    landscape, space, gpu = land
    traces = benchmark_traces(landscape, space, gpu, variant, SEEDS, BUDGET, settings_for)
    return sum(t.ratio_at(BUDGET) <= 1.0 for t in traces)


def test_the_gp_finds_the_optimum_of_a_non_smooth_integer_key_as_often_as_tpe(mi250x_like):
    assert mi250x_like[1].key_kinds["block_size_x"] == "ordered"       # implied: not all powers of two
    gp = _found(mi250x_like, "ours:gp", lambda budget, seed: (default_settings(budget, seed=seed), True))
    tpe = _found(mi250x_like, "plain-tpe")
    assert tpe >= 1, "plain TPE never found the optimum: the landscape shows nothing"
    assert gp >= tpe, f"the GP found the optimum in {gp} of {len(SEEDS)} runs, plain TPE in {tpe}"
