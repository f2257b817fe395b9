"""The Hopper GPUs we tune for: the names users type, the names CUDA reports, limits, read from
data (configs/gpus.yaml, and a `gpus.yaml` in each folder TUNER_CONFIG_DIRS names) and checked
when first used, so that a GPU is added by a file, not by code.

Rates here are datasheet figures, used only to print rough floors in a plan; reported
rooflines use ceilings measured on the device (bench/). The L2 size here sizes the L2 flush
only where the device cannot be asked (the CPU device); on a GPU the real one is read off it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import config_dirs

GPUS_FILE = "gpus.yaml"


@dataclass(frozen=True)
class GpuSpec:
    key: str                  # what the user types: "H200"
    cuda_name: str            # torch.cuda.get_device_name(): "NVIDIA H200"
    sm_count: int
    max_smem_per_block: int   # bytes a program may ask for (opt-in limit on sm_90)
    l2_bytes: int
    hbm_tb_s: float           # datasheet memory bandwidth
    fp8_tflops: float         # datasheet dense FP8 tensor rate
    memory_gb: float = 80.0   # datasheet HBM capacity (GB): does a model's shard fit?
    aliases: tuple[str, ...] = field(default=(), compare=False)     # other names people type for it


# field in the file -> (type, what it must be); every field but aliases is required
_FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
           "key": (str, "a name of letters, digits and dashes"), "cuda_name": (str, "a name"),
           "aliases": (list, "a list of names"), "sm_count": (int, "a whole number from 1 to 1024"),
           "max_smem_per_block": (int, "bytes, from 1 to 16 MiB"), "l2_mib": ((int, float), "MiB, above 0 and at most 4096"),
           "hbm_tb_s": ((int, float), "TB/s, above 0 and at most 1000"),
           "fp8_tflops": ((int, float), "TFLOP/s, above 0 and at most 100000"),
           "memory_gb": ((int, float), "GB, above 0 and at most 100000")}
_BOUNDS = {"sm_count": 1024, "max_smem_per_block": 16 << 20, "l2_mib": 4096, "hbm_tb_s": 1000,
           "fp8_tflops": 100000, "memory_gb": 100000}


def _plain(name: str) -> str:
    """A GPU's name as compared: lower case, without "NVIDIA" and without spaces, dashes or dots."""
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


def _spec(entry, where: str) -> GpuSpec:
    """One entry of a GPU file, checked field by field; one line naming the field otherwise."""
    if not isinstance(entry, dict):
        raise TunerError(f"{where}: each GPU is a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(map(str, entry)) - set(_FIELDS))
    if unknown:
        raise TunerError(f"{where}: unknown field {unknown[0]!r} (the fields: {', '.join(_FIELDS)})")
    missing = [k for k in _FIELDS if k != "aliases" and k not in entry]
    if missing:
        raise TunerError(f"{where}: no {missing[0]!r}")
    for name, (kind, what) in _FIELDS.items():
        value = entry.get(name, [])
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and name in _BOUNDS:
            ok = math.isfinite(value) and 0 < value <= _BOUNDS[name]
        if ok and name == "key":
            ok = bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,31}", value))
        if ok and name == "cuda_name":
            ok = 0 < len(value) <= 100 and value.isprintable() and bool(_plain(value))
        if ok and name == "aliases":
            ok = all(isinstance(a, str) and 0 < len(a) <= 100 and a.isprintable() and _plain(a) for a in value)
        if not ok:
            raise TunerError(f"{where}: {name} must be {what}, not {str(value)[:40]!r}")
    return GpuSpec(entry["key"], entry["cuda_name"], entry["sm_count"], entry["max_smem_per_block"],
                   round(entry["l2_mib"] * (1 << 20)), float(entry["hbm_tb_s"]), float(entry["fp8_tflops"]),
                   float(entry["memory_gb"]), tuple(entry.get("aliases", ())))


