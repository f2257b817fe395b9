"""Every registered kernel, ours and the engines', against the KernelSpec contract
(tuner/plan/kernel_api.py), in Triton's interpreter at tiny shapes: the output is written in
place (poisoned with NaN first), the reference agrees within the kernel's tolerance at the
default config and every seed config, the default is a point of the kernel's search space,
FLOPs and bytes are positive, inputs are a function of their seed, and tables round-trip
(a kernel's own format, and an engine table's entries).

A (kernel, source) pair whose KernelSpec cannot be built here (an engine kernel without
the engine's code: TUNER_ENGINE_WHEELS unset; a kernel an engine does not have) is skipped
with the reason get_kernel gives.
"""

import itertools

import pytest
import torch

from tuner.errors import TunerError
from tuner.measure.numerics import check_config, relative_error
from tuner.plan import kernel_registry
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_from_entry, config_tuple, table_entry
from tuner.plan.problems import Problem
from tuner.plan.space import load_space
from tuner.search.runner import StudyResult

GPU = get_gpu("H200")
MOE = {"E": 8, "N": 128, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": [128, 128], "routing": "uniform"}
# Tiny problems per kernel, and where an engine's kernel takes others (SGLang's fused MoE
# times its up and down tables, with the shared expert fused in as expert E-1; the engines'
# launchers' "quant" variants take the integer precisions, issue 52: INT8 W8A8 per channel and in
# blocks, INT8 W8A16 per channel, INT4 in K groups on the group-wise kernel's own space).
INT4 = {"dtype": "int4_w4a16", "block_shape": None, "group_size": 64, "zero_point": True}
PROBLEMS = {
    "fp8_gemm": [{"N": 256, "K": 256, "block_shape": [128, 128]}],
    "fused_moe": [{**MOE, "part": "op"}],
    ("fused_moe", "sglang"): [{**MOE, "E": 9, "shared_experts": 1, "part": "up"},
                              {**MOE, "E": 9, "shared_experts": 1, "part": "down"}],
    ("fused_moe", "vllm", "quant"): [{**MOE, "dtype": "int8_w8a8", "block_shape": None, "part": "op"},
                                     {**MOE, "dtype": "int8_w8a16", "block_shape": None, "part": "op"},
                                     {**MOE, **INT4, "part": "op"}],
    ("fused_moe", "sglang", "quant"): [{**MOE, "dtype": "int8_w8a8", "part": "up"}, {**MOE, **INT4, "part": "down"}],
    "mla_decode": [{"heads": 16, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": 16, "context": 48}],
}
BATCH_SIZES = (1, 5)

PAIRS = [(n, s, "") for n, s in itertools.product(kernel_registry.KERNEL_MODULES, kernel_registry.KERNEL_SOURCES)] + \
    [("fused_moe", s, v) for s in kernel_registry.KERNEL_SOURCES if s != "ours"
     for v in kernel_registry.launcher_variants(s)]
pytestmark = pytest.mark.triton


# an engine's kernel comes from its wheel (TUNER_ENGINE_WHEELS), ours from the repository
@pytest.fixture(scope="module", params=[pytest.param(p, marks=() if p[1] == "ours" else pytest.mark.ci_variables)
                                        for p in PAIRS], ids=[f"{n}@{s}" + (f"({v})" if v else "") for n, s, v in PAIRS])
def spec(request):
    name, source, variant = request.param
    try:
        return kernel_registry.get_kernel(name, source, variant=variant)
    except TunerError as e:
        pytest.skip(f"{name} from {source}: {e}")


def problems_of(spec):
    if spec.variant:
        return PROBLEMS[(spec.name, spec.source, spec.variant)]
    return PROBLEMS.get((spec.name, spec.source), PROBLEMS[spec.name])


def configs_to_check(spec, params, M):
    """The default config and every seed config, each once."""
    seen, out = set(), []
    for label, cfg in [("default", spec.default_config(params, M))] + [
            ("seed", c) for c in spec.extra_seeds(params, M)]:
        t = config_tuple(spec, config_from_entry(spec, cfg))
        if t not in seen:
            seen.add(t)
            out.append((label, cfg))
    return out


def test_the_spec_is_whole(spec):
    assert spec.name and spec.table_kind and spec.problem_keys and spec.config_keys
    assert len(set(spec.config_keys)) == len(spec.config_keys)
    assert 0 < spec.tolerance < 0.1
    assert spec.source in kernel_registry.KERNEL_SOURCES and spec.source_label
    assert spec.code_version, "a kernel built with its code records a hash of it"
    assert set(spec.optional_keys) <= set(spec.config_keys) and set(spec.bool_keys) <= set(spec.config_keys)
    rebuilt = kernel_registry.get_kernel(**spec.ref)
    assert (rebuilt.name, rebuilt.source, rebuilt.code_version) == (spec.name, spec.source, spec.code_version)


@pytest.mark.parametrize("M", BATCH_SIZES)
def test_default_and_seed_configs_agree_with_the_reference_in_place(spec, M):
    for p, params in enumerate(problems_of(spec)):
        for label, cfg in configs_to_check(spec, params, M):
            agreement, out = check_config(spec, params, M, cfg, "cpu", seed=100 * p + M)
            where = f"{spec.name}@{spec.source} {Problem(spec.name, params).key} M={M} {label} {cfg}"
            assert agreement.in_place, f"{where}: run() did not return the out tensor it was given"
            assert not agreement.unwritten, f"{where}: {agreement.detail}"
            assert agreement.passed, f"{where}: relative error {agreement.rel_error:.3g} > {spec.tolerance}"


def test_the_check_has_teeth(spec):
    """A wrong answer fails the comparison: the reference of other inputs (another seed)."""
    params, M = problems_of(spec)[0], 5
    _, out = check_config(spec, params, M, None, "cpu", seed=1)
    other = spec.reference(spec.make_inputs(params, M, "cpu", 2))
    assert relative_error(out, other) > spec.tolerance


def test_inputs_are_a_function_of_their_seed(spec):
    params = problems_of(spec)[0]
    a, b, c = (spec.make_inputs(params, 3, "cpu", seed) for seed in (4, 4, 5))
    assert "out" in a and isinstance(a["out"], torch.Tensor)
    refs = [spec.reference(x) for x in (a, b, c)]
    assert torch.equal(refs[0], refs[1]) and not torch.equal(refs[0], refs[2])
    assert refs[0].abs().max() > 0, "a reference of zeros would let anything pass"


@pytest.mark.parametrize("M", BATCH_SIZES)
def test_the_default_config_is_a_point_of_the_space(spec, M):
    for params in problems_of(spec):
        space = load_space(spec, problems=[params])          # the space of the jit kernel it launches
        default = space.canonical(params, M, GPU, spec.default_config(params, M))
        assert set(default) == set(spec.config_keys)
        outside = {k: v for k, v in default.items() if v not in space.choices[k]}
        assert not outside, f"{space.source}: the default's {outside} are not among the space's values"
        assert spec.shared_memory(params, default) > 0


@pytest.mark.parametrize("M", (1, 64, 4096))
def test_flops_and_bytes_are_positive_and_grow_with_the_batch(spec, M):
    for params in problems_of(spec):
        assert spec.flops(params, M) > 0 and spec.bytes_moved(params, M) > 0
        assert spec.flops(params, 2 * M) > spec.flops(params, M)
        assert spec.bytes_moved(params, 2 * M) >= spec.bytes_moved(params, M)


def test_tables_round_trip(spec):
    params = problems_of(spec)[0]
    problem = Problem(spec.name, params)
    configs = {M: config_from_entry(spec, spec.default_config(params, M)) for M in BATCH_SIZES}
    # an engine table's entry (optional keys left out where they are the default, booleans
    # as JSON booleans) reads back as the same config
    for cfg in configs.values():
        assert config_from_entry(spec, table_entry(spec, cfg)) == cfg
    if spec.emit_table is None:
        assert spec.read_table is None
        return
    results = [StudyResult(problem, M, cfg, 1.0, None, cfg, None, 1, "budget") for M, cfg in configs.items()]
    tables, file_of = spec.emit_table([(problem, results)], GPU.cuda_name)
    assert file_of[problem.key] in tables
    held = spec.read_table(tables[file_of[problem.key]])
    assert [(Problem(spec.name, p).key, {M: config_from_entry(spec, c) for M, c in rows.items()})
            for p, rows in held] == [(problem.key, configs)]
    assert spec.read_table({"1": configs[1]}) == []          # an engine's table is not this kernel's
