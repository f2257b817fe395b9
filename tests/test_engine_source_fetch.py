"""`tuner engine-source fetch`: the engines' wheels downloaded with pip (really run, from a local
folder: no network) into the per-user cache the tool then reads by itself; checked against the
releases tuner knows; and the one-line error that names a missing engine says the command."""

import shutil
import zipfile

import pytest
from engine_loaders import wheel_dir

from tuner.cli import main
from tuner.errors import TunerError
from tuner.plan.kernel_sources import known_release_files, locate

WHEELS = wheel_dir()          # read before a test takes $TUNER_ENGINE_WHEELS away


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No engine installed, no $TUNER_ENGINE_WHEELS, a cache of its own."""
    monkeypatch.delenv("TUNER_ENGINE_WHEELS", raising=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "engine-wheels"


def fake_wheel(folder, engine, version, files):
    """A wheel pip takes (its metadata) holding `files` ({path in the wheel: text})."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{engine}-{version}-py3-none-any.whl"
    info = f"{engine}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in files.items():
            z.writestr(rel, text)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_a_missing_engine_is_said_with_the_command_that_fetches_it(clean_env):
    newest = sorted(known_release_files()["vllm"], key=lambda v: tuple(map(int, v.split("."))))[-1]
    with pytest.raises(TunerError) as e:
        locate("vllm")
    assert f"`tuner engine-source fetch vllm=={newest}`" in str(e.value) and "\n" not in str(e.value)


