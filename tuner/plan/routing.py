"""Recorded routing for timing a MoE layer (`--routing FILE`).

The engines' one-table tuners time the fused MoE on uniformly random top-k ids, and `zipf`
is far more skewed than a served model (one expert gets most tokens). SGLang's `_sep` tuner
times on routing recorded from a serving run; so can we. `--routing FILE` takes the top-k
expert ids a served model chose:
  - SGLang's expert-distribution dump in its per-token mode
    (`--expert-distribution-recorder-mode per_token`, then `/start_expert_distribution_record`
    and `/dump_expert_distribution_record`): a torch.save'd dict whose "records" each hold
    "topk_ids_of_layer" [layers, tokens, 8] in physical expert ids (-1 where unused), and
    "last_physical_to_logical_map" [layers, physical experts] to map them back;
  - a plain array of shape [tokens, topk] (or [layers, tokens, topk]) of expert ids, as .npy
    or as a torch.save'd tensor (.pt).
The ids are checked against the problem (top-k, number of experts), stored once in canonical
form (int32 [layers, tokens, topk], .npy) under `<out>/routing/`, and named in the problem's
params as `recorded:<file stem>@<hash of the ids>`: that name is part of every study name,
table identity and manifest, so tables timed on other routing are never mixed. The kernel
(kernels/fused_moe.py) samples each input set's M tokens from it: one layer, M consecutive
tokens (a batch as served), both drawn from the input set's seed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.plan.kernel_api import ROUTING_DIR_ENV, ROUTING_PREFIX

BUILT_IN = ("uniform", "zipf")
MAX_ROUTING_BYTES = 2 << 30          # a dump of a long serving run; read once


@dataclass(frozen=True)
class RecordedRouting:
    ids: np.ndarray                  # int32 [layers, tokens, topk]
    source: str                      # what the file was, in words
    stem: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.ids).tobytes()
                              + str(self.ids.shape).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The routing as problems, studies and manifests name it."""
        return f"{ROUTING_PREFIX}{self.stem}@{self.digest}"

    def describe(self) -> str:
        layers, tokens, topk = self.ids.shape
        return f"{self.source}: {layers} layer(s) x {tokens} tokens, top-{topk}"


MAX_EXPERT_ID = (1 << 31) - 1     # ids are stored as int32


def is_file_routing(routing: str) -> bool:
    return routing not in BUILT_IN


