"""`tuner audit` on hand-made engine folders (no wheels needed): each finding class, the
M ranges per key, the rewrites, the exit status, the outputs, bad input. The rules it
applies are tested against the engines' own loaders in tests/test_loader_rules.py."""

import json
import random
import re
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.emit.audit import audit_deployment
from tuner.emit.audit_all import audit_all
from tuner.emit.audit_report import markdown, terminal_lines
from tuner.emit.audit_rules import Batches
from tuner.emit.engine_tables import FolderFiles, Installation
from tuner.plan.engines import DEFAULT_BATCH_SIZES
from tuner.plan.gpus import get_gpu
from tuner.plan.models import load_model
from tuner.plan.table_lookup import far_ranges, nearest_key, snap_ranges

REPO = Path(__file__).resolve().parents[1]
VMOE = "vllm/model_executor/layers/fused_moe/configs"
VGEMM = "vllm/model_executor/layers/quantization/utils/configs"
SMOE = "sglang/srt/layers/moe/moe_runner/triton_utils/configs"
SGEMM = "sglang/kernels/ops/gemm/configs"
ROW = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
V3_MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
S3_MOE = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"


def grid(keys=DEFAULT_BATCH_SIZES, **row):
    return {str(m): {**ROW, **row} for m in keys}


def put(site: Path, rel: str, obj) -> None:
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text(obj if isinstance(obj, str) else json.dumps(obj))


def inst(site: Path, engine: str, triton="3.6.0", version="") -> Installation:
    return Installation(engine, version, FolderFiles(site), f"installed in {site}", triton, "given")


def by_kind(report) -> dict:
    return {kind: (sev, fs) for kind, sev, fs in report.by_kind()}


