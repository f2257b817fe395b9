"""The engines' own kernels, read from vLLM 0.33.0's and SGLang 0.5.23's released wheels (as
.ci/run downloads them) and run in Triton's interpreter through our launchers, against the
float64 reference; the launchers' decisions (swap-AB, small-batch path, TMA, kernel choice);
and the check that the wrappers the launchers mirror are still the ones they were written for."""

import functools
import json
import re
import sys

import pytest
import torch
from engine_loaders import wheel_dir

from kernels.engines import sglang as sgl
from kernels.engines import vllm
from tuner.cli import main
from tuner.errors import TunerError
from tuner.measure.numerics import check_config
from tuner.plan import kernel_registry
from tuner.plan.kernel_registry import launcher
from tuner.plan.kernel_sources import extract, function_source, locate

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

@functools.cache          # one launch in the interpreter per process, however many tests ask
def triton_unsqueezes_scalars() -> bool:
    """Whether this Triton's front end takes `scalar[:, None]`. 3.6 does; 3.9 refuses it
    ("too many indices for tensor of rank 0"), interpreted and compiled alike (compiling
    for sm_90 fails the same way without a GPU)."""
    import triton
    import triton.language as tl

    @triton.jit
    def unsqueeze(p, o):
        s = tl.load(p)
        tl.store(o + tl.arange(0, 1)[:, None], s[:, None])

    x = torch.ones(1)
    try:
        unsqueeze[(1,)](x, torch.zeros(1))
        return True
    except Exception:  # noqa: BLE001 - InterpreterError or CompilationError, by Triton version
        return False


# SGLang 0.5.23's fused_moe_kernel, with swap-AB (BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64 on
# sm_90) and BLOCK_SIZE_N <= the 128-wide scale block, swaps its two scales and then takes
# `a_scale[:, None]` of what is now the block's one (scalar) weight scale. A Triton whose
# front end refuses that cannot compile those configs at all, so there is no result to check.
SGLANG_SCALAR_SCALE = pytest.mark.skipif(
    not triton_unsqueezes_scalars(),
    reason="this Triton refuses `scalar[:, None]`, which SGLang 0.5.23's fused_moe_kernel does with swap-AB at "
           "BLOCK_SIZE_N <= 128 (a_scale[:, None] on the one weight scale): it cannot compile such configs here")

BLOCK = [128, 128]
MOE = {"E": 8, "N": 256, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": BLOCK, "routing": "uniform"}
SGL_MOE = {**MOE, "E": 9, "shared_experts": 1}      # 8 routed experts + SGLang's fused shared one


def cfg(bm, bn, bk=128, group=1, warps=4, stages=3, **extra):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages, **extra}


def rel_error(kernel, params, M, config, seed=7):
    """Run into a NaN-poisoned output on fresh inputs; the relative error to float64."""
    agreement, _ = check_config(kernel, params, M, config, "cpu", seed)
    assert not agreement.unwritten, "the kernel left part of the output unwritten"
    return agreement.rel_error


@pytest.fixture(scope="module")
def engine_kernels():
    return {(e, n): kernel_registry.get_kernel(n, e) for e in ("vllm", "sglang") for n in ("fused_moe", "fp8_gemm")}


# -- numerics of each engine's kernel -----------------------------------------------------
@pytest.mark.parametrize("M,config", [
    (1, cfg(16, 64)),              # swap-AB (BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64), small-batch path
    (1, cfg(8, 32, stages=4)),     # BLOCK_SIZE_M 8 without swap (vLLM's shipped M=1 entry)
    (6, cfg(8, 128)),              # BLOCK_SIZE_M 8 with swap, aligned path (6 * 2 * 4 > 8)
    (6, cfg(64, 32, bk=64)),       # no swap
    (6, cfg(32, 64, bk=256)),      # K tile 256: vLLM clamps it to the 128-wide blocks
])
def test_vllm_fused_moe_matches_reference(engine_kernels, M, config):
    kernel = engine_kernels["vllm", "fused_moe"]
    assert rel_error(kernel, {**MOE, "part": "op"}, M, config) < kernel.tolerance / 4


