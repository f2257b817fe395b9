"""`tuner engine-source extract` of every supported release: the files tuner launches that release
with, and no file of a kernel the release data says tuner does not launch at it (configs/engines/).
Before, SGLang 0.5.19 and 0.5.20 (whose block-FP8 GEMM lives elsewhere, without the sm_90 and
split-K kernels) could not be extracted at all: "has no sglang/kernels/ops/gemm/fp8_kernel.py"."""

import json
import os
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.plan import kernel_registry
from tuner.plan.engine_releases import refused_kernel, supported_versions

WHEELS = os.environ.get("TUNER_ENGINE_WHEELS")
pytestmark = [pytest.mark.ci_variables,
              pytest.mark.skipif(not WHEELS, reason="extracts from the engines' wheels: TUNER_ENGINE_WHEELS is not set "
                                                    "(.ci/run provides it)")]


def _wheel(engine: str, version: str) -> Path:
    found = sorted(Path(WHEELS or "").glob(f"{engine}-{version}-*.whl"))
    assert found, f"no {engine} {version} wheel in {WHEELS}"
    return found[0]


@pytest.mark.parametrize("engine,version", [(e, v) for e in ("vllm", "sglang") for v in supported_versions(e)])
def test_every_supported_release_extracts_what_tuner_launches_it_with(engine, version, tmp_path, capsys):
    out = tmp_path / f"{engine}-{version}"
    assert main(["engine-source", "extract", "--engine", engine, "--from", str(_wheel(engine, version)),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "tuner-engine-source.json").read_text())
    assert manifest["version"] == version
    refused = {k for k in ("fused_moe", "fp8_gemm") if refused_kernel(engine, k, version)}
    kept = set(manifest["files"])
    for kernel in ("fused_moe", "fp8_gemm"):
        own = {f for f in kernel_registry.launcher(engine).KERNEL_FUNCTIONS[kernel]}
        if kernel in refused:
            assert not own & kept, (kernel, kept)
            assert f"not extracted: {engine} {version}'s {kernel}, which tuner does not launch:" in printed
        else:
            assert own <= kept, (kernel, own - kept)
    # the folder serves the GPU machine as its wheel does: the MoE launcher loads from it at that release
    spec = kernel_registry.get_kernel("fused_moe", engine, str(out))
    assert (spec.source_version, spec.notes.get("launched_as")) == (version, version)
    assert Path(spec.origin).resolve() == out.resolve()