def test_fetch_runs_pip_into_the_cache_the_tool_then_reads(clean_env, tmp_path, capsys):
    """pip downloads (from a local folder) a version tuner does not know: kept with a note,
    found afterwards without any option; asking again downloads nothing."""
    source = fake_wheel(tmp_path / "index", "sglang", "9.9.9", {"sglang/__init__.py": ""})
    argv = ["engine-source", "fetch", "sglang==9.9.9", "--no-index", "--find-links", str(source.parent),
            "--trust-engine-source"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    cached = clean_env / source.name
    assert cached.read_bytes() == source.read_bytes() and f"sglang 9.9.9: {cached}" in out
    assert "not a release tuner knows" in err
    assert not [p for p in clean_env.iterdir() if p.name.startswith(".")]          # no temporary left
    code = locate("sglang")
    assert (code.version, code.kind, code.origin) == ("9.9.9", "wheel", str(cached.resolve()))
    source.unlink()                                       # in the cache already: pip is not asked again
    assert main(argv) == 0


def test_a_fetched_wheel_whose_kernel_files_are_not_the_release_is_not_kept(clean_env, tmp_path, capsys):
    version = sorted(known_release_files()["sglang"])[0]
    files = {rel: "# not the released file\n" for rel in known_release_files()["sglang"][version]}
    source = fake_wheel(tmp_path / "index", "sglang", version, files)
    rc = main(["engine-source", "fetch", f"sglang=={version}", "--no-index", "--find-links", str(source.parent)])
    err = capsys.readouterr().err
    assert rc == 2 and f"is not sglang {version}'s as released" in err.strip().splitlines()[-1]
    assert not clean_env.exists() or not list(clean_env.iterdir())


@pytest.mark.parametrize("spec,needle", [("vllm==", "ENGINE==VERSION"), ("torch==2.0", "ENGINE==VERSION"),
                                         ("sglang==9.9.9 --trust-engine-source",
                                          "pip could not download sglang==9.9.9")])
def test_fetch_refusals_are_one_line(clean_env, tmp_path, capsys, spec, needle):
    (tmp_path / "empty").mkdir()
    assert main(["engine-source", "fetch", *spec.split(), "--no-index", "--find-links", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert needle in err.strip().splitlines()[-1] and "Traceback" not in err


def test_a_release_tuner_does_not_know_is_refused_before_pip_runs(clean_env, monkeypatch, capsys):
    """`fetch vllm==0.35.0` ran pip (a download of ~400 MB) for a release no launcher knows;
    now one line before pip, unless --trust-engine-source asks for it."""
    from tuner.commands import engine_source

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran")
    monkeypatch.setattr(engine_source, "fetch", no_pip)
    assert main(["engine-source", "fetch", "vllm==0.35.0"]) == 2
    said, err = capsys.readouterr()
    known = ", ".join(sorted(known_release_files()["vllm"], key=lambda v: tuple(map(int, v.split(".")))))
    assert err.splitlines() == [f"tuner: error: vllm 0.35.0 is not a release tuner knows ({known}): fetch one of "
                                "those, or add --trust-engine-source to fetch it anyway (its kernels then run only "
                                "with --trust-engine-source)"] and not said
    assert not clean_env.exists()


def test_a_version_x_y_is_the_release_x_y_0(clean_env, tmp_path, capsys):
    """`fetch vllm==0.32` had pip download vllm-0.32.0 and then said 'pip left no vllm 0.32 wheel
    (it found [..., 'vllm-0.32.0-...whl'])': 0.32 is the release 0.32.0 (here a wheel whose files are
    not the release's, from a local folder: the check of 0.32.0's files is what refuses it)."""
    from tuner.commands.engine_source import parse_spec
    assert parse_spec("vllm==0.32") == ("vllm", "0.32.0") and parse_spec("sglang==0.5.21") == ("sglang", "0.5.21")
    files = {rel: "# not the released file\n" for rel in known_release_files()["vllm"]["0.32.0"]}
    source = fake_wheel(tmp_path / "index", "vllm", "0.32.0", files)
    assert main(["engine-source", "fetch", "vllm==0.32", "--no-index", "--find-links", str(source.parent)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not vllm 0.32.0's as released" in last and "pip left no" not in last, last


@pytest.mark.ci_variables
@pytest.mark.skipif(WHEELS is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")
def test_fetch_a_released_wheel_and_plan_on_it(clean_env, tmp_path, monkeypatch, capsys):
    """SGLang 0.5.21's released wheel, fetched by pip from the CI's wheel folder (no network),
    its kernel files checked; a plan of SGLang's own kernel then reads it from the cache."""
    local = tmp_path / "index"
    local.mkdir()
    for w in WHEELS.glob("sglang-0.5.21-*.whl"):
        shutil.copy(w, local)
    assert main(["engine-source", "fetch", "sglang==0.5.21", "--no-index", "--find-links", str(local)]) == 0
    capsys.readouterr()
    assert main(["moe", "--model", "configs/examples/small-moe.json", "--gpu", "H200", "--kernel-source", "sglang",
                 "--batch-sizes", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"read from {clean_env.resolve()}/sglang-0.5.21-" in out and "sglang 0.5.21" in out


def test_a_kill_9_of_fetch_takes_its_pip_with_it(tmp_path):
    """`tuner engine-source fetch` killed with SIGKILL (no handler of ours runs): the pip it
    started dies with it. A stand-in pip (first on PYTHONPATH, so `python -m pip` runs it) writes
    its pid and sleeps. Before: nothing tied pip to tuner and it kept downloading, orphaned."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    fake = tmp_path / "fakepip" / "pip"
    fake.mkdir(parents=True)
    pid_file = tmp_path / "pip.pid"
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                      "time.sleep(120)\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fakepip"), str(repo)]),
           "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TUNER_ENGINE_WHEELS", None)
    tuner = subprocess.Popen([sys.executable, "-m", "tuner", "engine-source", "fetch", "vllm==0.33.0", "--no-index"],
                             env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pip = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            assert tuner.poll() is None, "tuner ended before its pip started"
            time.sleep(0.05)
        pip = int(pid_file.read_text())
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pip):
            time.sleep(0.05)
        assert not _alive(pip), "pip outlived the tuner that started it"
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
        if pip is not None and _alive(pip):
            os.kill(pip, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
