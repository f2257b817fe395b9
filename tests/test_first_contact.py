"""What a new user meets first (issue 41, items 7 and 8): the no-GPU refusal suggests only what
works here, within 120 columns; the GPU names people type are accepted (or get a did-you-mean);
the README's set-up pins the Triton its own audit names and says how to get the manual's tools."""

import re
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.plan.gpus import get_gpu

REPO = Path(__file__).resolve().parents[1]


def test_the_no_gpu_refusal_suggests_what_works_within_120_columns(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert len(line) <= 120, line
    assert "--dry-run" in line and "--synthetic" in line and "docs/cpu-device-and-proof.md" in line
    assert "--device cpu" not in line and "--replay" not in line     # neither runs as a bare suggestion
    assert (REPO / "docs" / "cpu-device-and-proof.md").is_file()
    page = (REPO / "docs" / "cpu-device-and-proof.md").read_text()
    assert re.search(r"tuner gemm --model configs/examples/small-moe\.json .*--device cpu --kernel-source ours", page)


@pytest.mark.parametrize("typed,key", [("H100 SXM", "H100"), ("H100 PCIe", "H100-PCIe"), ("H200 NVL", "H200-NVL"),
                                       ("h100-sxm5", "H100"), ("NVIDIA H200", "H200"), ("h20", "H20")])
def test_the_gpu_names_people_type_are_accepted(typed, key):
    assert get_gpu(typed).key == key


def test_a_misspelt_gpu_gets_a_did_you_mean(capsys):
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H2OO NVL", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "did you mean H200-NVL?" in err and len(err.strip().splitlines()) == 1
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "B200", "--dry-run"]) == 2
    assert "did you mean" not in capsys.readouterr().err          # another family is not a typo
    # as close to several: all of them, not the first (H300 suggested H800 alone, H200 as close)
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H300", "--dry-run"]) == 2
    assert "unknown GPU 'H300'; did you mean H100, H200 or H800? supported:" in capsys.readouterr().err


def test_the_readme_pins_the_triton_its_audit_names_and_says_how_to_build_the_manual():
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("##", 1)[0]
    pinned = re.search(r'pip install -e "\.\[test\]" "triton==([0-9.]+)"', setup)
    assert pinned, setup
    audited = set(re.findall(r"--triton ([0-9.]+)", readme))
    assert audited == {pinned.group(1)}
    assert 'pip install -e ".[docs]"' in readme.split("mkdocs build", 1)[0]


def test_the_mla_closing_table_tells_its_contexts_apart(tmp_path, capsys):
    """Messages that mislead (item 6): MLA decode's rows, one problem per context in one table
    file, each say their context instead of all carrying the same label. SYNTHETIC."""
    assert main(["mla", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--synthetic", "--batch-sizes", "1",
                 "--trials", "2", "--contexts", "4096", "32768", "--quiet", "--out", str(tmp_path / "o")]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if re.search(r"\s1\s+\d+ \d+ \d+", ln)]
    assert len(rows) == 2, rows
    assert "context=4096" in rows[0] and "context=32768" in rows[1]