@pytest.fixture
def vllm_site(tmp_path):
    s = tmp_path / "vllm-site"
    put(s, "vllm/__init__.py", "")
    bk = grid()
    for m in ("64", "128"):
        bk[m]["BLOCK_SIZE_K"] = 256
    bk["256"]["SPLIT_K"] = 2
    put(s, f"{VMOE}/{V3_MOE}", {"triton_version": "3.1.0", **bk})                           # clamped K, ignored keys
    put(s, f"{VMOE}/E=8,N=7168,device_name=NVIDIA_H200.json", grid([2048, 3072, 4096]))    # truncated
    put(s, f"{VMOE}/E=8,N=3584,device_name=NVIDIA_H200.json", grid([96, 128, 256, 512, 1024]))  # truncated, far
    put(s, f"{VMOE}/E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json", grid())            # never asked for
    put(s, f"{VMOE}/old/E=8,N=1024,device_name=NVIDIA_H200.json", grid())                    # in a subfolder
    put(s, f"{VMOE}/E=16,N=1024,device_name=NVIDIA_H200_NVL.json", grid())                   # folded away
    put(s, f"{VMOE}/E=16,N=2048,device_name=NVIDIA_H200.json", {"1": ROW, "x": ROW})        # int() raises
    put(s, f"{VMOE}/E=16,N=4096,device_name=NVIDIA_H200.json", grid(waves_per_eu=2))       # CUDA launch refuses
    put(s, f"{VMOE}/E=16,N=512,device_name=AMD_Instinct_MI300X.json", grid(waves_per_eu=2))  # fine on AMD
    put(s, f"{VGEMM}/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        grid(BLOCK_SIZE_K=256))                                                              # no clamp in GEMM
    put(s, f"{VGEMM}/N=7168,K=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        grid(BLOCK_SIZE_K=256))                                                              # one group: harmless
    return s


@pytest.fixture
def sglang_site(tmp_path):
    s = tmp_path / "sglang-site"
    put(s, "sglang/__init__.py", "")
    up = grid(BLOCK_SIZE_M=16)
    down = grid(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128)
    down["64"]["BLOCK_SIZE_M"] = 32                                  # SGLang runs 16, the up table's
    put(s, f"{SMOE}/triton_3_5_1/{S3_MOE}.json", up)
    put(s, f"{SMOE}/triton_3_5_1/{S3_MOE}_down.json", down)
    put(s, f"{SMOE}/triton_3_6_0/E=8,N=7168,device_name=NVIDIA_H200.json", grid())
    put(s, f"{SMOE}/triton_3_6_0/E=8,N=7168,device_name=NVIDIA_H200_down.json", grid())     # a copy
    put(s, f"{SMOE}/triton_3_5_1/E=8,N=7168,device_name=NVIDIA_H200.json", grid())          # shadowed by 3.6.0
    put(s, f"{SMOE}/triton_3_4_0/E=512,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128]"
           ".json", grid(BLOCK_SIZE_K=256))                                                  # wrong results
    put(s, f"{SMOE}/causal_conv1d_fwd_sm_90.json", {"useful_configs": {}})                   # at the root
    put(s, f"{SGEMM}/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
        grid([1, 2]))
    return s


def test_all_vllm_finds_every_class(vllm_site, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole: tests/test_one_width_rule.py)
    r = audit_all(inst(vllm_site, "vllm"), Batches(4096), None)
    k = by_kind(r)
    assert k["block_k_above_block"][0] == "error"        # the GEMM table (K=2048 spans 16 blocks)
    sev = {(f.severity, Path(f.table).name.split(",")[0]) for f in k["block_k_above_block"][1]}
    assert sev == {("warning", "E=256"), ("error", "N=7168")}
    assert [f.rows for f in k["block_k_above_block"][1] if f.severity == "warning"] == [[64, 128]]
    assert {Path(f.table).name for f in k["truncated"][1]} == {"E=8,N=7168,device_name=NVIDIA_H200.json",
                                                               "E=8,N=3584,device_name=NVIDIA_H200.json"}
    far = {Path(f.table).name: f.reason for f in k["far_keys"][1]}
    assert far["E=8,N=7168,device_name=NVIDIA_H200.json"] == "M=1-1023 run the entry for 2048 (up to 2048x away)"
    assert far["E=8,N=3584,device_name=NVIDIA_H200.json"].startswith("M=1-47 run the entry for 96 (up to 96x away); "
                                                                        "M=2049-4096 run the entry for 1024")
    assert len(k["unloadable"][1]) == 2 and any("dtype=bf16 is never asked for" in f.reason for f in k["unloadable"][1])
    assert [Path(f.table).name for f in k["device_name"][1]] == ["E=16,N=1024,device_name=NVIDIA_H200_NVL.json"]
    assert k["crashes_loader"][0] == "error" and "'x'" in k["crashes_loader"][1][0].reason
    bad = [f for f in k["bad_row"][1]]
    assert len(bad) == 1 and "waves_per_eu" in bad[0].reason and "N=4096" in bad[0].table   # not the AMD table
    ignored = {f.severity: f.reason for f in k["ignored_key"][1]}
    assert "triton_version 3.1.0" in ignored["info"] and "SPLIT_K" in ignored["warning"]
    assert r.exit_code == 1
    lines = terminal_lines(r)
    assert max(map(len, lines)) <= 120 and lines[-1].startswith("exit status 1")
    assert "## Findings by kind" in markdown(r)


def test_all_sglang_pairs_fallback_and_folders(sglang_site):
    r = audit_all(inst(sglang_site, "sglang", triton="3.6.0"), Batches(4096), None)
    k = by_kind(r)
    (m,) = k["down_block_m"][1]
    assert m.rows == [64] and "M=57-80 (down 64, up 64)" in m.reason
    assert [Path(f.table).name for f in k["down_copy"][1]] == ["E=8,N=7168,device_name=NVIDIA_H200_down.json"]
    fb = sorted(str(Path(f.table).relative_to(sglang_site / SMOE)) for f in k["triton_fallback"][1])
    assert fb == ["triton_3_4_0/E=512,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json",
                  f"triton_3_5_1/{S3_MOE}.json", f"triton_3_5_1/{S3_MOE}_down.json"]
    assert [f.rows for f in k["block_k_above_block"][1]] == [DEFAULT_BATCH_SIZES] and \
        k["block_k_above_block"][0] == "error"
    assert [Path(f.table).name for f in k["unloadable"][1]] == ["causal_conv1d_fwd_sm_90.json"]
    # Triton 3.5.1: the pair is exact; the E=8 up table too, its _down only in 3.6.0 (a fallback)
    r2 = audit_all(inst(sglang_site, "sglang", triton="3.5.1"), Batches(4096), None)
    assert sorted(Path(f.table).relative_to(sglang_site / SMOE).as_posix() for f in by_kind(r2)["triton_fallback"][1]) == [
        "triton_3_4_0/E=512,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json",
        "triton_3_6_0/E=8,N=7168,device_name=NVIDIA_H200_down.json"]
    # a triton_* folder that is not a version makes the fallback raise
    (sglang_site / SMOE / "triton_3_6_0_post1").mkdir()
    r3 = audit_all(inst(sglang_site, "sglang"), Batches(4096), None)
    assert any("triton_3_6_0_post1" in f.table and "ValueError" in f.reason for f in by_kind(r3)["crashes_loader"][1])


def test_deployment_rows_rewrites_and_findings(vllm_site, tmp_path):
    model, h200 = load_model("deepseek-v3"), get_gpu("H200-NVL")
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), None, {})
    moe = r.kernels[0]
    assert moe.resolved.how == "package" and moe.short == V3_MOE       # H200 NVL folds to NVIDIA_H200 for MoE
    rows = {(row["first"], row["last"]): row for row in moe.rows}
    assert [k for k, _, _ in snap_ranges([int(k) for k in DEFAULT_BATCH_SIZES], 1, 4096)] == [row["key"] for row in moe.rows]
    assert rows[(57, 80)]["key"] == 64 and rows[(57, 80)]["runs_as"]["BLOCK_SIZE_K"] == 128
    assert rows[(57, 80)]["changes"] == ["BLOCK_SIZE_K 256->128 (clamped at launch)"]
    assert rows[(193, 384)]["runs_as"]["SPLIT_K"] == 1
    kinds = {f.kind for f in moe.findings}
    assert {"block_k_above_block", "ignored_key"} <= kinds and "not_read" not in kinds
    assert any(f.kind == "ignored_key" and f.severity == "warning" and "Triton 3.6.0" in f.reason for f in moe.findings)
    gemm = [ka for ka in r.kernels if ka.kind == "fp8_gemm"]
    o_proj = next(ka for ka in gemm if (ka.problem.params["N"], ka.problem.params["K"]) == (7168, 2048))
    # vLLM does not fold H200 variants for GEMM tables: the NVIDIA_H200 one is not read on an H200 NVL
    assert not o_proj.resolved.found
    assert {f.kind for f in o_proj.findings} == {"not_read", "no_table", "device_name"}
    # expert parallelism and VLLM_USE_DEEP_GEMM: the Triton MoE does not read the table
    r_ep = audit_deployment(inst(vllm_site, "vllm"), model, get_gpu("H200"), 8, 8, "fp8_w8a8", Batches(64), None, {})
    assert any(f.kind == "not_read" and "--moe-backend triton" in f.reason for f in r_ep.kernels[0].findings)
    r_dg = audit_deployment(inst(vllm_site, "vllm"), model, get_gpu("H200"), 8, 1, "fp8_w8a8", Batches(64), None,
                            {"VLLM_USE_DEEP_GEMM": "1"})
    assert any(f.kind == "not_read" and "VLLM_USE_DEEP_GEMM=1" in f.reason for f in r_dg.kernels[0].findings)
    # VLLM_TUNED_CONFIG_FOLDER is searched first
    override = tmp_path / "tuned"
    put(override, V3_MOE, grid([1, 4096]))
    r_ov = audit_deployment(inst(vllm_site, "vllm"), model, get_gpu("H200"), 8, 1, "fp8_w8a8", Batches(4096), override, {})
    assert r_ov.kernels[0].resolved.how == "override folder" and r_ov.kernels[0].short.startswith("$VLLM_TUNED_CONFIG")
    assert any(f.kind == "far_keys" for f in r_ov.kernels[0].findings)


