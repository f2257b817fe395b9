"""What the README and the manual say the tool prints, and the figures they quote, checked against
what the tool prints and the files it read them from (issue 50, item 9). Each claim is quoted
from its page (a page edited away from it fails here, so the text and the check move together)
and then found in the output, `...` in a quoted example standing for any text.

Checked elsewhere: the commands run as written (tests/test_readme.py), the deployment line
(tests/test_deployments.py), the plan's trials and minutes (issue 48's tests), "windows add up"
(tests/test_windows.py). Not checkable by the tool: the suite's own run time on an idle machine
(README "Set up"), and the device minutes a lent machine counted."""

import json
import math
import os
import re
import zipfile
from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUN = REPO / "bench/results/H200-2026-11-27"
TOUR = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic", "--batch-sizes", "1",
        "64", "--trials", "8"]
OUT = "runs/moe-deepseek-v3-H200-tp8-synthetic"


def page(path: Path) -> str:
    """A page's text with its line breaks and runs of spaces as one space."""
    return " ".join(path.read_text().split())


def quoted(path: Path, text: str) -> str:
    """`text`, which the page must say (whitespace aside)."""
    assert " ".join(text.split()) in page(path), f"{path.name} no longer says: {text}"
    return text


def pattern(example: str) -> re.Pattern:
    """A quoted example as a regular expression: `...` any text, runs of spaces any run."""
    parts = [r"\s+".join(re.escape(w) for w in piece.split()) for piece in example.split("...")]
    return re.compile(".*?".join(parts))


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


# -- Status: the H200 run's figures, from its files -------------------------------------------
def _bench(rel: str) -> list[dict]:
    return json.loads((RUN / rel).read_text())["rows"]


def test_the_moe_figures_are_the_benchs():
    claim = quoted(README, "tuned vs the engine's shipped table, 15 cells (M = 1, 16, 64, 256, 1024 x vLLM's table, "
                           "SGLang's up and `_down`), 0.967x to 1.081x, geometric mean 1.017x")
    rows = {(r["kernel_source"], r["problem"], r["M"], r["contender"]): r["time_us"]
            for r in _bench("bench/moe/bench-NVIDIA_H200-2026-11-27.json")}
    cells = sorted({k[:3] for k in rows})
    shipped, default = [], []
    for c in cells:
        engine, version = c[0].split()
        tuned = rows.get((*c, "tuned"))
        if tuned and rows.get((*c, f"shipped {engine}-{version}")):
            shipped.append(rows[(*c, f"shipped {engine}-{version}")] / tuned)
        if tuned and rows.get((*c, "default")):
            default.append(rows[(*c, "default")] / tuned)
    lo, hi, mean = (float(x) for x in re.findall(r"(\d\.\d+)x", claim))
    assert f"{len(shipped)} cells" in claim and sorted({c[2] for c in cells}) == [1, 16, 64, 256, 1024]
    assert (round(min(shipped), 3), round(max(shipped), 3), round(gmean(shipped), 3)) == (lo, hi, mean)
    said = quoted(README, "tuned vs the engine's default config, geometric mean 1.22x")
    assert f"{gmean(default):.2f}x" in said
    # the fastest contender's share of the roofline floor, at each (table, M)
    fastest: dict = {}
    for r in _bench("bench/moe/bench-NVIDIA_H200-2026-11-27.json"):
        key = (r["kernel_source"], r["problem"], r["M"])
        if r["time_us"] and (key not in fastest or r["time_us"] < fastest[key]["time_us"]):
            fastest[key] = r
    fractions = [r["roofline_fraction"] for r in fastest.values()]
    said = quoted(README, "The fastest contender reaches 20-94% of the roofline floor.")
    assert f"{min(fractions):.0%}-{max(fractions):.0%}".replace("%-", "-") in said
    # the noise the gain is within, and the shipped config kept by vLLM's search
    noise = json.loads((REPO / "bench/noise/H200.json").read_text())["between_process"]["spread"]
    assert f"within the {noise:.1%} between-process noise" in quoted(
        README, "within the 3.1% between-process noise measured in that run, `bench/noise/H200.json`")
    manifest = json.loads((RUN / "tuned/moe/manifest.json").read_text())
    vllm = next(t for t in manifest["tables"] if "vllm" in t["files"])
    kept = [m for m, e in vllm["entries"].items() if (e.get("choice") or {}).get("kept") == "installed"]
    assert f"kept the shipped config at {len(kept)} of {len(vllm['entries'])} M" in quoted(
        README, "vLLM's search kept the shipped config at 4 of 5 M")


