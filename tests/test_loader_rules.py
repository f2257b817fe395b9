"""The loader rules of tuner/plan/engines.py and table_lookup.py (which file, which row, what
the kernel gets) against the engines' own loader functions, executed from every supported release's wheel
(tests/engine_loaders.py), over a grid of models, GPUs and Triton versions, with the
override folders, SGLang's Triton fallback and its `_down` reuse; and the hashes of the
mirrored loader functions against every wheel CI reads."""

import functools
import json
import shutil

import pytest
from engine_loaders import LOG, VERSIONS, load_loaders, site_from_wheel, wheel, wheel_dir

from tuner.emit.audit import deployment_problems
from tuner.emit.audit_rules import Batches
from tuner.emit.engine_tables import FolderFiles, Installation, WheelFiles, log_lines
from tuner.plan.engines import ENGINES, LOADER_FUNCTIONS, load_table, release_reads, table_family
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_sources import function_source, source_hash
from tuner.plan.models import load_model
from tuner.plan.table_lookup import nearest_key, resolve_table

pytestmark = [pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"),
              pytest.mark.ci_variables, pytest.mark.triton]

E512 = {"architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "n_routed_experts": 512, "moe_intermediate_size": 512,
        "num_experts_per_tok": 10, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
MODELS = [("deepseek-v3", 8, 1, "fp8_w8a8"), ("deepseek-v3", 8, 8, "fp8_w8a8"), ("kimi-k2", 8, 1, "fp8_w8a8"),
          ("mixtral-8x7b", 2, 1, "bf16"), ("e512", 2, 1, "fp8_w8a8")]
GPUS = ["H100", "H200", "H200-NVL", "H20"]
TRITONS = ["3.5.1", "3.6.0", "3.9.0"]
MS = [1, 3, 17, 100, 700, 4096]
RELEASES = [(e, v) for e in VERSIONS for v in VERSIONS[e]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "e512.json"
    path.write_text(json.dumps(E512))
    return {name: load_model(str(path) if name == "e512" else name) for name, *_ in MODELS}


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """One fake site-packages per release, holding exactly its wheel's shipped tables."""
    out = {}
    for engine, version in RELEASES:
        if wheel(engine, version) is not None:
            out[(engine, version)] = site_from_wheel(engine, version, tmp_path_factory.mktemp(f"{engine}-{version}"))
    return out


def _ours(engine, problem, gpu, site, triton, override=None):
    """(our resolved table as the loader returns it, the file we say it reads, lookup name)."""
    fam = table_family(engine, problem.kernel)
    p = problem.params
    if problem.kernel == "fused_moe":
        ask = dict(E=p["E"], N=p["N"], dtype=None if p["dtype"] == "bf16" else p["dtype"], block_shape=p["block_shape"])
        down = p.get("part") == "down"
        name = fam.lookup_name(gpu.cuda_name, **ask, down=down)
        up = fam.lookup_name(gpu.cuda_name, **ask) if down else None
    else:
        name, up = fam.lookup_name(gpu.cuda_name, N=p["N"], K=p["K"], block_shape=p["block_shape"]), None
    res = resolve_table(fam, name, FolderFiles(site), FolderFiles(override) if override else None, triton, down_of=up)
    if not res.found:
        return None, res, name
    table, crash = load_table(fam, res.files.read(res.rel))
    assert crash is None
    if problem.kernel == "fp8_gemm":
        table = {m: fam.loaded_config(c, p["block_shape"])[0] for m, c in table.items()}
    return table, res, name


@functools.lru_cache(maxsize=None)
def _installation(engine, version):
    return Installation(engine, version, WheelFiles(wheel(engine, version)), "", "", "")


def _expected_log(engine, version, problem, res, site):
    """The log line the engine writes for this resolution, as tuner quotes it from the
    engine's source (tuner.emit.engine_tables.log_lines): (level, text)."""
    inst = _installation(engine, version)
    fam = table_family(engine, problem.kernel)
    values = {"config_file_path": res.tried[0], "config_file_paths": res.tried}
    if res.how == "Triton fallback":
        values.update(try_config_file_path=str(site / res.rel),
                      try_triton_version=res.triton_folder.removeprefix("triton_").replace("_", "."))
        return "warning", log_lines(inst, fam, values)["fell back"]
    if res.found:
        values["config_file_path"] = str(site / res.rel)
        return "info", log_lines(inst, fam, values)["loaded"]
    return "warning", log_lines(inst, fam, values)["not loaded"]


def _theirs(engine, f, problem):
    for fn in f.values():                       # the loaders' lru_caches: log every lookup
        getattr(fn, "cache_clear", lambda: None)()
    p = problem.params
    bn, bk = p["block_shape"] or (0, 0)
    if problem.kernel == "fp8_gemm":
        return f["get_w8a8_block_fp8_configs"](p["N"], p["K"], bn, bk)
    dtype = None if p["dtype"] == "bf16" else p["dtype"]
    if engine == "sglang":
        return f["get_moe_configs"](p["E"], p["N"], dtype, bn, bk, down_moe=p.get("part") == "down")
    return f["get_moe_configs"](p["E"], p["N"], dtype, bn, bk)


@pytest.mark.parametrize("engine,version", RELEASES)
def test_resolution_matches_the_engines_loaders(engine, version, models, sites):
    """Every table of every (model, GPU, Triton): the same file (the one the engine logs it
    loads), the same {M: config} as the loader returns, the same row per M through its
    try_get_optimal_moe_config, and for SGLang's down GEMM the up table's BLOCK_SIZE_M."""
    if (engine, version) not in sites:
        pytest.skip(f"no {engine} {version} wheel in TUNER_ENGINE_WHEELS")
    site = sites[(engine, version)]
    fam = table_family(engine, "fused_moe")
    seen = {"found": 0, "none": 0, "fallback": 0, "reuses up": 0}
    for gpu_key in GPUS:
        gpu = get_gpu(gpu_key)
        for triton in TRITONS:
            f = load_loaders(engine, site, gpu.cuda_name, triton, version)
            for name, tp, ep, dtype in MODELS:
                up_tables = {}
                for problem in deployment_problems(models[name], tp, ep, dtype, engine):
                    if not release_reads(engine, version, problem.kernel):      # a family it lays out otherwise
                        continue
                    LOG.clear()
                    theirs = _theirs(engine, f, problem)
                    ours, res, lookup = _ours(engine, problem, gpu, site, triton)
                    case = f"{engine} {version} {gpu_key} triton {triton} {name}: {lookup}"
                    assert ours == theirs, case
                    seen["found" if res.found else "none"] += 1
                    seen["fallback"] += res.how == "Triton fallback"
                    seen["reuses up"] += res.how == "the up table"
                    if res.how != "the up table" and not (res.how == "none" and problem.params.get("part") == "down"):
                        level, line = _expected_log(engine, version, problem, res, site)
                        assert (level, line) in LOG, (case, line, LOG)
                    if problem.kernel != "fused_moe" or ours is None:
                        continue
                    p = problem.params
                    part = p.get("part")
                    if part == "up":
                        up_tables[lookup] = ours
                    w1, w2 = (p["E"], 2 * p["N"], p["K"]), (p["E"], p["K"], p["N"])
                    dt = None if p["dtype"] == "bf16" else p["dtype"]
                    # the audit's M ranges per key, checked at both ends of every range
                    runs = Batches(4096).runs(list(ours))
                    for M, key in [(M, key) for key, a, b in runs for M in (a, b)] + [(M, None) for M in MS]:
                        if engine == "vllm":
                            cfg = f["try_get_optimal_moe_config"](w1, w2, p["topk"], dt, M, p["block_shape"])
                            assert cfg == ours[key if key is not None else nearest_key(list(ours), M)], (case, M)
                        elif part == "down":
                            up, (down_cfg, _) = f["try_get_optimal_moe_config"](
                                w1, w2, p["topk"], dt, M, block_shape=p["block_shape"], return_down_config=True)
                            up_table = up_tables.get(lookup.replace("_down.json", ".json"))
                            mine = ours[key if key is not None else nearest_key(list(ours), M)]
                            if up_table is not None:
                                up_entry = up_table[nearest_key(list(up_table), M)]
                                assert up == up_entry, (case, M)
                                mine, _ = fam.loaded_config(mine, p["block_shape"], up_entry)
                            assert down_cfg == mine, (case, M)
    # the grid must exercise every path: found, absent, (SGLang) fallback and reuse
    assert seen["found"] and seen["none"], seen
    if engine == "sglang":
        assert seen["fallback"] and seen["reuses up"], seen


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_override_folders_and_loader_crashes(engine, sites, tmp_path, monkeypatch):
    """VLLM_TUNED_CONFIG_FOLDER is searched first (MoE only); SGLANG_MOE_CONFIG_DIR replaces
    the package root, with its own Triton fallback, and crashes the loader where it has no
    configs/ folder or a triton_* folder that is not a version."""
    version = VERSIONS[engine][-1]
    if (engine, version) not in sites:
        pytest.skip(f"no {engine} {version} wheel")
    site, gpu = sites[(engine, version)], get_gpu("H200")
    problem = deployment_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", engine)[0]
    fam = table_family(engine, "fused_moe")
    p = problem.params
    name = fam.lookup_name(gpu.cuda_name, E=p["E"], N=p["N"], dtype="fp8_w8a8", block_shape=p["block_shape"])
    mine = {"7": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                  "num_stages": 3}}
    override = tmp_path / "override"
    target = override / name if engine == "vllm" else override / "configs" / "triton_3_6_0" / name
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(mine))
    monkeypatch.setenv(fam.env_var, str(override))
    for triton in ("3.6.0", "3.9.0"):
        f = load_loaders(engine, site, gpu.cuda_name, triton, version)
        theirs = _theirs(engine, f, problem)
        ours, res, _ = _ours(engine, problem, gpu, site, triton, override)
        assert ours == theirs == {7: mine["7"]}
        assert res.how == ("override folder" if engine == "vllm" else
                           "exact Triton folder" if triton == "3.6.0" else "Triton fallback")
    if engine == "vllm":
        # the GEMM tables ignore the variable
        gemm = [q for q in deployment_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", engine)
                if q.kernel == "fp8_gemm"][0]
        assert _ours(engine, gemm, gpu, site, "3.6.0", override)[0] == _theirs(engine, f, gemm)
        return
    # an override without configs/, then one with a triton_* folder that is no version
    for layout in ("missing", "bad-version"):
        shutil.rmtree(override, ignore_errors=True)
        if layout == "bad-version":
            (override / "configs" / "triton_3_6_0_post1").mkdir(parents=True)
        f = load_loaders(engine, site, gpu.cuda_name, "3.6.0", version)
        with pytest.raises((FileNotFoundError, ValueError)):
            _theirs(engine, f, problem)
        ours, res, _ = _ours(engine, problem, gpu, site, "3.6.0", override)
        assert ours is None and res.crash and ("FileNotFoundError" if layout == "missing" else "ValueError") in res.crash


