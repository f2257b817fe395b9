"""`tuner audit` on the tables shipped inside the engines' released wheels.

The counts each test expects come from its own reading of the zip (a few direct lines
per class, not tuner's code); `--numerics` runs SGLang's and vLLM's own kernels from the
wheels in Triton's interpreter on the small model."""

import collections
import json
import re
import zipfile

import numpy as np
import pytest
from engine_loaders import VERSIONS, wheel, wheel_dir
from test_engine_kernels import SGLANG_SCALAR_SCALE

from tuner.cli import main
from tuner.emit.audit_all import audit_all
from tuner.emit.audit_rules import Batches
from tuner.emit.engine_tables import locate_installation

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
FOLDERS = {"vllm": {"vllm/model_executor/layers/fused_moe/configs/": "moe",
                    "vllm/model_executor/layers/quantization/utils/configs/": "gemm"},
           "sglang": {"sglang/srt/layers/moe/moe_runner/triton_utils/configs/": "moe",
                      "sglang/kernels/ops/gemm/configs/": "gemm"}}
# dtype= parts each loader asks for (read from vLLM's _get_config_dtype_str and SGLang's
# get_config_dtype_str), and the names other loaders of the same folder read.
ASKED = {("vllm", "moe"): {"fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32"},
         ("sglang", "moe"): {"fp8_w8a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "float32"},
         ("vllm", "gemm"): {"fp8_w8a8"}, ("sglang", "gemm"): {"fp8_w8a8"}}
OTHER = {("vllm", "moe"): (",backend=flydsl.json",), ("vllm", "gemm"): (),
         ("sglang", "moe"): (), ("sglang", "gemm"): ("dtype=int8_w8a8,block_shape", "dtype=fp8_w8a8_channelwise")}
ACCEPTED = {("vllm", "moe"): {"SPLIT_K"}, ("vllm", "gemm"): set(), ("sglang", "moe"): {"USE_TMA"},
            ("sglang", "gemm"): {"SWAP_AB", "SPLIT_K"}}
MATMUL = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages", "num_ctas"}


def far_and_nearest(keys, hi=4096):
    """(nearest key per M=1..hi, whether any M is more than 2x from its key), with numpy."""
    k = np.array(keys)
    m = np.arange(1, hi + 1)
    nearest = k[np.argmin(np.abs(m[:, None] - k[None, :]), axis=1)]      # argmin: first key in file order
    return nearest, bool(((nearest > 2 * m) | (m > 2 * nearest)).any())


def independent_counts(engine, version, triton="3.6.0"):
    """Each finding class counted straight from the wheel's files."""
    c = collections.Counter()
    tables = {}
    with zipfile.ZipFile(wheel(engine, version)) as z:
        for name in z.namelist():
            folder = next((f for f in FOLDERS[engine] if name.startswith(f)), None)
            if folder is None or not name.endswith(".json"):
                continue
            kind = FOLDERS[engine][folder]
            sub, _, fname = name[len(folder):].rpartition("/")
            if any(o in fname for o in OTHER[(engine, kind)]):
                continue
            if (engine, kind) == ("sglang", "moe") and not sub:
                c["unloadable"] += 1                            # at the configs/ root
                continue
            dtype = [p[len("dtype="):] for p in fname.removesuffix(".json").removesuffix("_down").split(",")
                     if p.startswith("dtype=")]
            if dtype and dtype[0] not in ASKED[(engine, kind)]:
                c["unloadable"] += 1
                continue
            t = json.loads(z.read(name))
            if "triton_version" in t:
                c["ignored triton_version"] += 1
            rows = {int(k): v for k, v in t.items() if k != "triton_version"}
            tables[name] = rows
            block = re.search(r"block_shape=\[(\d+), ?(\d+)\]", fname)
            gemm_k = re.match(r"N=\d+,K=(\d+),", fname)
            if block and not (gemm_k and int(gemm_k.group(1)) <= int(block.group(2))):
                wide = sum(v["BLOCK_SIZE_K"] > int(block.group(2)) for v in rows.values())
                c["K>block rows " + ("warning" if (engine, kind) == ("vllm", "moe") else "error")] += wide
            if fname.split("device_name=")[1].startswith("NVIDIA"):
                c["refused keys"] += any(set(v) - MATMUL - ACCEPTED[(engine, kind)] for v in rows.values())
            ks = sorted(rows)
            if set(ks) <= set(GRID) and len(ks) < 9 and GRID[GRID.index(ks[0]):GRID.index(ks[0]) + len(ks)] == ks:
                c["truncated"] += 1
            c["far"] += far_and_nearest(list(rows))[1]
    if engine == "sglang":
        by_folder = collections.defaultdict(set)
        for name, rows in tables.items():
            if "/triton_" in name:
                folder, fname = name.rsplit("/", 1)
                by_folder[fname].add(folder.rsplit("/", 1)[1])
                if fname.endswith("_down.json") and (up := name[: -len("_down.json")] + ".json") in tables:
                    if tables[up] == rows:
                        c["down copies"] += 1
                        continue
                    nu, _ = far_and_nearest(list(tables[up]))
                    nd, _ = far_and_nearest(list(rows))
                    c["down BM mismatch"] += any(tables[up][a]["BLOCK_SIZE_M"] != rows[b]["BLOCK_SIZE_M"]
                                                 for a, b in set(zip(nu.tolist(), nd.tolist())))
        target = "triton_" + triton.replace(".", "_")
        c["triton fallback"] = sum(target not in folders for folders in by_folder.values())
    return c


def audited_counts(report):
    c = collections.Counter()
    for f in report.findings:
        if f.kind == "block_k_above_block":
            c[f"K>block rows {f.severity}"] += len(f.rows)
        elif f.kind == "ignored_key" and "triton_version" in f.reason:
            c["ignored triton_version"] += 1
        else:
            name = {"unloadable": "unloadable", "truncated": "truncated", "far_keys": "far", "down_copy": "down copies",
                    "down_block_m": "down BM mismatch", "triton_fallback": "triton fallback", "bad_row": "refused keys",
                    "crashes_loader": "crashes", "device_name": "device names"}[f.kind]
            c[name] += 1
    return c


RELEASES = [(e, v) for e in VERSIONS for v in VERSIONS[e]]


@pytest.mark.parametrize("engine,version", RELEASES)
def test_all_on_shipped_tables(engine, version):
    """Every class the shipped tables hold is found, with the counts read independently
    (docs/install-and-audit.md lists them per release)."""
    if wheel(engine, version) is None:
        pytest.skip(f"no {engine} {version} wheel")
    inst = locate_installation(engine, engine_source=[str(wheel(engine, version))], triton="3.6.0")
    report = audit_all(inst, Batches(4096), None)
    expected = +independent_counts(engine, version)
    assert +audited_counts(report) == expected
    # what the issue names is in there
    assert expected["truncated"] and expected["far"] and expected["unloadable"]
    if engine == "vllm":
        assert expected["K>block rows warning"] and expected["ignored triton_version"] and report.exit_code == 0
    else:
        assert expected["K>block rows error"] == 4 and expected["down copies"] and expected["triton fallback"]
        assert report.exit_code == 1



@pytest.mark.parametrize("engine", list(VERSIONS))
def test_shipped_tables_are_read_back_as_their_engines(engine, tmp_path):
    """`tuner drift`, `tuner check`, nightly and the warm starts tell whose table a file is from
    its name and folder (tuner/plan/table_files.py, from the engines' rules as data): every
    table shipped in the engine's newest wheel is read back as that engine's."""
    from engine_loaders import TABLE_FOLDERS, site_from_wheel

    from tuner.plan.models import load_model
    from tuner.plan.table_files import find_tables
    if wheel(engine) is None:
        pytest.skip(f"no {engine} wheel")
    site = site_from_wheel(engine, None, tmp_path)
    tables = find_tables([str(site / f) for f in TABLE_FOLDERS[engine]], load_model("deepseek-v3"))
    kinds = collections.Counter(t.problem.kernel for t in tables)
    assert kinds["fused_moe"] > 50 and kinds["fp8_gemm"] > 50, kinds
    assert {t.engine for t in tables} == {engine}

def test_cli_all_on_a_wheel_gates_on_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole)
    args = ["audit", "--all", "--triton", "3.6.0", "--out", str(tmp_path / "a")]
    assert main([*args, "--engine", "sglang", "--engine-source", str(wheel("sglang"))]) == 1
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 120
    assert "triton_3_5_1/E=512,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json" in text
    data = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert data["by_kind"]["block_k_above_block"]["count"] == 4
    assert main([*args, "--engine", "vllm", "--engine-source", str(wheel("vllm"))]) == 0


