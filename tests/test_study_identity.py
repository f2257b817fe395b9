"""What resumable state is of: studies, plans, landscapes and manifests record the device,
whose kernel code (source, version, a hash of the code), the search space and the Triton;
reopened with another, they refuse with one line instead of reusing timings of something
else (SYNTHETIC landscapes and a FAKE measurer, on a CPU)."""

import dataclasses
import gzip
import json
import logging

import optuna
import pytest
import triton
from synthetic import fake_time_us, write_synthetic_landscape

from tuner.cli import main
from tuner.errors import TunerError
from tuner.measure.landscape import LandscapeWriter, Point
from tuner.measure.measurers import Measurement, NumericsCheck, ReplayMeasurer
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace, load_space
from tuner.search.runner import SearchSettings, StudyRunner, study_name

KERNEL = get_kernel("fp8_gemm")
GPU = get_gpu("H200")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
PROBLEM = Problem("fp8_gemm", P)


class FakeMeasurer:
    """Times configs by the synthetic cost model; says what a GPU measurer says of itself."""
    label = "gpu"

    def __init__(self, kernel=KERNEL, triton="3.6.0", device="NVIDIA H200", policy=None):
        self.kernel, self.env = kernel, {"device": device, "triton": triton, **({"policy": policy} if policy else {})}

    def environment(self):
        return dict(self.env)

    def candidates(self, problem, M):
        return None

    def measure(self, problem, M, configs):
        return [Measurement(t, 0.01) if (t := fake_time_us(problem.params, M, c)) else Measurement(None, None, "x")
                for c in configs]

    def check_numerics(self, problem, M, config):
        return NumericsCheck("passed", 0.001, "fake")

    def close(self):
        pass


def tune_once(storage, measurer, space=None, kernel=KERNEL, budget=6):
    runner = StudyRunner(kernel, space or load_space(KERNEL), GPU, measurer, storage,
                         SearchSettings(budget=budget, patience=100, batch=3, seed=1))
    return runner.tune(PROBLEM, 16, [])


def stored_identity(storage):
    return optuna.load_study(study_name=study_name(PROBLEM, 16), storage=storage).user_attrs["identity"]


def test_a_study_records_what_it_was_timed_on():
    storage = optuna.storages.InMemoryStorage()
    space = load_space(KERNEL)
    tune_once(storage, FakeMeasurer(), space)
    assert stored_identity(storage) == {"device": "NVIDIA H200", "kernel": "ours", "code_version": KERNEL.code_version,
                                        "space": space.version, "triton": "3.6.0", "times": "GPU",
                                        "timing": None, "l2": None, "routing": None, "clocks": None}
    # a measurer that says how it times (every device measurer does: tuner/measure/policy.py)
    storage = optuna.storages.InMemoryStorage()
    tune_once(storage, FakeMeasurer(policy={"timing": "eager", "l2": "warm", "clocks": "unlocked"}), space)
    assert {k: stored_identity(storage)[k] for k in ("timing", "l2", "clocks")} == \
        {"timing": "eager", "l2": "warm", "clocks": "unlocked"}


@pytest.mark.parametrize("change,needle", [
    (lambda: {"kernel": dataclasses.replace(KERNEL, code_version="0123456789abcdef")}, "code_version"),
    (lambda: {"measurer": FakeMeasurer(triton="3.7.0")}, "triton 3.6.0 (now 3.7.0)"),
    (lambda: {"measurer": FakeMeasurer(device="NVIDIA H100 80GB HBM3")}, "device NVIDIA H200 (now NVIDIA H100"),
    # results taken under another measurement policy are never resumed into this one
    (lambda: {"first": {"timing": "graph", "l2": "cold"}, "measurer": FakeMeasurer(policy={"timing": "eager",
                                                                                          "l2": "cold"})},
     "timing graph (now eager)"),
    (lambda: {"first": {"timing": "graph", "l2": "cold"}, "measurer": FakeMeasurer(policy={"timing": "graph",
                                                                                          "l2": "warm"})},
     "l2 cold (now warm)"),
    (lambda: {"space": SearchSpace(KERNEL, {**load_space(KERNEL).choices, "num_stages": [3, 4]},
                                   load_space(KERNEL).constraints)}, "space "),
])
def test_a_study_timed_on_something_else_is_refused(change, needle):
    storage = optuna.storages.InMemoryStorage()
    kw = change()
    first = tune_once(storage, FakeMeasurer(policy=kw.get("first")))
    kernel = kw.get("kernel", KERNEL)
    measurer = kw.get("measurer", FakeMeasurer(kernel))
    with pytest.raises(TunerError, match="already holds study") as e:
        # a finished study included: its stored result must not be handed back either
        tune_once(storage, measurer, kw.get("space"), kernel)
    assert needle in str(e.value) and "give another --out" in str(e.value)
    study = optuna.load_study(study_name=study_name(PROBLEM, 16), storage=storage)
    assert study.user_attrs["result"]["config"] == first.config        # nothing was overwritten


