"""What CUDA-graph capture refuses, refused on the CPU device while a run is timed.

On a GPU, CudaDevice.time_runs (tuner/measure/device.py) captures every timed run in a CUDA
graph, and torch refuses there whatever needs the host in the middle of the run. The CPU
device never captures, so without these rules CI would time code the first GPU call cannot
run. CpuDevice.time_runs times every call inside `capture_rules()`, in whatever process
times (the isolated measuring child, `tuner ceilings`, bench's references); compile workers
time nothing (they compile). A refusal raises CaptureRuleError (a RuntimeError) whose text
begins with the words torch or CUDA gives on the GPU (torch 2.11, CUDA 13):

  rule                       refused on the GPU with                         what does it
  host-to-device copy        "Cannot copy between CPU and CUDA tensors       a Python scalar written into one element
                             during CUDA graph capture unless the CPU        (t[i] = 0), torch.tensor/as_tensor of host
                             tensor is pinned..." (aten/.../Copy.cu)         data with a device, host.to(device),
                                                                             x.new_tensor(data), copy_ from host memory,
                                                                             a Python list or host tensor as an index,
                                                                             a host tensor as index_put_'s values
  device-to-host copy        the same words                                  .cpu(), .to("cpu"), .tolist(), copy_
                                                                             into host memory
  host read                  "CUDA error: operation not permitted when       .item(), bool()/int()/float() of a device
                             stream is capturing" (cudaStreamSynchronize     value (Python control flow on it, slicing
                             inside capture)                                 by it), torch.equal, allclose
  data-dependent size        the same words (the size is read back)          nonzero, argwhere, masked_select,
                                                                             boolean-mask indexing x[mask], torch.unique
                                                                             (any flavour), repeat_interleave without
                                                                             output_size, bincount, histc without a range
  synchronize                the same words                                  torch.cuda.synchronize(),
                                                                             torch.accelerator.synchronize()
  mixed devices              "Expected all tensors to be on the same         a host tensor of one or more dimensions
                             device, but found at least two devices,         in an op with device tensors
                             cuda:0 and cpu!"
  host tensor to a kernel    "Pointer argument (at N) cannot be accessed     a host tensor (or a TMA descriptor over
                             from Triton (cpu tensor?)" (Triton's launcher)  one) passed to a Triton kernel
  numpy of device data       "can't convert cuda:0 device type tensor to     .numpy(), numpy.asarray(t)
                             numpy. Use Tensor.cpu() ..."

What torch lists beyond these and why it needs no rule here: capture on a non-default stream
(torch.cuda.graph's own side stream), dynamic shapes and data-dependent control flow (both
need a host read: refused above), random numbers (no timed run draws any: inputs are made
before timing), one capture at a time in a process (the measuring child times one run).

Host and device on a machine that has only a host. Every tensor here is in CPU memory, so a
tensor's side is told by where it came from, as the GPU machine would have placed it:
  device data   every tensor that existed when the timed run began (inputs, weights, caches
                a warm-up filled), and every tensor made during it by an op from device data
                or by a factory call given a device (torch.empty(n, device=x.device), ...).
  host values   what torch makes from Python data during the run: a Python scalar assigned
                into a tensor, torch.tensor / as_tensor / asarray / from_numpy of Python or
                NumPy data, a Python list used as an index (torch lifts it with
                aten.lift_fresh), a factory call with no device or device="cpu"
                (torch.empty(n), torch.arange(n): the GPU machine's default device is its
                CPU), and whatever an op computes from host values alone.
A 0-dim host value may still meet device data where torch passes it by value: an elementwise
op (x * torch.tensor(2)), a fill (t[1:3] = 0 is fill_), a masked assignment (t[mask] = 0
is masked_fill_); anywhere else host meets device the GPU copies (refused during capture)
or refuses the mix. Python scalars passed to ops (x + 1, torch.where(m, 0, x)) are kernel
arguments, never copies. Known gaps: a torch.device("cpu") object cannot be told from
x.device (both are the CPU here), so only the string "cpu" names the host; tensors made
before the run in host memory (a module's constant built without a device) pass as device
data; functions bound before the run (from torch import empty) escape the factory hooks.

Triton's interpreter runs each kernel launch on the host with torch ops of its own (copies
of the arguments' storages): those are not the timed code's and are let through, after
the launch's arguments are checked; the launcher code around a launch is the timed code's
and stays under the rules.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

COPY = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
        "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.")
SYNC = "CUDA error: operation not permitted when stream is capturing"
MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
POINTER = "Pointer argument (at {index}) cannot be accessed from Triton (cpu tensor?)"
NUMPY = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
         "memory first.")

# The rules by name, with the words they raise (tests and docs list them from here).
RULES = {"host-to-device copy": COPY, "device-to-host copy": COPY, "host read": SYNC,
         "data-dependent size": SYNC, "synchronize": SYNC, "mixed devices": MIXED,
         "host tensor to a kernel": POINTER, "numpy of device data": NUMPY}

# ops whose CUDA implementation reads device data back to the host (a stream synchronize)
HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose", "_linalg_check_errors"}
SIZE_READS = {"nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
              "unique_consecutive", "unique_dim_consecutive", "bincount"}
LIFTS = {"lift_fresh", "lift_fresh_copy", "lift"}
FACTORIES = ("empty", "zeros", "ones", "full", "arange", "range", "linspace", "logspace", "eye", "rand", "randn",
             "randint", "randperm", "empty_strided", "scalar_tensor")
FROM_DATA = ("tensor", "as_tensor", "asarray")
_HOST = "_tuner_host_memory"          # the mark a host value carries (an attribute of the tensor object)


class CaptureRuleError(RuntimeError):
    """What the GPU would refuse during capture, refused on the CPU device: `rule` (a key of
    RULES), the GPU's words, and what did it."""

    def __init__(self, rule: str, words: str, why: str):
        super().__init__(f"{words} [{why}: refused by the CPU device's capture rules]")
        self.rule, self.words, self.why = rule, words, why