def test_the_gemm_figures_are_the_benchs():
    rows = _bench("extra/bench-gemm/bench-NVIDIA_H200-2026-11-27.json")
    shipped_small = [r["roofline_fraction"] for r in rows if r["contender"].startswith("shipped")
                     and r["M"] in (1, 16) and r["time_us"]]
    claim = quoted(README, "at M = 1 and 16 they run at 10-27% of the weight-read floor at 4.27 TB/s")
    assert f"{min(shipped_small):.0%}-{max(shipped_small):.0%}".replace("%-", "-") in claim
    copy = json.loads((RUN / "extra/bench-gemm/bench-NVIDIA_H200-2026-11-27.json").read_text())["ceiling_values"]
    assert f"{copy['copy_tb_s']:.2f} TB/s" in claim
    ratios = []
    for c in sorted({(r["kernel_source"], r["problem"]) for r in rows}):
        at = [r for r in rows if (r["kernel_source"], r["problem"]) == c and r["M"] == 1024 and r["time_us"]]
        shipped = [r["time_us"] for r in at if r["contender"].startswith("shipped")]
        scaled = [r["time_us"] for r in at if r["contender"].startswith("torch._scaled_mm")]
        if shipped and scaled:
            ratios.append(min(shipped) / min(scaled))
    claim = quoted(README, "is 1.33-1.80x faster than the best shipped config at M = 1024, and fails at M = 1 "
                           "(CUBLAS_STATUS_NOT_SUPPORTED)")
    assert f"{min(ratios):.2f}-{max(ratios):.2f}x" in claim
    assert all("CUBLAS_STATUS_NOT_SUPPORTED" in (r["error"] or "") for r in rows
               if r["M"] == 1 and r["contender"].startswith("torch._scaled_mm"))


def test_the_validation_and_step_figures_are_the_runs():
    proof = json.loads((RUN / "validate/kernels.json").read_text())["cases"]
    ours = json.loads((RUN / "extra/validate-ours.json").read_text())["cases"]
    ok = lambda cases: sum(c["numerics"]["status"] == "passed" for c in cases)  # noqa: E731
    claim = quoted(README, "Validation: 44 of 44 kernel cases within tolerance** against the float64 reference: 18 "
                           "of 18 in the proof")
    assert f"{ok(proof) + ok(ours)} of {len(proof) + len(ours)} kernel cases" in claim
    assert f"{ok(proof)} of {len(proof)} in the proof" in claim
    assert f"{ok(ours)} of {len(ours)} of ours" in quoted(README, "26 of 26 of ours (MLA decode included)")
    assert any(c["kernel"] == "mla_decode" for c in ours)
    steps = {s["name"]: s for s in json.loads((RUN / "steps.json").read_text())["steps"]}
    seconds = {name: f"{s['seconds']:.0f} s" for name, s in steps.items()}
    assert seconds["smoke"] in quoted(README, "smoke (33 s)")
    assert steps["validate"]["status"] == "out of time" and seconds["validate"] in quoted(
        README, "the step was cut by its time box at 61 s")
    assert seconds["tune-vllm"] in quoted(README, "vLLM 5 batch sizes in 106 s")
    assert seconds["tune-sglang"] in quoted(README, "SGLang 10 studies in 85 s")
    assert steps["bench-gemm"]["status"] == "out of time" and seconds["bench-gemm"] in quoted(
        README, "bench-gemm cut at 48 s in the proof")


# -- The try without a GPU: what its commands print -------------------------------------------
@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """The README's try without a GPU, run as written in a scratch folder (our kernels, piped),
    then again, then the audit the README runs over it: {name: (stdout, stderr)}."""
    import contextlib
    import io
    root = tmp_path_factory.mktemp("tour")
    said = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("TUNER_ENGINE_WHEELS", raising=False)
        mp.setenv("TUNER_CACHE_DIR", str(root / "cache"))
        for name, argv in (("run", TOUR), ("again", TOUR),
                           ("audit", ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0",
                                      "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir",
                                      f"{OUT}/vllm/fused_moe"]),
                           ("install", ["install", OUT, "--engine", "vllm", "--engine-version", "0.33.0",
                                        "--dry-run"]),
                           ("plan", ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8",
                                     "--dry-run"])):
            out, err = io.StringIO(), io.StringIO()
            if name == "run":
                mp.setenv("COLUMNS", "120")         # a 120-column terminal, as the README says; the rest piped
            else:
                mp.delenv("COLUMNS", raising=False)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
            said[name] = (code, out.getvalue(), err.getvalue())
    return root, said