@pytest.mark.parametrize("part", ["up", "down"])
@pytest.mark.parametrize("M,config", [
    pytest.param(1, cfg(16, 64, USE_TMA=0), marks=SGLANG_SCALAR_SCALE),   # swap-AB
    # swap-AB and TMA (down: A and B descriptors, sorted rows)
    pytest.param(5, cfg(16, 64, USE_TMA=1), marks=SGLANG_SCALAR_SCALE),
    (5, cfg(16, 256, bk=64, USE_TMA=1)),   # swap-AB, two scale blocks per N tile
    (5, cfg(64, 128, bk=64, USE_TMA=1)),
    (5, cfg(32, 32, USE_TMA=0)),   # no swap
])
def test_sglang_fused_moe_matches_reference(engine_kernels, part, M, config):
    kernel = engine_kernels["sglang", "fused_moe"]
    params = {**SGL_MOE, "part": part}
    assert rel_error(kernel, params, M, config) < kernel.tolerance / 4


@pytest.mark.parametrize("config", [pytest.param(cfg(16, 128, USE_TMA=1), marks=SGLANG_SCALAR_SCALE),
                                    cfg(32, 256, bk=64, USE_TMA=1)])
def test_sglang_whole_layer_with_tma_sorted_intermediate(engine_kernels, config):
    """The up GEMM storing in sorted order and the TMA down GEMM reading it, end to end."""
    kernel = engine_kernels["sglang", "fused_moe"]
    assert rel_error(kernel, {**SGL_MOE, "part": "op"}, 5, config) < kernel.tolerance / 4


@pytest.mark.parametrize("engine,extra", [
    ("vllm", [{}]),
    ("sglang", [{"SWAP_AB": 0, "SPLIT_K": 1}, {"SWAP_AB": 1, "SPLIT_K": 1}, {"SWAP_AB": 1, "SPLIT_K": 2}]),
])
def test_engine_gemm_matches_reference(engine_kernels, engine, extra):
    kernel = engine_kernels[engine, "fp8_gemm"]
    params = {"N": 256, "K": 384, "block_shape": BLOCK}
    for e in extra:
        for M, c in ((1, cfg(16, 64)), (33, cfg(32, 128, bk=64, group=4))):
            assert rel_error(kernel, params, M, {**c, **e}) < kernel.tolerance / 4


# -- the launchers' decisions ------------------------------------------------------------
class RecordingKernel:
    """Stands in for an engine's jit function: records each launch's grid and arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


def launches(monkeypatch, module, kernel, inputs, config):
    fake = RecordingKernel()
    monkeypatch.setattr(module, "jit_functions", lambda code, rel, names: [fake] * len(names))
    kernel.run(inputs, config)
    return fake.launches


def test_vllm_launch_decisions(monkeypatch, engine_kernels):
    kernel = engine_kernels["vllm", "fused_moe"]
    small = kernel.make_inputs({**MOE, "part": "op"}, 1, "cpu", 0)      # 1 * 2 * 4 <= 8: small-batch path
    (grid, args, kw), (_, _, kw2) = launches(monkeypatch, vllm, kernel, small, cfg(16, 64))
    assert kw["naive_block_assignment"] and args[7] is None             # no sorted ids
    assert kw["SWAP_AB"] and kw2["SWAP_AB"]
    assert grid == (1 * 2 * 16 // 16 * (512 // 64),)                    # one program per pair and N tile
    big = kernel.make_inputs({**MOE, "part": "op"}, 6, "cpu", 0)
    (grid, args, kw), _ = launches(monkeypatch, vllm, kernel, big, cfg(64, 32, bk=256))
    assert not kw["naive_block_assignment"] and args[7] is not None
    assert not kw["SWAP_AB"]                                             # BLOCK_SIZE_M 64
    assert kw["BLOCK_SIZE_K"] == 128                                     # clamped to the weight block
    # M=6 < BLOCK_SIZE_M=64: the grid covers min(sorted length, 6 * 2 * 64) rows
    assert grid[0] == -(-min(args[7].numel(), 6 * 2 * 64) // 64) * (512 // 32)


def test_sglang_launch_decisions(monkeypatch, engine_kernels):
    kernel = engine_kernels["sglang", "fused_moe"]
    down = kernel.make_inputs({**SGL_MOE, "part": "down"}, 5, "cpu", 0)
    [(grid, args, kw)] = launches(monkeypatch, sgl, kernel, down, cfg(16, 64, USE_TMA=1))
    a_desc, b_desc = args[1], args[3]
    assert a_desc is not None and b_desc is not None and kw["swap_ab"]
    assert args[0].dtype == torch.float8_e4m3fn                         # quantized over the sorted rows
    assert args[0].shape[0] == sgl.tma_rows(5 * 3, 9, 16)               # top-2 + the shared expert
    assert "launch_pdl" not in kw                                       # no PDL in the interpreter
    numel, E = 5 * 3, 9
    assert args[9].numel() == sgl.sorted_rows(numel, E, 16) == (numel + (E + 1) * 15 + 3) // 4 * 4
    up = kernel.make_inputs({**SGL_MOE, "part": "up"}, 5, "cpu", 0)
    [(grid, args, kw)] = launches(monkeypatch, sgl, kernel, up, cfg(64, 32, USE_TMA=0))
    assert args[1] is None and args[3] is None and not kw["swap_ab"] and not kw["c_sorted"]
    assert kw["even_Ks"]                                                # 256 % 128 == 0


def test_fused_shared_expert_routing():
    """SGLang's fused shared expert: every token also goes to expert E-1, top-(k+1)."""
    gen = torch.Generator().manual_seed(0)
    from kernels.fused_moe_inputs import route
    weights, ids = route(64, 9, 2, "uniform", gen, "cpu", shared=1)
    assert ids.shape == (64, 3) and (ids[:, 2] == 8).all() and (ids[:, :2] < 8).all()
    assert (ids[:, 0] != ids[:, 1]).all()


