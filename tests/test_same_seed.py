"""The same --seed gives the same search in any process (issue 32): every sampler is seeded by
--seed alone, and the loop's random fill by --seed, the study and its state (it used to take
the process id, so tpe and random searches differed from one run to the next). Two runs in two
processes over one SYNTHETIC landscape (a cost model, labelled so) measure the same configs in
the same order."""

import subprocess
import sys

import optuna
import pytest
from synthetic import write_synthetic_landscape

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search.storage import open_journal

KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


def measured_order(out) -> list:
    store = open_journal(out / "studies.journal")
    name = next(n for n in optuna.get_all_study_names(store) if n.endswith(":M=16"))
    trials = optuna.load_study(study_name=name, storage=store).get_trials(deepcopy=False)
    return [tuple(tr.user_attrs["config"].values()) for tr in trials if tr.user_attrs.get("config")]


@pytest.mark.parametrize("sampler", ["gp", "tpe", "random"])
def test_the_same_seed_gives_the_same_search_in_another_process(tmp_path, sampler):
    land = tmp_path / "land.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [P], [16])
    orders = []
    for run in ("a", "b"):
        subprocess.run([sys.executable, "-m", "tuner", "gemm", "--model", "deepseek-v3", "--tp", "8", "--only",
                        "N=7168,K=2048", "--batch-sizes", "16", "--gpu", "H200", "--replay", str(land),
                        "--trials", "24", "--sampler", sampler, "--seed", "7", "--kernel-source", "ours",
                        # the whole budget (not the evidence stop): enough trials to compare the two orders
                        "--patience", "24", "--out", str(tmp_path / run), "--quiet"], check=True, capture_output=True)
        orders.append(measured_order(tmp_path / run))
    assert len(orders[0]) >= 12 and orders[0] == orders[1]