def load_gpus(folders: list[Path]) -> dict[str, GpuSpec]:
    """Every GPU of the `gpus.yaml` files in `folders`, in order; a name (key, CUDA name or alias,
    as compared) given twice is refused in one line, so no file silently redefines a GPU."""
    from tuner.reading import read_yaml_file
    gpus: dict[str, GpuSpec] = {}
    names: dict[str, str] = {}
    for folder in folders:
        path = folder / GPUS_FILE
        if not path.exists() and folder != folders[0]:
            continue
        data = read_yaml_file(path, "the GPU file ")
        if not isinstance(data, dict) or set(data) != {"gpus"} or not isinstance(data["gpus"], list):
            raise TunerError(f"the GPU file {path} must hold one key, gpus: a list of GPUs")
        for i, entry in enumerate(data["gpus"]):
            spec = _spec(entry, f"the GPU file {path}, GPU {i + 1}")
            for name in {_plain(spec.key), _plain(spec.cuda_name), *map(_plain, spec.aliases)}:
                if name in names:
                    raise TunerError(f"the GPU file {path}: {spec.key} takes the name {name!r} of {names[name]}")
                names[name] = spec.key
            gpus[spec.key] = spec
    return gpus


class _Gpus(Mapping):
    """The GPUs by key, read from the data on first use (so a bad file is one line from the command
    that needs it, not an error at import), and again when TUNER_CONFIG_DIRS changes."""

    def __init__(self) -> None:
        self._read: tuple[tuple[Path, ...], dict[str, GpuSpec]] | None = None

    def _gpus(self) -> dict[str, GpuSpec]:
        folders = tuple(config_dirs())
        if self._read is None or self._read[0] != folders:
            self._read = (folders, load_gpus(list(folders)))
        return self._read[1]

    def __getitem__(self, key: str) -> GpuSpec:
        return self._gpus()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._gpus())

    def __len__(self) -> int:
        return len(self._gpus())


GPUS: Mapping[str, GpuSpec] = _Gpus()


def gpu_keys_text() -> str:
    """The keys --gpu takes, for a help line; where the data cannot be read, where it lives."""
    try:
        return ", ".join(GPUS)
    except TunerError:
        return "the GPUs of configs/gpus.yaml"


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by the user's key or its CUDA name, or a name people type for it ("H100 SXM",
    "h200 nvl"): case, spaces, dashes and "NVIDIA" aside; an unknown one gets a did-you-mean."""
    plain = _plain(str(name))
    for spec in GPUS.values():
        if plain in {_plain(spec.key), _plain(spec.cuda_name), *map(_plain, spec.aliases)}:
            return spec
    import difflib
    names = {_plain(n): g.key for g in GPUS.values() for n in (g.key, *g.aliases)}
    # the same family letter (a B200 is no misspelt H200)
    close = [c for c in difflib.get_close_matches(plain, list(names), n=len(names), cutoff=0.7) if c[:1] == plain[:1]]
    # every GPU as close as the closest (H300: H200 and H800 alike), not the first of them
    score = {c: difflib.SequenceMatcher(None, plain, c).ratio() for c in close}
    best = [key for key in GPUS if key in {names[c] for c in close if score[c] == max(score.values())}]
    hint = f"did you mean {', '.join(best[:-1])} or {best[-1]}? " if len(best) > 1 else \
        f"did you mean {best[0]}? " if best else ""
    raise TunerError(f"unknown GPU {name!r}; {hint}supported: {', '.join(GPUS)}")


def resolve_gpu(key: str | None, device: str):
    """The GPU the check runs on: --gpu, else the one present (the CPU device stands in for
    an H100 unless told otherwise)."""
    if key:
        return get_gpu(key)
    if device == "cpu":
        return GPUS["H100"]
    import torch
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    found = next((g for g in GPUS.values() if g.cuda_name == name), None)
    if found is None:
        raise TunerError(f"this machine's GPU {name or '(none)'} is not one of {', '.join(GPUS)}; give --gpu")
    return found
