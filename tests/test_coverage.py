"""`tuner coverage`: for the deployments people run, the table every engine version reads per
layer and what it is (shipped, fallback, tuned, default), as `tuner audit` says it; the K a
file name hides; the picture; and the README's statement of where tuning pays, from what the
command prints. The map reads the engines' tables from their released wheels
(TUNER_ENGINE_WHEELS): those tests skip without them (ci_variables)."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
WHEELS = os.environ.get("TUNER_ENGINE_WHEELS")
TRITON = "3.6.0"            # the GPU machines' Triton: the statuses below are SGLang's under it
needs_wheels = [pytest.mark.ci_variables,
                pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                                      "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")]


def coverage_json(capsys, *args) -> dict:
    assert main(["coverage", "--triton", TRITON, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    """`tuner coverage --json` over every model of configs/models/, every Hopper GPU and every
    supported engine version, as a user runs it (Triton 3.6.0), on an 80-column terminal: JSON is
    never fitted to it (a line break inside a string made it invalid)."""
    if not WHEELS:
        pytest.skip("the coverage map reads the engines' tables from their wheels: TUNER_ENGINE_WHEELS is not set")
    import contextlib
    import io
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("COLUMNS", "80")
        assert main(["coverage", "--triton", TRITON, "--json"]) == 0
    assert max(map(len, out.getvalue().splitlines())) > 80          # lines a terminal would have wrapped
    return json.loads(out.getvalue())


def rows_of(doc, **where):
    return [r for r in doc["rows"] if all(r[k] == v for k, v in where.items())]


@pytest.mark.ci_variables
def test_deepseek_v3_on_the_h200_as_the_issue_found_it(everything):
    """DeepSeek-V3 on the H200, vLLM 0.33.0 and SGLang 0.5.23 under Triton 3.6.0: at TP16 fp8
    vLLM's fused-MoE table does not exist (the default config runs); SGLang's falls back to the
    H200 table of its triton_3_3_1 folder (its _down to that up table); at TP8 fp8 vLLM's is
    shipped, SGLang's its triton_3_5_1 copy (fallback); SGLang's TP8 EP8 tables (E=32,N=2048)
    do not exist; vLLM's EP8 table is shipped but its default backend under EP does not read it."""
    def moe(engine, version, tp, ep=1, dtype="fp8_w8a8"):
        rs = rows_of(everything, model="deepseek-v3", gpu="H200", engine=engine, engine_version=version, tp=tp, ep=ep,
                     dtype=dtype, kernel="fused_moe")
        return {r["part"]: r for r in rs}
    tp16 = moe("vllm", "0.33.0", 16)
    assert tp16["op"]["status"] == "default" and tp16["op"]["file"].startswith("E=256,N=128,") and tp16["op"]["read"] is None
    s16 = moe("sglang", "0.5.23", 16)
    assert {p: r["status"] for p, r in s16.items()} == {"up": "fallback", "down": "fallback"}
    assert s16["up"]["read"].startswith("triton_3_3_1/E=257,N=128,device_name=NVIDIA_H200,")
    tp8 = moe("vllm", "0.33.0", 8)
    assert tp8["op"]["status"] == "shipped" and tp8["op"]["read_by_default"]
    s8 = moe("sglang", "0.5.23", 8)
    assert {p: r["status"] for p, r in s8.items()} == {"up": "fallback", "down": "fallback"}
    assert all(r["read"].startswith("triton_3_5_1/") and "triton_3_5_1" in r["why"] for r in s8.values())
    ep8 = moe("sglang", "0.5.23", 8, 8)
    assert {p: (r["status"], r["file"].split(",device")[0]) for p, r in ep8.items()} == {
        "up": ("default", "E=32,N=2048"), "down": ("default", "E=32,N=2048")}
    vep8 = moe("vllm", "0.33.0", 8, 8)["op"]
    assert vep8["status"] == "shipped" and not vep8["read_by_default"]
    # and the bf16 deployment (DeepSeek-V3 dequantized) only over two nodes: no table in either engine
    assert {r["status"] for r in rows_of(everything, model="deepseek-v3", gpu="H200", dtype="bf16", tp=16, ep=1,
                                         kernel="fused_moe")} == {"default"}
    assert not rows_of(everything, model="deepseek-v3", gpu="H200", dtype="bf16", tp=8)
    # the gains a committed GPU run measured, on the rows it measured
    assert tp8["op"]["gain_vs_default"] and tp8["op"]["measured_in"] == "bench/results/H200-2026-11-27"
    assert tp16["op"]["gain_vs_default"] is None