def test_sglang_gemm_kernel_choice(monkeypatch, engine_kernels):
    kernel = engine_kernels["sglang", "fp8_gemm"]
    inputs = kernel.make_inputs({"N": 256, "K": 384, "block_shape": BLOCK}, 4, "cpu", 0)
    fake = {}

    class Named(RecordingKernel):
        def __init__(self, name):
            super().__init__()
            fake[name] = self
    monkeypatch.setattr(sgl, "jit_functions", lambda code, rel, names: [Named(n) for n in names])
    kernel.run(inputs, cfg(16, 64, SWAP_AB=0, SPLIT_K=1))
    assert fake["_w8a8_block_fp8_matmul"].launches and not fake["_w8a8_block_fp8_matmul_hopper"].launches
    kernel.run(inputs, cfg(16, 64, SWAP_AB=0, SPLIT_K=2))
    (grid, _, kw), = fake["_w8a8_block_fp8_matmul_hopper"].launches
    assert grid[1] == 2 and kw["SPLIT_K"] == 2 and fake["_reduce_block_fp8_split_k"].launches


# -- the wrappers the launchers mirror ---------------------------------------------------
@pytest.mark.parametrize("engine,module", [("vllm", vllm), ("sglang", sgl)])
def test_every_supported_version_resolves_to_its_release(engine, module):
    """Each supported version's wheel (as .ci/run downloads them) has exactly the wrappers and
    kernel signatures its release records: a new engine version must be read and added."""
    from engine_wrappers import wheel
    for name in module.KERNEL_FUNCTIONS:
        for version in [r.version for r in module.releases(name)]:      # the releases the data launches it for
            spec = kernel_registry.get_kernel(name, engine, str(wheel(wheel_dir(), engine, version)), load_code=True)
            assert spec.notes["launched_as"] == version and spec.notes["launcher_matches_engine"] is True


def test_a_changed_wrapper_is_refused(tmp_path):
    """An extracted folder whose swap rule was edited: the launcher no longer mirrors it, so
    it is refused in one line naming what changed (not run with a warning)."""
    folder = extract("vllm", None, tmp_path / "vllm", launcher("vllm").FILES)
    rel = "vllm/model_executor/layers/fused_moe/utils.py"
    text = (folder / rel).read_text()
    old = function_source(text, "enable_swap_ab")
    (folder / rel).write_text(text.replace(old, old.replace("BLOCK_SIZE_M < 64", "BLOCK_SIZE_M < 32")))
    with pytest.raises(TunerError, match="wrappers differ from the released 0.33.0's: enable_swap_ab changed"):
        kernel_registry.get_kernel("fused_moe", "vllm", str(folder))
    assert kernel_registry.get_kernel("fused_moe", "vllm").notes["launcher_matches_engine"] is True


def test_extracted_folder_runs_the_same_code(tmp_path, engine_kernels):
    folder = extract("sglang", None, tmp_path / "sg", launcher("sglang").FILES)
    manifest = json.loads((folder / "tuner-engine-source.json").read_text())
    assert manifest["engine"] == "sglang" and manifest["version"] == "0.5.23"
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 1 << 20                                                 # small enough to carry
    spec = kernel_registry.get_kernel("fused_moe", "sglang", str(folder))
    assert spec.code_version == engine_kernels["sglang", "fused_moe"].code_version
    assert spec.origin == str(folder.resolve())
    assert rel_error(spec, {**SGL_MOE, "part": "up"}, 3, cfg(16, 256, bk=64, USE_TMA=1)) < spec.tolerance / 4


