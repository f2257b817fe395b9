"""Tables written by a replay run and put in place by `tuner install` are read back through
vLLM 0.33's and SGLang 0.5.23's own loader functions (tests/engine_loaders.py says how CI
gets that code). Tables come from SYNTHETIC landscapes; install needs --force for them."""

import json

import pytest
import triton
from engine_loaders import LOADERS, LOG, load_loaders, wheel, wheel_dir
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import load_model, moe_problems
from tuner.plan.space import load_space

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

H200 = "NVIDIA H200"
MS = [1, 64]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("loaders")
    gemm, moe = get_kernel("fp8_gemm"), get_kernel("fused_moe")
    g_land, m_land = d / "g.jsonl", d / "m.jsonl"
    write_synthetic_landscape(g_land, gemm, load_space(gemm), get_gpu("H200"),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], MS)
    write_synthetic_landscape(m_land, moe, load_space(moe), get_gpu("H200"),
                              [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8")], MS)
    out = d / "out"
    common = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--out", str(out), "--trials", "8",
              "--batch-sizes", *map(str, MS), "--quiet"]
    assert main(["gemm", "--replay", str(g_land), *common]) == 0
    assert main(["moe", "--replay", str(m_land), *common]) == 0
    return out


# The fake site runs the Triton that runs the tests (the one that measured the tables), as a
# user who tunes and installs on one machine has it; NEWER is a Triton that has no folder.
TRITON = triton.__version__
NEWER = f"{TRITON.split('.')[0]}.{int(TRITON.split('.')[1]) + 1}.0"


def site(tmp_path, engine):
    s = tmp_path / engine
    (s / engine).mkdir(parents=True)
    (s / engine / "__init__.py").write_text("")
    (s / f"triton-{TRITON}.dist-info").mkdir()
    return s


def ours(results, rel):
    return {int(k): v for k, v in json.loads((results / rel).read_text()).items()}


def with_loader_source(s, engine):
    """The fake site gets the engine's loader files, as an installed engine has them."""
    import zipfile
    with zipfile.ZipFile(wheel(engine)) as z:
        for rel in LOADERS[engine]:
            (s / rel).parent.mkdir(parents=True, exist_ok=True)
            (s / rel).write_bytes(z.read(rel))
    return s


def printed_log_lines(out: str) -> dict:
    """{table file name: the loaded line} that tuner install printed."""
    lines = {}
    for line in out.splitlines():
        if " logs when it loads " in line:
            name, _, text = line.split(" logs when it loads ", 1)[1].partition(": ")
            lines[name] = text
    return lines


def test_vllm_reads_what_we_install(results, tmp_path, monkeypatch, capsys):
    s = with_loader_source(site(tmp_path, "vllm"), "vllm")
    assert main(["install", str(results), "--engine", "vllm", "--site-packages", str(s), "--force"]) == 0
    printed = printed_log_lines(capsys.readouterr().out)
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    f = load_loaders("vllm", s, H200, TRITON)
    LOG.clear()
    moe = f["get_moe_configs"](256, 256, "fp8_w8a8", 128, 128)
    # the line tuner install printed is the one vLLM's own loader logs
    assert ("info", printed["E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"]) in LOG
    assert moe == ours(results, "vllm/fused_moe/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    assert set(moe) == set(MS)
    gemm = f["get_w8a8_block_fp8_configs"](7168, 2048, 128, 128)
    assert gemm == ours(results, "vllm/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    # and through VLLM_TUNED_CONFIG_FOLDER
    cfg_dir = tmp_path / "vllm-moe"
    assert main(["install", str(results), "--engine", "vllm", "--site-packages", str(site(tmp_path / "b", "vllm")),
                 "--moe-config-dir", str(cfg_dir), "--force"]) == 0
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(cfg_dir))
    f = load_loaders("vllm", tmp_path / "nowhere", H200, TRITON)   # nothing in the package folder
    assert f["get_moe_configs"](256, 256, "fp8_w8a8", 128, 128) == moe


def test_sglang_reads_what_we_install(results, tmp_path, monkeypatch, capsys):
    s = with_loader_source(site(tmp_path, "sglang"), "sglang")
    assert main(["install", str(results), "--engine", "sglang", "--site-packages", str(s), "--force"]) == 0
    printed = printed_log_lines(capsys.readouterr().out)
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
    f = load_loaders("sglang", s, H200, TRITON)
    measured_by = next((results / "sglang/fused_moe/configs").glob("triton_*")).name     # the Triton running the tests
    base = f"sglang/fused_moe/configs/{measured_by}/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
    LOG.clear()
    up = f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128)
    assert ("info", printed["E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"]) in LOG
    down = f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128, down_moe=True)
    assert up == ours(results, base + ".json") and down == ours(results, base + "_down.json")
    assert all(up[m]["BLOCK_SIZE_M"] == down[m]["BLOCK_SIZE_M"] for m in MS)
    gemm = f["get_w8a8_block_fp8_configs"](7168, 2048, 128, 128)
    assert gemm == ours(results, "sglang/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
    # SGLang under another Triton falls back to the newest triton_* folder it has
    f = load_loaders("sglang", s, H200, NEWER)
    assert f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128) == up


