"""The engines' own config-loader functions, run against a folder layout of ours.

How CI gets that code cheaply: .ci/run downloads the two released wheels once with
`pip download --no-deps` (vllm 0.33.0, about 340 MB; sglang 0.5.23, about 40 MB; nothing is
installed) and names the folder in TUNER_ENGINE_WHEELS. We read four source files out of the
zips and take the loader functions from them verbatim (their `def`s, decorators included,
found with `ast`), then run them with `__file__` pointing into a fake site-packages. Only
what they import for logging, the device name, environment variables and the Triton version
is stubbed; the lookup logic (file names, folders, fallbacks, parsing) is theirs.
"""

import ast
import functools
import json
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

WHEELS = {"vllm": "vllm-0.33.0-*.whl", "sglang": "sglang-0.5.23-*.whl"}
LOADERS = {
    "vllm": {
        "vllm/model_executor/layers/fused_moe/fused_moe.py": ["get_config_file_name", "get_moe_configs"],
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py": ["get_w8a8_block_fp8_configs"],
    },
    "sglang": {
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py":
            ["get_config_file_name", "get_moe_configs"],
        "sglang/kernels/ops/gemm/fp8_kernel.py": ["get_w8a8_block_fp8_configs"],
    },
}


class _Quiet:
    def __getattr__(self, name):
        return lambda *a, **k: None


class _VllmEnvs:
    """vllm.envs reads the environment when an attribute is asked for; so do we."""
    @property
    def VLLM_TUNED_CONFIG_FOLDER(self):
        return os.environ.get("VLLM_TUNED_CONFIG_FOLDER")

    VLLM_BATCH_INVARIANT = False


def wheel_dir() -> Path | None:
    d = os.environ.get("TUNER_ENGINE_WHEELS")
    return Path(d) if d and Path(d).is_dir() else None


def load_loaders(engine: str, site: Path, device_name: str, triton_version: str) -> dict:
    """{function name: the engine's function}, bound to a fake package under `site`."""
    wheel = next(wheel_dir().glob(WHEELS[engine]))
    funcs = {}
    with zipfile.ZipFile(wheel) as z:
        for rel, names in LOADERS[engine].items():
            tree = ast.parse(z.read(rel).decode())
            defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
            assert {d.name for d in defs} == set(names), f"{rel} no longer defines {names}"
            namespace = {
                "__file__": str(site / rel), "os": os, "json": json, "functools": functools,
                "Any": Any, "Dict": Dict, "List": List, "Optional": Optional, "Tuple": Tuple,
                "logger": _Quiet(), "envs": _VllmEnvs(), "_is_cuda": True, "_is_hip": False,
                "get_device_name_as_file_name": lambda: device_name.replace(" ", "_"),
                "get_device_name": lambda *a: device_name,
                "get_exec": lambda: SimpleNamespace(deterministic=SimpleNamespace(
                    enable_deterministic_inference=False)),
                "triton": SimpleNamespace(__version__=triton_version),
                "torch": SimpleNamespace(_dynamo=SimpleNamespace(is_compiling=lambda: False)),
                "log_info_on_rank0": lambda *a, **k: None,
            }
            exec(compile(ast.Module(body=defs, type_ignores=[]), rel, "exec"), namespace)
            for name in names:
                funcs.setdefault(name, {})[rel] = namespace[name]
    return {name: next(iter(v.values())) if len(v) == 1 else v for name, v in funcs.items()}
