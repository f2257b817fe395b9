"""A test kernel (module "capture_violations") that breaks one CUDA-graph capture rule on
purpose while the real measuring stack times it: the isolated child, the CPU device, its
capture rules (tuner/measure/capture_rules.py).

It is our fp8_gemm in every respect but `run`: the real GEMM runs, then the timed code does
what the problem's "violation" names (VIOLATIONS), or one of the capture-safe counterparts
(SAFE). make_inputs carries the name into the inputs.
"""

import dataclasses

import torch

from tuner.plan.kernel_registry import get_kernel

_BASE = get_kernel("fp8_gemm")


def _host_output(inputs: dict, config: dict):
    """The real launch, its output a host tensor (made with no device: the host's, on a GPU machine)."""
    out = inputs["out"]
    _BASE.run({**inputs, "out": torch.empty(out.shape, dtype=out.dtype)}, config)


def _control_flow(out):
    if out.float().sum() > 0:             # a Python branch on a device value
        out.mul_(1.0)


def _sync(inputs: dict):
    """torch.cuda.synchronize() raises on a torch built without CUDA ("Torch not compiled with
    CUDA enabled"), in the warm-up too: called here from the second call of an input set on,
    as code that synchronizes once it is set up."""
    if inputs.setdefault("_calls", 0):
        torch.cuda.synchronize()
    inputs["_calls"] += 1


# name -> what the timed code does wrong (after the real GEMM), each refused on a GPU during capture
VIOLATIONS = {
    "scalar written into one element": lambda out, As, inputs, config: out.__setitem__((0, 0), 0),
    "torch.tensor of host data onto the device": lambda out, As, inputs, config: torch.tensor([1.0, 2.0],
                                                                                             device=out.device),
    "host tensor moved to the device": lambda out, As, inputs, config: torch.ones(2).to(out.device),
    "Python list as an index": lambda out, As, inputs, config: out[:, [0, 1]],
    ".cpu()": lambda out, As, inputs, config: out.cpu(),
    ".tolist()": lambda out, As, inputs, config: out[0].tolist(),
    ".item()": lambda out, As, inputs, config: out[0, 0].item(),
    "Python control flow on a device value": lambda out, As, inputs, config: _control_flow(out),
    "nonzero": lambda out, As, inputs, config: torch.nonzero(out),
    "masked_select": lambda out, As, inputs, config: out.masked_select(out > 0),
    "boolean-mask indexing": lambda out, As, inputs, config: out[out > 0],
    "torch.unique": lambda out, As, inputs, config: torch.unique(As),
    "repeat_interleave without output_size": lambda out, As, inputs, config: As.repeat_interleave(
        torch.ones(As.shape[0], dtype=torch.long, device=As.device), dim=0),
    "torch.cuda.synchronize": lambda out, As, inputs, config: _sync(inputs),
    "host tensor in an op with device data": lambda out, As, inputs, config: out + torch.zeros(out.shape[-1],
                                                                                                dtype=out.dtype),
    "host tensor passed to the kernel": lambda out, As, inputs, config: _host_output(inputs, config),
    ".numpy()": lambda out, As, inputs, config: out.float().numpy(),
}


def _lazy_read(inputs: dict):
    """A host read on the first call of each input set only (lazy set-up cached in the inputs):
    the warm-up makes it, outside the rules, as on the GPU before its capture."""
    if "_lazy" not in inputs:
        inputs["_lazy"] = int(inputs["As"].numel() and inputs["As"][0, 0].item() > -1)


# the capture-safe ways to do the same things: all of these time
SAFE = [
    lambda out, As, inputs: out[0, 0].zero_(),                                  # a device fill
    lambda out, As, inputs: out.__setitem__((slice(0, 1), 0), 0),               # a fill with a host scalar
    lambda out, As, inputs: out.__setitem__(out < -1e30, 0),                    # masked_fill_ with a host scalar
    lambda out, As, inputs: out.mul_(torch.tensor(1.0)),                        # a 0-dim host scalar by value
    lambda out, As, inputs: torch.where(out > 0, 0.0, out),                     # a Python scalar
    lambda out, As, inputs: out + torch.zeros(out.shape[-1], dtype=out.dtype, device=out.device),
    lambda out, As, inputs: As.repeat_interleave(torch.ones(As.shape[0], dtype=torch.long, device=As.device),
                                                 dim=0, output_size=As.shape[0]),
    lambda out, As, inputs: torch.tensor([1.0, 2.0]) * 2,                       # host work on host values
    lambda out, As, inputs: _lazy_read(inputs),
]


def make_inputs(params: dict, M: int, device: str = "cuda", seed: int = 0) -> dict:
    return {**_BASE.make_inputs(params, M, device, seed), "violation": params.get("violation")}


def run(inputs: dict, config: dict):
    out = _BASE.run(inputs, config)
    violation = inputs["violation"]
    if violation == "none":
        for safe in SAFE:
            safe(out, inputs["As"], inputs)
    elif violation:
        VIOLATIONS[violation](out, inputs["As"], inputs, config)
    return out


KERNEL = dataclasses.replace(_BASE, make_inputs=make_inputs, run=run, module="capture_violations",
                             problem_keys=(*_BASE.problem_keys, "violation"), code_version="capture-violations-1",
                             description="fp8_gemm that breaks a CUDA-graph capture rule on purpose")