def test_h200_nvl_names_are_the_ones_vllm_and_sglang_look_for(tmp_path):
    """On an H200 NVL, vLLM's own MoE loader reads NVIDIA_H200 files and its GEMM loader
    NVIDIA_H200_NVL ones; SGLang's read NVIDIA_H200_NVL for both: the names we write."""
    from tuner.plan.engines import ENGINES
    nvl = get_gpu("H200-NVL").cuda_name
    entry = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                   "num_warps": 4, "num_stages": 3}}
    gemm = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    moe = {"E": 256, "N": 256, "dtype": "fp8_w8a8", "block_shape": [128, 128]}
    for engine in ("vllm", "sglang"):
        s = site(tmp_path, engine)
        eng = ENGINES[engine]
        for kind, params, folder in (("fp8_gemm", gemm, eng.gemm_folder), ("fused_moe", moe, eng.moe_folder)):
            rel = eng.table_relpath(kind, params, nvl, "3.6.0")
            sub = rel.split("/", 2)[2]                      # <engine>/<kind>/[configs/triton_x/]name
            if kind == "fused_moe" and eng.moe_env_subfolder:
                sub = sub.removeprefix(eng.moe_env_subfolder + "/")      # the package folder is configs/ itself
            path = s / folder / sub
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(entry))
        f = load_loaders(engine, s, nvl, "3.6.0")
        assert f["get_w8a8_block_fp8_configs"](7168, 2048, 128, 128) == {1: entry["1"]}, engine
        assert f["get_moe_configs"](256, 256, "fp8_w8a8", 128, 128) == {1: entry["1"]}, engine


def test_sglang_reads_a_results_folder_as_its_config_dir(results, tmp_path, monkeypatch, capsys):
    """SGLANG_MOE_CONFIG_DIR=<results>/sglang/fused_moe: SGLang 0.5.23's own loader reads our
    tables there, under the Triton that measured them and (its fallback listing configs/) under
    another one. A folder without configs/ is what it raises on: the audit says what to do."""
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(results / "sglang/fused_moe"))
    measured_by = next((results / "sglang/fused_moe/configs").glob("triton_*")).name
    base = f"sglang/fused_moe/configs/{measured_by}/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
    for triton_version in (TRITON, NEWER):
        f = load_loaders("sglang", tmp_path / "nowhere", H200, triton_version)
        assert f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128) == ours(results, base + ".json")
        assert f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128, down_moe=True) == ours(results, base + "_down.json")
    # the folder above it has no configs/: SGLang's fallback raises there, the audit says so and what to do
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(results / "sglang"))
    f = load_loaders("sglang", tmp_path / "nowhere", H200, NEWER)
    with pytest.raises(FileNotFoundError):
        f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128)
    capsys.readouterr()
    assert main(["audit", "--engine", "sglang", "--engine-version", "0.5.23", "--moe-config-dir", str(results / "sglang"),
                 "--model", "deepseek-v3", "--gpu", "H200", "--triton", NEWER, "--batch-sizes", "64"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "crashes_loader" in out and "point SGLANG_MOE_CONFIG_DIR at a folder holding configs/" in out
    assert main(["audit", "--engine", "sglang", "--engine-version", "0.5.23", "--moe-config-dir",
                 str(results / "sglang/fused_moe"), "--model", "deepseek-v3", "--gpu", "H200", "--triton", NEWER,
                 "--batch-sizes", "64"]) == 0
    assert "crashes_loader" not in capsys.readouterr().out


def test_install_without_sglang_writes_a_folder_its_loader_reads(results, tmp_path, monkeypatch, capsys):
    """No sglang here: a config folder for 0.5.23 (its wheel at hand gives the shipped tables the
    variable would hide), read by SGLang 0.5.23's own loader: our table and a shipped one."""
    cfg = tmp_path / "cfg"
    monkeypatch.setenv("TUNER_BACKUP_DIR", str(tmp_path / "backups"))
    assert main(["install", str(results), "--engine", "sglang", "--engine-version", "0.5.23", "--moe-config-dir",
                 str(cfg), "--force"]) == 0
    out = capsys.readouterr().out
    assert "shipped sglang MoE tables" in out and "E=257,N=256" in out
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(cfg))
    f = load_loaders("sglang", tmp_path / "nowhere", H200, TRITON)
    measured_by = next((results / "sglang/fused_moe/configs").glob("triton_*")).name
    ours_up = ours(results, f"sglang/fused_moe/configs/{measured_by}/E=257,N=256,device_name=NVIDIA_H200,"
                            "dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert f["get_moe_configs"](257, 256, "fp8_w8a8", 128, 128) == ours_up
    f = load_loaders("sglang", tmp_path / "nowhere", H200, "3.6.0")
    shipped = f["get_moe_configs"](128, 768, None)             # shipped in 0.5.23's triton_3_6_0/
    assert shipped and all(isinstance(k, int) for k in shipped)