# -- every row agrees with `tuner audit` ----------------------------------------------------------
def audit_status(kernel: dict, cuda_name: str) -> tuple[str, str | None]:
    """(status, the file read) as the audit's JSON says it, by the statuses' definitions."""
    if not kernel["file"]:
        return "default", None
    name = Path(kernel["file"].split(":")[-1]).name
    device = re.search(r"device_name=([^,]+?)(?:,|_down\.json|\.json)", name).group(1)
    fallback = (kernel["how"] in ("Triton fallback", "the up table") or device != cuda_name.replace(" ", "_")
                or any(f["kind"] in ("far_keys", "truncated") for f in kernel["findings"]))
    return ("fallback" if fallback else "shipped"), kernel["file"]


@pytest.mark.ci_variables
def test_every_row_agrees_with_tuner_audit(everything, tmp_path):
    """Each row's audit command (`tuner audit`, as printed in the row) run as a user runs it:
    the table it resolves for the row's layer, and what that is, are the row's. Rows read
    alike by several deployments are checked once per audit command."""
    by_command: dict[str, list[dict]] = {}
    for r in everything["rows"]:
        by_command.setdefault(r["audit"], []).append(r)
    assert len(everything["rows"]) > 1000 and len(by_command) > 300
    import contextlib
    import io
    for i, (command, rows) in enumerate(by_command.items()):
        argv = command.split()[1:] + ["--out", str(tmp_path / str(i)), "--max-batch", "4096"]
        with contextlib.redirect_stdout(io.StringIO()):
            main(argv)
        audit = json.loads((tmp_path / str(i) / "audit.json").read_text())
        kernels = {(json.dumps(k["problem"], sort_keys=True)): k for k in audit["kernels"]}
        for r in rows:
            k = kernels[json.dumps(r["problem"], sort_keys=True)]
            status, read = audit_status(k, audit["gpu"])
            assert (r["status"], r["read_by_default"]) == (status, k["read_by_default"]), (command, r, k)
            assert (r["read"] is None) == (read is None) and (read is None or read.endswith(r["read"])), (command, r)
            assert k["lookup"] == r["file"]
        shutil.rmtree(tmp_path / str(i))


# -- K where the name has none ------------------------------------------------------------------------
def glm_like(tmp_path: Path) -> Path:
    """A model whose experts have DeepSeek-V3's count and width but K=6144 (as GLM-5.3's,
    vllm#54668): it reads DeepSeek-V3's files."""
    import yaml
    raw = yaml.safe_load((REPO / "configs" / "models" / "deepseek-v3.yaml").read_text())
    raw.update(name="glm-like", hidden_size=6144, architectures=["Glm4MoeForCausalLM"])
    path = tmp_path / "glm-like.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_a_file_name_shared_by_models_of_another_k_is_named(capsys, tmp_path):
    doc = coverage_json(capsys, "--model", "deepseek-v3", str(glm_like(tmp_path)), "--only-given", "--gpu", "H200",
                        "--engine", "vllm", "--kernel", "fused_moe")
    mine = rows_of(doc, model="glm-like", tp=8, ep=1, dtype="fp8_w8a8", engine_version="0.33.0")
    theirs = rows_of(doc, model="deepseek-v3", tp=8, ep=1, dtype="fp8_w8a8", engine_version="0.33.0")
    assert [r["file"] for r in mine] == [r["file"] for r in theirs]
    assert mine[0]["k_shared"] and mine[0]["k_shared_with"] == ["deepseek-v3 (K=7168)"]
    assert theirs[0]["k_shared"] and theirs[0]["k_shared_with"] == ["glm-like (K=6144)"]
    assert mine[0]["K"] == 6144 and theirs[0]["K"] == 7168
    # without it, DeepSeek-V3's files are read by no model of another K (DeepSeek-R1's K is the same)
    alone = coverage_json(capsys, "--model", "deepseek-v3", "deepseek-r1", "--only-given", "--gpu", "H200", "--engine",
                          "vllm", "--kernel", "fused_moe")
    assert alone["rows"] and not any(r["k_shared"] for r in alone["rows"])


