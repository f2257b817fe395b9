"""The tables we ship under tuned/: the H200 run of 2026-11-27 (bench/results/H200-2026-11-27/),
installable with `tuner install --merge` into each engine's package from its released wheel,
marked partial (5 of the 18 batch sizes tuned), and audited clean after the install."""

import collections
import json
from pathlib import Path

import pytest
from engine_loaders import site_from_wheel, wheel, wheel_dir

from tuner.cli import main
from tuner.emit import partial
from tuner.emit.results import manifest_problem, read_manifest
from tuner.plan.engines import DEFAULT_BATCH_SIZES

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "tuned" / "NVIDIA_H200"
RUN = ROOT / "bench" / "results" / "H200-2026-11-27" / "tuned" / "moe"
TUNED_M = [1, 16, 64, 256, 1024]


def test_the_shipped_tables_are_the_runs_and_marked_partial():
    """Each table file is the one the GPU run wrote, byte for byte; the manifest is the run's
    with a partial marker the tools read (5 of the 18 planned batch sizes)."""
    manifest, run = read_manifest(TUNED), read_manifest(RUN)
    assert len(manifest["tables"]) == len(run["tables"]) == 3
    for table, ran in zip(manifest["tables"], run["tables"]):
        assert {k: v for k, v in table.items() if k != "partial"} == ran
        for rel in table["files"].values():
            assert (TUNED / rel).read_bytes() == (RUN / rel).read_bytes()
        part = partial.of_entry(table)
        assert part["tuned"] == TUNED_M and part["planned"] == DEFAULT_BATCH_SIZES
        assert part["left"] == [m for m in DEFAULT_BATCH_SIZES if m not in TUNED_M]
    bad = json.loads(json.dumps(manifest))
    bad["tables"][0]["partial"]["planned"] = ["1"]
    assert "partial.planned" in manifest_problem(bad)


def _audit(site: Path, engine: str, out: Path, capsys) -> tuple[dict, str]:
    code = main(["audit", "--engine", engine, "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--triton", "3.6.0", "--site-packages", str(site), "--moe-config-dir", "", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    return json.loads((out / "audit.json").read_text()), text


def _findings(audit: dict) -> collections.Counter:
    return collections.Counter((f["severity"], f["kind"]) for k in audit["kernels"] for f in k["findings"])


@pytest.mark.ci_variables
@pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_install_merge_from_tuned_then_audit_clean(tmp_path, capsys, engine):
    """Installed with --merge into the engine's package (its shipped tables from the wheel):
    the 5 tuned rows go in, every other batch size keeps the row the engine read before (for
    SGLang under Triton 3.6.0: its triton_3_5_1 table, the loader's fallback; a batch size
    planned that table has no key for gets the row of its nearest key there); install and
    audit say the table is partial; the audit finds no error and nothing it did not before."""
    if wheel(engine) is None:
        pytest.skip(f"no {engine} wheel in TUNER_ENGINE_WHEELS")
    site = site_from_wheel(engine, None, tmp_path / "site")
    before, _ = _audit(site, engine, tmp_path / "before", capsys)
    moe_before = [k for k in before["kernels"] if k["kind"] == "fused_moe"]
    assert moe_before and all(k["file"] for k in moe_before)
    read_before = {k["part"]: json.loads(Path(k["file"]).read_text()) for k in moe_before}

    assert main(["install", str(TUNED), "--engine", engine, "--site-packages", str(site), "--merge",
                 "--gpu", "H200"]) == 0
    said = capsys.readouterr()
    assert said.err.count("partial: ") == len(moe_before) and "M=1,16,64,256,1024 only" in said.err

    after, text = _audit(site, engine, tmp_path / "after", capsys)
    assert sum(f["severity"] == "error" for k in after["kernels"] for f in k["findings"]) == 0
    assert not _findings(after) - _findings(before)
    assert text.count("partial: ") == len(moe_before)
    manifest = read_manifest(TUNED)
    for k in (k for k in after["kernels"] if k["kind"] == "fused_moe"):
        installed = json.loads(Path(k["file"]).read_text())
        assert "triton_3_6_0" in k["file"] or engine == "vllm"
        ours = next(t for t in manifest["tables"] if t["problem"].get("part", "op") == k["part"]
                    or (t["problem"]["part"] == "op" and engine == "vllm"))
        tuned = json.loads((TUNED / ours["files"][engine]).read_text())
        old = read_before[k["part"]]
        old_keys = [int(m) for m in old if m.isdigit()]
        assert sorted(map(int, (m for m in installed if m.isdigit()))) == sorted(
            {*TUNED_M, *old_keys, *DEFAULT_BATCH_SIZES})
        for m in TUNED_M:
            assert installed[str(m)] == tuned[str(m)]
        for m in (m for m in old if m.isdigit() and int(m) not in TUNED_M):
            assert installed[m] == old[m]          # a batch size not tuned runs what it ran before
        for m in (m for m in DEFAULT_BATCH_SIZES if m not in TUNED_M and m not in old_keys):
            # planned, not tuned, no key of its own: the row the engine read there (its nearest key's)
            assert installed[str(m)] == old[str(min(old_keys, key=lambda k: abs(k - m)))]


def test_audit_of_the_tuned_folder_says_its_tables_are_partial(capsys):
    """Audited where it lies (not installed), a shipped table says it is partial, from its run's manifest, as the
    README says ('tuner install and tuner audit say so'); before, audit said so only of an installed one (found by
    a new-user pass)."""
    assert main(["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                 "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(TUNED / "vllm" / "fused_moe")]) in (0, 1)
    out = capsys.readouterr().out.replace("\n    ", " ")
    name = next(iter(read_manifest(TUNED)["tables"][0]["files"].values())).rsplit("/", 1)[-1]
    assert f"partial: {name} was tuned at M=1,16,64,256,1024 only (5 of the 18 batch sizes planned" in out, out[-2000:]
    assert "not installed: M=2,4,8,24" in out
