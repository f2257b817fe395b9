"""K where the name has none: a fused-MoE table file is named by E and N (and dtype, block),
not by K, so models of another hidden size read it all the same (vllm#54668). Our manifest
records the K each table was tuned for; `tuner audit` says when a deployment reads one of ours
tuned for another K (an error), and `tuner install` refuses to put one there unless --force,
recording the K of what it installs so that a later audit and install know it."""

import json
import shutil
from pathlib import Path

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
TABLE = {str(m): {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                  "num_stages": 3} for m in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072,
                                             4096)}
DSV3 = {"E": 256, "N": 256, "K": 7168, "topk": 8, "dtype": "fp8_w8a8", "block_shape": [128, 128], "part": "op",
        "routing": "uniform"}


def committed_state(root: Path, K: int) -> Path:
    """tuned/NVIDIA_H200 (both engines' DeepSeek-V3 TP8 tables) with its manifest saying K."""
    shutil.copytree(REPO / "tuned" / "NVIDIA_H200", root, ignore=shutil.ignore_patterns("*.journal"))
    manifest = json.loads((root / "manifest.json").read_text())
    for t in manifest["tables"]:
        t["problem"]["K"] = K
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def audit(tmp_path: Path, name: str, *args) -> tuple[int, dict]:
    out = tmp_path / name
    code = main(["audit", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--triton", "3.6.0",
                 "--batch-sizes", "1", "64", *args, "--out", str(out)])
    return code, json.loads((out / "audit.json").read_text())


def k_findings(report: dict) -> list[dict]:
    return [f for k in report["kernels"] for f in k["findings"] if f["kind"] == "k_mismatch"]


def test_the_audit_errs_on_a_table_of_ours_tuned_for_another_k(tmp_path, capsys):
    """DeepSeek-V3 (K=7168) reading our table through the override folder: tuned for K=6144 by
    its manifest, an error for vLLM's table and for SGLang's up and _down; tuned for 7168, none."""
    other = committed_state(tmp_path / "other", 6144)
    code, report = audit(tmp_path, "vllm", "--engine", "vllm", "--engine-version", "0.33.0",
                         "--moe-config-dir", str(other / "vllm" / "fused_moe"))
    [finding] = k_findings(report)
    assert code == 1 and finding["severity"] == "error"
    assert "tuned for K=6144 (deepseek-v3), this layer has K=7168" in finding["reason"]
    assert finding["table"].endswith(MOE)
    code, report = audit(tmp_path, "sglang", "--engine", "sglang", "--engine-version", "0.5.23",
                         "--moe-config-dir", str(other / "sglang" / "fused_moe"))
    assert code == 1 and len(k_findings(report)) == 2                        # the up table and its _down
    assert "k_mismatch" in capsys.readouterr().out
    same = committed_state(tmp_path / "same", 7168)
    for engine, version in (("vllm", "0.33.0"), ("sglang", "0.5.23")):
        _, report = audit(tmp_path, f"{engine}-same", "--engine", engine, "--engine-version", version,
                          "--moe-config-dir", str(same / engine / "fused_moe"))
        assert not k_findings(report)


def results(root: Path, K: int, model: str) -> Path:
    """A results folder with one vLLM MoE table of the engines' whole grid, tuned for K."""
    (root / "vllm" / "fused_moe").mkdir(parents=True)
    (root / "vllm" / "fused_moe" / MOE).write_text(json.dumps(TABLE))
    entry = {"kernel": "fused_moe", "problem": {**DSV3, "K": K}, "files": {"vllm": f"vllm/fused_moe/{MOE}"},
             "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "numerics_passed": True}
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "model": model, "tables": [entry]}))
    return root


def site(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm-0.33.0.dist-info").mkdir()
    (root / "triton-3.6.0.dist-info").mkdir()
    (root / "vllm/model_executor/layers/fused_moe/configs").mkdir(parents=True)
    return root


def test_install_refuses_a_table_of_another_k_and_records_the_k_it_installs(tmp_path, capsys):
    """--model names the model the engine serves: a table tuned for another K is refused (nothing
    written) unless --force. What install writes is recorded with its K: replacing it with a
    table of another K is refused too, and the audit of the engine says which K it holds."""
    packages = site(tmp_path / "site")
    dest = packages / "vllm/model_executor/layers/fused_moe/configs" / MOE
    glm = results(tmp_path / "glm", 6144, "glm-like")
    dsv3 = results(tmp_path / "dsv3", 7168, "deepseek-v3")
    install = ["install", "--engine", "vllm", "--site-packages", str(packages)]
    assert main([*install, str(glm), "--model", "deepseek-v3"]) == 2
    err = capsys.readouterr().err
    assert "it was tuned for K=6144, but deepseek-v3's layers have K=7168" in err and "--force" in err
    assert not dest.exists()
    assert main([*install, str(dsv3), "--model", "deepseek-v3"]) == 0 and dest.is_file()
    [record] = (tmp_path / "backups").glob("vllm-*/record.json")
    [entry] = json.loads(record.read_text())["files"]
    assert entry["problem"]["K"] == 7168 and entry["model"] == "deepseek-v3"
    capsys.readouterr()
    assert main([*install, str(glm)]) == 2                               # over the K=7168 table tuner put there
    err = capsys.readouterr().err
    assert f"it would replace {MOE}, which tuner installed for K=7168 (deepseek-v3)" in err
    assert json.loads(dest.read_text()) == TABLE
    assert main([*install, str(glm), "--force"]) == 0
    code, report = audit(tmp_path, "after", "--engine", "vllm", "--site-packages", str(packages))
    [finding] = k_findings(report)
    assert code == 1 and "tuned for K=6144 (glm-like)" in finding["reason"]
