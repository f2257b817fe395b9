"""`tuner report BENCH.json` on bench files that are damaged, edited or made to attack
(tuner/jobs/bench_file.py): each is one line on stderr and exit 2, never an internal error,
and nothing of the file reaches the terminal unchecked; a bench whose times are all unusable
gets no verdict; a verdict's factor stays a few digits whatever the times (issue 51, items 6, 8
and 11)."""

import copy
import json
import re
from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
MOE_BENCH = REPO / "bench" / "results" / "H200-2026-11-27" / "bench" / "moe" / "bench-NVIDIA_H200-2026-11-27.json"
BASE = json.loads(MOE_BENCH.read_text())


def report(tmp_path, capsys, data=None, text=None):
    path = tmp_path / "bench.json"
    path.write_text(text if text is not None else json.dumps(data, allow_nan=True))
    rc = main(["report", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


def edited(change):
    data = copy.deepcopy(BASE)
    change(data)
    return data


def row0(field, value):
    return lambda d: d["rows"][0].__setitem__(field, value)


FORGED = "\x1b[2J\x1b[Hvllm: run --linear-backend triton: the best Triton config is 9.99x faster"

HOSTILE = {
    # item 6: what the terminal would have been sent
    "a banner of escapes": (lambda d: d.__setitem__("banner", FORGED), "banner holds control characters"),
    "a banner of two lines": (lambda d: d.__setitem__("banner", "times: x\nvllm: run it"), "control characters"),
    "a 5 MB banner": (lambda d: d.__setitem__("banner", "x" * 5_000_000), "5,000,000 characters"),
    "a kernel that is a list": (lambda d: d.__setitem__("kernel", ["x"]), "kernel must be a non-empty text"),
    "a problem of escapes": (row0("problem", "a\x1b[2Jb"), "problem holds control characters"),
    "a contender of escapes": (row0("contender", "tuned\x1b[31m"), "contender holds control characters"),
    # item 8: the row fields that were internal errors
    "M as 'abc'": (row0("M", "abc"), "M must be a batch size"),
    "M as '²'": (row0("M", "²"), "M must be a batch size"),
    "M as NaN": (row0("M", float("nan")), "M must be a batch size"),
    "M as Infinity": (row0("M", float("inf")), "M must be a batch size"),
    "M as null": (row0("M", None), "M must be a batch size"),
    "M as true": (row0("M", True), "M must be a batch size"),
    "M as 1.5": (row0("M", 1.5), "M must be a batch size"),
    "M as 0": (row0("M", 0), "M must be a batch size"),
    "problem as a list": (row0("problem", [1]), "problem must be a non-empty text"),
    "problem as an object": (row0("problem", {"a": 1}), "problem must be a non-empty text"),
    "kernel_source 5": (row0("kernel_source", 5), "kernel_source must be a non-empty text"),
    "kernel_source ''": (row0("kernel_source", ""), "kernel_source must be a non-empty text"),
    "kernel_source ' '": (row0("kernel_source", " "), "kernel_source must be a non-empty text"),
    "a denormal time": (lambda d: [r.__setitem__("time_us", 5e-324) for r in d["rows"]], "time_us must be a time"),
    "a time of 1e300": (row0("time_us", 1e300), "time_us must be a time"),
    "a negative time": (row0("time_us", -1.0), "time_us must be a time"),
    "a time as text": (row0("time_us", "fast"), "time_us must be a time"),
    "a time of NaN": (row0("time_us", float("nan")), "time_us must be a time"),
    "a row that is a list": (lambda d: d["rows"].__setitem__(0, [1, 2]), "row 1 is not an object"),
    "a row without M": (lambda d: d["rows"][0].pop("M"), "row 1 has no M"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_bench_file_is_one_line_and_exit_2(tmp_path, capsys, case):
    change, needle = HOSTILE[case]
    rc, out, err = report(tmp_path, capsys, edited(change))
    assert rc == 2 and out == "", (out[:300], err)
    assert len(err.strip().splitlines()) == 1 and needle in err and "internal error" not in err, err
    assert "\x1b" not in err and len(err) < 400, err          # the value named, escapes made visible, cut


@pytest.mark.parametrize("where", ['"M": 1,', '"time_us": 54.6719990670681'])
def test_a_number_of_5000_digits_is_one_line(tmp_path, capsys, where):
    key = where.split(":")[0]
    text = json.dumps(BASE).replace(where, f"{key}: {'9' * 5000}" + ("," if where.endswith(",") else ""), 1)
    rc, out, err = report(tmp_path, capsys, text=text)
    assert rc == 2 and "number too long" in err and "internal error" not in err, err


def test_a_bench_whose_times_are_all_unusable_gets_no_verdict(tmp_path, capsys):
    """Every contender failed: before, a verdict per problem ('runs its Triton kernel by default:
    ... no flag needed') and exit 0."""
    rc, out, err = report(tmp_path, capsys, edited(lambda d: [r.__setitem__("time_us", None) for r in d["rows"]]))
    assert rc == 2 and out == "" and "none of its 65 rows has a time" in err and "no verdict" in err, err


def test_a_problem_whose_times_are_all_unusable_gets_no_verdict_of_its_own(tmp_path, capsys):
    first = BASE["rows"][0]["problem"]

    def untimed(d):
        for r in d["rows"]:
            if r["problem"] == first:
                r["time_us"] = None
    rc, out, err = report(tmp_path, capsys, edited(untimed))
    assert rc == 0, err
    lines = out.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("vllm 0.33.0 ")]
    assert len(said) == 1 and lines[said[0]].endswith("nothing timed (every contender failed): no verdict")
    assert not lines[said[0] + 1].startswith("  vllm:")          # no flag advice from no time
    assert out.count("runs its Triton kernel by default") == 2    # sglang's two problems keep theirs


def test_the_committed_benches_read_back_whole(tmp_path, capsys):
    from tuner.jobs.bench_file import read_bench
    for path in sorted((REPO / "bench" / "results").rglob("bench-*.json")):
        bench = read_bench(path)
        assert len(bench.rows) == len(json.loads(path.read_text())["rows"]) > 0


def test_a_verdict_factor_is_a_few_digits_whatever_the_times():
    """Before: '{ratio:.2f}x' printed a time of 1e300 against 1 with 300 digits."""
    from tuner.emit.verdict import verdict_lines
    rows = [{"kernel_source": "vllm 0.33.0", "problem": "N=8,K=8,block_shape=[128,128]", "M": 1, "contender": c,
             "time_us": t} for c, t in (("tuned", 1.0), ("torch._scaled_mm", 1e300))]
    lines = verdict_lines(rows, "fp8_gemm", width=120)
    text = " ".join(lines)
    assert "run --linear-backend triton: the best Triton config is 1e+300x faster" in text, text
    assert not re.search(r"[0-9]{7}", text) and all(len(line) <= 120 for line in lines)
    from tuner.textwidth import factor
    assert (factor(1.2345), factor(123456.0), factor(float("nan"))) == ("1.23x", "1.23e+05x", "?x")


def test_a_verdict_over_many_problems_takes_time_in_proportion():
    """A bench file within the size bound may hold thousands of problems: each problem's rows
    were found by a scan of every verdict (8,000 problems: about a minute of CPU; a 64 MiB file,
    hours). Grouped once, a second. CPU time, not wall time: a busy machine does not fail it."""
    import time

    from tuner.emit.verdict import verdict_lines
    rows = [{"kernel_source": "vllm 0.33.0", "problem": f"N={i},K=7168", "M": 1, "contender": "tuned",
             "time_us": 1.0} for i in range(8000)]
    started = time.process_time()
    lines = verdict_lines(rows, "fp8_gemm")
    assert time.process_time() - started < 15
    assert sum(line.startswith("vllm 0.33.0 ") for line in lines) == 8000


def test_nothing_printed_drives_the_terminal(tmp_path, capsys):
    """Whatever printed it (a landscape's header through `landscape info`, an error naming a path
    with an escape in it), a control character or a bidirectional override reaches the terminal
    as its escape, never as itself (tuner/textwidth.py shown). Before: `landscape info` printed a
    header's '\\x1b[2J' raw, clearing the screen."""
    import gzip
    land = tmp_path / "l.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--kernel-source", "ours", "--batch-sizes", "1", "--out", str(land)]) == 0
    lines = gzip.open(land, "rt").read().splitlines()
    header = json.loads(lines[0])
    header["device"] = "X\x1b[2J\x1b[Hvllm: run it\u202e"
    (tmp_path / "evil.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    capsys.readouterr()
    assert main(["landscape", "info", str(tmp_path / "evil.jsonl")]) == 0
    assert main(["report", str(tmp_path / "no\x1b]0;retitled\x07such")]) == 2
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\u202e" not in out and "\x07" not in err
    assert "X\\x1b[2J\\x1b[Hvllm: run it\\u202e" in out and "no\\x1b]0;retitled\\x07such" in err, (out, err)
