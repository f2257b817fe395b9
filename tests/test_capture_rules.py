"""CUDA-graph capture's rules on the CPU device (tuner/measure/capture_rules.py), each proved
through the real measuring path: the isolated measuring child (tuner/measure/isolation.py)
building the real DeviceMeasurer on the CPU device, timing a test kernel that breaks one rule
on purpose (tests/capture_violations.py). Each violation fails its config with the words torch
or Triton gives on a GPU; the capture-safe counterparts time; what is not timed (the warm-up
before it, the numerics check) is not held to the rules, as on the GPU; a refusal does not
cost the child (no CUDA context is lost to one). And the rules' own bookkeeping: what is a
host value, what Triton's interpreter may do, and that nothing is left patched after."""

import capture_violations
import pytest
import torch

from tuner.measure import capture_rules as rules
from tuner.measure.isolation import isolated_gpu_measurer
from tuner.plan.problems import Problem

pytestmark = pytest.mark.triton         # runs Triton kernels (tests/conftest.py)

CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
          "num_stages": 3}
COPY_WORDS = "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned."
SYNC_WORDS = "CUDA error: operation not permitted when stream is capturing"
MIXED_WORDS = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
# each violation of tests/capture_violations.py, the error the timed config fails with, and what it names
EXPECTED = {
    "scalar written into one element": ("CaptureRuleError: " + COPY_WORDS, "aten.copy_ from a host value"),
    "torch.tensor of host data onto the device": ("CaptureRuleError: " + COPY_WORDS, "torch.tensor of host data"),
    "host tensor moved to the device": ("CaptureRuleError: " + COPY_WORDS, "Tensor.to moves a host value"),
    "Python list as an index": ("CaptureRuleError: " + COPY_WORDS, "aten.index with a host index"),
    ".cpu()": ("CaptureRuleError: " + COPY_WORDS, "Tensor.cpu()"),
    ".tolist()": ("CaptureRuleError: " + COPY_WORDS, "Tensor.tolist()"),
    ".item()": ("CaptureRuleError: " + SYNC_WORDS, "aten._local_scalar_dense reads a device value"),
    "Python control flow on a device value": ("CaptureRuleError: " + SYNC_WORDS, "aten._local_scalar_dense"),
    "nonzero": ("CaptureRuleError: " + SYNC_WORDS, "aten.nonzero: its output size depends on device data"),
    "masked_select": ("CaptureRuleError: " + SYNC_WORDS, "aten.masked_select"),
    "boolean-mask indexing": ("CaptureRuleError: " + SYNC_WORDS, "aten.index with a boolean mask"),
    "torch.unique": ("CaptureRuleError: " + SYNC_WORDS, "aten._unique2"),
    "repeat_interleave without output_size": ("CaptureRuleError: " + SYNC_WORDS,
                                              "aten.repeat_interleave without output_size"),
    "torch.cuda.synchronize": ("CaptureRuleError: " + SYNC_WORDS, "an explicit device synchronize"),
    "host tensor in an op with device data": ("CaptureRuleError: " + MIXED_WORDS, "aten.add takes a host tensor"),
    "host tensor passed to the kernel": ("ValueError: Pointer argument (at 2) cannot be accessed from Triton "
                                         "(cpu tensor?)", "a host tensor passed to a Triton kernel"),
    ".numpy()": ("TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()",
                 "Tensor.numpy() of device data"),
}


def problem(violation: str) -> Problem:
    return Problem("fp8_gemm", {"N": 256, "K": 256, "block_shape": [128, 128], "violation": violation})


@pytest.fixture(scope="module")
def child():
    """One isolated measuring child on the CPU device for every rule: a refusal during capture
    leaves no lost CUDA context, so it is never replaced (asserted after each)."""
    m = isolated_gpu_measurer(capture_violations.KERNEL, "H200", compile_workers=0, timeout_s=120, device="cpu")
    yield m
    m.close()


def test_every_rule_has_a_violation_here():
    assert set(EXPECTED) == set(capture_violations.VIOLATIONS)
    assert {rules.RULES[r] for r in rules.RULES} <= {rules.COPY, rules.SYNC, rules.MIXED, rules.POINTER, rules.NUMPY}


@pytest.mark.parametrize("violation", list(EXPECTED))
def test_a_timed_run_that_breaks_a_capture_rule_fails_with_the_gpus_words(child, violation):
    [m] = child.measure(problem(violation), 1, [CONFIG])
    words, what = EXPECTED[violation]
    assert m.time_us is None and m.error.startswith(words), m.error
    assert what in m.error, m.error
    assert child.starts == 1, child.failures          # the child was not replaced over a refusal


def test_the_capture_safe_counterparts_time_and_the_untimed_work_is_not_held_to_the_rules(child):
    """t[0, 0].zero_(), a slice fill, a masked fill with a scalar, a 0-dim host scalar in an
    op, Python scalars, a device factory, repeat_interleave with output_size, host work on
    host values, and a host read made once in the warm-up (lazy set-up) all time; the numerics
    check, which the GPU runs outside any capture, may read device values on the host."""
    [m] = child.measure(problem("none"), 1, [CONFIG])
    assert m.error is None and m.time_us > 0
    check = child.check_numerics(problem(".item()"), 1, CONFIG, seed=3)
    assert check.status == "passed", check
    env = child.environment()
    assert env["device_kind"] == "cpu" and env["clock_warmups"] >= 1


# -- the rules' bookkeeping, in this process ---------------------------------------------------------
def test_host_values_are_told_from_device_data():
    device = torch.zeros(4)                      # made before the rules: device data
    with rules.capture_rules():
        assert not rules.is_host(device)
        assert rules.is_host(torch.tensor([1, 2])) and rules.is_host(torch.arange(3))
        assert rules.is_host(torch.arange(3, device="cpu"))          # the string names the host
        assert not rules.is_host(torch.arange(3, device=device.device))
        assert not rules.is_host(torch.zeros_like(device)) and not rules.is_host(device[1:])
        host = torch.ones(3)
        assert rules.is_host(host * 2) and rules.is_host(host[0])     # computed from host values alone
        assert not rules.is_host(device[:3] + host[0])                # a 0-dim host value meets device data
    assert rules._ACTIVE is None


def test_nothing_stays_patched_after_the_rules():
    import triton.runtime.interpreter as ti
    before = (torch.Tensor.__dict__.get("to"), torch.empty, torch.tensor, ti.GridExecutor.__call__,
              torch.cuda.synchronize)
    device = torch.zeros(2)
    with pytest.raises(rules.CaptureRuleError):
        with rules.capture_rules():
            device[0].item()
    with rules.capture_rules():
        pass
    assert (torch.Tensor.__dict__.get("to"), torch.empty, torch.tensor, ti.GridExecutor.__call__,
            torch.cuda.synchronize) == before
    device[0].item()                             # outside the rules: allowed
    torch.tensor([1]).tolist()


def test_the_interpreters_own_copies_pass_but_a_host_argument_does_not():
    """Triton's interpreter copies every tensor argument's storage to a host buffer and back
    around a launch (torch ops of its own): not refused. The launcher around the launch is
    the timed code's: a host tensor among a launch's arguments is refused before it runs."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(8)
    with rules.capture_rules():
        add_one[(1,)](x, 8, BLOCK=8)
        with pytest.raises(ValueError, match=r"Pointer argument \(at 0\) cannot be accessed from Triton"):
            add_one[(1,)](torch.zeros(8), 8, BLOCK=8)
    assert x.tolist() == [1.0] * 8
