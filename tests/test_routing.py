"""Recorded routing (issue 32, item 5; tuner/plan/routing.py): `--routing FILE` takes top-k ids from
SGLang's per-token expert-distribution dump or a plain .npy/.pt [tokens, topk], checks them
against the model, samples each input set's M tokens from them (kernels/fused_moe.py), and names
the routing in the problem, the study identity and the manifest. The file here is SYNTHETIC:
made by scripts/make_routing.py, a generator shaped like DeepSeek-V3's router (labelled so),
since no small MoE model is at hand to record from."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.errors import TunerError
from tuner.plan import routing as rt
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import ROUTING_DIR_ENV
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import load_model, moe_problems
from tuner.plan.space import load_space

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("routing")
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_routing.py"), "--out", str(d / "dsv3.npy"),
                    "--tokens", "512", "--layers", "2"], check=True, capture_output=True)
    # the same ids as SGLang's recorder dumps them, written by the script's own writer
    spec = importlib.util.spec_from_file_location("make_routing", REPO / "scripts" / "make_routing.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.write(np.load(d / "dsv3.npy"), {}, d / "dsv3-dump.pt", "sglang")
    return d


def test_the_generator_is_labelled_and_balanced_overall_but_skewed_per_batch(files):
    info = json.loads((files / "dsv3.npy.json").read_text())
    assert "SYNTHETIC" in info["generator"] and "not a recording" in info["generator"]
    ids = np.load(files / "dsv3.npy")
    assert ids.shape == (2, 512, 8) and ids.min() >= 0 and ids.max() < 256
    assert all(len(set(row)) == 8 for row in ids.reshape(-1, 8))
    for layer in info["per_layer"]:
        # unlike zipf (one expert with most tokens), the busiest expert of a 64-token batch has
        # a few times its share, not most of the batch
        assert 2.5 < layer["batch_of_64_max_over_mean"] < 12


def test_sglangs_dump_and_a_plain_array_read_as_the_same_ids(files):
    plain = rt.load_routing(files / "dsv3.npy")
    dump = rt.load_routing(files / "dsv3-dump.pt")
    assert dump.source.startswith("SGLang's per-token") and plain.source == "a .npy of expert ids"
    assert np.array_equal(plain.ids, dump.ids) and plain.digest == dump.digest
    assert plain.name.startswith("recorded:dsv3@") and plain.name.endswith(plain.digest)
    # SGLang's physical ids are mapped back to logical experts, and its unused columns (-1) dropped
    raw = torch.load(files / "dsv3-dump.pt", weights_only=True)
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    raw["last_physical_to_logical_map"] = perm.repeat(2, 1)
    for rec in raw["records"]:
        ids = rec["topk_ids_of_layer"]
        rec["topk_ids_of_layer"] = torch.cat([torch.argsort(perm)[ids.long()].int(),
                                              torch.full(ids.shape[:2] + (1,), -1, dtype=torch.int32)], dim=2)
    torch.save(raw, files / "physical.pt")
    assert np.array_equal(rt.load_routing(files / "physical.pt").ids, plain.ids)
    # a plain [tokens, topk] tensor in a .pt
    torch.save(torch.from_numpy(plain.ids[0]), files / "one-layer.pt")
    assert rt.load_routing(files / "one-layer.pt").ids.shape == (1, 512, 8)


def test_a_routing_that_does_not_fit_the_model_is_one_line(files, tmp_path):
    r = rt.load_routing(files / "dsv3.npy")
    with pytest.raises(TunerError, match="picks 8 experts per token, the model 6"):
        rt.checked(r, 6, 256, "--routing x")
    with pytest.raises(TunerError, match="expert ids run from 0 to .*, but the model routes over 64 experts"):
        rt.checked(r, 8, 64, "--routing x")
    torch.save({"rank": 0, "logical_count": torch.zeros(3, 256)}, tmp_path / "stat.pt")
    with pytest.raises(TunerError, match="stat mode .* record with --expert-distribution-recorder-mode per_token"):
        rt.load_routing(tmp_path / "stat.pt")
    np.save(tmp_path / "floats.npy", np.zeros((4, 8)))
    with pytest.raises(TunerError, match="expert ids must be integers"):
        rt.load_routing(tmp_path / "floats.npy")


def test_the_kernel_samples_each_input_sets_tokens_from_the_recording(files, tmp_path, monkeypatch):
    r = rt.load_routing(files / "dsv3.npy")
    monkeypatch.delenv(ROUTING_DIR_ENV, raising=False)
    rt.install(r, tmp_path / "routing")
    kernel = get_kernel("fused_moe")
    params = {"E": 8, "N": 32, "K": 64, "topk": 8, "dtype": "bf16", "block_shape": None, "part": "up",
              "routing": r.name}
    # a small layer with the recording's ids folded onto its 8 experts is not what a model runs: use 256
    params["E"] = 256
    rows = {tuple(map(tuple, r.ids[layer])) for layer in range(2)}
    seen = []
    for seed in range(3):
        ids = kernel.make_inputs(params, 16, "cpu", seed)["topk_ids"].numpy()
        assert ids.shape == (16, 8)
        # M consecutive tokens of one layer of the recording
        assert any(all(tuple(row) in layer for row in ids) for layer in rows)
        seen.append(ids.tobytes())
    assert len(set(seen)) > 1                       # other input sets, other tokens


def test_a_moe_run_names_the_recorded_routing_in_its_identity_and_manifest(files, tmp_path, capsys):
    model = load_model("deepseek-v3")
    r = rt.load_routing(files / "dsv3.npy")
    problems = [p for p in moe_problems(model, 8, 1, "fp8_w8a8", r.name, ["vllm"])]
    kernel = get_kernel("fused_moe")
    land = tmp_path / "moe.jsonl"
    write_synthetic_landscape(land, kernel, load_space(kernel), get_gpu("H200"), [p.params for p in problems], [16])
    args = ["moe", "--model", "deepseek-v3", "--tp", "8", "--gpu", "H200", "--engines", "vllm", "--batch-sizes",
            "16", "--kernel-source", "ours", "--replay", str(land), "--trials", "6", "--routing",
            str(files / "dsv3.npy")]
    assert main([*args, "--dry-run"]) == 0
    assert f"routing={r.name}" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["measurement"]["routing"] == r.name
    assert manifest["routing"]["name"] == r.name and manifest["routing"]["file"] == str(files / "dsv3.npy")
    table = manifest["tables"][0]
    assert table["problem"]["routing"] == r.name and table["identity"]["routing"] == r.name
    assert (tmp_path / "out" / "routing" / f"{r.digest}.npy").is_file()
    # uniform routing is another study, never resumed from this one
    assert main([*args[:-1], "uniform", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "(now uniform); its studies are not this run's" in err.strip().splitlines()[-1]
