"""A config built once serves every batch size when the kernel's build does not depend on M
(KernelSpec.compile_per_m False, as MLA decode declares): the compile workers get one job per
(problem, config), not one per (problem, M, config). Configs handed out ahead (compile_ahead) are
built after the batch's own, waited for when asked, and dropped when still queued."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from kernels.mla_decode_spec import SPEC as MLA
from tuner.measure.device_measurer import DeviceMeasurer
from tuner.measure.measurers import Measurement


class _Done:
    def __init__(self, started: bool = True):
        self.started = started

    def result(self, timeout=None):
        return None                      # built

    def done(self) -> bool:
        return self.started

    def cancel(self) -> bool:
        return not self.started          # a job no worker took yet is cancelled


class _Pool:
    def __init__(self, started: bool = True):
        self.jobs: list[tuple] = []
        self.started = started

    def submit(self, fn, ref, params, M, config):
        self.jobs.append((M, tuple(sorted(config.items()))))
        return _Done(self.started)


def _measurer(kernel) -> DeviceMeasurer:
    # only what _submit/precompile read: no device, no worker processes
    m = object.__new__(DeviceMeasurer)
    m.kernel, m._pool, m.compile_timeout_s = kernel, _Pool(), 1.0
    m.compiles = {"built": 0, "failed": 0, "lost": 0, "reused": 0, "ahead": 0, "ahead_used": 0, "ahead_dropped": 0,
                  "wait_s": 0.0, "errors": []}
    m._submitted, m._ahead_keys, m._ahead = {}, set(), []
    m.on_step, m.poisoned, m._compile_workers = None, False, 4
    m.device = SimpleNamespace(kind="cuda")
    m._time = lambda problem, M, config: Measurement(1.0, 0.0, None)
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


def test_configs_built_ahead_follow_the_batch_and_are_waited_for_when_asked():
    """Before: no way to build a config before it was asked for; its batch waited for its compile."""
    m = _measurer(dataclasses.replace(MLA, compile_per_m=True))
    problem = SimpleNamespace(key="heads=16,context=512", params={"heads": 16, "context": 512})
    a, b, c = ({"BLOCK_N": n, "num_kv_splits": 4} for n in (16, 32, 64))
    m.compile_ahead([(problem, 1, c), (problem, 1, a)])            # a is in the batch: not handed out twice
    assert [x.time_us for x in m.measure_iter(problem, 1, [a, b])] == [1.0, 1.0]
    key = lambda cfg: (1, tuple(sorted(cfg.items())))              # noqa: E731
    assert m._pool.jobs == [key(a), key(b), key(c)]                # the batch's own jobs first
    assert m.compiles["ahead"] == 1 and m.compiles["built"] == 2
    list(m.measure_iter(problem, 1, [c]))                          # asked now: its job is waited for, not redone
    assert len(m._pool.jobs) == 3 and m.compiles["ahead_used"] == 1 and m.compiles["built"] == 3
    assert m.compiles["wait_s"] >= 0.0


def test_a_config_built_ahead_that_no_worker_took_is_dropped_at_the_next_batch():
    m = _measurer(dataclasses.replace(MLA, compile_per_m=True))
    m._pool = _Pool(started=False)
    problem = SimpleNamespace(key="heads=16,context=512", params={"heads": 16, "context": 512})
    a, b, c = ({"BLOCK_N": n, "num_kv_splits": 4} for n in (16, 32, 64))
    m.compile_ahead([(problem, 1, b), (problem, 1, c)])
    list(m.measure_iter(problem, 1, [a]))
    list(m.measure_iter(problem, 1, [b]))          # b: asked, kept; c: still queued, dropped before b's batch
    assert m.compiles["ahead_dropped"] == 1 and m.compiles["ahead_used"] == 1
    assert len(m._pool.jobs) == 3                  # b was not handed out again


def test_no_config_is_built_ahead_where_the_batch_leaves_no_worker_idle():
    """The CPU device's 2 workers for batches of 2: a job ahead would only delay the next batch."""
    m = _measurer(dataclasses.replace(MLA, compile_per_m=True))
    m._pool, m._compile_workers = _Pool(started=False), 2
    problem = SimpleNamespace(key="heads=16,context=512", params={"heads": 16, "context": 512})
    a, b, c = ({"BLOCK_N": n, "num_kv_splits": 4} for n in (16, 32, 64))
    m.compile_ahead([(problem, 1, c)])
    list(m.measure_iter(problem, 1, [a, b]))
    assert len(m._pool.jobs) == 2 and m.compiles["ahead"] == 0
