"""Issue 50, item 10, the small ones: a window's length as a person reads it; no `%%` in any help;
a `_down` table that is not written named as its file in `report` and `diff` (not `ours: (no
file)`); a `_down` row kept as the incumbent pair at a speedup other than 1.00x says why; and one
rule of width for every command: fitted to a known terminal, whole lines when piped (`audit` and
`report` used to wrap at 120 when piped, `moe`, `nightly` and `install` did not)."""

import argparse
import re

import pytest

from tuner.cli import build_parser, main

RUN = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
       "--batch-sizes", "1", "8", "32", "128", "--trials", "12"]


@pytest.fixture(autouse=True)
def _no_engine_code(monkeypatch, tmp_path):
    """Our kernels time these runs (no engine wheel at hand): the rows below are theirs."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


def _piped(mp, root):
    mp.delenv("COLUMNS", raising=False)            # printed piped (whole lines), whatever test set it up
    mp.delenv("TUNER_ENGINE_WHEELS", raising=False)
    mp.setenv("TUNER_CACHE_DIR", str(root / "cache"))


TOUR = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
        "--batch-sizes", "1", "64", "--trials", "8"]         # the README's try: its `_down` table is not written


@pytest.fixture(scope="module")
def tours(tmp_path_factory):
    import contextlib
    import io
    root = tmp_path_factory.mktemp("tours")
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()):
        _piped(mp, root)
        assert main([*TOUR, "--out", str(root / "a")]) == 0
        assert main([*TOUR, "--out", str(root / "b")]) == 0
    return root / "a", root / "b"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two SYNTHETIC runs of the MoE tables (the second with another seed) and what the first printed."""
    import contextlib
    import io
    root = tmp_path_factory.mktemp("runs")
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(said):
        _piped(mp, root)
        assert main([*RUN, "--out", str(root / "a")]) == 0
        assert main([*RUN, "--seed", "3", "--out", str(root / "b")]) == 0
    return root / "a", root / "b", said.getvalue()


def test_a_windows_length_reads_as_a_person_would_say_it(tmp_path, capsys):
    """A night gives a job what is left of its slot (0.0196884 min); the window says 1.2 s."""
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--synthetic", "--only",
                 "N=7168,K=2048", "--engines", "vllm", "--batch-sizes", "1", "--trials", "3", "--minutes",
                 "0.0196884", "--out", str(tmp_path / "w")]) == 0
    said = capsys.readouterr().out
    window = next(line for line in said.splitlines() if line.startswith("window of"))
    assert window.startswith("window of 1.2 s:") and "0.0196884" not in window, window


def test_no_help_shows_a_doubled_percent():
    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)
    shown = {p.prog: p.format_help() for p in parsers(build_parser())}
    assert "tuner ceilings" in shown and "70% of the datasheet" in shown["tuner ceilings"]
    assert not [prog for prog, text in shown.items() if "%%" in text]


def test_report_and_diff_name_the_down_table_not_written(tours, capsys):
    a, b = tours
    for argv in (["report", str(a)], ["diff", str(a), str(b)]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "(no file)" not in out
        assert re.search(r"^sglang: E=257,N=256,.*_down\.json \(not written\)$", out, re.M), out
        assert "  not written: the same configs as sglang E=257,N=256 at every M" in out


def test_a_tied_tables_row_says_its_gain_is_the_pairs(runs):
    """SGLang's up and _down tables are kept or replaced together: the row column's gain is the pair's (both
    tables), marked so, where before a _down row at 1.00x showed the up table's "tuned +44.1%" unexplained."""
    _, _, said = runs
    rows = [line for line in said.splitlines() if line.startswith("sglang E=257,N=256")]
    gains = [row for row in rows if re.search(r"\s(tuned|default|installed) [+-]\d+\.\d%", row)]
    assert gains and all(row.endswith("% pair") for row in gains), rows
    vllm = [line for line in said.splitlines() if re.match(r"vllm E=256,N=256 .*\s(tuned|default) [+-]", line)]
    assert vllm and not any(row.endswith(" pair") for row in vllm), vllm      # a table tied to none: its own gain
    assert "row ... pair: tables tied together (one BLOCK_SIZE_M) are kept or replaced together" in said


def test_a_down_row_kept_as_the_pair_says_why_its_speedup_is_not_one(runs):
    _, _, said = runs
    rows = [line for line in said.splitlines() if line.startswith("sglang E=257,N=256 _down ")]
    odd = [int(row.split()[3]) for row in rows
           if re.search(r"\s(default|installed) [+-]", row) and not re.search(r"\s1\.00x\s", row)]
    assert odd, rows              # this run has one (M=32): a row of the pair kept, at 0.98x
    why = " ".join(said[said.index("_down at M="):].split())
    assert f"_down at M={','.join(map(str, odd))}: the row is the incumbent pair's" in why
    assert "its default_us times this table's own default" in why


def _lines(argv, capsys, columns=None, monkeypatch=None):
    if columns:
        monkeypatch.setenv("COLUMNS", str(columns))
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    main(argv)
    out, err = capsys.readouterr()
    return (out + err).splitlines()


def test_one_width_rule_for_every_command(runs, tmp_path, capsys, monkeypatch):
    """Piped (no terminal, no $COLUMNS) every command's long lines go whole, a problem key or a
    finding on one line to grep; on an 80-column terminal every line fits 80."""
    a, b, _ = runs
    commands = {
        "report": ["report", str(a)],
        "diff": ["diff", str(a), str(b)],
        "audit": ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--triton", "3.6.0", "--model",
                  "deepseek-v3", "--gpu", "H200", "--tp", "8", "--moe-config-dir", str(a / "vllm/fused_moe")],
        "install": ["install", str(a), "--engine", "sglang", "--engine-version", "0.5.23", "--dry-run", "--force"],
        "moe": [*RUN, "--out", str(a)],
    }
    whole = {"report": "  problem fused_moe E=257,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128],"
                       "shared_experts=1,part=up,routing=uniform",
             "diff": "  problem fused_moe E=257,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128],"
                     "shared_experts=1,part=down,routing=uniform",
             "audit": "far_keys: M=3-4 run the entry for 1 (up to 4x away)",
             "install": "*** SYNTHETIC: 2 of these 2 tables were chosen on times that never came from a GPU",
             "moe": "the 3 table(s) hold only the batch sizes tuned (M=1,8,32,128): M=3-4 run the entry for 1"}
    for name, argv in commands.items():
        piped = _lines(argv, capsys, monkeypatch=monkeypatch)
        assert any(whole[name] in line for line in piped), (name, piped)
        assert any(len(line) > 120 for line in piped), name        # nothing cut to 120 when piped
        narrow = _lines(argv, capsys, 80, monkeypatch)
        assert narrow and all(len(line) <= 80 for line in narrow), (name, [x for x in narrow if len(x) > 80])