def test_deployments_on_shipped_tables(tmp_path, capsys):
    """DeepSeek-V3 TP8 on H200 under Triton 3.6.0: SGLang runs its MoE tables from
    triton_3_5_1; vLLM on an H200 NVL finds its MoE table (folded) but no GEMM table (not
    folded), and reads GEMM tables only with --linear-backend triton."""
    common = ["audit", "--model", "deepseek-v3", "--tp", "8", "--triton", "3.6.0", "--engine-source", str(wheel_dir())]
    assert main([*common, "--engine", "sglang", "--gpu", "H200", "--out", str(tmp_path / "s")]) == 0
    kernels = json.loads((tmp_path / "s" / "audit.json").read_text())["kernels"]
    assert [(k["part"], k["how"], k["triton_folder"]) for k in kernels[:2]] == [
        ("up", "Triton fallback", "triton_3_5_1"), ("down", "Triton fallback", "triton_3_5_1")]
    assert all(any(f["kind"] == "triton_fallback" for f in k["findings"]) for k in kernels[:2])
    assert all(not k["read_by_default"] for k in kernels if k["kind"] == "fp8_gemm")
    assert main([*common, "--engine", "vllm", "--gpu", "H200-NVL", "--out", str(tmp_path / "v")]) == 0
    kernels = json.loads((tmp_path / "v" / "audit.json").read_text())["kernels"]
    assert kernels[0]["file"].endswith("/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    o_proj = next(k for k in kernels if k["problem"].get("K") == 2048 and k["kind"] == "fp8_gemm")
    assert o_proj["file"] is None and o_proj["lookup"].startswith("N=7168,K=2048,device_name=NVIDIA_H200_NVL,")
    assert any(f["kind"] == "device_name" and "N=7168,K=2048,device_name=NVIDIA_H200,dtype" in f["reason"]
               for f in o_proj["findings"])
    assert "--linear-backend triton" in o_proj["read_why"]
    capsys.readouterr()


E512 = {"architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "n_routed_experts": 512, "moe_intermediate_size": 512,
        "num_experts_per_tok": 10, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


def _numerics(tmp_path, engine):
    """Audit a 512-expert model at TP2 on H100 (the E=512,N=256 tables) at M=64 only, with
    --numerics: in Triton's interpreter on the small model configs/examples/small-moe.json."""
    model = tmp_path / "e512.json"
    model.write_text(json.dumps(E512))
    argv = ["audit", "--model", str(model), "--gpu", "H100", "--tp", "2", "--triton", "3.6.0", "--batch-sizes", "64",
            "--numerics", "--seed", "3", "--engine-source", str(wheel_dir()), "--engine", engine,
            "--out", str(tmp_path / engine)]
    status = main(argv)
    data = json.loads((tmp_path / engine / "audit.json").read_text())
    return status, [k for k in data["kernels"] if k["kind"] == "fused_moe"]


@SGLANG_SCALAR_SCALE
def test_numerics_sglang_k256_rows_fail(tmp_path, capsys):
    """The K=256 row of SGLang 0.5.23's triton_3_5_1 E=512,N=256 H100 table computes wrong
    results on SGLang's own kernel: the up GEMM, and the down GEMM that reuses its table."""
    status, moe = _numerics(tmp_path, "sglang")
    assert status == 1
    assert [(k["part"], k["numerics"][0]["status"]) for k in moe] == [("up", "fail"), ("down", "fail")]
    assert all(n["rel_error"] > 0.05 for k in moe for n in k["numerics"])
    assert moe[0]["numerics"][0]["config"]["BLOCK_SIZE_K"] == 256
    capsys.readouterr()


def test_numerics_vllm_k256_rows_pass_clamped(tmp_path, capsys):
    """vLLM 0.33.0 ships the same table; its launch clamps BLOCK_SIZE_K to the 128 block,
    so the row runs as K=128 on vLLM's kernel and passes (the audit still warns)."""
    status, (op,) = _numerics(tmp_path, "vllm")
    assert status == 0
    assert op["rows"][0]["entry"]["BLOCK_SIZE_K"] == 256 and op["rows"][0]["runs_as"]["BLOCK_SIZE_K"] == 128
    assert [n["status"] for n in op["numerics"]] == ["pass"] and op["numerics"][0]["rel_error"] < 0.02
    assert any(f["kind"] == "block_k_above_block" and f["severity"] == "warning" for f in op["findings"])
    capsys.readouterr()
