"""A study's stored state edited or damaged (issue 51, item 9): the default sampler's model fit and
random stream, and a finished study's result. The journal stays whole, so `tuner repair-journal`
cannot help: what does not validate is discarded, said once, and the study goes on from its trials.
Before, every window ended in an internal error. Replayed SYNTHETIC landscape, the window's clock
driven by the test (tests/window_clock.py)."""

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search.storage import counts, open_storage
from tuner.search.surrogate import FIT_ATTR, RNG_ATTR

KERNEL = get_kernel("fp8_gemm")
PROBLEM = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


@pytest.fixture(scope="module")
def landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    write_synthetic_landscape(path, KERNEL, load_space(KERNEL), get_gpu("H200"), [PROBLEM], [16])
    return path


def args(landscape, out, minutes):
    return ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(landscape),
            "--only", "N=7168,K=2048", "--batch-sizes", "16", "--trials", "24", "--out", str(out),
            "--minutes", str(minutes), "--patience", "24"]   # the whole budget: the resumed study measures to it


def the_study(out):
    storage = open_storage(f"journal:///{out / 'studies.journal'}")
    name = next(n for n in optuna.get_all_study_names(storage) if "tuner-plan" not in n)
    return storage, optuna.load_study(study_name=name, storage=storage)


RNG_GOOD = {"bit_generator": "PCG64", "state": {"state": 1, "inc": 1}, "has_uint32": 0, "uinteger": 0}
FITS = {"NaN length scales": {"at": 10, "ls": [float("nan")] * 6},
        "zero length scales": {"at": 10, "ls": [0.0] * 6},
        "strings": {"at": 10, "ls": ["short"] * 6},
        "'at' not a number": {"at": "ten", "ls": [0.3] * 6},
        "'at' past the trials": {"at": 10 ** 6, "ls": [0.3] * 6},
        "not an object": "fitted"}
RNGS = {"out of range": {**RNG_GOOD, "state": {"state": 2 ** 200, "inc": 1}},
        "negative": {**RNG_GOOD, "state": {"state": -1, "inc": 1}},
        "another generator": {**RNG_GOOD, "bit_generator": "MT19937"},
        "strings": {**RNG_GOOD, "state": {"state": "x", "inc": "y"}},
        "a list": [1, 2, 3]}


@pytest.mark.parametrize("attr,bad", [*((FIT_ATTR, v) for v in FITS.values()),
                                      *((RNG_ATTR, v) for v in RNGS.values())],
                         ids=[*(f"fit: {k}" for k in FITS), *(f"stream: {k}" for k in RNGS)])
def test_a_model_state_that_does_not_validate_is_discarded_once(landscape, tmp_path, clock, capsys, attr, bad):
    out = tmp_path / "out"
    clock.t = 0.0
    main(args(landscape, out, 16 / 60))          # the study cut after its model's first fit
    storage, study = the_study(out)
    assert FIT_ATTR in study.user_attrs and RNG_ATTR in study.user_attrs
    measured = sum(counts(t) for t in study.trials)
    assert 8 < measured < 24
    storage.set_study_user_attr(study._study_id, attr, bad)
    capsys.readouterr()
    clock.t = 0.0
    rc = main(args(landscape, out, 30))
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "internal error" not in err
    said = [ln for ln in err.splitlines() if "does not validate" in ln]
    assert len(said) == 1 and "discarded; the study goes on from its trials" in said[0], err
    _, study = the_study(out)
    assert study.user_attrs["result"]["config"] and sum(counts(t) for t in study.trials) == 24


@pytest.mark.parametrize("damage", ["time_us", "trials", "config", "whole"])
def test_a_result_that_does_not_validate_is_closed_again(landscape, tmp_path, clock, capsys, damage):
    out = tmp_path / "out"
    clock.t = 0.0
    assert main(args(landscape, out, 30)) == 0
    storage, study = the_study(out)
    result = dict(study.user_attrs["result"])
    if damage == "time_us":
        result.pop("time_us")                       # a result without time_us
    elif damage == "trials":
        result["trials"] = "many"
    elif damage == "config":
        result["config"] = {"BLOCK_SIZE_M": "big"}
    else:
        result = "finished"
    storage.set_study_user_attr(study._study_id, "result", result)
    capsys.readouterr()
    clock.t = 0.0
    rc = main(args(landscape, out, 30))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "internal error" not in captured.err
    assert len([ln for ln in captured.err.splitlines() if "does not validate" in ln]) == 1, captured.err
    _, study = the_study(out)
    assert study.user_attrs["result"]["time_us"] > 0 and sum(counts(t) for t in study.trials) == 24
    assert "every table of the plan is written" in captured.out