def _as_array(obj, where: str) -> np.ndarray:
    if hasattr(obj, "detach"):                       # a torch tensor
        obj = obj.detach().cpu().numpy()
    arr = np.asarray(obj)
    if arr.dtype.kind not in "iu":
        raise TunerError(f"{where}: expert ids must be integers, not {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] == 0 or arr.shape[2] == 0:
        raise TunerError(f"{where}: expected expert ids of shape [tokens, topk] or [layers, tokens, topk], "
                         f"not {list(arr.shape)}")
    # compared as Python ints, before any cast: 2^32 + k must not become k (int32), nor 2^63 a negative
    low, high = int(arr.min()), int(arr.max())
    if high > MAX_EXPERT_ID or low < -1:
        bad = high if high > MAX_EXPERT_ID else low
        raise TunerError(f"{where}: expert id {bad} is out of range (an expert id is from 0 to {MAX_EXPERT_ID}; "
                         "-1 marks an unused column of SGLang's dump)")
    return arr.astype(np.int64)


def _from_sglang_dump(data: dict, where: str) -> np.ndarray:
    """SGLang's per-token dump: each record's ids mapped from physical to logical experts,
    the unused columns (-1) dropped; the records' tokens joined per layer."""
    records = data.get("records")
    if not isinstance(records, list) or not records:
        if "logical_count" in data:
            raise TunerError(f"{where} is SGLang's expert-distribution dump in its stat mode (counts per expert, "
                             "no per-token ids): record with --expert-distribution-recorder-mode per_token")
        raise TunerError(f"{where}: an SGLang expert-distribution dump holds 'records'; this one holds none")
    mapping = data.get("last_physical_to_logical_map")
    mapping = None if mapping is None else _as_array(mapping, f"{where} (last_physical_to_logical_map)")[0]
    parts = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "topk_ids_of_layer" not in rec:
            raise TunerError(f"{where}: record {i} has no topk_ids_of_layer (not a per_token dump)")
        ids = _as_array(rec["topk_ids_of_layer"], f"{where} record {i}")
        if ids.shape[1]:
            parts.append(ids)
    if not parts:
        raise TunerError(f"{where}: its records hold no tokens")
    ids = np.concatenate(parts, axis=1)                       # [layers, tokens, width]
    used = (ids >= 0).any(axis=(0, 1))
    ids = ids[:, :, used]
    if (ids < 0).any():
        raise TunerError(f"{where}: some tokens have fewer experts than others (-1 ids): not a top-k routing")
    if mapping is not None:
        if mapping.shape[0] != ids.shape[0] or ids.max() >= mapping.shape[1]:
            raise TunerError(f"{where}: its physical-to-logical map does not fit its ids")
        ids = np.take_along_axis(mapping[:, None, :].repeat(ids.shape[1], axis=1), ids, axis=2)
    return ids


def load_routing(path: str | Path) -> RecordedRouting:
    """A routing file as top-k ids (.npy, or a .pt holding a tensor or SGLang's dump)."""
    p = Path(path)
    where = f"--routing {path}"
    if not p.is_file():
        raise TunerError(f"{where}: not found (give uniform, zipf, or a routing file: SGLang's per-token "
                         "expert-distribution dump, or a .npy/.pt of expert ids [tokens, topk])")
    if p.stat().st_size > MAX_ROUTING_BYTES:
        raise TunerError(f"{where}: {p.stat().st_size >> 20} MiB is more than a routing file should hold "
                         f"({MAX_ROUTING_BYTES >> 20} MiB)")
    try:
        if p.suffix == ".npy":
            arr, source = _as_array(np.load(p, allow_pickle=False), where), "a .npy of expert ids"
        else:
            import torch
            obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, dict):
                arr, source = _from_sglang_dump(obj, where), "SGLang's per-token expert-distribution dump"
            else:
                arr, source = _as_array(obj, where), "a tensor of expert ids"
    except TunerError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        if type(e).__name__ == "UnpicklingError":
            # torch's own advice (to load it unsafely, with terminal escapes) is not ours to pass on
            raise TunerError(f"{where}: holds objects other than tensors, lists and dicts (torch.load refuses "
                             "them with weights_only): not expert ids") from None
        said = "".join(c for c in (str(e).splitlines() or [""])[0] if c.isprintable())[:120]
        raise TunerError(f"{where}: not readable as .npy or torch.save data ({type(e).__name__}: {said})") from None
    return RecordedRouting(arr.astype(np.int32), source, p.stem.split(".")[0][:40] or "routing")


def checked(routing: RecordedRouting, topk: int, experts: int, where: str) -> None:
    """The ids must be a top-`topk` routing over `experts` experts (the router's, all GPUs')."""
    ids = routing.ids
    if ids.shape[2] != topk:
        raise TunerError(f"{where}: the routing picks {ids.shape[2]} experts per token, the model {topk}")
    if ids.min() < 0 or ids.max() >= experts:
        raise TunerError(f"{where}: expert ids run from {int(ids.min())} to {int(ids.max())}, but the model "
                         f"routes over {experts} experts")
    if any(len(np.unique(row)) != topk for row in ids.reshape(-1, topk)[:4096]):
        raise TunerError(f"{where}: a token lists one expert twice: not a top-{topk} routing")


def install(routing: RecordedRouting, folder: Path) -> Path:
    """Store the canonical ids where the kernel finds them (`<folder>/<hash>.npy`), and point
    this process (and the measuring children it starts) at that folder."""
    import io

    from tuner.paths import atomic_write_file, make_folder
    make_folder(folder)
    dst = folder / f"{routing.digest}.npy"
    if not dst.is_file():
        # the bytes made first, then written with write(2) into a temporary removed on any error:
        # numpy's own file writer says a full disk as "N requested and 0 written", no errno
        buf = io.BytesIO()
        np.save(buf, routing.ids)

        def fill(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(buf.getvalue())
        atomic_write_file(dst, fill, root=folder)
    os.environ[ROUTING_DIR_ENV] = str(folder.resolve())
    return dst


def use_stored(folder: Path) -> None:
    """A worker or a later run: the routing files a stored plan names are in `folder`."""
    if folder.is_dir():
        os.environ[ROUTING_DIR_ENV] = str(folder.resolve())


def load_profile_stats(routing: RecordedRouting, experts: int) -> dict:
    """Per-expert load over the whole file, as the plan prints it: the busiest expert's share
    against a balanced one's, and the share of experts never chosen."""
    counts = np.bincount(routing.ids.reshape(-1), minlength=experts).astype(float)
    mean = counts.mean() or 1.0
    return {"max_over_mean": float(counts.max() / mean), "unused": float((counts == 0).mean())}