def refuse(rule: str, why: str, **fmt) -> CaptureRuleError:
    return CaptureRuleError(rule, RULES[rule].format(**fmt), why)


def is_host(t: Any) -> bool:
    """Whether `t` is a host value (see the module's notes); device data otherwise."""
    return isinstance(t, torch.Tensor) and bool(getattr(t, _HOST, False))


def mark_host(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        try:
            setattr(t, _HOST, True)
        except (AttributeError, TypeError):      # a tensor type without a __dict__: left as device data
            pass
    return t


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _op(func) -> tuple[str, str]:
    return func._overloadpacket.__name__, func._overloadname


# -- what each op may do ----------------------------------------------------------------------
def check_op(func, args: tuple, kwargs: dict) -> None:
    """Raise CaptureRuleError when the GPU would refuse this op during capture."""
    name, overload = _op(func)
    tensors = _tensors((args, kwargs))
    if not tensors or all(is_host(t) for t in tensors):
        return                       # host memory only (or no tensor): nothing reaches the GPU
    what = f"aten.{name}"
    if name in HOST_READS:
        raise refuse("host read", f"{what} reads a device value on the host (.item(), bool(), int(), "
                                  "Python control flow or slicing on a device value)")
    if name in SIZE_READS:
        raise refuse("data-dependent size", f"{what}: its output size depends on device data, read back to the host")
    if name == "repeat_interleave" and overload in ("Tensor", "self_Tensor"):
        if kwargs.get("output_size") is None:
            raise refuse("data-dependent size", f"{what} without output_size reads the repeats' sum on the host")
    if name == "histc":
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        if lo == hi:
            raise refuse("data-dependent size", f"{what} without a range reads the data's min and max on the host")
    if name == "copy_":
        dst, src = args[0], args[1]
        if is_host(src) and not is_host(dst):
            raise refuse("host-to-device copy", f"{what} from a host value into device memory (a Python scalar "
                                                "written into one element, or host data)")
        if is_host(dst) and not is_host(src):
            raise refuse("device-to-host copy", f"{what} of device data into host memory")
    if name == "index":
        _check_index(what, args[0], args[1])
    if name in ("index_put", "index_put_", "_index_put_impl_"):
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        _check_index_put(what, args[0], args[1], args[2], bool(accumulate))
    mixed = [t for t in tensors if is_host(t) and t.dim() > 0]
    if mixed:
        raise refuse("mixed devices", f"{what} takes a host tensor of shape {tuple(mixed[0].shape)} with device data")


def _is_mask(t: torch.Tensor) -> bool:
    return t.dtype in (torch.bool, torch.uint8)


def _check_index(what: str, src: torch.Tensor, indices) -> None:
    for index in indices:
        if index is None:
            continue
        if is_host(index) and not is_host(src):
            raise refuse("host-to-device copy", f"{what} with a host index (a Python list or host tensor), copied "
                                                "to the device")
        if _is_mask(index):
            raise refuse("data-dependent size", f"{what} with a boolean mask: the number of selected elements "
                                                "is read back to the host")


def _check_index_put(what: str, dst: torch.Tensor, indices, values: torch.Tensor, accumulate: bool) -> None:
    given = [i for i in indices if i is not None]
    if any(is_host(i) for i in given) and not is_host(dst):
        raise refuse("host-to-device copy", f"{what} with a host index (a Python list or host tensor), copied "
                                            "to the device")
    masks = [i for i in given if _is_mask(i)]
    # t[mask] = scalar: torch turns it into masked_fill_ with the host scalar (capture-safe)
    if not accumulate and len(given) == 1 and masks and values.numel() == 1 and is_host(values):
        return
    if masks:
        raise refuse("data-dependent size", f"{what} with a boolean mask: the selected positions are read back "
                                            "to the host (t[mask] = <Python scalar> is captured as masked_fill_)")
    if is_host(values) and values.dim() == 0 and not is_host(dst):
        raise refuse("host-to-device copy", f"{what} of a host scalar (t[index_tensor] = <Python scalar>), copied "
                                            "to the device")


def mark_outputs(func, args: tuple, kwargs: dict, out: Any) -> None:
    """A lifted Python value is a host value, and so is what an op computes from host values
    alone."""
    name, _ = _op(func)
    if name in LIFTS:
        for t in _tensors(out):
            mark_host(t)
        return
    tensors = _tensors((args, kwargs))
    if tensors and all(is_host(t) for t in tensors):
        for t in _tensors(out):
            mark_host(t)


class _Rules(TorchDispatchMode):
    """The dispatch-level half: sees every aten op of the timed code."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable, whose first call
        # imports dynamo and sympy: about 2 s of CPU in every measuring process, for nothing
        # (no timed run compiles with torch.compile)
        return False

    def __init__(self) -> None:
        super().__init__()
        self.paused = 0                    # > 0 inside a Triton interpreter launch
        self.thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        check_op(func, args, kwargs)
        out = func(*args, **kwargs)
        mark_outputs(func, args, kwargs, out)
        return out


_ACTIVE: _Rules | None = None


def _live() -> _Rules | None:
    """The rules, when they apply here and now (this thread, outside an interpreter launch)."""
    rules = _ACTIVE
    if rules is None or rules.paused or rules.thread != threading.get_ident():
        return None
    return rules


# -- the Python-level half: what never reaches an aten op on the CPU -------------------------------
def _names_host(device: Any) -> bool:
    """A device argument naming the host: none (the default device is the host's) or "cpu"."""
    return device is None or (isinstance(device, str) and device.split(":")[0] == "cpu")


def _to_target(args: tuple, kwargs: dict):
    """What Tensor.to moves to: ("device", spec), ("tensor", other) or None (a dtype only)."""
    if "device" in kwargs:
        return ("device", kwargs["device"])
    if args and isinstance(args[0], torch.Tensor):
        return ("tensor", args[0])
    if args and isinstance(args[0], (str, torch.device, int)):
        return ("device", args[0])
    return None


def _hooks() -> dict[tuple[Any, str], Callable]:
    """(owner, attribute) -> the wrapper installed there while the rules are on."""
    hooks: dict[tuple[Any, str], Callable] = {}
    T = torch.Tensor
    orig_to, orig_cpu, orig_tolist, orig_numpy, orig_new_tensor = T.to, T.cpu, T.tolist, T.numpy, T.new_tensor
    orig_setitem = T.__setitem__

    def to(self, *args, **kwargs):
        if _live() is not None:
            target = _to_target(args, kwargs)
            if target is not None:
                kind, where = target
                to_host = is_host(where) if kind == "tensor" else (where is not None and _names_host(where))
                if is_host(self) and not to_host:
                    raise refuse("host-to-device copy", "Tensor.to moves a host value to the device")
                if not is_host(self) and to_host:
                    raise refuse("device-to-host copy", "Tensor.to moves device data to the host")
        out = orig_to(self, *args, **kwargs)
        return mark_host(out) if is_host(self) else out

    def cpu(self, *args, **kwargs):
        if _live() is not None and not is_host(self):
            raise refuse("device-to-host copy", "Tensor.cpu() copies device data to the host")
        return orig_cpu(self, *args, **kwargs)

    def tolist(self):
        if _live() is not None and not is_host(self):
            raise refuse("device-to-host copy", "Tensor.tolist() copies device data to the host")
        return orig_tolist(self)

    def numpy(self, *args, **kwargs):
        if _live() is not None and not is_host(self):
            raise TypeError(f"{NUMPY} [Tensor.numpy() of device data: refused by the CPU device's capture rules]")
        return orig_numpy(self, *args, **kwargs)

    def new_tensor(self, data, *args, **kwargs):
        if _live() is not None and not isinstance(data, torch.Tensor) and not is_host(self) \
                and not _names_host(kwargs.get("device", "device")):
            raise refuse("host-to-device copy", "Tensor.new_tensor copies host data to the device")
        return orig_new_tensor(self, data, *args, **kwargs)

    def setitem(self, index, value):
        # torch makes a CPU scalar tensor of a Python number written into a CUDA tensor (and
        # copies it when the target is one element): make it here, marked, whatever this
        # torch's CPU path does
        if _live() is not None and isinstance(value, (bool, int, float, complex)) and not is_host(self):
            rules = _ACTIVE
            assert rules is not None
            rules.paused += 1
            try:
                value = mark_host(torch.tensor(value, dtype=self.dtype))
            except (TypeError, RuntimeError):     # not of this dtype: torch says so itself below
                pass
            finally:
                rules.paused -= 1
        return orig_setitem(self, index, value)

    hooks.update({(T, "to"): to, (T, "cpu"): cpu, (T, "tolist"): tolist, (T, "numpy"): numpy,
                  (T, "new_tensor"): new_tensor, (T, "__setitem__"): setitem})

    def factory(orig):
        def make(*args, **kwargs):
            out = orig(*args, **kwargs)
            if _live() is not None and _names_host(kwargs.get("device")):
                mark_host(out)
            return out
        return make

    for name in FACTORIES:
        if hasattr(torch, name):
            hooks[(torch, name)] = factory(getattr(torch, name))

    def from_data(orig, positional_device: int | None):
        def make(data, *args, **kwargs):
            device = kwargs.get("device")
            if device is None and positional_device is not None and len(args) > positional_device:
                device = args[positional_device]
            if _live() is not None and not isinstance(data, torch.Tensor):
                if not _names_host(device):
                    raise refuse("host-to-device copy", f"torch.{orig.__name__} of host data onto the device")
                return mark_host(orig(data, *args, **kwargs))
            out = orig(data, *args, **kwargs)
            if _live() is not None and is_host(data):
                mark_host(out)
            return out
        return make

    for name in FROM_DATA:
        if hasattr(torch, name):
            hooks[(torch, name)] = from_data(getattr(torch, name), 1 if name == "as_tensor" else None)

    orig_from_numpy = torch.from_numpy

    def from_numpy(array):
        out = orig_from_numpy(array)
        return mark_host(out) if _live() is not None else out
    hooks[(torch, "from_numpy")] = from_numpy

    def synchronize(*args, **kwargs):
        if _live() is not None:
            raise refuse("synchronize", "an explicit device synchronize")
        return orig_sync(*args, **kwargs)
    orig_sync = torch.cuda.synchronize
    hooks[(torch.cuda, "synchronize")] = synchronize
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        orig_acc = accelerator.synchronize

        def acc_synchronize(*args, **kwargs):
            if _live() is not None:
                raise refuse("synchronize", "an explicit device synchronize")
            return orig_acc(*args, **kwargs)
        hooks[(accelerator, "synchronize")] = acc_synchronize
    _interpreter_hook(hooks)
    return hooks


def _interpreter_hook(hooks: dict) -> None:
    """Triton's interpreter launch: its arguments checked (a host tensor cannot be a kernel's
    pointer on a GPU), then run with the rules paused (its own copies are not the timed code's)."""
    try:
        from triton.runtime.interpreter import GridExecutor
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:                   # no interpreter: nothing is launched there
        return
    orig_call = GridExecutor.__call__

    def call(self, *args, **kwargs):
        rules = _live()
        if rules is None:
            return orig_call(self, *args, **kwargs)
        for i, arg in enumerate([*args, *kwargs.values()]):
            base = arg.base if isinstance(arg, TensorDescriptor) else arg
            if is_host(base):
                raise ValueError(POINTER.format(index=i) + " [a host tensor passed to a Triton kernel: refused by "
                                 "the CPU device's capture rules]")
        rules.paused += 1
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            rules.paused -= 1
    hooks[(GridExecutor, "__call__")] = call


@contextlib.contextmanager
def capture_rules() -> Iterator[_Rules]:
    """While it is open, this thread's torch work is held to what CUDA-graph capture allows
    (see the module's notes); re-entering it is a no-op."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    hooks = _hooks()
    saved = {key: key[0].__dict__.get(key[1], _MISSING) for key in hooks}
    rules = _Rules()
    try:
        for (owner, attr), fn in hooks.items():
            setattr(owner, attr, fn)
        _ACTIVE = rules
        with rules:
            yield rules
    finally:
        _ACTIVE = None
        for (owner, attr), before in saved.items():
            if before is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, before)


_MISSING = object()


@contextlib.contextmanager
def exempt() -> Iterator[None]:
    """What runs inside is not held to the rules: a stand-in for one device op (a test's shim
    of an engine's CUDA op, which on the GPU is one capturable launch), like Triton's
    interpreter running a kernel."""
    rules = _ACTIVE
    if rules is None:
        yield
        return
    rules.paused += 1
    try:
        yield
    finally:
        rules.paused -= 1
