"""A problem: one kernel shape to tune, independent of the batch size M."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

from tuner.plan.engines import ENGINE_NAMES


@dataclass(frozen=True)
class Problem:
    kernel: str                       # module name in kernels/, e.g. "fp8_gemm"
    params: dict = field(hash=False)  # shape and dtype keys, as landscapes store them
    layers: tuple[str, ...] = ()      # the model's layers that run this shape
    engines: tuple[str, ...] = ENGINE_NAMES      # the engines that read its tables: by default every one
    # A problem tuned after another whose chosen config fixes some of its keys at each M
    # (SGLang's `_down` MoE table must share BLOCK_SIZE_M with the up table).
    tied_to: str | None = None
    tied_keys: tuple[str, ...] = ()

    @cached_property
    def key(self) -> str:
        """A stable, readable identity: 'N=7168,K=2048,block_shape=[128,128]'. Computed once a
        problem (a run looks it up for every study, row and table: 1.5 million times in one
        synthetic night); `params` is never changed after a problem is made."""
        return ",".join(f"{k}={_shown(v)}" for k, v in self.params.items())

    def __hash__(self) -> int:
        return hash((self.kernel, self.key))

    def __eq__(self, other) -> bool:
        return isinstance(other, Problem) and (self.kernel, self.key) == (other.kernel, other.key)


def _shown(v) -> str:
    """A param's value in a problem's key: JSON, but a string as itself; an int (not a bool:
    JSON's `true`) is its str, the same text without the encoder (landscapes key every point)."""
    if isinstance(v, str):
        return v
    if type(v) is int:
        return str(v)
    return json.dumps(v, separators=(",", ":"))
