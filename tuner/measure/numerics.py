"""Does a kernel compute the right thing? One comparison for everyone who asks.

A config is checked on fresh random inputs, its output poisoned with NaN first so that an
element the kernel never wrote cannot pass, against the kernel's float32/float64
reference: the relative error ||out - ref|| / ||ref|| must be at most the kernel's
tolerance. The tuning run's numerics check (tuner/measure/device_measurer.py), `tuner check`
(tuner/commands/check.py) and the tests all use this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tuner.plan.kernel_api import Config, KernelSpec, Params


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; infinite when `out` holds a NaN or an infinity
    (an element never written into a poisoned output, or an overflow). A reference of
    zeros is no excuse: its norm counts as tiny, so any difference is huge."""
    got = out.double()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    ref = ref.double()
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


def poison(out: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN before the kernel runs, so that anything it leaves unwritten shows."""
    return out.fill_(float("nan"))


@dataclass
class Agreement:
    """How one run of a config compares with the reference."""
    rel_error: float            # math.inf when the output holds NaN or infinity
    tolerance: float
    seed: int
    # The kernel returned the `out` tensor it was given (the contract, KernelSpec.run);
    # the comparison is of what it returned either way.
    in_place: bool = True

    @property
    def unwritten(self) -> bool:
        return math.isinf(self.rel_error)

    @property
    def passed(self) -> bool:
        return self.rel_error <= self.tolerance

    @property
    def detail(self) -> str:
        if self.unwritten:
            return f"NaN left in the output (seed {self.seed})"
        return f"tolerance {self.tolerance}, seed {self.seed}"


def check_config(kernel: KernelSpec, params: Params, M: int, config: Config | None, device: str,
                 seed: int) -> tuple[Agreement, torch.Tensor]:
    """Run `config` (None: the kernel's default) on inputs drawn from `seed` into a
    NaN-poisoned output and compare with the reference. Returns the agreement and the
    output. Exceptions of the kernel (a config that does not compile or run) propagate."""
    inputs = kernel.make_inputs(params, M, device, seed)
    given = poison(inputs["out"])
    out = kernel.run(inputs, config if config is not None else kernel.default_config(params, M))
    if device == "cuda":
        torch.cuda.synchronize()
    in_place = out.data_ptr() == given.data_ptr() and out.shape == given.shape
    return Agreement(relative_error(out, kernel.reference(inputs)), kernel.tolerance, seed, in_place), out