def test_the_try_without_a_gpu_prints_what_the_readme_says(tour):
    root, said = tour
    code, out, err = said["run"]
    assert code == 0, err
    quoted(README, "tuner " + " ".join(TOUR))
    landscape = quoted(README, f"`{OUT}/synthetic-fused_moe.jsonl.gz`").strip("`")
    assert (root / landscape).is_file() and f"made {landscape}:" in out
    assert (root / OUT / "manifest.json").is_file() and quoted(README, f"writes the tables and `manifest.json` "
                                                                       f"under `{OUT}/`")
    # its closing table: the columns in the README's order, each row named by engine and shape
    quoted(README, "then M, config, time, the default config's time, speedup, trials, numerics)")
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("file "))
    assert lines[head].split()[:8] == ["file", "M", "config", "time_us", "default_us", "speedup", "trials",
                                       "numerics"]
    rows = lines[head + 1:head + 7]
    example = quoted(README, "e.g. `sglang E=257,N=256 _down` (marked `*` where that table came out the same as its "
                             "up table and is not written)")
    label = example.split("`")[1]
    down = [r for r in rows if r.startswith(label)]
    assert down, rows
    written = (root / OUT / "sglang/fused_moe/configs/triton_3_6_0").glob("*_down.json")
    assert all(r.startswith(label + ("" if list(written) else "*")) for r in down), down
    assert all(len(line) <= 120 for line in lines)
    # 8 configs per study: the trials column
    quoted(README, "8 configs per study")
    trials = [int(re.search(r"\s(\d+)\s+not checked", r).group(1)) for r in rows]
    assert trials == [8] * 6
    # headed by the SYNTHETIC banner, every progress line says SYNTHETIC, numerics not checked
    banner = quoted(README, "`*** SYNTHETIC cost model: nothing was measured; ... ***`").strip("`")
    assert any(pattern(banner).fullmatch(line.strip()) for line in lines[:head])
    progress = re.findall(r"^\[\d+/\d+\].*(?:\n    .*)*", err, re.M)       # each with its wrapped lines
    assert progress and all("SYNTHETIC" in line for line in progress), progress
    quoted(README, "every row's numerics are `not checked` (in the table's column and in `manifest.json`)")
    manifest = json.loads((root / OUT / "manifest.json").read_text())
    assert all(e["numerics"]["status"] == "not checked" for t in manifest["tables"] for e in t["entries"].values())
    assert all(" not checked " in r + " " for r in rows)
    # run again: it resumes, replaying the landscape it made
    quoted(README, "Run again, it resumes (replaying the landscape it made, not making it again).")
    code, out2, err2 = said["again"]
    assert code == 0 and f"replaying {landscape}, made by an earlier run" in out2 and "made " + landscape not in out2
    assert "6 of 6 studies finished before" in " ".join(err2.split())


