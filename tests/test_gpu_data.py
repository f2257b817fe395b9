"""GPUs as data (configs/gpus.yaml, and a `gpus.yaml` in a folder TUNER_CONFIG_DIRS names): a GPU
added by a file alone is planned, tuned on a SYNTHETIC replay and audited, and `--gpu` lists it;
a file that does not check out is one line and exit 2 from the command that needs it."""

import json
from pathlib import Path

import pytest
import yaml

from tuner.cli import build_parser, main
from tuner.paths import CONFIGS_DIR
from tuner.plan.gpus import GPUS, get_gpu
from tuner.reading import read_yaml_file

NEW = {"key": "H20-3e", "cuda_name": "NVIDIA H20-3e", "aliases": ["H20 3e"], "sm_count": 78,
       "max_smem_per_block": 232448, "l2_mib": 60, "hbm_tb_s": 4.8, "fp8_tflops": 296, "memory_gb": 141}


def data_folder(root: Path, *gpus: dict, text: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "gpus.yaml").write_text(text if text is not None else yaml.safe_dump({"gpus": list(gpus)}))
    return root


def test_the_repository_gpus_are_its_data():
    """Every GPU of configs/gpus.yaml, and nothing else, with its fields as written there."""
    entries = read_yaml_file(CONFIGS_DIR / "gpus.yaml")["gpus"]
    assert list(GPUS) == [e["key"] for e in entries]
    for e in entries:
        spec = GPUS[e["key"]]
        assert (spec.cuda_name, spec.sm_count, spec.l2_bytes, spec.memory_gb) == (
            e["cuda_name"], e["sm_count"], e["l2_mib"] << 20, e["memory_gb"])
        for name in (e["key"], e["cuda_name"], *e.get("aliases", ())):
            assert get_gpu(name.lower().replace(" ", "-")) is spec


def test_a_gpu_added_by_data_alone_is_planned_tuned_and_audited(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(data_folder(tmp_path / "data", NEW)))
    monkeypatch.chdir(tmp_path)
    assert "H20-3e" in build_parser()._subparsers._group_actions[0].choices["moe"].format_help()
    assert get_gpu("h20 3E").key == "H20-3e"

    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H20-3e", "--dtype", "fp8_w8a8", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "H20-3e" in plan and "device_name=NVIDIA_H20-3e" in plan

    out = tmp_path / "run"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H20-3e", "--dtype", "fp8_w8a8", "--synthetic",
                 "--engines", "vllm", "--batch-sizes", "1", "64", "--trials", "3", "--out", str(out)]) == 0
    table = out / "vllm/fused_moe/E=256,N=256,device_name=NVIDIA_H20-3e,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert sorted(json.loads(table.read_text()), key=int) == ["1", "64"]
    capsys.readouterr()

    assert main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                 "deepseek-v3", "--gpu", "H20-3e", "--tp", "8", "--moe-config-dir", str(table.parent)]) == 0
    audit = capsys.readouterr().out
    assert "on NVIDIA H20-3e" in audit and f"$VLLM_TUNED_CONFIG_FOLDER/{table.name}" in audit


@pytest.mark.parametrize("change, words", [
    ({"sm_count": -3}, "sm_count must be a whole number"),
    ({"hbm_tb_s": float("nan")}, "hbm_tb_s must be TB/s"),
    ({"sm_count": True}, "sm_count must be"),
    ({"key": "H 20\x1b[2J"}, "key must be a name"),
    ({"smem": 1}, "unknown field 'smem'"),
    ({"cuda_name": "NVIDIA H200"}, "takes the name 'h200' of H200"),
    ({"aliases": ["h100 sxm"]}, "takes the name 'h100sxm' of H100"),
    ({"aliases": "H20x"}, "aliases must be a list"),
])
def test_gpu_data_that_does_not_check_is_one_line(tmp_path, monkeypatch, capsys, change, words):
    """A bad field, an unknown one (a typo would otherwise be a default), or a name another GPU has
    (a file must not redefine a GPU silently): one line naming the file and the field, exit 2."""
    folder = data_folder(tmp_path / "data", NEW | change)
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(folder))
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and str(folder / "gpus.yaml") in err[0], err


@pytest.mark.parametrize("text, words", [("gpus: 3\n", "must hold one key, gpus"), ("[", "is not valid YAML"),
                                         ("gpus: []\nmore: 1\n", "must hold one key, gpus")])
def test_a_gpu_file_of_the_wrong_form_is_one_line(tmp_path, monkeypatch, capsys, text, words):
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(data_folder(tmp_path / "data", text=text)))
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_folder_without_a_gpu_file_adds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CONFIG_DIRS", str(tmp_path))
    assert list(GPUS) == [e["key"] for e in read_yaml_file(CONFIGS_DIR / "gpus.yaml")["gpus"]]
