"""`tuner install --merge` keeps the rows the engine reads today, or refuses (issue 50, item 2;
issue 51, item 2): it reads the engine's table where the engine does (the package, else the same
version's wheel), says when vLLM's config folder hides a shipped table, never claims a merge it
could not make, and never puts a row its run did not tune (a --minutes window's incumbent) over
a row the engine reads.

The wheel here is a stand-in made in tmp_path (a zip named as the release's, holding the shipped
table), so these run in a plain clone; tests/test_tuned_tables.py does the same with the real
wheels."""

import json
import zipfile
from pathlib import Path

from tuner.cli import main

MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
FOLDER = "vllm/model_executor/layers/fused_moe/configs"
GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
SHIPPED = {str(m): {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                    "num_warps": 4, "num_stages": 3} for m in GRID}
TUNED = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 4}
DEFAULT = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2}


def window_results(root: Path, tuned=(1, 16), planned=GRID) -> Path:
    """A results folder as a --minutes window leaves it (tuner/pipeline/emission.py): the table
    holds the tuned rows and, at every other batch size planned, the incumbent (here the default
    config: the tuning Python had no engine); the manifest's entries and partial.tuned name the
    tuned ones."""
    rel = "vllm/fused_moe/" + MOE
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_text(json.dumps({str(m): TUNED if m in tuned else DEFAULT for m in planned}))
    table = {"kernel": "fused_moe", "problem": {"E": 256}, "files": {"vllm": rel},
             "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "numerics_passed": True,
             "entries": {str(m): {"config": TUNED, "time_us": 10.0} for m in tuned},
             "partial": {"tuned": list(tuned), "planned": list(planned),
                         "incumbent": {str(m): "default" for m in planned if m not in tuned},
                         "why": "not tuned yet (the run stopped or its --minutes window ended)"}}
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": [table]}))
    return root


def whole_results(root: Path) -> Path:
    """A results folder with one whole vLLM MoE table tuned at M=1 only."""
    rel = "vllm/fused_moe/" + MOE
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_text(json.dumps({"1": TUNED}))
    table = {"kernel": "fused_moe", "problem": {"E": 256}, "files": {"vllm": rel},
             "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "numerics_passed": True,
             "entries": {"1": {"config": TUNED, "time_us": 10.0}}}
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": [table]}))
    return root


