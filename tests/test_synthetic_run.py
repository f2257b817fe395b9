"""`tuner moe|gemm|mla --synthetic`: the main job end to end without a GPU, on a SYNTHETIC
landscape made on the fly, labelled SYNTHETIC wherever a time shows; run again as written, it
resumes (the README's tour too: `landscape synth` replaces its own earlier file)."""

import json

from tuner.cli import main


def test_the_missions_command_runs_end_to_end_on_a_synthetic_landscape(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # the tool as a new user has it: no engine wheel at hand, whose shipped tables would be the incumbents
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
            "--batch-sizes", "1", "64", "--trials", "6"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("*** SYNTHETIC") and "tuner: tp=8: the smallest that holds deepseek-v3's" in err
    run = tmp_path / "runs" / "moe-deepseek-v3-H200-tp8-synthetic"
    assert f"made {run.relative_to(tmp_path)}/synthetic-fused_moe.jsonl.gz" in out
    studies = [line for line in (out + err).splitlines() if " M=" in line and "trials" in line]
    assert len(studies) == 6 and all("us (SYNTHETIC)" in line for line in studies)      # 3 problems x 2 M
    assert "*** SYNTHETIC cost model" in out
    # the closing table names no kernel as the times' source, and each engine's file-name form
    assert "fused MoE (sorted tokens, grouped GEMMs) [SYNTHETIC: no kernel ran]\nconfig = BLOCK_SIZE_M" in out
    assert "[ours]" not in out
    assert ("named <shape>,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json "
            "(sglang: [128, 128])") in out
    assert "\n      vllm/fused_moe/, sglang/fused_moe/configs/triton_" in out
    table = out.split("\nconfig = ", 1)[1].splitlines()
    assert max(map(len, table)) <= 120, max(table, key=len)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["tp"] == 8 and len(manifest["tables"]) == 3
    assert all(t["environment"]["synthetic"] and t["identity"]["times"] == "SYNTHETIC" for t in manifest["tables"])
    assert (run / "vllm/fused_moe/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
            ).is_file()
    # again, as written: the landscape made for the same problems is replayed, the studies are resumed
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert sum("stored:" in line for line in (out + err).splitlines()) == 6


def test_a_synthetic_dry_run_writes_nothing_and_clashes_are_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "*** SYNTHETIC" in printed and "kernel: ours" in printed and not out.exists()
    # nothing is timed: the plan claims no GPU timing
    assert "timing: none: a SYNTHETIC cost model" in printed and "CUDA-graph" not in printed
    for clash in (["--replay", str(tmp_path / "x.jsonl")], ["--device", "cpu"]):
        assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic", *clash]) == 2
        err = capsys.readouterr().err
        assert "--synthetic makes its own SYNTHETIC landscape" in err and err.count("\n") == 1


def test_a_foreign_file_where_the_runs_landscape_goes_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "synthetic-fp8_gemm.jsonl.gz").write_text("mine")
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic", "--batch-sizes", "1",
                 "--only", "N=7168,K=2048", "--out", str(out)]) == 2
    assert "exists and is not a SYNTHETIC landscape" in capsys.readouterr().err
    assert (out / "synthetic-fp8_gemm.jsonl.gz").read_text() == "mine"
