"""The wheels a GPU call carries (.whl/): exactly the versions pinned in scripts/gpu_wheels.txt,
one wheel each. scripts/prepare_gpu_proof.sh downloads them and checks the folder here;
scripts/gpu_proof.sh checks it again on the GPU machine before installing (the standard library
only: nothing else is installed there yet)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

PINS = Path(__file__).resolve().parents[2] / "scripts" / "gpu_wheels.txt"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def read_pins(path: Path = PINS) -> dict[str, str]:
    """{distribution: version} of the pin file; a line that is not NAME==VERSION is refused."""
    pins = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        if not m:
            raise ValueError(f"{path}:{n}: {line!r} is not NAME==VERSION")
        pins[_norm(m.group(1))] = m.group(2)
    return pins


def problems(folder: Path, pins: dict[str, str] | None = None) -> list[str]:
    """What is wrong with the wheels in `folder` against the pins: a pinned package missing, a
    version not the pin's, two wheels of one package, a wheel not pinned; [] when none."""
    pins = read_pins() if pins is None else pins
    found: dict[str, list[str]] = {}
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        parts = wheel.name.split("-")
        if len(parts) < 5:
            return [f"{wheel.name} is not a wheel's name"]
        found.setdefault(_norm(parts[0]), []).append(parts[1])
    out = []
    for dist, version in pins.items():
        got = found.get(dist, [])
        if not got:
            out.append(f"no wheel of {dist}=={version}")
        elif len(got) > 1:
            out.append(f"{len(got)} wheels of {dist} ({', '.join(got)}): keep one, the pinned {version}")
        elif got[0] != version:
            out.append(f"{dist} {got[0]} is not the pinned {version}")
    out += [f"{dist} {', '.join(v)} is not pinned in {PINS.name}" for dist, v in found.items() if dist not in pins]
    return out


if __name__ == "__main__":
    wrong = problems(Path(sys.argv[1] if len(sys.argv) > 1 else ".whl"))
    for line in wrong:
        print(f"wheels: {line}", file=sys.stderr)
    sys.exit(1 if wrong else 0)
