"""Record, as facts, the SHA-256 of every engine file whose code tuner imports (the files
holding the jit kernels the launchers in kernels/engines/ run), for each released version
whose wheel is in $TUNER_ENGINE_WHEELS: kernels/engines/release_files.json.

tuner refuses, by default, to import an engine file matching none of these (a tampered wheel
or extracted folder would run whatever it holds); --trust-engine-source runs it anyway. Run
this when a launcher learns a new release, with that release's wheel in the folder:

    TUNER_ENGINE_WHEELS=~/.cache/tuner-engine-wheels python scripts/engine_release_files.py
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def release_files(wheels: Path) -> dict:
    import importlib

    from tuner.plan.kernel_registry import imported_files_of
    from tuner.plan.kernel_sources import _from_wheel, _wheel_version, file_digest, version_key
    out: dict = {}
    for engine in imported_files_of():
        launcher = importlib.import_module(f"kernels.engines.{engine}")
        found = sorted(wheels.glob(f"{engine}-*.whl"), key=lambda w: version_key(_wheel_version(w, engine) or ""))
        for wheel in found:
            code = _from_wheel(wheel, engine)
            with zipfile.ZipFile(wheel) as z:
                present = set(z.namelist())
            if code.version not in launcher.SUPPORTED:
                continue
            # a file the release lacks (SGLang 0.5.19-0.5.20 keep no gemm/fp8_kernel.py: the data refuses
            # that kernel there) has no digest: nothing of it is imported
            out.setdefault(engine, {})[code.version] = {rel: file_digest(code.read(rel))
                                                        for rel in imported_files_of()[engine] if rel in present}
    return out


def main() -> int:
    wheels = Path(os.environ.get("TUNER_ENGINE_WHEELS", Path.home() / ".cache" / "tuner-engine-wheels"))
    facts = release_files(wheels)
    path = REPO / "kernels" / "engines" / "release_files.json"
    path.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}: " + ", ".join(f"{e} {' '.join(v)}" for e, v in sorted(facts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
