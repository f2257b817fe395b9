"""Engine releases as data (configs/engines/<engine>.yaml, and the same-named file in a folder
TUNER_CONFIG_DIRS names): a release added by a file alone is planned, tuned on a SYNTHETIC
replay, audited and installed for, and `--engine-version` lists it; a file that does not check
out is one line and exit 2 from the command that needs it. (Each release against its wheel:
tests/test_engine_versions.py, tests/test_loader_rules.py.)"""

import json
from pathlib import Path

import pytest
import yaml

from tuner.cli import build_parser, main
from tuner.paths import CONFIGS_DIR
from tuner.plan import engine_releases
from tuner.plan.engines import LOADER_FUNCTIONS, supported_releases
from tuner.reading import read_yaml_file

NEW = {"version": "0.34.0", "like": "0.33.0"}
# a command that reads the release data
AUDIT = ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model", "deepseek-v3",
         "--gpu", "H200", "--tp", "8", "--moe-config-dir", ""]


def data_folder(root: Path, engine: str = "vllm", *releases: dict, text: str | None = None) -> Path:
    (root / "engines").mkdir(parents=True, exist_ok=True)
    (root / "engines" / f"{engine}.yaml").write_text(
        text if text is not None else yaml.safe_dump({"releases": list(releases)}))
    return root


def test_the_repository_releases_are_its_data():
    """Every release of configs/engines/, and nothing else, with what differs between them as
    written there: vLLM 0.29.0 aligns with another moe_align_block_size than 0.31.0 and
    launches as it does; SGLang 0.5.19 and 0.5.20 are launched for their fused MoE only."""
    for engine in ("vllm", "sglang"):
        entries = read_yaml_file(CONFIGS_DIR / "engines" / f"{engine}.yaml")["releases"]
        assert supported_releases(engine) == sorted((e["version"] for e in entries),
                                                    key=engine_releases.version_key)
    assert {"0.29.0", "0.30.0"} <= set(supported_releases("vllm"))
    assert {"0.5.19", "0.5.20"} <= set(supported_releases("sglang"))
    old, new = (next(r for r in engine_releases.kernel_releases("vllm", "fused_moe") if r.version == v)
                for v in ("0.29.0", "0.31.0"))
    assert {k for k in old.mirrored if old.mirrored[k] != new.mirrored[k]} == {
        "vllm/model_executor/layers/fused_moe/moe_align_block_size.py:moe_align_block_size"}
    assert old.launch == new.launch and old.signatures == new.signatures
    gemm = [r.version for r in engine_releases.kernel_releases("sglang", "fp8_gemm")]
    assert "0.5.19" not in gemm and "0.5.21" in gemm
    assert "sglang/kernels/ops/quantization" in engine_releases.refused_kernel("sglang", "fp8_gemm", "0.5.19")
    assert not any(k.startswith("sglang/kernels/ops/gemm/") for k in LOADER_FUNCTIONS["sglang"]["0.5.20"])


def test_a_release_added_by_data_alone_is_planned_tuned_audited_and_installed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(data_folder(tmp_path / "data", "vllm", NEW)))
    monkeypatch.chdir(tmp_path)
    sub = build_parser()._subparsers._group_actions[0].choices
    assert "0.33.0, 0.34.0" in " ".join(sub["audit"].format_help().split())
    assert "0.33.0, 0.34.0" in " ".join(sub["install"].format_help().split())
    assert supported_releases("vllm")[-1] == "0.34.0"
    assert LOADER_FUNCTIONS["vllm"]["0.34.0"] == LOADER_FUNCTIONS["vllm"]["0.33.0"]

    out = tmp_path / "run"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--engines", "vllm", "--batch-sizes", "1", "64", "--trials", "3", "--out", str(out)]) == 0
    table = out / "vllm/fused_moe/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert sorted(json.loads(table.read_text()), key=int) == ["1", "64"]
    capsys.readouterr()

    assert main(["audit", "--engine", "vllm", "--engine-version", "0.34.0", "--triton", "3.6.0", "--model",
                 "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(table.parent)]) == 0
    audit = capsys.readouterr().out
    assert "loader rules of vllm 0.34.0" in audit and f"$VLLM_TUNED_CONFIG_FOLDER/{table.name}" in audit

    # a release the data does not hold is refused by install; this one is taken
    assert main(["install", str(out), "--engine", "vllm", "--engine-version", "0.35.0", "--dry-run"]) == 2
    assert "0.34.0" in capsys.readouterr().err
    assert main(["install", str(out), "--engine", "vllm", "--engine-version", "0.34.0", "--dry-run", "--force"]) == 0


BAD = [
    ({"version": "0.34.0", "like": "0.33.0", "kernal": {}}, "unknown field 'kernal'"),
    ({"version": 0.34, "like": "0.33.0"}, "version must be a release number"),
    ({"version": "0.34.0", "like": "0.99.0"}, "like must name a release given before it"),
    ({"version": "0.33.0", "like": "0.32.0"}, "vllm 0.33.0 is given twice"),
    ({"version": "0.34.0"}, "no 'kernels'"),
    ({"version": "0.34.0", "like": "0.33.0", "kernels": {"mla_decode": {}}}, "no kernel 'mla_decode'"),
    ({"version": "0.34.0", "like": "0.33.0", "kernels": {"fused_moe": {"refused": "x", "launch": {}}}},
     "refused must stand alone"),
    ({"version": "0.34.0", "like": "0.33.0", "kernels": {"fused_moe": {"mirrored": {
        "vllm/model_executor/layers/fused_moe/fused_moe.py:fused_experts_impl": "12345"}}}},
     "must be a hash of 16 hexadecimal digits"),
    ({"version": "0.34.0", "like": "0.33.0", "kernels": {"fused_moe": {"mirrored": {
        "vllm/model_executor/layers/fused_moe/fused_moe.py:fused_experts": "0123456789abcdef"}}}},
     "which the release it is like has not"),
    ({"version": "0.34.0", "like": "0.33.0", "loader": {"sglang/x.py:f": "0123456789abcdef"}},
     "not a function as 'vllm/....py:name'"),
]


@pytest.mark.parametrize("entry, words", BAD)
def test_release_data_that_does_not_check_is_one_line(tmp_path, monkeypatch, capsys, entry, words):
    """A bad field, an unknown one (a typo would otherwise keep the release it is like), a
    release given twice, a launch value the launcher cannot run: one line naming the file and
    the release, exit 2, from a command that needs the data."""
    folder = data_folder(tmp_path / "data", "vllm", entry)
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(folder))
    assert main(AUDIT) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and str(folder / "engines" / "vllm.yaml") in err[0], err


@pytest.mark.parametrize("name, text, words", [
    ("vllm", "releases: 3\n", "must hold one key, releases"), ("vllm", "[", "is not valid YAML"),
    ("vllm", "releases: []\nmore: 1\n", "must hold one key, releases"), ("trtllm", "releases: []\n", "no engine 'trtllm'")])
def test_a_release_file_of_the_wrong_form_is_one_line(tmp_path, monkeypatch, capsys, name, text, words):
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(data_folder(tmp_path / "data", name, text=text)))
    assert main(AUDIT) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_folder_without_release_files_adds_nothing(tmp_path, monkeypatch):
    before = supported_releases("sglang")
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(tmp_path))
    assert supported_releases("sglang") == before
