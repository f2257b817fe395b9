"""`tuner install` into FAKE site-packages folders laid out like vLLM 0.33 and SGLang 0.5.23.

Not yet here: loading the installed tables through the engines' own loader code (next step
of the install issue)."""

import json
import os
from pathlib import Path

import pytest

from tuner.cli import main

MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
GEMM = "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
SG_MOE = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
TABLE = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
               "num_warps": 4, "num_stages": 3}}


def results_folder(root: Path, triton="3.6.0", passed=True) -> Path:
    """A results folder as a run writes it (hand-made: two tables and their manifest)."""
    env = {"device": "NVIDIA H200", "triton": triton}
    files = {"vllm/fused_moe/" + MOE: {"vllm": "vllm/fused_moe/" + MOE},
             "vllm/fp8_gemm/" + GEMM: {"vllm": "vllm/fp8_gemm/" + GEMM},
             "sglang/fused_moe/triton_3_6_0/" + SG_MOE: {"sglang": "sglang/fused_moe/triton_3_6_0/" + SG_MOE}}
    tables = []
    for i, (rel, f) in enumerate(files.items()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(TABLE))
        tables.append({"kernel": "x", "problem": {"i": i}, "files": f, "environment": env, "numerics_passed": passed})
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": tables}))
    return root


def site_packages(root: Path, triton="3.6.0") -> Path:
    for pkg in ("vllm", "sglang"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / f"triton-{triton}.dist-info").mkdir()
    moe = root / "vllm/model_executor/layers/fused_moe/configs"
    moe.mkdir(parents=True)
    (moe / MOE).write_text('{"1": "shipped"}')
    sg = root / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_5_1"
    sg.mkdir(parents=True)
    (sg / "E=8,N=7168,device_name=NVIDIA_H200.json").write_text('{"1": "shipped"}')
    return root


def test_install_then_restore_vllm(tmp_path, capsys):
    res, site = results_folder(tmp_path / "res"), site_packages(tmp_path / "site")
    shipped = (site / "vllm/model_executor/layers/fused_moe/configs" / MOE).read_text()
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site)]) == 0
    moe = site / "vllm/model_executor/layers/fused_moe/configs" / MOE
    gemm = site / "vllm/model_executor/layers/quantization/utils/configs" / GEMM
    assert json.loads(moe.read_text()) == TABLE and json.loads(gemm.read_text()) == TABLE
    assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert moe.read_text() == shipped and not gemm.exists()


def test_sglang_goes_to_its_triton_folder_and_config_dir_keeps_shipped(tmp_path, capsys):
    res, site = results_folder(tmp_path / "res"), site_packages(tmp_path / "site")
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site)]) == 0
    assert (site / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0" / SG_MOE).is_file()
    cfg = tmp_path / "moe-dir"
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site),
                 "--moe-config-dir", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert f"export SGLANG_MOE_CONFIG_DIR={cfg.resolve()}" in out
    assert (cfg / "configs/triton_3_6_0" / SG_MOE).is_file()
    assert (cfg / "configs/triton_3_5_1/E=8,N=7168,device_name=NVIDIA_H200.json").is_file()   # shipped, copied


@pytest.mark.parametrize("kwargs,needle", [
    ({"triton": "3.5.1"}, "measured under Triton 3.6.0, the target runs 3.5.1"),
    ({"passed": False}, "numerics check did not pass"),
    ({"gpu": "H100"}, "measured on NVIDIA H200, the target GPU is NVIDIA H100 80GB HBM3"),
])
def test_refusals_change_nothing(tmp_path, capsys, kwargs, needle):
    res = results_folder(tmp_path / "res", passed=kwargs.get("passed", True))
    site = site_packages(tmp_path / "site", triton=kwargs.get("triton", "3.6.0"))
    before = sorted(str(p) for p in site.rglob("*"))
    gpu = ["--gpu", kwargs["gpu"]] if "gpu" in kwargs else []
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), *gpu]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "--force" in err and len(err.splitlines()) == 1
    assert sorted(str(p) for p in site.rglob("*")) == before
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), *gpu, "--force"]) == 0


def test_install_errors(tmp_path, capsys):
    site = site_packages(tmp_path / "site")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["install", str(empty), "--engine", "vllm", "--site-packages", str(site)], "no manifest.json"),
        (["install", str(results_folder(tmp_path / "r")), "--engine", "vllm", "--site-packages",
          str(tmp_path)], "no vllm package"),
        (["install", "--restore", "--engine", "sglang"], "no sglang install to restore"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2
        assert needle in capsys.readouterr().err


def test_read_only_target(tmp_path, capsys, monkeypatch):
    # Root writes through permission bits, so the check is fed a denial for the target
    # folder: the install must stop before writing anything.
    res, site = results_folder(tmp_path / "res"), site_packages(tmp_path / "site")
    target = site / "vllm/model_executor/layers/quantization"
    target.mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == target else real_access(p, mode))
    before = sorted(str(p) for p in site.rglob("*"))
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site)]) == 2
    assert f"cannot write to {target}: permission denied" in capsys.readouterr().err
    assert sorted(str(p) for p in site.rglob("*")) == before