def test_no_engine_is_one_clear_line(monkeypatch, tmp_path, capsys):
    wheels = wheel_dir()
    monkeypatch.delenv("TUNER_ENGINE_WHEELS")
    with pytest.raises(TunerError, match="--engine-source PATH.*--kernel-source ours"):
        locate("vllm")
    # without a GPU that is what a run says first; with one, the missing engine
    rc = main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "no CUDA GPU is visible" in err
    import tuner.measure.device
    monkeypatch.setattr(tuner.measure.device, "require_gpu", lambda *a, **k: None)
    rc = main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "--engine-source" in err
    # a wheel of the other engine is no source of this one's code
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"1": cfg(16, 64)}))
    rc = main(["check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "vllm", "--table",
               str(table), "--engine-source", str(next(wheels.glob("sglang-*.whl")))])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "holds vllm's code" in err


def test_mla_has_no_engine_kernel():
    with pytest.raises(TunerError, match="reads no mla_decode table"):
        kernel_registry.get_kernel("mla_decode", "vllm")


def test_engine_packages_are_read_not_imported(engine_kernels):
    """The launchers ran from the wheels' files; neither engine (nor its CUDA extensions) loaded."""
    assert engine_kernels and "vllm" not in sys.modules and "sglang" not in sys.modules


# -- tables written for the engines' kernels (replayed, SYNTHETIC landscapes) ---------------
def _engine_landscape(tmp_path, engine, faster):
    """A SYNTHETIC landscape of an engine's MoE kernel at DeepSeek-V3 TP8 shapes, with the
    configs `faster(params, M, config)` picks made 3x faster."""
    from synthetic import scaled_landscape, write_synthetic_landscape

    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import load_model, moe_problems
    from tuner.plan.space import load_space
    kernel = kernel_registry.get_kernel("fused_moe", engine)          # its version goes into the header
    problems = [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", "uniform", [engine])]
    raw, land = tmp_path / f"{engine}-raw.jsonl", tmp_path / f"{engine}.jsonl"
    write_synthetic_landscape(raw, kernel, load_space(kernel), get_gpu("H200"), problems, [1, 64])
    return scaled_landscape(raw, land, kernel, 1 / 3, only=faster)


def test_replay_writes_sglang_use_tma(tmp_path):
    land = _engine_landscape(tmp_path, "sglang", lambda params, M, c: c["USE_TMA"] == 1 and params["part"] == "down")
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
                 "--engines", "sglang", "--batch-sizes", "1", "64", "--trials", "24", "--out", str(out),
                 "--quiet"]) == 0
    folder = next((out / "sglang" / "fused_moe" / "configs").glob("triton_*"))
    name = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
    down = json.loads((folder / f"{name}_down.json").read_text())
    up = json.loads((folder / f"{name}.json").read_text())
    assert set(down) == set(up) == {"1", "64"}
    assert all(e["USE_TMA"] is True for e in down.values())            # a JSON boolean, as SGLang ships it
    assert all(e.get("USE_TMA", False) in (True, False) for e in up.values())
    assert all(down[m]["BLOCK_SIZE_M"] == up[m]["BLOCK_SIZE_M"] for m in up)
    manifest = json.loads((out / "manifest.json").read_text())
    sources = {t["kernel_source"]["source"] for t in manifest["tables"]}
    assert sources == {"sglang"}