def test_the_same_identity_resumes_and_an_older_study_is_adopted():
    storage = optuna.storages.InMemoryStorage()
    tune_once(storage, FakeMeasurer(), budget=4)
    assert tune_once(storage, FakeMeasurer(), budget=8).trials == 8     # resumed: 4 more
    study = optuna.load_study(study_name=study_name(PROBLEM, 16), storage=storage)
    # a study stored before identities existed: no identity, an environment on the same device
    older = optuna.create_study(study_name=study_name(PROBLEM, 32), storage=storage)
    older.set_user_attr("environment", {"device": "NVIDIA H200"})
    runner = StudyRunner(KERNEL, load_space(KERNEL), GPU, FakeMeasurer(), storage,
                         SearchSettings(budget=4, patience=100, batch=2, seed=1))
    runner.tune(PROBLEM, 32, [])
    assert optuna.load_study(study_name=older.study_name, storage=storage).user_attrs["identity"]["device"] \
        == "NVIDIA H200"
    # ...and one whose environment names another device is refused
    other = optuna.create_study(study_name=study_name(PROBLEM, 64), storage=storage)
    other.set_user_attr("environment", {"device": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(TunerError, match="device NVIDIA H100 80GB HBM3 \\(now NVIDIA H200\\)"):
        runner.tune(PROBLEM, 64, [])
    assert study.user_attrs["identity"]["triton"] == "3.6.0"


def test_another_gpus_results_in_the_same_out_are_refused(tmp_path, capsys):
    """The same --out for an H200 run and then an H100 run: the second refuses (one line)
    instead of writing an H100 table from H200 timings (issue 11, item 7)."""
    for gpu, device in (("H200", "NVIDIA H200"), ("H100", "NVIDIA H100 80GB HBM3")):
        write_synthetic_landscape(tmp_path / f"{gpu}.jsonl", KERNEL, load_space(KERNEL), get_gpu(gpu), [P], [1],
                                  device=device)
    args = ["gemm", "--model", "deepseek-v3", "--tp", "8", "--per-rank", "--batch-sizes", "1", "--trials", "6",
            "--out", str(tmp_path / "out"), "--quiet"]         # --per-rank: TP8 does not hold it on H100s
    assert main([*args, "--gpu", "H200", "--replay", str(tmp_path / "H200.jsonl")]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    identity = manifest["tables"][0]["identity"]
    assert identity["device"] == "NVIDIA H200" and identity["code_version"] == KERNEL.code_version
    assert identity["space"] == load_space(KERNEL).version and identity["triton"] == triton.__version__
    before = (tmp_path / "out" / "manifest.json").read_text()
    capsys.readouterr()
    assert main([*args, "--gpu", "H100", "--replay", str(tmp_path / "H100.jsonl")]) == 2
    err = capsys.readouterr().err
    # its tables say whose they are first (tests/test_cli_errors.py); without them, its studies do
    assert len(err.splitlines()) == 1 and "holds tables for H200" in err and "this run is for H100" in err, err
    assert (tmp_path / "out" / "manifest.json").read_text() == before
    (tmp_path / "out" / "manifest.json").rename(tmp_path / "manifest.json")
    assert main([*args, "--gpu", "H100", "--replay", str(tmp_path / "H100.jsonl")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "device NVIDIA H200 (now NVIDIA H100 80GB HBM3)" in err
    assert not list((tmp_path / "out").rglob("*H100*"))


def test_an_edited_space_in_the_same_out_is_refused(tmp_path, capsys):
    land = tmp_path / "land.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), GPU, [P], [1])
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1", "--trials", "6",
            "--replay", str(land), "--out", str(tmp_path / "out"), "--quiet"]
    assert main(args) == 0
    edited = tmp_path / "space.yaml"
    text = load_space(KERNEL).source
    edited.write_text(open(text).read().replace("num_stages: [", "num_stages: [7, "))
    capsys.readouterr()
    assert main([*args, "--space", str(edited)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "already holds a plan" in err and "space " in err


def write_landscape(path, header, rows=()):
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_replay_refuses_a_landscape_of_other_code_and_notes_an_old_one(tmp_path, caplog):
    cfg = KERNEL.default_config(P, 16)
    row = {"problem": P, "M": 16, "config": cfg, "time_us": 10.0}
    base = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200", "triton": "3.6.0"}
    write_landscape(tmp_path / "other.jsonl", {**base, "code_version": "0123456789abcdef"}, [row])
    with pytest.raises(TunerError, match="recorded on other code of ours's fp8_gemm"):
        ReplayMeasurer.from_file(str(tmp_path / "other.jsonl"), KERNEL, "NVIDIA H200")
    write_landscape(tmp_path / "same.jsonl", {**base, "code_version": KERNEL.code_version}, [row])
    with caplog.at_level(logging.WARNING, logger="tuner"):
        m = ReplayMeasurer.from_file(str(tmp_path / "same.jsonl"), KERNEL, "NVIDIA H200")
    assert not caplog.records and m.environment()["code_version"] == KERNEL.code_version
    write_landscape(tmp_path / "old.jsonl", base, [row])                # recorded before code versions
    with caplog.at_level(logging.WARNING, logger="tuner"):
        m = ReplayMeasurer.from_file(str(tmp_path / "old.jsonl"), KERNEL, "NVIDIA H200")
    assert [r.getMessage() for r in caplog.records] == [
        f"landscape {tmp_path / 'old.jsonl'} predates code versions: its timings are taken as of this fp8_gemm "
        f"code ({KERNEL.code_version})"]
    # its studies say the code is unknown rather than claim this code's
    assert m.measure(PROBLEM, 16, [cfg])[0].time_us == 10.0 and m.environment()["code_version"] is None


@pytest.mark.parametrize("key,old,new", [("code_version", "aaaa", "bbbb"), ("triton", "3.5.1", "3.6.0"),
                                         ("space", "s1", "s2"), ("kernel_source_version", "0.33.0", "0.34.0")])
def test_a_partial_recording_of_something_else_is_not_continued(tmp_path, key, old, new):
    header = {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200"}
    partial = tmp_path / "land.jsonl.partial"
    cfg = KERNEL.default_config(P, 1)
    write_landscape(partial, {**header, key: old}, [{"problem": P, "M": 1, "config": cfg, "time_us": 3.0}])
    with pytest.raises(TunerError, match=f"another {key} {old} \\(now {new}\\)"):
        LandscapeWriter(tmp_path / "land.jsonl", KERNEL, {**header, key: new})
    assert partial.read_text().count("\n") == 2                         # left as it was
    # the same header, or one of an older recording that lacks the key: continued
    w = LandscapeWriter(tmp_path / "land.jsonl", KERNEL, {**header, key: old})
    assert w.has(P, 1, cfg)
    w.close()
    write_landscape(partial, header, [{"problem": P, "M": 1, "config": cfg, "time_us": 3.0}])
    w = LandscapeWriter(tmp_path / "land2.jsonl", KERNEL, {**header, key: new})
    w.close()


def test_a_recorded_landscape_names_its_code_and_space(tmp_path):
    from tuner.measure.landscape import landscape_source
    assert landscape_source(KERNEL) == {"code_version": KERNEL.code_version}
    path = tmp_path / "l.jsonl.gz"
    w = LandscapeWriter(path, KERNEL, {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200",
                                       **landscape_source(KERNEL), "space": load_space(KERNEL).version})
    w.write(P, 1, KERNEL.default_config(P, 1), Point(None, "CompilationError: at 1:2"))
    w.close()
    with gzip.open(path, "rt") as f:
        header, line = (json.loads(x) for x in f.read().splitlines())
    assert header["code_version"] == KERNEL.code_version and header["space"] == load_space(KERNEL).version
    assert line["error"].startswith("CompilationError") and line["failure"] == "compile"


def test_the_space_version_is_the_content_not_the_path(tmp_path):
    space = load_space(KERNEL)
    copy = tmp_path / "copy.yaml"
    copy.write_text(open(space.source).read())
    assert load_space(KERNEL, copy).version == space.version
    rebuilt = SearchSpace(KERNEL, json.loads(json.dumps(space.choices)), json.loads(json.dumps(space.constraints)))
    assert rebuilt.version == space.version                              # as a worker rebuilds it from a plan
    fewer = SearchSpace(KERNEL, {**space.choices, "num_warps": [4]}, space.constraints)
    assert fewer.version != space.version


# -- where the times came from: never reuse synthetic results -------------------------------------
def _landscapes(tmp_path):
    """A SYNTHETIC landscape, and two 'recorded' ones (the same points, header not synthetic;
    the second with one time changed): what the study identity must tell apart."""
    synth = tmp_path / "synth.jsonl"
    write_synthetic_landscape(synth, KERNEL, load_space(KERNEL), GPU, [P], [1, 16])
    lines = synth.read_text().splitlines()
    header = json.loads(lines[0])
    del header["synthetic"]
    header.update(torch="2.13.0", cuda="12.8", driver="570.1", code_version=KERNEL.code_version)
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    point = json.loads(lines[1])
    point["time_us"] = (point.get("time_us") or 10.0) * 1.5
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join([json.dumps(header), json.dumps(point), *lines[2:]]) + "\n")
    return synth, recorded, other


def test_studies_timed_on_a_synthetic_landscape_are_never_resumed_by_real_times(tmp_path, capsys):
    """A folder of studies timed on a SYNTHETIC landscape, given a recorded landscape of the
    same device, code and Triton: refused in one line, the SYNTHETIC results untouched; two
    recorded landscapes of other content are told apart by their hash."""
    synth, recorded, other = _landscapes(tmp_path)
    args = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1", "--trials", "6",
            "--only", "N=7168,K=2048", "--kernel-source", "ours", "--quiet"]
    out = tmp_path / "out"
    assert main([*args, "--replay", str(synth), "--out", str(out)]) == 0
    manifest = (out / "manifest.json").read_text()
    assert json.loads(manifest)["tables"][0]["identity"]["times"] == "SYNTHETIC"
    capsys.readouterr()
    assert main([*args, "--replay", str(recorded), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # its tables say their times are SYNTHETIC first (tests/test_cli_errors.py); without them, its studies do
    assert len(err.splitlines()) == 1 and "holds tables of SYNTHETIC times" in err, err
    assert (out / "manifest.json").read_text() == manifest
    (out / "manifest.json").rename(tmp_path / "manifest.json")
    assert main([*args, "--replay", str(recorded), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "source of times SYNTHETIC (now landscape sha256:" in err
    # a recorded landscape's studies are resumed by the same landscape, refused by another one
    out2 = tmp_path / "out2"
    assert main([*args, "--replay", str(recorded), "--out", str(out2)]) == 0
    assert main([*args, "--replay", str(recorded), "--out", str(out2)]) == 0
    capsys.readouterr()
    assert main([*args, "--replay", str(other), "--out", str(out2)]) == 2
    assert "source of times landscape sha256:" in capsys.readouterr().err


def test_a_gpu_run_never_resumes_synthetic_studies_old_or_new(tmp_path):
    """On the GPU (a FAKE measurer that says what a GPU measurer says): a study timed on a
    SYNTHETIC landscape is refused, and so is one stored before identities named the source
    (its environment says synthetic)."""
    synth, _, _ = _landscapes(tmp_path)
    storage = optuna.storages.InMemoryStorage()
    tune_once(storage, ReplayMeasurer.from_file(str(synth), KERNEL, "NVIDIA H200"))
    assert stored_identity(storage)["times"] == "SYNTHETIC"
    with pytest.raises(TunerError, match=r"source of times SYNTHETIC \(now GPU\)"):
        tune_once(storage, FakeMeasurer(triton=triton.__version__))
    study = optuna.load_study(study_name=study_name(PROBLEM, 16), storage=storage)
    old = {k: v for k, v in study.user_attrs["identity"].items() if k != "times"}
    study.set_user_attr("identity", old)                      # as an older tuner stored it
    with pytest.raises(TunerError, match=r"source of times SYNTHETIC \(now GPU\)"):
        tune_once(storage, FakeMeasurer(triton=triton.__version__))


def test_install_of_synthetic_tables_says_so_forced_or_not(tmp_path, capsys):
    synth, _, _ = _landscapes(tmp_path)
    out = tmp_path / "out"
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1", "--trials", "4",
                 "--only", "N=7168,K=2048", "--kernel-source", "ours", "--engines", "vllm", "--quiet",
                 "--replay", str(synth), "--out", str(out)]) == 0
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    capsys.readouterr()
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site), "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert "SYNTHETIC" in err and "never timed on a GPU" in err and len(err.splitlines()) == 1
    assert main(["install", str(out), "--engine", "vllm", "--site-packages", str(site), "--gpu", "H200",
                 "--force"]) == 0
    printed = capsys.readouterr().out
    assert "*** SYNTHETIC: 1 of these 1 tables was chosen on times that never came from a GPU" in printed
    assert "[SYNTHETIC: never timed on a GPU]" in printed