def test_an_override_folder_vllm_reads_nothing_from_is_a_finding(vllm_site, sglang_site, tmp_path):
    """VLLM_TUNED_CONFIG_FOLDER pointed at SGLang's results folder (its tables named with "[128, 128]",
    E=257, under configs/triton_*/): vLLM quietly read its package's tables and the audit said only
    which package file runs. Now one warning says the folder gave nothing and whose tables it holds;
    a folder holding the deployment's table gives none, and SGLang (which reads the folder in place of
    its package) keeps its own findings."""
    model, h200 = load_model("deepseek-v3"), get_gpu("H200")
    wrong = tmp_path / "sglang-results"
    put(wrong, f"configs/triton_3_6_0/{S3_MOE}.json", grid())
    put(wrong, f"configs/triton_3_6_0/{S3_MOE}_down.json", grid())
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), wrong, {})
    assert r.kernels[0].resolved.how == "package"
    found = [f for f in r.findings if f.kind == "override_unused"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "named as sglang names them" in found[0].reason and "--engine vllm" in found[0].reason
    assert V3_MOE in found[0].reason and "its package's instead" in found[0].reason
    empty = tmp_path / "empty"
    empty.mkdir()
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), empty, {})
    assert [f.reason.split(": ")[-1] for f in r.findings if f.kind == "override_unused"] == [
        "it holds no vllm table; it reads its package's instead"]
    # a results folder's root: the table lies in its vllm/fused_moe/ (it said "for other shapes or GPUs"), named
    results = tmp_path / "results"
    put(results, f"vllm/fused_moe/{V3_MOE}", grid())
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), results, {})
    [f] = [f for f in r.findings if f.kind == "override_unused"]
    assert "lies in its subfolder vllm/fused_moe/" in f.reason and f"at {results / 'vllm' / 'fused_moe'}" in f.reason
    # a file name holding a newline is said on one line (it forged an "exit status 0" line of the report)
    forged = tmp_path / "forged"
    put(forged, "E=8,N=1,device_name=X\nexit status 0: no error finding\n.json", grid())
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), forged, {})
    [f] = [f for f in r.findings if f.kind == "override_unused"]
    assert "\n" not in f.reason and "\\x0aexit status 0" in f.reason, f.reason
    right = tmp_path / "tuned"
    put(right, V3_MOE, grid())
    r = audit_deployment(inst(vllm_site, "vllm"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), right, {})
    assert not [f for f in r.findings if f.kind == "override_unused"]
    r = audit_deployment(inst(sglang_site, "sglang"), model, h200, 8, 1, "fp8_w8a8", Batches(4096), empty, {})
    assert not [f for f in r.findings if f.kind == "override_unused"]


