"""A config built once serves every batch size when the kernel's build does not depend on M
(KernelSpec.compile_per_m False, as MLA decode declares): the compile workers get one job per
(problem, config), not one per (problem, M, config)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from kernels.mla_decode_spec import SPEC as MLA
from tuner.measure.device_measurer import DeviceMeasurer


class _Done:
    def result(self, timeout=None):
        return None                      # built


class _Pool:
    def __init__(self):
        self.jobs: list[tuple] = []

    def submit(self, fn, ref, params, M, config):
        self.jobs.append((M, tuple(sorted(config.items()))))
        return _Done()


def _measurer(kernel) -> DeviceMeasurer:
    # only what _submit/precompile read: no device, no worker processes
    m = object.__new__(DeviceMeasurer)
    m.kernel, m._pool, m.compile_timeout_s = kernel, _Pool(), 1.0
    m.compiles = {"built": 0, "failed": 0, "lost": 0, "reused": 0, "errors": []}
    m._submitted = set()
    return m


def _jobs(batch_sizes):
    problem = SimpleNamespace(key="heads=16,context=512", params={"heads": 16, "context": 512})
    other = SimpleNamespace(key="heads=16,context=1024", params={"heads": 16, "context": 1024})
    a, b = {"BLOCK_N": 32, "num_kv_splits": 4}, {"BLOCK_N": 64, "num_kv_splits": 4}
    return [(p, M, c) for p in (problem, other) for M in batch_sizes for c in (a, b)]


def test_mla_builds_each_config_once_across_batch_sizes():
    assert MLA.compile_per_m is False
    m = _measurer(MLA)
    stats = m.precompile(_jobs([1, 2, 4]))
    # 2 problems x 2 configs built once each; the other 2 batch sizes reuse them
    assert len(m._pool.jobs) == 4
    assert stats["built"] == 4 and stats["reused"] == 8


def test_a_kernel_whose_build_depends_on_m_compiles_per_m():
    m = _measurer(dataclasses.replace(MLA, compile_per_m=True))
    stats = m.precompile(_jobs([1, 2, 4]))
    assert len(m._pool.jobs) == 12 and stats["reused"] == 0
