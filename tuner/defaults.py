"""The default config a table's entry at M is compared with: one notion, used by tuning
(the seed every study measures and the speedup it reports), by drift and by nightly.

It is the engine's default for the problem and M (what the engine runs without a table),
with the keys a table is tied to another table by set to that table's choice at M
(SGLang's MoE `_down` table must use the up table's BLOCK_SIZE_M: the default down
config it could run beside a given up table has that BLOCK_SIZE_M), in the space's
canonical form, so that it is the very point a search or a landscape has measured.
"""

from __future__ import annotations

from tuner.engines import lookup_nearest
from tuner.gpus import GpuSpec
from tuner.kernel_api import Config, KernelSpec, Params, config_from_entry


def table_default(kernel: KernelSpec, space, gpu: GpuSpec, params: Params, M: int,
                  tied: Config | None = None) -> Config:
    """`tied`: the values of the tied keys at M ({} or None when the table is not tied)."""
    return space.canonical(params, M, gpu, {**kernel.default_config(params, M), **(tied or {})})


def tied_values(kernel: KernelSpec, tied_keys, tied_table: dict | None, M: int) -> Config:
    """The tied keys' values at M, read from the table this one is tied to (the entry the
    engine would use at M: the nearest key)."""
    if not tied_keys or not tied_table:
        return {}
    entry = config_from_entry(kernel, lookup_nearest(tied_table, M))
    return {k: entry[k] for k in tied_keys}