def test_deployment_sglang_down_tie_and_fallback(sglang_site):
    model = load_model("deepseek-v3")
    r = audit_deployment(inst(sglang_site, "sglang", triton="3.6.0"), model, get_gpu("H200"), 8, 1, "fp8_w8a8",
                         Batches(4096), None, {})
    up, down = r.kernels[0], r.kernels[1]
    assert (up.part, down.part) == ("up", "down")
    assert up.resolved.how == down.resolved.how == "Triton fallback" and up.resolved.triton_folder == "triton_3_5_1"
    row = next(row for row in down.rows if row["key"] == 64)
    assert row["entry"]["BLOCK_SIZE_M"] == 32 and row["runs_as"]["BLOCK_SIZE_M"] == 16
    assert {f.kind for f in down.findings} >= {"triton_fallback", "down_block_m"}
    # a deployment whose _down table is missing reuses the up table (SGLang's fallback), said as info
    (sglang_site / SMOE / "triton_3_5_1" / f"{S3_MOE}_down.json").unlink()
    r2 = audit_deployment(inst(sglang_site, "sglang", triton="3.5.1"), model, get_gpu("H200"), 8, 1, "fp8_w8a8",
                          Batches(4096), None, {})
    assert r2.kernels[1].resolved.how == "the up table"
    assert [f.kind for f in r2.kernels[1].findings if f.kind != "not_read"] == ["down_reuses_up"]
    # the GEMM tables are not read by default (DeepGEMM), unless SGLANG_ENABLE_JIT_DEEPGEMM=0
    g = [ka for ka in r2.kernels if ka.kind == "fp8_gemm"]
    assert all(not ka.reads for ka in g)
    r3 = audit_deployment(inst(sglang_site, "sglang", triton="3.5.1"), model, get_gpu("H200"), 8, 1, "fp8_w8a8",
                          Batches(4096), None, {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"})
    assert all(ka.reads for ka in r3.kernels)


def test_snap_ranges_are_the_nearest_key_rule():
    """The M ranges per key equal min(keys, key=|k - M|) at every M, keys in any file order
    (ties to the earlier key), and the far parts are exactly the Ms more than 2x away."""
    rng = random.Random(7)
    for _ in range(200):
        keys = rng.sample(range(1, 300), rng.randint(1, 8))
        hi = rng.randint(1, 700)
        ranges = snap_ranges(keys, 1, hi)
        per_m = {M: k for k, a, b in ranges for M in range(a, b + 1)}
        assert per_m == {M: nearest_key(keys, M) for M in range(1, hi + 1)}, keys
        far = {M for k, a, b, _ in far_ranges(ranges) for M in range(a, b + 1)}
        assert far == {M for M, k in per_m.items() if k > 2 * M or M > 2 * k}, keys


def test_triton_is_a_version_and_x_y_is_x_y_0(sglang_site, capsys):
    """--triton took any text: 'banana' warned and exited 0, and '3.6' was not SGLang's 3.6.0
    (its loader names the folder from triton.__version__: triton_3_6_0/), a false fallback."""
    args = ["audit", "--engine", "sglang", "--site-packages", str(sglang_site), "--model", "deepseek-v3", "--gpu",
            "H200", "--tp", "8", "--max-batch", "64", "--triton"]
    for bad in ("banana", "3", "3.6rc1", "3.6.0.1"):
        assert main([*args, bad]) == 2
        said, err = capsys.readouterr()
        assert err.splitlines() == [f"tuner: error: argument --triton: not a Triton version: {bad!r} (give X.Y.Z as "
                                    "triton.__version__ says it, e.g. 3.6.0) (see `tuner audit --help`)"] and not said
    assert main([*args, "3.6.0"]) == 0
    full = capsys.readouterr().out
    assert main([*args, "3.6"]) == 0
    assert capsys.readouterr().out == full and "Triton 3.6.0 (given)" in full and "triton_3_6/" not in full


def test_an_engine_version_without_rules_or_package_is_refused_as_install_refuses_it(tmp_path, monkeypatch, capsys):
    """--engine-version alone (no package: override folders only) picks the loader rules: one tuner
    does not know was audited with 0.33.0's while its note said 0.34.0's, exit 0, where `tuner
    install --engine-version 0.34.0` refuses it."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    from tuner.plan.engines import supported_releases
    for version in ("0.34.0", "0.33"):
        assert main(["audit", "--engine", "vllm", "--engine-version", version, "--triton", "3.6.0", "--model",
                     "deepseek-v3", "--gpu", "H200", "--tp", "8"]) == 2
        said, err = capsys.readouterr()
        assert err.splitlines() == [f"tuner: error: --engine-version {version}: tuner knows the loader rules of vllm "
                                    f"{', '.join(supported_releases('vllm'))} only"] and not said
    assert main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                 "deepseek-v3", "--gpu", "H200", "--tp", "8"]) == 0
    said = capsys.readouterr().out
    assert "loader rules of vllm 0.33.0" in said.splitlines()[0] and "with the loader rules of vllm 0.33.0" in said


def test_a_far_keys_ratio_is_never_printed_as_2x_or_less():
    """Far keys are more than 2x away: M=9-10 on the entry for 4 is 2.5x, printed '2x' ({:.0f})."""
    from tuner.emit.audit_rules import Batches, key_findings
    [far] = [f.reason for f in key_findings([1, 4, 16], "t", Batches(10)) if f.kind == "far_keys"]
    assert far == "M=9-10 run the entry for 4 (up to 2.5x away)", far
    [far] = [f.reason for f in key_findings([16], "t", Batches(40, (7, 33, 40))) if f.kind == "far_keys"]
    assert far == "M=7-40 run the entry for 16 (up to 2.5x away)", far


def test_cli_exit_status_outputs_and_bad_input(vllm_site, sglang_site, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole)
    out = tmp_path / "audit-out"
    args = ["audit", "--engine", "sglang", "--site-packages", str(sglang_site), "--triton", "3.6.0"]
    assert main([*args, "--all", "--out", str(out)]) == 1                 # SGLang's K=256 rows: error
    printed = capsys.readouterr().out
    assert "exit status 1" in printed and max(map(len, printed.splitlines())) <= 120
    monkeypatch.delenv("COLUMNS")               # piped again: an error is one line
    data = json.loads((out / "audit.json").read_text())
    assert data["exit_status"] == 1 and data["by_kind"]["block_k_above_block"]["severity"] == "error"
    assert (out / "audit.md").read_text().startswith("# tuner audit --all: sglang")
    assert not list(out.glob(".*.tmp"))
    assert main([*args, "--all", "--out", str(out)]) == 1                 # its own audit.json and audit.md: replaced
    capsys.readouterr()
    # a deployment without an error finding exits 0
    assert main(["audit", "--engine", "sglang", "--site-packages", str(sglang_site), "--triton", "3.6.0",
                 "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--max-batch", "64"]) == 0
    assert "fused_moe up E=257,N=256,K=7168" in capsys.readouterr().out
    bad = [
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site)],                       # neither
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--all", "--model", "deepseek-v3"],
        ["audit", "--engine", "vllm", "--site-packages", str(tmp_path), "--all"],               # no package
        ["audit", "--engine", "vllm", "--engine-source", str(tmp_path / "nope.whl"), "--all"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--model", "deepseek-v3", "--gpu", "A100"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--model", "nope", "--gpu", "H200"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--model", "deepseek-v3", "--gpu", "H200",
         "--tp", "3"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--all", "--out", str(vllm_site / "vllm" /
                                                                                                "__init__.py")],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--all", "--max-batch", "0"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--all", "--engine-version", "9.9.9"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--model", "mixtral-8x7b", "--gpu", "H200",
         "--dtype", "fp8_w8a8", "--tp", "2", "--ep", "4"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--engine-source", str(vllm_site), "--all"],
        ["audit", "--engine", "vllm", "--site-packages", str(vllm_site), "--all", "--numerics"],
    ]
    (vllm_site / "vllm-0.33.0.dist-info").mkdir()
    before = sorted(p for p in tmp_path.rglob("*"))
    for argv in bad:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("tuner: error:") and len(err.splitlines()) == 1, (argv, err)
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_our_tables_pass_the_audit(tmp_path, capsys):
    """A run over the engines' whole batch-size grid (replayed from a SYNTHETIC landscape),
    installed into an empty SGLang package: `tuner audit --all` finds nothing in it. Enough
    trials that the `_down` table is tuned apart from the up table (with 2, and no wheels whose
    shipped tables are raced, both kept the default config everywhere, and a `_down` that is
    the up table's copy is rightly not written: results.copied_tied_tables)."""
    land, run, site = tmp_path / "m.jsonl.gz", tmp_path / "run", tmp_path / "site"
    common = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--engines", "sglang"]
    assert main(["landscape", "synth", "--kernel", "moe", *common, "--out", str(land)]) == 0
    assert main(["moe", *common, "--replay", str(land), "--trials", "6", "--out", str(run), "--quiet"]) == 0
    written = sorted(Path(f).name for t in json.loads((run / "manifest.json").read_text())["tables"]
                     for f in t["files"].values())
    assert len(written) == 2 and written[1].endswith("_down.json"), written
    put(site, "sglang/__init__.py", "")
    assert main(["install", str(run), "--engine", "sglang", "--site-packages", str(site), "--force"]) == 0
    out = capsys.readouterr().out
    assert "audit: the 2 tables pass" in out
    triton = next((site / SMOE).iterdir()).name.removeprefix("triton_").replace("_", ".")
    assert main(["audit", "--all", "--engine", "sglang", "--site-packages", str(site), "--triton", triton,
                 "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert data["stats"]["tables"] == 2 and data["counts"]["error"] == data["counts"]["warning"] == 0
    assert set(data["by_kind"]) == {"loader_changed"}      # info: this fake package has no loader source to compare


def test_emitter_writes_no_down_copy(tmp_path):
    """A `_down` table that came out the same as the up table at every M is not written (SGLang
    reuses the up table without it; the audit flags such a file as an untuned copy); one that
    differs is."""
    from types import SimpleNamespace

    from tuner.pipeline.emission import _emit
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.models import moe_problems
    from tuner.search.runner import StudyResult

    kernel = get_kernel("fused_moe", "sglang", load_code=False)
    up, down = moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", engines=["sglang"])
    cfg = {**ROW, "USE_TMA": 0}

    def results(problem, **change):
        return [StudyResult(problem, M, {**cfg, **change}, 1.0, 0.01, cfg, 1.0, 3, "budget") for M in (1, 64)]

    for change, written in (({}, False), ({"BLOCK_SIZE_N": 128}, True)):
        out = tmp_path / f"run-{written}"
        opts = SimpleNamespace(out_dir=out, kernel=kernel, gpu=get_gpu("H200"), engines=["sglang"], batch_sizes=[1, 64],
                               traffic=None)
        # the group's manifest entries come back (collect writes them once for every group)
        entries = _emit(opts, [up, down], [results(up), results(down, **change)], {"triton": "3.6.0"}, {})
        files = sorted(p.name for p in out.rglob("*.json"))
        assert files == [f"{S3_MOE}.json"] + ([f"{S3_MOE}_down.json"] if written else [])
        entry = next(t for t in entries if t["problem"]["part"] == "down")
        assert bool(entry["files"]) == written and ("not_written" in entry) != written
    # run again into the folder that has a `_down` table, and it comes out the same as the up table:
    # the earlier run's `_down` file goes (SGLang would read it beside the new up table)
    out = tmp_path / "run-True"
    assert [p.name for p in out.rglob("*_down.json")] == [f"{S3_MOE}_down.json"]
    opts = SimpleNamespace(out_dir=out, kernel=kernel, gpu=get_gpu("H200"), engines=["sglang"], batch_sizes=[1, 64],
                           traffic=None)
    _emit(opts, [up, down], [results(up), results(down)], {"triton": "3.6.0"}, {})
    assert sorted(p.name for p in out.rglob("*.json")) == [f"{S3_MOE}.json"]


def test_traffic_weighs_each_tables_keys(tmp_path, capsys):
    """--traffic: per key of each table read, the M it serves and its share of the passes; a
    warning where a key serves much traffic far from its own M (a sparse table's key 96
    running decode at M=1-8), none for a table with keys where the traffic is."""
    traffic = tmp_path / "decode.csv"
    traffic.write_text("M,weight\n1,5\n2,5\n4,10\n8,30\n64,40\n512,10\n")
    site = tmp_path / "site"
    put(site, "vllm/__init__.py", "")
    args = ["audit", "--engine", "vllm", "--site-packages", str(site), "--triton", "3.6.0", "--model",
            "deepseek-v3", "--gpu", "H200", "--tp", "8", "--max-batch", "1024", "--traffic", str(traffic)]
    sparse = tmp_path / "sparse"
    put(sparse, V3_MOE, grid([96, 128, 256, 512, 1024]))
    assert main([*args, "--moe-config-dir", str(sparse), "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    moe = json.loads((tmp_path / "a" / "audit.json").read_text())["kernels"][0]
    shares = {c["key"]: c["share"] for c in moe["traffic"]}
    assert shares[96] == pytest.approx(0.9) and shares[512] == pytest.approx(0.1) and shares[1024] == 0
    far = [f for f in moe["findings"] if f["kind"] == "traffic_far"]
    assert len(far) == 1 and far[0]["rows"] == [96] and "farthest 1 (96.00x)" in far[0]["reason"]
    assert "traffic: key 96 serves M=1-64, 90.0% of the passes" in printed
    assert "| 96 | M=1-64 | 90.00% |" in (tmp_path / "a" / "audit.md").read_text()
    dense = tmp_path / "dense"
    put(dense, V3_MOE, grid())
    assert main([*args, "--moe-config-dir", str(dense), "--out", str(tmp_path / "b")]) == 0
    moe = json.loads((tmp_path / "b" / "audit.json").read_text())["kernels"][0]
    assert not [f for f in moe["findings"] if f["kind"] == "traffic_far"]
    assert sum(c["share"] for c in moe["traffic"]) == pytest.approx(1.0)
    capsys.readouterr()
    traffic.write_text("M,weight\n0,1\n")
    assert main([*args, "--moe-config-dir", str(dense)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "decode.csv" in err


def test_a_deployment_audit_without_tp_audits_the_serving_tp(sglang_site, capsys):
    """No --tp: the deployment that serves the model (TP8 for DeepSeek-V3 on H200s), said first;
    an explicit --tp that cannot hold the weights is refused in one line."""
    args = ["audit", "--engine", "sglang", "--site-packages", str(sglang_site), "--triton", "3.6.0",
            "--model", "deepseek-v3", "--gpu", "H200", "--max-batch", "64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("tp=8: the smallest that holds deepseek-v3's") and "fused_moe up E=257,N=256,K=7168" in out
    assert main([*args, "--tp", "1"]) == 2
    out, err = capsys.readouterr()
    assert "--tp 1 cannot serve deepseek-v3" in err and err.count("\n") == 1 and out == ""


def test_tables_no_gpu_timed_fail_the_audit(tmp_path, capsys):
    """A SYNTHETIC run's tables installed with --force passed `tuner audit` (exit 0, "0 error") with one line at
    the end saying SYNTHETIC, where the audit is a deployment's gate (a new user's finding): each table read
    whose rows no GPU timed is now a not_measured finding, once per file: an error where tuner installed it, a
    warning in a results folder audited as it is (exit 0: the README's try audits its synthetic run so); a GPU
    run's tables give none."""
    run, sgl = tmp_path / "run", tmp_path / "sgl"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--batch-sizes", "1", "--trials", "4", "--quiet", "--out", str(run)]) == 0
    assert main(["install", str(run), "--engine", "sglang", "--engine-version", "0.5.23", "--moe-config-dir", str(sgl),
                 "--force"]) == 0
    capsys.readouterr()
    audit = ["audit", "--engine", "sglang", "--engine-version", "0.5.23", "--triton", "3.6.0", "--model", "deepseek-v3",
             "--gpu", "H200", "--tp", "8", "--moe-config-dir"]

    def said_of(folder, code):
        assert main([*audit, str(folder)]) == code, folder
        out = capsys.readouterr().out
        return [ln.split(":")[0].strip() for ln in out.splitlines()
                if ": not_measured: its rows were chosen on SYNTHETIC times, never measured on a GPU" in ln]
    for folder, code, said in ((sgl, 1, "error"), (run / "sglang" / "fused_moe", 0, "warning"),
                               (REPO / "tuned" / "NVIDIA_H200" / "sglang" / "fused_moe", 0, None)):
        assert said_of(folder, code) == ([said] if said else []), folder
    # an attacker's pass: the same folders through a link (the audit of a container's path) said nothing; a newer
    # record of other bytes (forged, or outdated) hid the install's; a table edited since its install kept the
    # install's SYNTHETIC. Records apply to the bytes they wrote, whichever path names the file.
    (tmp_path / "link").symlink_to(sgl)
    (tmp_path / "runlink").symlink_to(run / "sglang" / "fused_moe")
    assert said_of(tmp_path / "link", 1) == ["error"] and said_of(tmp_path / "runlink", 0) == ["warning"]
    import tuner.emit.install as install
    [first] = [p for p in install.BACKUP_ROOT.glob("sglang-*") if (p / "record.json").is_file()]
    forged = first.with_name(first.name.replace("-00000001-", "-00000002-"))
    forged.mkdir()
    record = json.loads((first / "record.json").read_text())
    for e in record["files"]:
        e["sha256"], e["timed_on"] = "0" * 64, {**e["timed_on"], "not_a_gpu": ""}
    (forged / "record.json").write_text(json.dumps(record))
    assert said_of(sgl, 1) == ["error"]
    [table] = [p for p in sgl.rglob("*.json") if not p.name.endswith("_down.json")][:1]
    table.write_text(table.read_text().replace("{", "{ ", 1))       # the same rows, other bytes: not the install's
    assert said_of(sgl, 0) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_empty_table_is_a_finding_not_an_internal_error(engine, vllm_site, sglang_site, tmp_path):
    """A table holding `{}` was an internal error (IndexError in snap_ranges) where both engines' loaders return
    no row and the launch takes its default config (`if configs:` in try_get_optimal_moe_config); now a no_table
    warning saying so, its rows the default (an attacker's pass)."""
    model, h200 = load_model("deepseek-v3"), get_gpu("H200")
    folder = tmp_path / "empty"
    if engine == "vllm":
        put(folder, V3_MOE, {})
        site = vllm_site
    else:
        put(folder, f"configs/triton_3_6_0/{S3_MOE}.json", {})
        site = sglang_site
    r = audit_deployment(inst(site, engine), model, h200, 8, 1, "fp8_w8a8", Batches(4096), folder, {})
    moe = r.kernels[0]
    said = [f.reason for f in moe.findings if f.kind == "no_table"]
    assert moe.resolved.found and len(said) == 1 and said[0].startswith(engine), said
    assert said[0].endswith("reads no row from this empty table: its default config runs at every M"), said
    assert [row["runs_as"] for row in moe.rows] == ["the engine's default config"]


def test_a_broken_manifest_beside_an_audited_table_is_said_not_an_error_after_the_report(tmp_path, capsys):
    """The audit printed its whole report and 'exit status 0', then 'tuner: error: ... is not a tuner manifest',
    exit 2, and wrote no audit.json (an attacker's pass, a manifest whose model is a list): the measurement line
    now says the manifest cannot be read, and the report's exit status and files stand."""
    run = tmp_path / "run"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--batch-sizes", "1", "--trials", "4", "--quiet", "--out", str(run)]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "model": ["a"]}))
    capsys.readouterr()
    out = tmp_path / "audit"
    code = main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                 "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(run / "vllm" / "fused_moe"),
                 "--out", str(out)])
    printed, err = capsys.readouterr()
    assert code == int(re.search(r"^exit status (\d)", printed, re.M).group(1)) and "error" not in err, err
    assert "not installed: its manifest cannot be read" in printed and (out / "audit.json").is_file()