def test_replay_vllm_table_holds_block_m_8(tmp_path):
    land = _engine_landscape(tmp_path, "vllm", lambda params, M, c: c["BLOCK_SIZE_M"] == 8 and M == 1)
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
                 "--engines", "vllm", "--batch-sizes", "1", "64", "--trials", "24", "--out", str(out),
                 "--quiet"]) == 0
    table = json.loads((out / "vllm" / "fused_moe" /
                        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json").read_text())
    assert table["1"]["BLOCK_SIZE_M"] == 8 and "USE_TMA" not in table["1"]


def test_replay_refuses_another_kernel_source(tmp_path, capsys):
    land = _engine_landscape(tmp_path, "vllm", lambda params, M, c: False)
    rc = main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
               "--kernel-source", "ours", "--batch-sizes", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "recorded on vllm's kernel" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_drift_times_sglang_tables_on_sglang_kernel_with_their_use_tma(tmp_path, shared_dir):
    """SGLang's shipped H200 tables (its _down table sets USE_TMA everywhere) re-timed on a
    SYNTHETIC landscape of SGLang's kernel where TMA configs are 3x faster: the _down entries
    are timed with TMA and beat the engine's default (which has none)."""
    land = _engine_landscape(tmp_path, "sglang", lambda params, M, c: c["USE_TMA"] == 1)
    folder = shared_dir / "baselines" / "sglang-0.5.23" / "fused_moe" / "triton_3_5_1"
    out = tmp_path / "drift.json"
    assert main(["drift", str(folder), "--gpu", "H200", "--model", "deepseek-v3", "--replay", str(land),
                 "--out", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text()) if r["M"] in (1, 64)]
    assert rows and {r["kernel_source"] for r in rows} == {"sglang 0.5.23"}
    down = [r for r in rows if "part=down" in r["problem"]]
    assert len(down) == 2 and all(r["verdict"] == "wins" and r["table_us"] for r in down)
    assert all("shared_experts=1" in r["problem"] for r in rows)        # E=257: the fused shared expert


def test_install_refuses_a_table_timed_on_another_engine_version(tmp_path, capsys):
    """Tables timed (here: replayed) on SGLang 0.5.23's kernel, installed into an environment
    running another SGLang: refused without --force, with one line; into 0.5.23: installed."""
    land = _engine_landscape(tmp_path, "sglang", lambda params, M, c: False)
    out = tmp_path / "out"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
                 "--engines", "sglang", "--batch-sizes", "1", "--trials", "8", "--out", str(out), "--quiet"]) == 0
    entry = json.loads((out / "manifest.json").read_text())["tables"][0]
    assert entry["kernel_source"]["source"] == "sglang" and entry["kernel_source"]["version"] == "0.5.23"

    def site(version):
        s = tmp_path / f"site-{version}"
        (s / "sglang").mkdir(parents=True)
        (s / "sglang" / "__init__.py").write_text("")
        (s / f"sglang-{version}.dist-info").mkdir()
        (s / "triton-3.6.0.dist-info").mkdir()
        return s
    capsys.readouterr()
    newer = site("0.5.24")
    rc = main(["install", str(out), "--engine", "sglang", "--site-packages", str(newer), "--gpu", "H200"])
    err = capsys.readouterr().err
    assert rc == 2 and "timed on sglang 0.5.23's kernel, the target runs sglang 0.5.24" in err
    assert len(err.splitlines()) == 1 and not list((newer / "sglang").rglob("*.json"))
    same = site("0.5.23")
    assert main(["install", str(out), "--engine", "sglang", "--site-packages", str(same), "--gpu", "H200",
                 "--force"]) == 0                                   # --force: replayed tables have no numerics check
    out_text = capsys.readouterr()
    assert "--moe-runner-backend auto" in out_text.err                 # what makes SGLang read them
    assert len(list((same / "sglang").rglob("*.json"))) == 2


def test_check_finds_the_configs_an_engine_computes_wrong(tmp_path, capsys):
    """A K tile of 256 over 128-wide scale blocks: SGLang's kernel computes wrong results with
    it, vLLM's clamps it to 128. `tuner check` says so per config and by its exit status."""
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"hidden_size": 256, "num_attention_heads": 2, "head_dim": 128,
                                 "n_routed_experts": 8, "moe_intermediate_size": 256, "num_experts_per_tok": 2,
                                 "quantization_config": {"weight_block_size": [128, 128]}}))
    table = tmp_path / "table.json"
    # BLOCK_SIZE_M 64: no swap-AB, which SGLang cannot compile under every Triton (SGLANG_SCALAR_SCALE)
    table.write_text(json.dumps({"1": cfg(64, 64, bk=256), "8": cfg(64, 64)}))
    args = ["check", "--model", str(model), "--kernel", "moe", "--table", str(table), "--seed", "3"]
    assert main(args + ["--kernel-source", "sglang"]) == 1
    lines = capsys.readouterr().out.splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert len(fails) == 2 and all("BLOCK_SIZE_K=256" in ln for ln in fails)        # up and down at M=1
    assert all(re.match(r"FAIL +rel \d\.\d+e[-+]\d+ ", ln) for ln in fails)        # wrong numbers, not a crash
    assert lines[-1] == "2 passed, 2 failed"
    assert main(args + ["--kernel-source", "vllm"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 passed, 0 failed"
