import os
import re
import sys
from pathlib import Path

# One thread for torch's and numpy's own pools (OpenMP, OpenBLAS) in the test processes and the
# processes they start, unless set: pytest-xdist already runs a worker per core, and the tensors
# here are small, so a second thread per process only waited on the other workers' (on 2 cores,
# the kernels' numerics files took 10-12% less CPU: test_engine_versions, test_moe_precision_kernels
# and test_fused_moe 85 s -> 75 s, -n 2, with the variables). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Without a GPU, Triton kernels run in Triton's interpreter (NumPy on the CPU).
try:
    import torch
    _has_gpu = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _has_gpu = False
if not _has_gpu:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest
from window_clock import clock  # noqa: E402,F401 (the fixture `clock`: a --minutes window's clock the test drives)


@pytest.fixture
def shared_dir():
    """../shared beside the checkout: the engines' facts and shipped tables."""
    d = Path(__file__).resolve().parents[2] / "shared"
    if not (d / "baselines").is_dir():
        pytest.skip("needs the engines' shipped tables in ../shared/baselines beside this checkout (kept "
                    "outside the repository; absent in a clone elsewhere)")
    return d


@pytest.fixture(scope="session")
def gemm_landscape(tmp_path_factory):
    """A SYNTHETIC landscape of DeepSeek-V3's TP8 GEMMs on the H200 at M = 1 and 64, made once
    for the bench tests (tests/test_bench.py, tests/test_bench_contenders.py); read only."""
    from tuner.cli import main
    path = tmp_path_factory.mktemp("land") / "gemm.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--batch-sizes", "1", "64", "--out", str(path)]) == 0
    return path


@pytest.fixture(autouse=True)
def _backups_in_tmp(tmp_path, monkeypatch):
    """`tuner install` backs up into ~/.cache by default; tests keep theirs in tmp_path."""
    from tuner.emit import install
    monkeypatch.setattr(install, "BACKUP_ROOT", tmp_path / "backups")
    # commands fit their output to $COLUMNS (tuner/textwidth.py): a developer's terminal width
    # must not change what the tests read (tests of the width set it themselves)
    monkeypatch.delenv("COLUMNS", raising=False)


# -- Which tests .ci/run runs where (CONTRIBUTING.md, docs/testing.md) -------------------------
# The README's test command runs every test in a plain clone (none of the variables below).
# .ci/run adds two runs that select by marker (registered in pyproject.toml):
#   -m ci_variables  (Triton 3.6, the variables set): the tests whose outcome depends on what
#                    .ci/run provides (engine wheels, the real landscapes' sdist, PostgreSQL,
#                    ../shared beside the checkout): they skip, or take another path, without it;
#   -m "triton and not triton_incidental"  (the newest Triton, the variables set): the tests whose
#                    outcome depends on Triton's version (they run a Triton kernel, ours or an
#                    engine's, in Triton's interpreter here or in a child process, compile one, or
#                    read the version), but those that run kernels only on the way to what they
#                    check (a process, a clock, a signal, the proof's rehearsal: triton_incidental),
#                    whose kernels the others check.
# Two guards keep the markers honest in every run, the plain one included: a test that skips
# for want of what .ci/run provides must be marked ci_variables, and a test that launches a
# Triton kernel in this process must be marked triton; either fails otherwise, saying so.
CI_PROVIDES = re.compile(r"TUNER_ENGINE_WHEELS|TUNER_REAL_SDISTS|TUNER_TEST_POSTGRES_URL|TUNER_REAL_LANDSCAPES"
                         r"|\.\./shared|/shared/|engines' wheels|engine-source fetch|is not installed in this Python")
_launched: list[bool] = [False]


def _watch_kernel_launches() -> None:
    """Note every launch in Triton's interpreter (where the kernels run without a GPU)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:  # pragma: no cover
        return
    launch = GridExecutor.__call__

    def noted(self, *args, **kwargs):
        _launched[0] = True
        return launch(self, *args, **kwargs)
    GridExecutor.__call__ = noted


_watch_kernel_launches()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _launched[0] = False        # a launch in the test's fixtures counts as the test's


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    problem = None
    if report.skipped and item.get_closest_marker("ci_variables") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if CI_PROVIDES.search(reason):
            problem = (f"{item.nodeid} skips for want of what .ci/run provides ({reason}) but is not marked "
                       "ci_variables: .ci/run's run with the variables would not select it (tests/conftest.py)")
    if call.when == "call" and _launched[0] and item.get_closest_marker("triton") is None:
        problem = (f"{item.nodeid} launched a Triton kernel but is not marked triton: .ci/run's run under the newest "
                   "Triton would not select it (tests/conftest.py)")
    if problem:
        report.outcome, report.longrepr = "failed", problem


# The test files that take longest (a module-wide set-up, such as the proof's rehearsal): with
# pytest-xdist (`-n auto --dist loadfile`, pyproject.toml) each file goes whole to one worker, in
# the order collected, so these go first and the workers end together. Longest first, by their CPU
# seconds in .ci/run's runs (2026-12-02): test_readme 360 in a plain clone (docs/nightly.md's night
# 300), test_proof 375 with the variables, then 150 to 45.
SLOW_FIRST = ("test_readme.py", "test_proof.py", "test_coverage.py", "test_moe_precisions_cpu.py",
              "test_engine_versions.py", "test_cpu_device.py", "test_windows.py", "test_capture_kernels.py",
              "test_moe_precision_kernels.py", "test_bad_input_faults.py", "test_workers.py", "test_engine_kernels.py",
              "test_routing.py", "test_output_width.py", "test_interruptions.py")


def pytest_collection_modifyitems(config, items):
    for item in items:       # ../shared is beside CI's checkout, never beside the plain clone
        if "shared_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ci_variables)
    # triton_incidental narrows triton: without it, the newest Triton's run would drop nothing, and
    # the plain run would not know the test runs kernels
    loose = [item.nodeid for item in items
             if item.get_closest_marker("triton_incidental") and not item.get_closest_marker("triton")]
    if loose:
        raise pytest.UsageError(f"marked triton_incidental but not triton: {', '.join(loose)} (tests/conftest.py)")
    if getattr(config.option, "numprocesses", None):
        rank = {name: i for i, name in enumerate(SLOW_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most 4 (each holds torch and
    Triton, and many tests start processes of their own)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))