def stand_in_wheel(folder: Path, version: str = "0.33.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as z:
        z.writestr(f"{FOLDER}/{MOE}", json.dumps(SHIPPED))
    return folder


def no_wheels(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


def files(root: Path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


def test_a_merge_that_cannot_read_the_engines_table_is_refused(tmp_path, monkeypatch, capsys):
    """vLLM not here, no wheel at hand: --merge cannot know the rows the engine reads, so it
    refuses in one line naming the fetch (before: it wrote the 1-key table and said the other
    batch sizes keep the engine's rows); nothing is written, no backup made."""
    no_wheels(monkeypatch, tmp_path)
    res, cfg = window_results(tmp_path / "res"), tmp_path / "cfg"
    argv = ["install", str(res), "--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir", str(cfg)]
    assert main([*argv, "--merge"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot merge" in err and "tuner engine-source fetch vllm==0.33.0" in err
    assert "keep the rows" not in err and files(cfg) == {} and files(tmp_path / "backups") == {}
    # without --merge it installs, and says the folder's table hides a shipped one it cannot read
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "VLLM_TUNED_CONFIG_FOLDER is read before vllm's package" in err and "hides the table vllm ships" in err
    # the incumbent rows were not tuned: the file installed holds the tuned rows only
    assert sorted(json.loads((cfg / MOE).read_text()), key=int) == ["1", "16"]


def test_a_merge_reads_the_shipped_table_from_the_wheel_and_says_the_folder_hides_it(tmp_path, monkeypatch,
                                                                                      capsys):
    """vLLM not here, its wheel at hand: the config folder's table hides the shipped one (vLLM
    reads the folder first), so an install that covers fewer batch sizes is refused like one
    into the package, and --merge keeps the shipped rows, saying the folder hides that table."""
    no_wheels(monkeypatch, tmp_path)
    monkeypatch.setenv("TUNER_ENGINE_WHEELS", str(stand_in_wheel(tmp_path / "wheels")))
    res, cfg = whole_results(tmp_path / "res"), tmp_path / "cfg"
    argv = ["install", str(res), "--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir", str(cfg)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "would hide" in err and "M=2,4,8,16" in err and files(cfg) == {}
    assert main([*argv, "--merge"]) == 0
    out, err = capsys.readouterr()
    installed = json.loads((cfg / MOE).read_text())
    assert installed == {**SHIPPED, "1": TUNED}
    assert "VLLM_TUNED_CONFIG_FOLDER is read before vllm's package" in err and f"hides {MOE} in vllm-0.33.0-" in err
    assert "(merged: kept M=2,4,8,16,24" in out


def test_a_windows_incumbent_rows_never_go_over_the_engines(tmp_path, monkeypatch, capsys):
    """A --minutes window's table holds the default config where it tuned nothing (the incumbent
    of a Python without the engine); installed with --merge over vLLM's shipped table, those
    batch sizes keep the shipped rows and only M=1 and 16 are ours (before: every row of the file
    went in, the default over the shipped rows, while the install said they were kept); without
    --merge it is refused; with --force only the tuned rows go in."""
    no_wheels(monkeypatch, tmp_path)
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm/__init__.py").write_text("")
    (site / FOLDER).mkdir(parents=True)
    (site / FOLDER / MOE).write_text(json.dumps(SHIPPED))
    res = window_results(tmp_path / "res")
    argv = ["install", str(res), "--engine", "vllm", "--site-packages", str(site)]
    before = files(site)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing" in err and "not its rows at M=2,4,8" in err
    assert files(site) == before
    assert main([*argv, "--merge", "--force"]) == 0
    out, err = capsys.readouterr()
    installed = json.loads((site / FOLDER / MOE).read_text())
    assert installed == {**SHIPPED, "1": TUNED, "16": TUNED}
    assert "--merge keeps the rows vllm reads today for them" in err
    record = json.loads(next((tmp_path / "backups").glob("vllm-*/record.json")).read_text())
    merged = record["files"][0]["merged"]
    assert merged["new"] == [1, 16] and merged["not_tuned"] == [m for m in GRID if m not in (1, 16)]
    assert main(["install", "--restore", "--engine", "vllm"]) == 0
    assert main([*argv, "--force"]) == 0
    assert json.loads((site / FOLDER / MOE).read_text()) == {"1": TUNED, "16": TUNED}
    capsys.readouterr()


def test_a_merge_keeps_what_the_engine_reads_where_its_table_has_no_key(tmp_path, monkeypatch, capsys):
    """The engine's table has keys 1 and 64 only; the window tuned M=1 and planned 1, 8, 48: at
    8 and 48, which it did not tune, the merged table holds the row the engine reads there today
    (its nearest key's, 1 and 64: not the window's default)."""
    no_wheels(monkeypatch, tmp_path)
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm/__init__.py").write_text("")
    (site / FOLDER).mkdir(parents=True)
    old = {"1": SHIPPED["1"], "64": {**SHIPPED["64"], "num_warps": 8}}
    (site / FOLDER / MOE).write_text(json.dumps(old))
    res = window_results(tmp_path / "res", tuned=(1,), planned=[1, 8, 48])
    assert main(["install", str(res), "--engine", "vllm", "--site-packages", str(site), "--merge", "--force"]) == 0
    installed = json.loads((site / FOLDER / MOE).read_text())
    assert installed == {"1": TUNED, "8": old["1"], "48": old["64"], "64": old["64"]}
    capsys.readouterr()
