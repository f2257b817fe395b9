"""The configs our space folds together for vLLM's fused MoE (kernels/engines/vllm.py,
`moe_m_tiles`, and the K-tile clamp; tuner/plan/space.py) run identically under vLLM's own code:
each vLLM version's wrapper, from its released wheel (tests/engine_wrappers.py), launched
with the launches recorded (not run), passes the same grid and arguments for every config of
a fold but GROUP_SIZE_M, launches exactly `moe_m_tiles` programs along M there, and the
kernel's own program-to-tile mapping (its statements from `pid = tl.program_id(...)` to
`pid_n = ...`, cut out of the same wheel and executed here) sends every program to the same
(pid_m, pid_n) tile. Over tensor and expert parallelism, the small-batch (naive) path and the
aligned path with fewer pairs than BLOCK_SIZE_M."""

import ast
import zipfile
from types import SimpleNamespace

import pytest
import torch
from engine_loaders import wheel_dir
from engine_wrappers import LaunchRecorder, vllm_wrappers, wheel

from kernels.engines import vllm
from kernels.engines.base import jit_functions
from tuner.plan import kernel_registry
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_sources import locate
from tuner.plan.space import load_space

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

BLOCK = [128, 128]
PARAMS = {"E": 8, "N": 256, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": BLOCK, "routing": "uniform",
          "part": "op"}
GPU = get_gpu("H200")
CASES = [
    # (ep, M, BLOCK_SIZE_M): TP at M=1 takes vLLM's naive path (M x top-k x 4 <= E); TP at M=2
    # and 3 the aligned path with fewer pairs than BLOCK_SIZE_M (8 and 16) and than experts;
    # under EP (never naive) at M=1 and at M=3 with BLOCK_SIZE_M 64.
    pytest.param(1, 1, 16, id="tp-naive-m1"),
    pytest.param(1, 2, 8, id="tp-aligned-m2-bm8"),
    pytest.param(1, 3, 16, id="tp-aligned-m3"),
    pytest.param(2, 1, 16, id="ep2-m1"),
    pytest.param(2, 3, 64, id="ep2-m3-bm64"),
]


def tile_mapping(version: str):
    """The fused_moe_kernel's own statements mapping a program id to its (pid_m, pid_n)
    tile, from the wheel of `version`, as a function of a launch's arguments and a pid."""
    with zipfile.ZipFile(wheel(wheel_dir(), "vllm", version)) as zf:
        tree = ast.parse(zf.read(vllm.MOE_FILE).decode())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fused_moe_kernel")
    names = [n.targets[0].id if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) else None
             for n in fn.body]
    start, end = names.index("pid"), names.index("pid_n")
    code = compile(ast.Module(body=fn.body[start:end + 1], type_ignores=[]), f"<vllm {version} fused_moe_kernel>",
                   "exec")

    def mapping(args: dict, pid: int) -> tuple[int, int]:
        tl = SimpleNamespace(program_id=lambda axis: pid, cdiv=lambda a, b: -(-a // b))
        ns = {"tl": tl, **args}
        exec(code, ns)
        return ns["pid_m"], ns["pid_n"]
    return mapping


def recorder(version: str, kernel, params: dict, M: int):
    """A function of a config running vLLM's fused_experts_impl of `version` with that config
    as the table's entry, returning its two launches (up and down GEMM), recorded, not run."""
    spec = kernel_registry.get_kernel("fused_moe", "vllm", str(wheel(wheel_dir(), "vllm", version)))
    inputs = spec.make_inputs(params, M, "cpu", seed=5)
    ep, E = params.get("ep", 1), params["E"]
    expert_map = None
    if ep > 1:       # vLLM's expert map on EP rank 0: global experts 0..E-1 are local
        expert_map = torch.full((E * ep,), -1, dtype=torch.int32)
        expert_map[:E] = torch.arange(E, dtype=torch.int32)
    entry: dict = {}                 # the table's entry the wrapper looks up (filled per call)
    ns = vllm_wrappers(wheel_dir(), version, {"fused_moe_kernel": kernel}, entry)

    def launches(config: dict) -> list[dict]:
        entry.clear()
        entry.update(config)
        with LaunchRecorder({"fused_moe_kernel": kernel}, execute=False) as engine:
            ns["fused_experts_impl"](inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"],
                                     inputs["topk_ids"], use_fp8_w8a8=True, global_num_experts=E * ep,
                                     expert_map=expert_map, w1_scale=inputs["w1_scale"], w2_scale=inputs["w2_scale"],
                                     block_shape=BLOCK)
        assert [x["kernel"] for x in engine.launches] == ["fused_moe_kernel"] * 2
        assert all(x["args"]["GROUP_SIZE_M"] == config["GROUP_SIZE_M"] for x in engine.launches)
        return engine.launches
    return launches


@pytest.mark.parametrize("version", vllm.SUPPORTED)
@pytest.mark.parametrize("ep,M,bm", CASES)
def test_configs_folded_together_launch_the_same_programs_in_vllm(version, ep, M, bm):
    params = {**PARAMS, **({"ep": ep} if ep > 1 else {})}
    spec = kernel_registry.get_kernel("fused_moe", "vllm", str(wheel(wheel_dir(), "vllm", version)), load_code=False)
    space = load_space(spec)
    (kernel,) = jit_functions(locate("vllm", str(wheel(wheel_dir(), "vllm", version))), vllm.MOE_FILE,
                              ["fused_moe_kernel"])
    mapping = tile_mapping(version)
    launches = recorder(version, kernel, params, M)
    base = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "num_warps": 4, "num_stages": 3}
    configs = [{**base, "GROUP_SIZE_M": g, "BLOCK_SIZE_K": k}
               for g, k in [(g, 128) for g in space.choices["GROUP_SIZE_M"]] + [(64, 256), (1, 256)]]
    folds: dict[tuple, list[dict]] = {}
    for c in configs:
        folds.setdefault(tuple(space.canonical(params, M, GPU, c).items()), []).append(c)
    m_tiles = vllm.moe_m_tiles(params, M, base)
    assert m_tiles < 1 << 30                                # the cases are ones the hook folds
    assert sorted(len(f) for f in folds.values()) == [2, 4]   # G 1 (K 128, 256); G 16, 32, 64 and 64 at K 256

    def programs(launch: dict) -> list[tuple[int, int]]:
        args = {k: launch["args"][k] for k in ("EM", "N", "BLOCK_SIZE_M", "BLOCK_SIZE_N", "GROUP_SIZE_M")}
        return [mapping(args, pid) for pid in range(launch["grid"][0])]

    seen = {}
    for canonical, fold in folds.items():
        runs = [launches(c) for c in fold]
        for up_down in zip(*runs):
            first = up_down[0]
            # vLLM's wrapper fixes the programs along M to moe_m_tiles: exactly
            assert -(-first["args"]["EM"] // bm) == m_tiles, (first["args"]["EM"], bm, m_tiles)
            for other in up_down[1:]:
                assert other["grid"] == first["grid"] and other["options"] == first["options"]
                assert {k: v for k, v in other["args"].items() if k != "GROUP_SIZE_M"} == \
                    {k: v for k, v in first["args"].items() if k != "GROUP_SIZE_M"}
                assert programs(other) == programs(first)          # every program on the same tile
        seen[canonical] = [programs(x) for x in runs[0]]
    # and the test can tell walks apart: GROUP_SIZE_M 1 (not folded) walks the tiles otherwise
    assert len({tuple(tuple(p) for p in walks) for walks in seen.values()}) == len(seen) == 2
