"""Tables and runs that once ended in an internal error or were read wrong without a word
(issue 33, items 5 and 7), on hand-made folders laid out like vLLM 0.33's. `tuner audit`
reports what the engine would do with a table nested 200,000 deep, keyed 0 or -8, or keyed
2^70 under a traffic profile; `tuner install --merge` onto such tables installs, and drops
the keys that are no batch size (a design decision: recorded in the backup record, said in a
note); `audit --numerics` finds its default model from anywhere; a run whose every config
timed out exits 1 with one line. Landscapes are SYNTHETIC."""

import json
from pathlib import Path

from test_bad_input import CFG, GEMM_ARGS, landscape, results_with, site

from tuner.cli import main

MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
VMOE = "vllm/model_executor/layers/fused_moe/configs"
AUDIT = ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model", "deepseek-v3",
         "--gpu", "H200", "--tp", "8"]


def override(tmp_path: Path, text: str) -> list[str]:
    """--moe-config-dir holding the deployment's MoE table as `text`."""
    folder = tmp_path / "ov"
    folder.mkdir(exist_ok=True)
    (folder / MOE).write_text(text)
    return ["--moe-config-dir", str(folder)]


def deep(depth: int) -> str:
    return '{"1": ' + "[" * depth + "]" * depth + "}"


def test_audit_of_a_table_nested_200000_deep(tmp_path, capsys):
    assert main([*AUDIT, *override(tmp_path, deep(200_000))]) == 1
    out, err = capsys.readouterr()
    assert "internal error" not in err and "crashes_loader" in out and "nested too deeply" in out


def test_audit_of_keys_that_are_no_batch_size(tmp_path, capsys):
    """Keys 0 and -8 (the loader's int() takes them): no division by them; the batch sizes
    they serve are said to run an entry of a key that is no batch size; --batch-sizes too."""
    table = json.dumps({"-8": CFG, "0": CFG, "64": CFG})
    for extra in ([], ["--batch-sizes", "1", "2", "64"]):
        rc = main([*AUDIT, *override(tmp_path, table), *extra])
        out, err = capsys.readouterr()
        assert rc in (0, 1) and "internal error" not in err, err
        assert "far_keys" in out and "run the entry for 0 (a key that is no batch size)" in out


def test_audit_under_traffic_of_a_key_of_2_to_the_70(tmp_path, capsys):
    traffic = tmp_path / "t.csv"
    traffic.write_text("M,weight\n1,1\n64,3\n")
    rc = main([*AUDIT, *override(tmp_path, json.dumps({"1": CFG, str(2 ** 70): CFG})), "--traffic", str(traffic),
               "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert rc in (0, 1) and "internal error" not in err, err
    moe = json.loads((tmp_path / "a" / "audit.json").read_text())["kernels"][0]
    assert {c["key"]: c["share"] for c in moe["traffic"]} == {1: 1.0, 2 ** 70: 0.0}


def merge_onto(tmp_path: Path, installed: str):
    """`tuner install --merge` of a 1-key table (M=1) onto an installed table `installed`."""
    s = site(tmp_path / "site")
    (s / VMOE).mkdir(parents=True)
    (s / VMOE / MOE).write_text(installed)
    res = results_with(tmp_path / "r", {f"vllm/fused_moe/{MOE}": {"1": CFG}})
    rc = main(["install", str(res), "--engine", "vllm", "--site-packages", str(s), "--merge", "--force"])
    return rc, s / VMOE / MOE


def test_merge_onto_a_table_nested_200000_deep(tmp_path, capsys):
    rc, table = merge_onto(tmp_path, deep(200_000))
    err = capsys.readouterr().err
    assert rc == 0 and "internal error" not in err, err
    assert "nested too deeply" in err and json.loads(table.read_text()) == {"1": CFG}


def test_merge_drops_keys_that_are_no_batch_size(tmp_path, capsys):
    """Design decision: a merge keeps the installed entries for the batch sizes the new table
    lacks, and drops keys below 1 (no batch size; every table we install is refused with one):
    said in a note and recorded in the backup record."""
    rc, table = merge_onto(tmp_path, json.dumps({"-8": CFG, "0": CFG, "64": {**CFG, "num_warps": 8}}))
    err = capsys.readouterr().err
    assert rc == 0 and "internal error" not in err, err
    assert json.loads(table.read_text()) == {"1": CFG, "64": {**CFG, "num_warps": 8}}
    assert "keys -8,0 are dropped: no batch size" in err
    record = json.loads(next((tmp_path / "backups").glob("vllm-*/record.json")).read_text())
    assert record["files"][0]["merged"]["dropped"] == [-8, 0] and record["files"][0]["merged"]["kept"] == [64]


def test_audit_numerics_finds_its_default_model_from_anywhere(tmp_path, monkeypatch, capsys):
    """--numerics without --numerics-model, run from a folder that is not the checkout: the
    repository's small model is found (here no table is read, so no row runs)."""
    engine = site(tmp_path / "site")                    # vLLM's package, holding no table
    monkeypatch.chdir(tmp_path)
    rc = main([a for a in AUDIT if a not in ("--engine-version", "0.33.0")] + [
        "--site-packages", str(engine), "--moe-config-dir", "", "--numerics"])
    out, err = capsys.readouterr()
    assert rc == 0 and "unknown model" not in err, err


def timeouts(lines: list[str]) -> list[str]:
    """A landscape's lines with every point a timeout."""
    out = [lines[0]]
    for line in lines[1:]:
        rec = json.loads(line)
        rec.pop("time_us", None), rec.pop("spread", None)
        rec["error"], rec["failure"] = "hang: no result within 120s", "timeout"
        out.append(json.dumps(rec))
    return out


def test_a_run_whose_every_config_timed_out_exits_1(tmp_path, capsys):
    """Every config of the study timed out (a landscape of timeouts): no table entry, one
    line on stderr saying so, exit 1 (it was 0)."""
    land = landscape(tmp_path / "l.jsonl", timeouts)
    rc = main([*GEMM_ARGS, "--replay", str(land), "--trials", "4", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tuner: no config was timed for 1 of 1 studies (M=1 of N=7168,K=2048")
    assert last.endswith("first failure: hang: no result within 120s")      # the recorded timeout, said


def test_a_nightly_job_whose_every_config_timed_out_fails(tmp_path, capsys):
    """The same in a night: the job fails with that line (its status was "fresh", exit 0)."""
    land = landscape(tmp_path / "l.jsonl", timeouts)
    job = {"name": "a", "kernel": "gemm", "model": "deepseek-v3", "gpu": "H200", "tp": 8, "batch_sizes": [1],
           "trials": 4, "replay": str(land), "kernel_source": "ours"}
    config = tmp_path / "n.yaml"
    config.write_text(f"runs_dir: {tmp_path / 'runs'}\njobs:\n- {json.dumps(job)}\n")
    assert main(["nightly", str(config), "--night", "n1"]) == 1
    [result] = json.loads((tmp_path / "runs" / "n1" / "summary.json").read_text())
    assert result["status"] == "failed" and "no config was timed for 1 of 1 studies" in result["error"]
    capsys.readouterr()