@pytest.mark.parametrize("engine,version", RELEASES)
def test_writer_names_are_the_loaders_names(engine, version, sites):
    """What tuner writes (tuner.plan.engines.ENGINES) and what the audit looks up are the names
    the engine's get_config_file_name builds, on every Hopper GPU we know."""
    if (engine, version) not in sites:
        pytest.skip(f"no {engine} {version} wheel")
    from tuner.plan.gpus import GPUS
    fam = table_family(engine, "fused_moe")
    for gpu in GPUS.values():
        f = load_loaders(engine, sites[(engine, version)], gpu.cuda_name, "3.6.0", version)
        for E, N, dtype, block in ((257, 256, "fp8_w8a8", [128, 128]), (8, 7168, None, None)):
            args = (E, N, dtype, block) if engine == "vllm" else (E, N, dtype, block or [0, 0])
            theirs = f["get_config_file_name"](*args)
            assert fam.lookup_name(gpu.cuda_name, E=E, N=N, dtype=dtype, block_shape=block) == theirs
            assert ENGINES[engine].moe_filename(E, N, gpu.cuda_name, dtype, block) == theirs, gpu.key
            if engine == "sglang":
                assert fam.lookup_name(gpu.cuda_name, E=E, N=N, dtype=dtype, block_shape=block, down=True) == \
                    f["get_config_file_name"](*args, down_moe=True)


def test_loader_hashes_match_every_wheel():
    """The loader functions the rules mirror, hashed per release, are those of every wheel
    in TUNER_ENGINE_WHEELS: a release whose loaders changed (or a new release) fails here
    until its rules are read again and its hashes recorded."""
    import zipfile
    checked = []
    for engine in ("vllm", "sglang"):
        for path in sorted(wheel_dir().glob(f"{engine}-*.whl")):
            version = path.name.split("-")[1]
            assert version in LOADER_FUNCTIONS[engine], f"{path.name}: no loader rules recorded for {engine} {version}"
            with zipfile.ZipFile(path) as z:
                for key, expected in LOADER_FUNCTIONS[engine][version].items():
                    rel, fn = key.rsplit(":", 1)
                    assert source_hash(function_source(z.read(rel).decode(), fn)) == expected, f"{path.name}: {key}"
            checked.append(f"{engine} {version}")
    assert checked
