"""The engines' own config-loader functions, run against a folder layout of ours.

How CI gets that code cheaply: .ci/run downloads the released wheels once with
`pip download --no-deps` (vllm 0.31.0-0.33.0, about 330 MB each; sglang 0.5.21-0.5.23, about
30-40 MB each; nothing is installed) and names the folder in TUNER_ENGINE_WHEELS. We read
their loader files out of the zips and take the loader functions from them verbatim (their
`def`s, decorators included, found with `ast`), then run them with `__file__` pointing into a
fake site-packages. Only what they import for logging, the device name, environment
variables and the Triton version is stubbed; the lookup logic (file names, device-name
folding, folders, fallbacks, parsing, nearest-key choice, the down BLOCK_SIZE_M override)
is theirs. Log calls are recorded (`LOG`), so tests can compare the engine's own lines.
"""

import ast
import functools
import json
import os
import re
import sys
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from tuner.plan.engines import supported_releases  # noqa: E402

# the releases configs/engines/ holds, oldest first
VERSIONS = {engine: tuple(supported_releases(engine)) for engine in ("vllm", "sglang")}
NEWEST = {engine: versions[-1] for engine, versions in VERSIONS.items()}
LOADERS = {
    "vllm": {
        "vllm/utils/platform_utils.py": ["get_device_name_as_file_name"],
        "vllm/model_executor/layers/fused_moe/fused_moe.py": ["get_config_file_name", "get_moe_configs",
                                                              "try_get_optimal_moe_config"],
        "vllm/model_executor/layers/fused_moe/config.py": ["_get_config_dtype_str"],
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py": ["get_w8a8_block_fp8_configs"],
    },
    "sglang": {
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py":
            ["get_config_file_name", "get_moe_configs", "try_get_optimal_moe_config", "get_config_dtype_str"],
        "sglang/kernels/ops/gemm/fp8_kernel.py": ["get_w8a8_block_fp8_configs"],
    },
}
# The package folders the loaders read tables from (what `site_from_wheel` extracts).
TABLE_FOLDERS = {
    "vllm": ["vllm/model_executor/layers/fused_moe/configs/", "vllm/model_executor/layers/quantization/utils/configs/"],
    "sglang": ["sglang/srt/layers/moe/moe_runner/triton_utils/configs/", "sglang/kernels/ops/gemm/configs/"],
}
# Where try_get_optimal_moe_config imports its override `get_config` from (stubbed: no override).
_GET_CONFIG = {"vllm": "vllm.model_executor.layers.fused_moe",
               "sglang": "sglang.srt.layers.moe.moe_runner.triton_utils"}
LOG: list = []                       # (level, message) of every log call, newest last
DEFAULT = {"default config": True}   # what the stubbed get_default_config returns


class _Log:
    """A logger that records each call's rendered message."""
    def __getattr__(self, name):
        def log(msg, *args, **kwargs):
            LOG.append((name.split("_")[0], " ".join((str(msg) % args if args else str(msg)).split())))
        return log


class _VllmEnvs:
    """vllm.envs reads the environment when an attribute is asked for; so do we."""
    @property
    def VLLM_TUNED_CONFIG_FOLDER(self):
        return os.environ.get("VLLM_TUNED_CONFIG_FOLDER")

    VLLM_BATCH_INVARIANT = False


def wheel_dir() -> Path | None:
    d = os.environ.get("TUNER_ENGINE_WHEELS")
    return Path(d) if d and Path(d).is_dir() else None


def wheel(engine: str, version: str | None = None) -> Path | None:
    d = wheel_dir()
    if d is None:
        return None
    return next(iter(sorted(d.glob(f"{engine}-{version or NEWEST[engine]}-*.whl"))), None)


def site_from_wheel(engine: str, version: str, site: Path) -> Path:
    """A fake site-packages holding the wheel's shipped tables (and nothing else)."""
    with zipfile.ZipFile(wheel(engine, version)) as z:
        for name in z.namelist():
            if any(name.startswith(f) for f in TABLE_FOLDERS[engine]) and not name.endswith("/"):
                (site / name).parent.mkdir(parents=True, exist_ok=True)
                (site / name).write_bytes(z.read(name))
    (site / engine).mkdir(parents=True, exist_ok=True)
    (site / engine / "__init__.py").write_text("")
    return site


@functools.lru_cache(maxsize=None)
def _defs(engine: str, version: str) -> tuple:
    """((file, function names, their compiled defs), ...) read out of the wheel once."""
    out = []
    with zipfile.ZipFile(wheel(engine, version)) as z:
        for rel, names in LOADERS[engine].items():
            if rel not in z.namelist():      # a table family this release has not (its data says no loader)
                continue
            tree = ast.parse(z.read(rel).decode())
            defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
            assert {d.name for d in defs} == set(names), f"{engine} {version}: {rel} no longer defines {names}"
            out.append((rel, names, compile(ast.Module(body=defs, type_ignores=[]), rel, "exec")))
    return tuple(out)


def load_loaders(engine: str, site: Path, device_name: str, triton_version: str, version: str | None = None) -> dict:
    """{function name: the engine's function}, bound to a fake package under `site`, for a
    GPU CUDA calls `device_name` and a running Triton `triton_version`."""
    funcs: dict = {}
    platform = ModuleType("vllm.platforms")
    platform.current_platform = SimpleNamespace(get_device_name=lambda *a: device_name)   # type: ignore[attr-defined]
    override = ModuleType(_GET_CONFIG[engine])
    override.get_config = lambda: None                                                  # type: ignore[attr-defined]
    sys.modules["vllm.platforms"] = platform
    sys.modules[_GET_CONFIG[engine]] = override
    shared: dict = {}
    for rel, names, code in _defs(engine, version or NEWEST[engine]):
        namespace = {
            "__file__": str(site / rel), "os": os, "json": json, "functools": functools, "re": re,
            "cache": functools.cache, "Any": Any, "Dict": Dict, "List": List, "Optional": Optional,
            "Tuple": Tuple, "logger": _Log(), "envs": _VllmEnvs(), "_is_cuda": True, "_is_hip": False,
            "get_device_name": lambda *a: device_name,
            "get_exec": lambda: SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=False)),
            "triton": SimpleNamespace(__version__=triton_version),
            # the dtype-string functions compare a dtype with torch.float (the activation's: bf16 here)
            "torch": SimpleNamespace(_dynamo=SimpleNamespace(is_compiling=lambda: False), dtype=object,
                                     float="torch.float32", bfloat16="torch.bfloat16"),
            "log_info_on_rank0": lambda lg, msg, *a: lg.info(msg, *a),
            "get_default_config": lambda *a, **k: dict(DEFAULT),
            **shared,
        }
        exec(code, namespace)
        for name in names:
            funcs[name] = namespace[name]
        if "get_device_name_as_file_name" in names:
            shared["get_device_name_as_file_name"] = namespace["get_device_name_as_file_name"]
    return funcs
