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


# -- coverage, --merge, and the audit of what an install leaves in place -------------------------
GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
OLD_ROW = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32, "num_warps": 4,
           "num_stages": 3}


def _tree(root: Path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fewer_batch_sizes_refused_merge_keeps_the_rest(tmp_path, capsys):
    """A 1-key table over an 18-key one: refused (exit 2, one line, nothing changed);
    --merge keeps the 17 old entries and records them; restore undoes it; --force replaces."""
    res, site = results_folder(tmp_path / "res"), site_packages(tmp_path / "site")
    moe = site / "vllm/model_executor/layers/fused_moe/configs" / MOE
    moe.write_text(json.dumps({str(m): OLD_ROW for m in GRID}))
    before = _tree(site)
    backups = list((tmp_path / "backups").rglob("*")) if (tmp_path / "backups").exists() else []
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing vllm/fused_moe/" in err and "covers M=1 " in err
    assert "M=2,4,8,16,24,32,48,64,96,128,256,512,1024,1536,2048,3072,4096" in err and "--merge" in err
    assert _tree(site) == before
    assert (list((tmp_path / "backups").rglob("*")) if (tmp_path / "backups").exists() else []) == backups
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), "--merge"]) == 0
    out = capsys.readouterr().out
    merged = json.loads(moe.read_text())
    assert list(merged) == [str(m) for m in GRID] and merged["1"] == TABLE["1"]
    assert sum(merged[str(m)] == OLD_ROW for m in GRID) == 17
    assert "(merged: kept M=2,4,8" in out
    record = json.loads(next((tmp_path / "backups").glob("vllm-*/record.json")).read_text())
    entry = next(e for e in record["files"] if e["dest"] == str(moe))
    assert entry["merged"]["kept"] == GRID[1:] and entry["merged"]["new"] == [1]
    assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert _tree(site) == before
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), "--force"]) == 0
    assert json.loads(moe.read_text()) == TABLE
    capsys.readouterr()


def test_install_audits_what_it_leaves(tmp_path, capsys):
    """SGLang: our up table beside a `_down` table already there with another BLOCK_SIZE_M is
    a warning (SGLang runs the up one's); a BLOCK_SIZE_K over the weight block is an error
    that refuses the install (nothing changed) unless --force."""
    res, site = results_folder(tmp_path / "res"), site_packages(tmp_path / "site")
    folder = site / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0"
    folder.mkdir(parents=True)
    (folder / SG_MOE.replace(".json", "_down.json")).write_text(json.dumps({"1": {**TABLE["1"], "BLOCK_SIZE_M": 32}}))
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "audit: warning: down_block_m:" in out and "BLOCK_SIZE_M differs from the up table's at M=1-4096" in out
    (res / "sglang/fused_moe/triton_3_6_0" / SG_MOE).write_text(json.dumps({"1": {**TABLE["1"], "BLOCK_SIZE_K": 256}}))
    before = _tree(site)
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing the install" in err and "BLOCK_SIZE_K 256" in err
    assert _tree(site) == before
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site), "--force"]) == 0
    capsys.readouterr()


def _timed_results(root: Path, row: dict, time_us: float, timing: str = "graph") -> Path:
    """A results folder with one vLLM MoE table whose M=1 row has a time, taken on the H200 under
    a measurement policy (tuner/measure/policy.py), as a run's manifest records it."""
    (root / "vllm/fused_moe").mkdir(parents=True)
    (root / "vllm/fused_moe" / MOE).write_text(json.dumps({"1": row}))
    table = {"kernel": "fused_moe", "problem": {"i": 0}, "files": {"vllm": "vllm/fused_moe/" + MOE},
             "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "numerics_passed": True,
             "measurement": {"timing": timing, "l2": "cold", "clocks": "unlocked"},
             "entries": {"1": {"config": row, "time_us": time_us}}}
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": [table]}))
    return root