# -- ours: tuned/ ------------------------------------------------------------------------------------------
def our_state(tmp_path: Path, K: int | None = None) -> Path:
    """tuned/NVIDIA_H200 copied, its vLLM table made whole (no partial mark), K rewritten if given."""
    root = tmp_path / "tuned"
    shutil.copytree(REPO / "tuned" / "NVIDIA_H200", root / "NVIDIA_H200", ignore=shutil.ignore_patterns("*.journal"))
    path = root / "NVIDIA_H200" / "manifest.json"
    manifest = json.loads(path.read_text())
    for t in manifest["tables"]:
        t.pop("partial", None)
        if K is not None:
            t["problem"]["K"] = K
    path.write_text(json.dumps(manifest))
    return root


@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_our_tables_are_tuned_where_the_engine_would_read_them_and_only_there(tmp_path, capsys):
    """A whole table of ours in tuned/ for this engine version, GPU, Triton and K makes its row
    `tuned`, and the row's audit command (pointed at it) reads it; the committed state is
    partial (5 of 18 batch sizes): shipped/fallback, with why not ours; tuned for another K:
    not ours, said."""
    from tuner.emit import coverage_sources
    from tuner.emit.coverage import coverage_map
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    insts, _ = coverage_sources.installations(["vllm", "sglang"], triton=TRITON)
    insts = [i for i in insts if i.version in ("0.33.0", "0.5.23", "0.32.0")]
    model = [("deepseek-v3", load_model("deepseek-v3"))]

    def tp8(roots):
        rows = coverage_map(model, [get_gpu("H200")], insts, roots, {}, ("fused_moe",)).rows
        return {(r.engine_version, r.part): r for r in rows if r.served.tp == 8 and r.served.ep == 1
                and r.dtype == "fp8_w8a8"}
    committed = tp8(coverage_sources.tuned_roots())
    assert committed[("0.33.0", "op")].status == "shipped" and "partial, 5 of 18" in committed[("0.33.0", "op")].ours
    whole = tp8(coverage_sources.tuned_roots(our_state(tmp_path / "a")))
    for key in (("0.33.0", "op"), ("0.5.23", "up"), ("0.5.23", "down")):
        assert whole[key].status == "tuned", whole[key]
        assert "--moe-config-dir" in whole[key].audit
        argv = whole[key].audit.split()[1:] + ["--out", str(tmp_path / "audit" / key[1])]
        main(argv)
        audit = json.loads((tmp_path / "audit" / key[1] / "audit.json").read_text())
        [k] = [k for k in audit["kernels"] if k["problem"] == whole[key].problem]
        assert str(tmp_path / "a" / "tuned") in k["file"] and not [f for f in k["findings"] if f["severity"] == "error"]
    assert whole[("0.32.0", "op")].status == "shipped" and "tuned on vllm 0.33.0's kernel" in whole[("0.32.0", "op")].ours
    other_k = tp8(coverage_sources.tuned_roots(our_state(tmp_path / "b", K=6144)))
    assert other_k[("0.33.0", "op")].status == "shipped" and "K=6144" in other_k[("0.33.0", "op")].ours