def test_a_replayed_synthetic_landscape_says_no_kernel_ran(tmp_path, capsys, monkeypatch):
    """Its times are the cost model's, as --synthetic's: the closing table says so, not "[ours]" (before)."""
    _piped(monkeypatch, tmp_path)
    land = tmp_path / "s.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--batch-sizes", "1", "--out", str(land)]) == 0
    capsys.readouterr()
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land), "--trials", "3",
                 "--out", str(tmp_path / "r")]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fused MoE")]
    assert heads == ["fused MoE (sorted tokens, grouped GEMMs) [SYNTHETIC: no kernel ran]"], heads


def test_the_mla_closing_table_fits_120_columns_unwrapped(tmp_path, capsys, monkeypatch):
    """MLA decode's rows go to one table whose shape runs 59 columns: said once above the table, each row keeps the
    engine and its context. Before, its rows ran 129 columns (155 with two contexts), wrapped mid-row on a
    120-column terminal ('not' / 'checked'; found by a new-user pass)."""
    _piped(monkeypatch, tmp_path)
    assert main(["mla", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic", "--batch-sizes", "1", "8",
                 "--contexts", "1024", "4096", "--trials", "6", "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("file ") and " M " in ln)
    rows = [ln for ln in lines[head + 1:] if re.match(r"tuner ", ln)]
    assert [re.match(r"(tuner context=\d+) +(\d+) ", r).groups() for r in rows] == [
        ("tuner context=1024", "1"), ("tuner context=1024", "8"), ("tuner context=4096", "1"), ("tuner context=4096", "8")]
    assert all(len(ln) <= 120 and ln.endswith("not checked") for ln in rows), rows
    assert "      <shape>: heads=16,kv_lora_rank=512,qk_rope_dim=64,page_size=64" in lines[:head]


def test_no_row_showing_one_is_said_to_show_another_speedup(runs, tmp_path, capsys, monkeypatch):
    """The pair's note ('hence a speedup other than 1.00x') names only the rows whose speedup column is not 1.00x:
    a new user found it beside a row showing 1.00x. Run again into its folder, the first run's tables are shown
    stored, and each row named by the note shows another speedup."""
    a, _, _ = runs
    lines = _lines([*RUN, "--out", str(a)], capsys, monkeypatch=monkeypatch)
    rows = {(ln.split()[0] + " " + ln.split()[1] + (" _down" if " _down " in ln else ""), m.group(1)): m.group(2)
            for ln in lines if (m := re.match(r"sglang E=\S+(?: _down)? +(\d+) .* (~?\d+\.\d+x) ", ln))}
    for ln in lines:
        if (m := re.match(r"(sglang \S+(?: _down)?) at M=([\d,]+): the row is the incumbent pair's", ln)):
            for M in m.group(2).split(","):
                assert rows[(m.group(1), M)] not in ("1.00x", "~1.00x"), (ln, rows)


def test_a_table_of_same_rows_says_its_threshold(tmp_path):
    """Where every row is '(same)' (the search's best is the incumbent itself: no pair timed, no min_gain recorded),
    the row legend still says the run's threshold; it ended in a bare '--min-gain' (found by a new-user pass)."""
    from types import SimpleNamespace

    from tuner.emit.run_table import run_table_lines
    row = SimpleNamespace(M=1, config={"BLOCK_SIZE_M": 16}, time_us=5.0, default_time_us=5.0, default_error=None,
                          speedup=1.0, trials=4, numerics={"status": "passed"}, kept_default=None,
                          choice={"kept": "default", "incumbent": "default"})
    lines = run_table_lines({"p": [row]}, ("BLOCK_SIZE_M",), {"p": {"vllm": "vllm/fused_moe/E=8,N=64,x.json"}},
                            tmp_path, threshold=0.02)
    legend = lines[lines.index(next(ln for ln in lines if ln.startswith("row: tuned"))) + 1]
    assert legend.strip() != "--min-gain" and "2" in legend, lines