def test_the_audit_and_install_say_what_the_pages_say(tour):
    _, said = tour
    code, out, err = said["audit"]
    assert code in (0, 1), err
    # README: its rows are SYNTHETIC; the two keys leave M 3 to 32 and 129 to 4096 far from their key
    claim = quoted(README, "(here: its rows are SYNTHETIC, never to be served, and the two keys of the synthetic run "
                           "leave M 3 to 32 and 129 to 4096 far from their key)")
    assert "not_measured: its rows were chosen on SYNTHETIC times, never measured on a GPU: no server should run" in out
    a, b, c, d = map(int, re.findall(r"\d+", claim.split("leave")[1]))
    assert f"far_keys: M={a}-{b} run the entry for 1" in out and f"M={c}-{d} run the entry for 64" in out
    # docs/install-and-audit.md's example of what that audit prints (its configs vary)
    doc = REPO / "docs/install-and-audit.md"
    text = doc.read_text()
    block = text[text.index("it prints\n\n```\n") + len("it prints\n\n```\n"):]
    block = block[:block.index("```")].splitlines()
    assert block and quoted(doc, "(configs vary with the synthetic landscape)")
    for line in block:
        example = re.sub(r"BM\d+ BN\d+ BK\d+ G\d+ w\d+ s\d+", "...", line)
        assert any(pattern(example).fullmatch(got.strip()) for got in out.splitlines()), (line, out)
    # README: the synthetic run is refused by install
    quoted(README, "(so the synthetic run above is refused)")
    code, out, err = said["install"]
    assert code == 2 and "its times are SYNTHETIC" in err and len(err.strip().splitlines()) == 1
    # README: the plan's first line names the deployment
    line = quoted(README, "`tp=8: the smallest that holds deepseek-v3's 669 GB of fp8 weights on H200s with room "
                          "for the KV cache; --tp to choose`").strip("`")
    code, out, err = said["plan"]
    assert code == 0 and (out + err).splitlines()[0] == " ".join(line.split())


@pytest.mark.ci_variables
@pytest.mark.skipif(not os.environ.get("TUNER_ENGINE_WHEELS"), reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")
def test_the_lines_install_quotes_from_the_engine_are_the_pages(tour, tmp_path, capsys, monkeypatch):
    """docs/install-and-audit.md's example of the lines vLLM logs, as install quotes them from its
    wheel after installing the tour's table into a config folder (--force: it is SYNTHETIC)."""
    root, _ = tour
    wheels = Path(os.environ["TUNER_ENGINE_WHEELS"])
    if not any(zipfile.is_zipfile(w) for w in wheels.glob("vllm-0.33.0-*.whl")):
        pytest.skip("no vllm 0.33.0 wheel in TUNER_ENGINE_WHEELS")
    monkeypatch.setenv("TUNER_BACKUP_DIR", str(tmp_path / "backups"))
    assert main(["install", str(root / OUT), "--engine", "vllm", "--engine-version", "0.33.0", "--moe-config-dir",
                 str(tmp_path / "cfg"), "--force", "--merge"]) == 0
    out = capsys.readouterr().out
    doc = REPO / "docs/install-and-audit.md"
    text = doc.read_text()
    block = text[text.index("e.g. for vLLM:\n\n```\n") + len("e.g. for vLLM:\n\n```\n"):]
    for line in block[:block.index("```")].splitlines():
        assert any(pattern(line).fullmatch(got.strip()) for got in out.splitlines()), (line, out)


def test_file_formats_names_every_key_an_engines_table_may_carry():
    """docs/file-formats.md said a table holds six keys, where SGLang's MoE tables carry USE_TMA and
    its GEMM tables SWAP_AB and SPLIT_K: its Tables section names every key of each engine kernel's
    rows (KernelSpec.config_keys, the optional ones among them) and no key no kernel has."""
    from tuner.plan.kernel_registry import get_kernel
    text = page(REPO / "docs" / "file-formats.md")
    section = text.split("## Tables", 1)[1].split("File names follow", 1)[0]
    keys = set()
    for source in ("vllm", "sglang"):
        for name in ("fused_moe", "fp8_gemm"):
            keys |= set(get_kernel(name, source, load_code=False).config_keys)
    named = set(re.findall(r"`?\b([A-Z][A-Z_]+[A-Z]|num_warps|num_stages)\b`?", section)) - {"JSON"}
    assert keys <= named, f"file-formats.md's Tables do not name {sorted(keys - named)}"
    assert named <= keys | {"MoE", "GEMM"}, f"file-formats.md's Tables name keys no table has: {sorted(named - keys)}"


def test_install_and_audit_lists_every_finding_kind():
    """Every finding kind the audit reports (tuner/emit/audit_rules.py KINDS) has its row in
    docs/install-and-audit.md's table of findings, and the table lists no kind the audit lacks."""
    from tuner.emit.audit_rules import KINDS
    rows = set(re.findall(r"^\| `([a-z_]+)` \| (?:error|warning|info)", (REPO / "docs/install-and-audit.md").read_text(),
                          re.M))
    assert rows == set(KINDS), (sorted(set(KINDS) - rows), sorted(rows - set(KINDS)))
