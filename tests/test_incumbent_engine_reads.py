"""The incumbent of every row is what the engine reads (issue 39, item 4;
tuner/pipeline/incumbents.py, tuner/search/tied_race.py): the table `tuner audit` resolves for
the run's GPU, SGLang's fallback to another Triton's folder included, raced in pairs against the
tuned config; SGLang's up and `_down` tables, chosen together, are raced together, so that no
row of theirs lacks a choice. Over a faithful constructed SGLang site-packages folder (its
tables in configs/triton_X_Y_Z/, the Triton version from a dist-info folder) and a SYNTHETIC
run; the real wheel where $TUNER_ENGINE_WHEELS has it."""

import json
import os
import re
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.emit.engine_tables import locate_installation
from tuner.pipeline.incumbents import engine_tables
from tuner.plan.engines import table_family
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import load_model, moe_problems

GPU = get_gpu("H200")
KERNEL = get_kernel("fused_moe")
UP, DOWN = moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", engines=["sglang"])
FAMILY = table_family("sglang", "fused_moe")
NAME = FAMILY.lookup_name(GPU.cuda_name, E=257, N=256, dtype="fp8_w8a8", block_shape=[128, 128])
DOWN_NAME = NAME.removesuffix(".json") + "_down.json"


def row(m: int, stages: int) -> dict:
    return {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": stages}


def site(tmp_path: Path, folders: dict[str, dict[str, dict]], triton: str = "3.6.0") -> Path:
    """An SGLang site-packages folder: {triton folder: {file name: table}}, Triton `triton`."""
    root = tmp_path / "site"
    (root / "sglang").mkdir(parents=True, exist_ok=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang-0.5.23.dist-info").mkdir(exist_ok=True)
    (root / f"triton-{triton}.dist-info").mkdir(exist_ok=True)
    for folder, files in folders.items():
        d = root / FAMILY.folder / folder
        d.mkdir(parents=True, exist_ok=True)
        for name, table in files.items():
            (d / name).write_text(json.dumps(table))
    return root


def test_the_incumbent_is_the_file_the_engine_reads_exact_folder_then_newest_then_the_up_table(tmp_path):
    up_old = {"1": row(16, 3), "256": row(32, 3)}
    up_new = {"1": row(64, 4), "256": row(64, 4)}
    exact = {"1": row(16, 5), "256": row(16, 5)}
    root = site(tmp_path, {"triton_3_5_1": {NAME: up_old}, "triton_3_7_1": {NAME: up_new},
                           "triton_3_6_0": {NAME: exact}})

    def read(problem):
        return engine_tables(KERNEL, problem, GPU, ["sglang"], [str(root)], {})
    # Triton 3.6.0 (the folder's dist-info): its own folder, though a newer one ships the table too
    (up,) = read(UP)
    assert up.rows == exact and "triton_3_6_0" in up.where and "exact Triton folder" in up.where
    # no `_down` file anywhere: SGLang runs the down GEMM with the up table's rows
    (down,) = read(DOWN)
    assert down.rows == exact and "(the up table," in down.where
    # no folder of its own Triton: the newest other folder, as SGLang's fallback reads it
    (root / FAMILY.folder / "triton_3_6_0" / NAME).unlink()
    (up,) = read(UP)
    assert up.rows == up_new and "triton_3_7_1" in up.where and "Triton fallback" in up.where
    # the engine not found: no incumbent table (the default is the incumbent)
    assert engine_tables(KERNEL, UP, GPU, ["sglang"], [str(tmp_path / "nothing")], {}) == []


def test_a_shipped_table_in_an_older_triton_folder_is_raced_and_no_sglang_row_lacks_a_choice(tmp_path, capsys):
    shipped_up = {"1": row(16, 3), "16": row(16, 3), "256": row(16, 4)}
    shipped_down = {"1": row(16, 2), "16": row(16, 2), "256": row(16, 2)}
    root = site(tmp_path, {"triton_3_5_1": {NAME: shipped_up, DOWN_NAME: shipped_down}})
    out = tmp_path / "run"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--engines", "sglang", "--engine-source", str(root), "--batch-sizes", "1", "16", "256",
                 "--trials", "6", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    tables = {t["problem"]["part"]: t for t in manifest["tables"]}
    assert set(tables) == {"up", "down"}
    for part, shipped in (("up", shipped_up), ("down", shipped_down)):
        for m, entry in tables[part]["entries"].items():
            choice = entry["choice"]                        # every row decided, the `_down` table's too
            assert choice["incumbent"] == "installed", (part, m, choice)
            assert "triton_3_5_1/" + NAME in choice["incumbent_table"] and "Triton fallback" in choice["incumbent_table"]
            assert choice.get("tied_with") and ("gain" in choice or "itself" in choice["why"])
            if choice["kept"] == "installed":               # the row the engine read stays as it was
                assert entry["config"] == {k: shipped[m][k] for k in entry["config"]}
    # the up and the down row of one M are decided together: the same verdict and gain
    for m in tables["up"]["entries"]:
        a, b = tables["up"]["entries"][m]["choice"], tables["down"]["entries"][m]["choice"]
        assert (a["kept"], a.get("gain")) == (b["kept"], b.get("gain"))
    # the closing table shows the row kept and its paired gain at every row
    # (a row: its file's label, then M; the notes under the table name the file too, then 'at M=')
    rows = [line for line in printed.splitlines() if re.match(r"sglang E=257,N=256( _down)? +\d+ ", line)]
    assert len(rows) == 6
    assert all(line.rstrip().endswith("% pair") or line.rstrip().endswith(" (same)") for line in rows), rows


@pytest.mark.ci_variables
def test_sglang_0_5_23_on_triton_3_6_0_reads_its_deepseek_v3_h200_tables_from_triton_3_5_1():
    wheels = os.environ.get("TUNER_ENGINE_WHEELS")
    wheel = next(Path(wheels).glob("sglang-0.5.23-*.whl"), None) if wheels else None
    if wheel is None:
        pytest.skip("no sglang 0.5.23 wheel in $TUNER_ENGINE_WHEELS")
    found = {"sglang": locate_installation("sglang", engine_source=[str(wheel)], triton="3.6.0")}
    (up,) = engine_tables(KERNEL, UP, GPU, ["sglang"], None, found)
    (down,) = engine_tables(KERNEL, DOWN, GPU, ["sglang"], None, found)
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        shipped = json.loads(z.read(f"{FAMILY.folder}/triton_3_5_1/{DOWN_NAME}"))
    assert f"triton_3_5_1/{NAME}" in up.where and "Triton fallback" in up.where
    assert f"triton_3_5_1/{DOWN_NAME}" in down.where
    assert down.rows == {k: v for k, v in shipped.items() if k != "triton_version"}


def test_a_row_written_for_two_engines_races_their_row_only_where_both_read_the_same(tmp_path):
    """A GEMM problem of our kernel is one row written into vLLM's and SGLang's tables: the
    incumbent is the engines' row where both read the same config at M, else the default."""
    from types import SimpleNamespace

    from tuner.pipeline.studies import incumbent_tables, incumbents
    from tuner.plan.problems import Problem
    gemm = get_kernel("fp8_gemm")
    P = {"N": 256, "K": 256, "block_shape": [128, 128]}
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}
    root = tmp_path / "site"
    for engine, version, rows in (("vllm", "0.33.0", {"1": cfg, "64": {**cfg, "num_stages": 4}}),
                                  ("sglang", "0.5.23", {"1": cfg, "64": cfg})):
        fam = table_family(engine, "fp8_gemm")
        (root / engine).mkdir(parents=True)
        (root / engine / "__init__.py").write_text("")
        (root / f"{engine}-{version}.dist-info").mkdir()
        folder = root / fam.folder / (fam.triton_folder("3.6.0") if fam.per_triton else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / fam.lookup_name(GPU.cuda_name, N=256, K=256, block_shape=[128, 128])).write_text(json.dumps(rows))
    (root / "triton-3.6.0.dist-info").mkdir()
    problem = Problem("fp8_gemm", P, engines=("vllm", "sglang"))
    opts = SimpleNamespace(problems=[problem], baseline=None, kernel=gemm, gpu=GPU, engines=["vllm", "sglang"],
                           request=SimpleNamespace(engine_source=[str(root)]))
    installed = incumbent_tables(opts)
    (label, row, where), = incumbents(opts, installed, problem, 1)       # both read cfg at M = 1
    assert label == "installed" and row["num_stages"] == 3 and "vllm 0.33.0" in where and "sglang 0.5.23" in where
    assert incumbents(opts, installed, problem, 64) == []                # they differ at 64: the default
    # one engine reads none: the default is the incumbent everywhere
    opts.request.engine_source = [str(tmp_path / "nothing")]
    assert incumbents(opts, incumbent_tables(opts), problem, 1) == []