@pytest.mark.parametrize("new_time,timing,kept", [
    (9.9, "graph", True),        # 1 % faster than the installed row: under --min-gain 2 %, the row stays
    (9.0, "graph", False),       # 11 % faster: replaced
    (9.9, "eager", False),       # timed under another policy: not comparable, the new row goes in
])
def test_merge_replaces_an_installed_row_only_for_a_real_gain(tmp_path, capsys, new_time, timing, kept):
    site = site_packages(tmp_path / "site")
    moe = site / "vllm/model_executor/layers/fused_moe/configs" / MOE
    first = _timed_results(tmp_path / "first", TABLE["1"], 10.0)
    assert main(["install", str(first), "--engine", "vllm", "--site-packages", str(site)]) == 0
    other = {**TABLE["1"], "BLOCK_SIZE_N": 128}
    second = _timed_results(tmp_path / "second", other, new_time, timing)
    capsys.readouterr()
    assert main(["install", str(second), "--engine", "vllm", "--site-packages", str(site), "--merge"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(moe.read_text())["1"] == (TABLE["1"] if kept else other)
    said = "the installed row (10.00 us) is kept: the new one (9.90 us) gains +1.0%, not above --min-gain 2%"
    assert (said in err) is kept
    records = sorted((tmp_path / "backups").glob("vllm-*/record.json"))
    entry = next(e for e in json.loads(records[-1].read_text())["files"] if e["dest"] == str(moe))
    assert ("kept_installed" in (entry.get("merged") or {})) is kept
    # a lower threshold lets the 1 % through
    if kept:
        assert main(["install", str(second), "--engine", "vllm", "--site-packages", str(site), "--merge",
                     "--min-gain", "0.005"]) == 0
        assert json.loads(moe.read_text())["1"] == other


# -- an engine that is not here: a config folder for a named version -----------------------------
def test_a_config_folder_for_an_engine_that_is_not_here(tmp_path, monkeypatch, capsys):
    """No sglang in this Python: `--moe-config-dir DIR --engine-version V` writes DIR as that
    version reads it (configs/triton_X_Y_Z/), leaves the GEMM tables out (only the package reads
    them) and says so; without a wheel at hand, that the shipped tables are hidden."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_BACKUP_DIR", str(tmp_path / "backups"))
    res, cfg = results_folder(tmp_path / "res"), tmp_path / "sglang-moe"
    argv = ["install", str(res), "--engine", "sglang", "--moe-config-dir", str(cfg)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    from tuner.plan.engines import supported_releases
    assert ("name the version that will read the tables with --engine-version V (one of "
            f"{', '.join(supported_releases('sglang'))})") in err
    assert main([*argv, "--engine-version", "0.5.23"]) == 0
    out, err = capsys.readouterr()
    assert (cfg / "configs/triton_3_6_0" / SG_MOE).is_file() and len(list(cfg.rglob("*.json"))) == 1
    assert "sglang 0.5.23 is not installed here: a config folder for it" in out
    assert f"export SGLANG_MOE_CONFIG_DIR={cfg.resolve()}" in out
    assert "hides sglang 0.5.23's shipped MoE tables" in err and "tuner engine-source fetch sglang==0.5.23" in err
    # vLLM's folder is flat; its GEMM tables have no variable: left out, said
    vcfg = tmp_path / "vllm-moe"
    assert main(["install", str(res), "--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir",
                 str(vcfg)]) == 0
    err = capsys.readouterr().err
    assert [p.name for p in vcfg.rglob("*.json")] == [MOE] and "1 fp8_gemm table(s) left out" in err
    # neither the engine nor a config folder: one line naming both ways
    capsys.readouterr()
    assert main(["install", str(res), "--engine", "sglang"]) == 2
    err = capsys.readouterr().err
    assert "--moe-config-dir DIR --engine-version V" in err and err.count("\n") == 1


def test_a_config_folder_install_of_no_table_it_would_install_is_refused_and_not_recorded(tmp_path, monkeypatch,
                                                                                           capsys):
    """A results folder with only a GEMM table, for a MoE config folder: nothing to install there.
    It used to say '0 tables installed; backup in ...', print an `export` of a folder that does
    not exist, exit 0 and record an empty install that the next --restore 'restored' instead of
    the install the user meant to undo (docs/install-and-audit.md: a results folder without tables
    is refused)."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    from tests.results_folders import results_folder as made
    res = made(tmp_path / "res", "fp8_gemm", {"vllm/fp8_gemm/" + GEMM: TABLE})
    cfg = tmp_path / "vllm-moe"
    before = sorted(p for p in tmp_path.rglob("*") if "cache" not in p.parts)
    assert main(["install", str(res), "--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir",
                 str(cfg)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"tuner: error: {res} holds no vllm table that an install "
                                                     f"into --moe-config-dir {cfg} would write"), err
    assert "fp8_gemm" in err and "tables installed" not in out and "export" not in out
    assert sorted(p for p in tmp_path.rglob("*") if "cache" not in p.parts) == before      # nothing recorded
    assert main(["install", "--restore", "--engine", "vllm"]) == 2                        # nothing to restore


def test_a_results_folder_that_is_a_file_is_said_so(tmp_path, capsys):
    """`tuner install README.md` said 'results folder README.md not found': it exists, as a file."""
    readme = tmp_path / "README.md"
    readme.write_text("# notes\n")
    argv = ["--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir", str(tmp_path / "cfg")]
    assert main(["install", str(readme), *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tuner: error: results folder {readme} is a file, not a folder (a run's --out folder, with its manifest.json)"]
    assert main(["install", str(tmp_path / "nowhere"), *argv]) == 2
    assert f"results folder {tmp_path / 'nowhere'} not found" in capsys.readouterr().err
    assert not (tmp_path / "cfg").exists()


def test_a_dry_run_for_an_engine_that_is_not_here_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)        # no wheel: no shipped table to compare
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    res = results_folder(tmp_path / "res")
    before = sorted(tmp_path.rglob("*"))
    assert main(["install", str(res), "--engine", "vllm", "--engine-version", "0.33.0", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "vllm 0.33.0 is not installed here: what an install into it would write" in out
    assert f"would install .../site-packages/vllm/model_executor/layers/fused_moe/configs/{MOE}" in out
    assert f"would install .../site-packages/vllm/model_executor/layers/quantization/utils/configs/{GEMM}" in out
    # the stand-in for a site-packages that is not here is never printed as if it were a path (issue 50, item 10)
    assert "site-packages>" not in out + err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_results_folder_in_the_engines_layout_installs(tmp_path, capsys):
    """A run writes SGLang's MoE tables under sglang/fused_moe/configs/triton_X_Y_Z/ (the folder
    is an SGLANG_MOE_CONFIG_DIR as it is); install maps them into the package's folders."""
    res = results_folder(tmp_path / "res")
    manifest = json.loads((res / "manifest.json").read_text())
    old, new = "sglang/fused_moe/triton_3_6_0/" + SG_MOE, "sglang/fused_moe/configs/triton_3_6_0/" + SG_MOE
    (res / new).parent.mkdir(parents=True)
    (res / old).rename(res / new)
    for t in manifest["tables"]:
        t["files"] = {k: new if v == old else v for k, v in t["files"].items()}
    (res / "manifest.json").write_text(json.dumps(manifest))
    site = site_packages(tmp_path / "site")
    assert main(["install", str(res), "--engine", "sglang", "--site-packages", str(site)]) == 0
    assert (site / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0" / SG_MOE).is_file()


def test_an_install_says_which_target_checks_it_could_not_make(tmp_path, capsys):
    """Installing from a machine with no GPU into a package with no version metadata and no Triton beside it
    (a CPU login node filling a container's site-packages) dropped the GPU, Triton and engine-version checks
    without a word, exit 0 (a new user's finding): the install now says which were not made, and a target
    given (--gpu, --engine-version) is checked and not named."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    tuned = Path(__file__).resolve().parents[1] / "tuned" / "NVIDIA_H200"
    args = ["install", str(tuned), "--engine", "vllm", "--merge", "--site-packages", str(site),
            "--dry-run"]
    assert main(args) == 0
    err = capsys.readouterr().err
    line = next((ln for ln in err.splitlines() if "not checked against the target" in ln), "")
    assert "the GPU it runs on (--gpu)" in line and "its Triton" in line and "vllm's version" in line, err
    assert main([*args, "--gpu", "H200", "--engine-version", "0.33.0"]) == 0
    line = next((ln for ln in capsys.readouterr().err.splitlines() if "not checked against the target" in ln), "")
    assert line.endswith("unknown here: its Triton"), line


def test_a_restore_that_empties_a_config_folder_says_to_unset_its_variable(tmp_path, capsys):
    """`install --moe-config-dir DIR` says to export SGLANG_MOE_CONFIG_DIR=DIR; its --restore removed the tables and
    said nothing of the variable, which, still set, makes SGLang read that empty folder alone and run its
    default configs (a new user's finding). Now it says to unset it; a folder still holding a table says nothing."""
    results = results_folder(tmp_path / "results")
    folder = tmp_path / "sgl-moe"
    install = ["install", str(results), "--engine", "sglang", "--engine-version", "0.5.23", "--moe-config-dir",
               str(folder), "--gpu", "H200", "--force"]
    restore = ["install", "--restore", "--engine", "sglang", "--moe-config-dir", str(folder)]
    assert main(install) == 0
    capsys.readouterr()
    assert main(restore) == 0
    out = capsys.readouterr().out
    assert f"{folder} holds no table now: unset SGLANG_MOE_CONFIG_DIR" in out and "default configs would run" in out
    (folder / "configs" / "triton_3_6_0").mkdir(parents=True, exist_ok=True)
    (folder / "configs" / "triton_3_6_0" / SG_MOE).write_text(json.dumps(TABLE))       # the user's own table
    assert main(install) == 0 and main(restore) == 0
    assert "unset" not in capsys.readouterr().out
