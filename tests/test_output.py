"""Output a person reads: `tuner --help` in the order of the work, every command's help ending
with examples that parse; a run's closing table and drift's within 120 columns, each row naming
the table file it goes to; one warning per fact (a one-M GEMM replay printed 28, some blaming
an overwrite that never happened). SYNTHETIC landscapes, on a CPU."""

import shlex

import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import _commands, build_parser, main
from tuner.commands.examples import EXAMPLES
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.space import load_space

WIDTH = 120


def test_the_help_lists_the_commands_in_the_order_of_the_work(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = [line.split()[0] for line in capsys.readouterr().out.split("COMMAND\n", 1)[1].splitlines()
              if line.startswith("    ") and not line.startswith("     ")]
    assert listed[:6] == ["coverage", "moe", "gemm", "mla", "install", "audit"]     # where tuning pays, first
    assert sorted(listed) == sorted(name for name, _, _ in _commands())


@pytest.mark.parametrize("name", [name for name, _, _ in _commands()])
def test_every_commands_help_ends_with_examples_that_parse(name, capsys):
    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = capsys.readouterr().out.rstrip().splitlines()
    head = max(i for i, line in enumerate(text) if line in ("example:", "examples:"))
    examples = text[head + 1:]
    assert 1 <= len(examples) <= 2 and examples == [f"  {e}" for e in EXAMPLES[name]]
    for example in EXAMPLES[name]:
        argv = shlex.split(example.split("  #")[0])
        assert argv[:2] == ["tuner", name]
        build_parser().parse_args(argv[1:])          # a bad option would raise TunerError


@pytest.fixture(scope="module")
def one_m_landscape(tmp_path_factory):
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl"
    kernel = get_kernel("fp8_gemm")
    problems = [p.params for p in gemm_problems(load_model("deepseek-v3"), 8)]
    write_synthetic_landscape(path, kernel, load_space(kernel), get_gpu("H200"), problems, [16])
    return path


def test_a_one_m_replay_says_each_fact_once_and_its_table_fits(one_m_landscape, tmp_path, capsys):
    """DeepSeek-V3's 8 GEMM shapes (14 tables) tuned at M=16 alone: one warning, that the tables
    hold only that batch size (none blaming an overwrite); the closing table within 120
    columns, each row naming its file."""
    out = tmp_path / "out"
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--replay", str(one_m_landscape),
                 "--batch-sizes", "16", "--trials", "6", "--quiet", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    warnings = err.strip().splitlines()
    assert len(warnings) == 1, warnings
    assert "the 14 table(s) hold only the batch sizes tuned (M=16)" in warnings[0]
    assert "overwr" not in err
    table = printed.split("file: the table each row goes to", 1)[1].splitlines()
    assert max(map(len, table)) <= WIDTH, max(table, key=len)
    rows = [line for line in table if line.split()[:1] in (["vllm"], ["sglang"], ["vllm+sglang"])]
    assert len(rows) == 8 and all(" 16 " in r for r in rows)
    assert any(r.startswith("vllm+sglang N=7168,K=2048 ") for r in rows)      # one shape, both engines' files
    assert any(r.startswith("vllm N=512,K=7168 ") for r in rows)              # vLLM's alone (SGLang fuses it)
    # drift re-times those tables: one row per file and M, within 120 columns
    assert main(["drift", str(out), "--gpu", "H200", "--model", "deepseek-v3", "--replay",
                 str(one_m_landscape)]) == 0
    drift = capsys.readouterr().out.splitlines()
    assert max(map(len, drift)) <= WIDTH, max(drift, key=len)
    assert sum(line.startswith(("vllm N=", "sglang N=")) for line in drift) == 14


def test_a_forced_install_says_each_reason_once(one_m_landscape, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--replay", str(one_m_landscape), "--only",
                 "N=7168,K=2048", "N=4608,K=7168", "N=512,K=7168", "--batch-sizes", "16", "--trials", "4",
                 "--engines", "vllm", "--quiet", "--out", str(out)]) == 0
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm/__init__.py").write_text("")
    capsys.readouterr()
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site), "--force", "--dry-run"]) == 0
    printed, err = capsys.readouterr()
    assert sum("forced" in line for line in err.splitlines()) == 1 and "forced 3 table(s)" in err
    audit = [line for line in printed.splitlines() if line.startswith("audit: ")]
    assert len(audit) == len({line.split(": ")[2] for line in audit}) == 2            # truncated, far_keys
    assert all("3 tables (" in line for line in audit)


def test_the_file_name_legend_says_each_engines_form():
    """The closing table's legend (and drift's) gives the text every file name holds after its
    shape, as the files hold it: SGLang's block_shape=[128, 128] is said as SGLang's, not shown
    as vLLM's; and the folders are each engine's where they differ."""
    from tuner.emit.run_table import name_legend, where_lines
    vllm = ("vllm", "vllm/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    sglang = ("sglang", "sglang/fp8_gemm/N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert name_legend([vllm]) == "<shape>,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert name_legend([sglang]) == "<shape>,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert name_legend([vllm, sglang]) == ("<shape>,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
                                           " (sglang: [128, 128])")
    assert name_legend([vllm, ("vllm", vllm[1].replace("H200", "H100"))]) == ""    # no one text: the rows say it
    assert where_lines("OUT", [vllm, sglang]) == ["file: the table each row goes to, in OUT/<engine>/fp8_gemm/"]
    moe = [("sglang", "sglang/fused_moe/configs/triton_3_6_0/E=257,N=256.json"), ("vllm", "vllm/fused_moe/E=256,N=256.json")]
    assert where_lines("OUT", moe) == ["file: the table each row goes to, under OUT/:",
                                       "      vllm/fused_moe/, sglang/fused_moe/configs/triton_3_6_0/"]


def test_a_runs_far_keys_are_the_audits(tmp_path, capsys):
    """A run of M = 1 and 64 said its tables leave M=3-32 on the entry for 1, and nothing of M=129-4096 on the
    entry for 64 (it looked only up to the largest M tuned), where `tuner audit` of the same table says both
    first (a new user's finding): the run's line now names the audit's far ranges, word for word."""
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--batch-sizes", "1", "64", "--trials", "4", "--quiet", "--out", str(out)]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "hold only the batch sizes tuned (M=1,64)" in x)
    main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model", "deepseek-v3",
          "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(out / "vllm" / "fused_moe")])
    far = next(x for x in capsys.readouterr().out.splitlines() if "far_keys: M=" in x).split("far_keys: ", 1)[1]
    assert "M=129-4096 run the entry for 64" in far and f"(M=1,64): {far}; leave --batch-sizes out" in line, (far, line)
