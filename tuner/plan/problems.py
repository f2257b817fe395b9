"""A problem: one kernel shape to tune, independent of the batch size M."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

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

    @property
    def key(self) -> str:
        """A stable, readable identity: 'N=7168,K=2048,block_shape=[128,128]'."""
        return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
                        for k, v in self.params.items())

    def __hash__(self) -> int:
        return hash((self.kernel, self.key))

    def __eq__(self, other) -> bool:
        return isinstance(other, Problem) and (self.kernel, self.key) == (other.kernel, other.key)