# -- output ----------------------------------------------------------------------------------------
@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_the_table_fits_120_columns_and_names_every_deployment(capsys, tmp_path):
    png = tmp_path / "coverage.png"
    assert main(["coverage", "--triton", TRITON, "--gpu", "H200", "--model", "deepseek-v3", "--only-given",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120
    assert lines[0].startswith("tuner coverage: 1 model x 1 GPU; "), lines[0]     # not "1 models x 1 GPUs"
    for deployment in ("TP8 ", "TP16 ", "TP8 EP8 "):
        assert any(ln.startswith(f"  {deployment}") for ln in lines), deployment
    assert re.search(r"^  TP16 +fp8 +vllm 0\.29\.0-0\.33\.0 +op E=256,N=128 +yes +default +no table", out, re.M)
    assert "tuner moe --model deepseek-v3 --gpu H200 --tp 16 --dtype fp8_w8a8 --engines vllm" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in out
    from tuner.file_kinds import PLOT
    assert PLOT.ours(png)                     # marked as tuner's: the next --plot replaces it, no other PNG


def test_the_plot_never_replaces_a_file_of_another_kind(tmp_path, capsys):
    """--plot is refused, in one line and before any work, unless it names a new .png in a
    folder that exists or a PNG image already there."""
    text = tmp_path / "notes.png"
    text.write_text("my notes")
    folder = tmp_path / "f.png"
    folder.mkdir()
    for target, why in ((text, "exists and is not a PNG image"), (tmp_path / "x.txt", "ending in .png"),
                        (tmp_path / "no" / "x.png", "does not exist"), (folder, "is a folder")):
        assert main(["coverage", "--plot", str(target)]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.splitlines()) == 1, err
    assert text.read_text() == "my notes" and not list(folder.iterdir())


def test_the_plot_never_replaces_a_png_tuner_did_not_draw(tmp_path, capsys):
    """A user's own PNG (no 'Software: tuner' text) was overwritten by --plot; docs/file-formats.md
    says a plot replaces only a PNG with that text. One line, before any work, the image kept."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mine = tmp_path / "holiday.png"
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(mine, format="png")
    plt.close(fig)
    before = mine.read_bytes()
    assert main(["coverage", "--plot", str(mine)]) == 2
    said, err = capsys.readouterr()
    assert err.splitlines() == [f"tuner: error: --plot {mine} exists and is a PNG image tuner did not draw (no "
                                "'Software: tuner' text): refusing to replace it (give another path)"] and not said
    assert mine.read_bytes() == before


def test_no_engine_at_hand_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_ENGINE_WHEELS", str(tmp_path))
    monkeypatch.setattr("tuner.plan.kernel_sources.fetched_wheels_dir", lambda: tmp_path / "none")
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "sglang") else
                        real(name, *a))
    assert main(["coverage", "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    from tuner.plan.engines import supported_releases
    assert err.startswith(f"tuner: error: no engine version is at hand: vllm {', '.join(supported_releases('vllm'))}: "
                          "no install and no wheel at hand") and len(err.splitlines()) == 1 and "Traceback" not in err


# -- the deployments and precisions a model is served with -------------------------------------------
def test_the_deployments_of_a_model_that_fills_a_node():
    from tuner.plan.deployment import served_deployments
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model
    dsv3 = load_model("deepseek-v3")
    served, notes = served_deployments(dsv3, get_gpu("H200"), "fp8_w8a8")
    assert [(s.label, s.kind, s.attention_tp) for s in served] == [
        ("TP8", "one node", 8), ("TP16", "two nodes", 16), ("TP8 EP8", "EP", 1)]
    served, notes = served_deployments(dsv3, get_gpu("H200"), "bf16")         # 1.3 TB: two nodes only
    assert [s.label for s in served] == ["TP16", "TP16 EP16"] and "do not fit one node" in notes[0]
    served, _ = served_deployments(dsv3, get_gpu("H100"), "fp8_w8a8")
    assert [s.label for s in served] == ["TP16", "TP16 EP16"]
    mixtral = load_model("mixtral-8x7b")
    assert [s.label for s in served_deployments(mixtral, get_gpu("H200"), "bf16")[0]] == ["TP1"]
    qwen = load_model("qwen3-235b-a22b-fp8")          # TP8 cuts its experts through a weight block
    served, notes = served_deployments(qwen, get_gpu("H100"), "fp8_w8a8")
    assert [s.label for s in served] == ["TP8 EP8"] and any("no TP8: --tp 8 leaves" in n for n in notes)


def test_asking_which_deployments_plan_says_nothing_of_what_an_engine_runs_none_of(caplog):
    """served_deployments plans each deployment only to learn whether it can be planned: the line that an
    engine runs no MoE of the precision is the tuning plan's (and coverage's note), not said per deployment
    (before: `tuner coverage` printed vLLM's "no int8_w8a8 tables planned" 3-5 times)."""
    import logging

    from tuner.plan.deployment import served_deployments
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model, moe_problems
    int8 = load_model("deepseek-v3-int8")
    with caplog.at_level(logging.WARNING, logger="tuner"):
        served, _ = served_deployments(int8, get_gpu("H200"), "int8_w8a8")
    assert [s.label for s in served] == ["TP8", "TP16", "TP8 EP8"]
    assert not [r for r in caplog.records if "tables planned" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="tuner"):       # the plan that tunes it still says it, once
        moe_problems(int8, 8, 1, "int8_w8a8")
    assert len([r for r in caplog.records if "vllm: no int8_w8a8 tables planned" in r.getMessage()]) == 1


def test_the_precisions_a_checkpoint_is_served_at():
    from tuner.plan.models import load_model
    from tuner.plan.precision import served_dtypes
    assert served_dtypes(load_model("deepseek-v3")) == ["fp8_w8a8", "bf16"]
    assert served_dtypes(load_model("mixtral-8x7b")) == ["bf16", "fp8_w8a8"]
    int4 = load_model(str(REPO / "configs" / "examples" / "small-moe.json"))
    int4.raw["quantization_config"] = {"quant_method": "awq", "bits": 4}
    assert served_dtypes(int4) == ["int4_w4a16"]


# -- what the README and docs/coverage.md say, from what the commands print --------------------------
@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_the_readme_says_where_tuning_pays_as_coverage_prints_it(capsys):
    """The README's counts per GPU are the lines `tuner coverage --gpu H100 H200 --kernel
    moe --triton 3.6.0` prints (the command the README names, which drew its picture; `moe`, as
    the other commands name the family, where coverage took only `fused_moe`),
    with the gains measured; its picture is there; and the window it says the next GPU run
    expects is what `tuner proof --plan` prints."""
    readme = (REPO / "README.md").read_text()
    assert "`tuner coverage --gpu H100 H200 --kernel moe --triton 3.6.0 --plot docs/coverage.png`" in readme
    assert main(["coverage", "--gpu", "H100", "H200", "--kernel", "moe", "--triton", TRITON]) == 0
    out = capsys.readouterr().out
    # the header's models and the summary's agree: it said "7 models x 2 GPUs", then "for 6 models' deployments"
    mapped = int(re.search(r"^tuner coverage: (\d+) models? x", out, re.M).group(1))
    pays = " ".join(out.split("where tuning pays:", 1)[1].split())
    paying = int(re.match(r".*? read by default for the deployments of (\d+) models?", pays).group(1))
    assert paying == mapped or f"{paying} models of the {mapped}" in pays, pays[:200]
    counts = re.findall(r"^  (H\d+: \d+ of \d+ run the engine's default config, .*)$", out, re.M)
    assert [c.split(":")[0] for c in counts] == ["H100", "H200"]
    for line in counts:
        assert f"- {line}\n" in readme, line
    measured = re.search(r"tuned vs the default config (\d\.\d+)x, tuned vs\s+the\s+shipped\s+table\s+(\d\.\d+)x", out)
    assert measured and f"at {measured.group(1)}x" in readme and f"at {measured.group(2)}x" in readme
    assert "fused-MoE tables vllm 0.33.0, sglang 0.5.23 read by default" in out
    assert "![" in readme and "(docs/coverage.png)" in readme
    assert (REPO / "docs" / "coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["proof", "--plan", "--gpu", "H200", "--call", "gpu"]) == 0
    plan = capsys.readouterr().out
    window = re.search(r"^this run's window \(\d+ s\) finishes: MoE vllm TP16 fp8 (\d+)/(\d+)", plan, re.M)
    assert window, plan
    assert re.search(rf"expects its window to tune {window.group(1)} of the {window.group(2)} batch sizes of vLLM's\s+"
                     r"DeepSeek-V3\s+TP16 fp8 MoE table", readme)


@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_the_docs_excerpt_is_what_coverage_prints(capsys):
    page = (REPO / "docs" / "coverage.md").read_text()
    excerpt = page.split("For DeepSeek-V3 on the H200")[1].split("```")[1].strip("\n").splitlines()
    assert len(excerpt) >= 8
    assert main(["coverage", "--gpu", "H200", "--model", "deepseek-v3", "--only-given", "--triton", TRITON]) == 0
    out = capsys.readouterr().out.splitlines()
    for line in excerpt:
        assert line in out, line


# -- nightly: `order: value` ---------------------------------------------------------------------------
def night_config(tmp_path: Path, order: str) -> Path:
    jobs = [("gemm-tp8", "gemm", 8), ("moe-tp8", "moe", 8), ("moe-tp16", "moe", 16)]
    text = f"order: {order}\nruns_dir: {tmp_path / 'runs'}\njobs:\n" + "".join(
        f"  - {{name: {n}, kernel: {k}, model: deepseek-v3, gpu: H200, tp: {tp}"
        + (", dtype: fp8_w8a8" if k == "moe" else "") + "}\n" for n, k, tp in jobs)
    path = tmp_path / "night.yaml"
    path.write_text(text)
    return path


@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_a_night_asked_to_orders_its_jobs_by_expected_value(tmp_path):
    """`order: value`: the MoE job whose tables run the default config (DeepSeek-V3 TP16 on the
    H200: vLLM has none) before the one whose tables are shipped or fall back (TP8), the GEMM
    job last, and the night says so; without it, the file's order (what `tuner nightly` runs:
    tuner/jobs/nightly.py takes its jobs from ordered_jobs)."""
    from tuner.jobs.nightly import load_config
    from tuner.jobs.nightly_order import ordered_jobs
    said = []
    ranked = ordered_jobs(load_config(night_config(tmp_path, "value")), said.append)
    assert [j["name"] for j in ranked] == ["moe-tp16", "moe-tp8", "gemm-tp8"]
    assert said[-1] == "order by expected value (tuner coverage): moe-tp16, moe-tp8, gemm-tp8"
    said.clear()
    assert [j["name"] for j in ordered_jobs(load_config(night_config(tmp_path, "file")), said.append)] == [
        "gemm-tp8", "moe-tp8", "moe-tp16"] and not said


def test_a_night_with_an_unknown_order_is_refused(tmp_path, capsys):
    assert main(["nightly", str(night_config(tmp_path, "fastest")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "order must be one of file, value, not 'fastest'" in err and len(err.splitlines()) == 1


@pytest.mark.ci_variables
@pytest.mark.skipif(not WHEELS, reason="the coverage map reads the engines' tables from their wheels: "
                                       "TUNER_ENGINE_WHEELS is not set (.ci/run provides it)")
def test_a_folder_extracted_for_the_gpu_machine_maps_as_its_wheel(tmp_path, capsys):
    """The GPU machine has no wheels, only what `tuner engine-source extract` put in .engine-src/
    (scripts/prepare_gpu_proof.sh): it keeps the engine's tables and loader files beside the
    kernel files, so the map (and the GPU run's work list) there is the wheel's."""
    folders = []
    for engine in ("vllm", "sglang"):
        out = tmp_path / engine
        assert main(["engine-source", "extract", "--engine", engine, "--out", str(out)]) == 0
        assert re.search(rf"and \d{{3}} config tables in {out}/", capsys.readouterr().out)
        folders.append(str(out))
    common = ["--model", "deepseek-v3", "--only-given", "--gpu", "H200", "--kernel", "fused_moe"]
    extracted = coverage_json(capsys, *common, "--engine-source", *folders)
    assert {e["source"] for e in extracted["engines"]} == {f"extracted in {f}" for f in folders}
    wheels = [r for r in coverage_json(capsys, *common)["rows"] if r["engine_version"] in ("0.33.0", "0.5.23")]
    keep = ("engine", "engine_version", "tp", "ep", "dtype", "part", "file", "read", "status", "why")
    assert [{k: r[k] for k in keep} for r in extracted["rows"]] == [{k: r[k] for k in keep} for r in wheels]


def test_each_wheel_is_read_once_when_audits_go_through_every_release(tmp_path):
    """`tuner coverage` and its rows' audit commands (run in one process by
    test_every_row_agrees_with_tuner_audit) go through the wheels of every release tuner knows,
    in turn: each wheel's zip directory is read once, not again for every audit. Before, the
    cache held 8 wheels for 10 releases, so going round them read every one again each time
    (that test: 68 s, then 16 s)."""
    import zipfile

    from tuner.emit.engine_tables import WheelFiles
    from tuner.plan.engines import supported_releases
    wheels = []
    for engine in ("vllm", "sglang"):
        for version in supported_releases(engine):
            wheels.append(tmp_path / f"{engine}-{version}-py3-none-any.whl")
            with zipfile.ZipFile(wheels[-1], "w") as z:
                z.writestr(f"{engine}/__init__.py", "")
    assert len(wheels) >= 10
    first = [WheelFiles.of(w) for w in wheels]
    assert all(WheelFiles.of(w) is files for w, files in zip(wheels, first))     # the second round reads none


def test_coverage_refuses_a_triton_that_is_not_a_version(capsys):
    assert main(["coverage", "--triton", "banana"]) == 2
    said, err = capsys.readouterr()
    assert err.splitlines() == ["tuner: error: argument --triton: not a Triton version: 'banana' (give X.Y.Z as "
                                "triton.__version__ says it, e.g. 3.6.0) (see `tuner coverage --help`)"] and not said
