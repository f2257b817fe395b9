"""The SYNTHETIC mark travels with a table (issue 41, item 4): a forced install of tables no
device timed records it, and the audit of the engine's folder says so (not "on NVIDIA H200",
as if measured); the audit of the run's own folder calls it the run's table, not a shipped one."""

import json
from pathlib import Path
from types import SimpleNamespace

from test_bad_input_faults import GEMM_FOLDER, make_results, make_site

from tuner.cli import main


def synthetic_results(root: Path) -> Path:
    results = make_results(root, warps=8, count=2)
    manifest = json.loads((results / "manifest.json").read_text())
    for t in manifest["tables"]:
        t["environment"]["synthetic"] = True
    (results / "manifest.json").write_text(json.dumps(manifest))
    return results


def audited(where: Path) -> str:
    from tuner.commands.audit import policy_lines
    [line] = policy_lines(SimpleNamespace(kernels=[SimpleNamespace(resolved=SimpleNamespace(found=True),
                                                                   where=str(where))]), "vllm")
    return line


def test_a_forced_install_of_synthetic_tables_keeps_the_mark(tmp_path, capsys):
    from tuner.emit import install
    site, results = make_site(tmp_path / "site", count=2), synthetic_results(tmp_path / "r")
    assert main(["install", str(results), "--engine", "vllm", "--site-packages", str(site), "--force"]) == 0
    said = capsys.readouterr()
    assert "SYNTHETIC" in said.out + said.err and "timed on our kernels" not in said.out + said.err
    [record] = (install.BACKUP_ROOT).glob("vllm-*/record.json")
    entries = json.loads(record.read_text())["files"]
    assert entries and all(e["timed_on"]["not_a_gpu"] == "SYNTHETIC" for e in entries)
    installed = sorted((site / GEMM_FOLDER).glob("*.json"))[0]
    line = audited(installed)
    assert "SYNTHETIC" in line and "never measured on a GPU" in line and "on NVIDIA H200" not in line, line
    # the run's own folder, audited where it was written: the run's table, SYNTHETIC, not "a shipped table"
    own = audited(next((results / "vllm").rglob("*.json")))
    assert "a table of the tuner run" in own and "SYNTHETIC" in own and "shipped" not in own, own
    capsys.readouterr()
