"""What the engines' launchers share: loading their jit functions once per process, the
check that the wrappers they mirror are the ones they were written against, the code
version of what runs, and the device facts the engines' launch decisions depend on. Torch and
Triton load only in the functions that launch (a plan builds specs without them)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.engine_releases import Release, refused_kernel
from tuner.plan.kernel_api import COMPILE_DEVICE, KernelSpec
from tuner.plan.kernel_sources import version_key


def target_capability() -> tuple[int, int]:
    """The compute capability the engine's launch decisions are taken for: the GPU in use,
    or, without one (Triton's interpreter), sm_90, the Hopper GPUs the tables are for."""
    from kernels.interpreter_fixes import interpreting
    if not interpreting():
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_capability()
    return (9, 0)


def on_cuda_device() -> bool:
    """Launching (or compiling) for a CUDA GPU: one is present, or this is a compile worker of
    the CPU device, which compiles for sm_90 without one (tuner/measure/device.py)."""
    import torch

    from kernels.interpreter_fixes import interpreting
    from tuner.measure.device import compiling_for_sm90
    return not interpreting() and (torch.cuda.is_available() or compiling_for_sm90())


@functools.lru_cache(maxsize=None)
def _module(code_key: tuple, relpath: str, names: tuple[str, ...]):
    from tuner.plan.kernel_sources import jit_module
    return jit_module(_CODES[code_key], relpath, list(names))


_CODES: dict = {}


def jit_functions(code, relpath: str, names: list[str]):
    """The engine's jit functions `names` from `relpath` (loaded once per process)."""
    if code is None:
        raise TunerError("this kernel was set up without the engine's code (a replay or a plan); "
                         "running it needs the engine: give --engine-source PATH")
    from kernels.interpreter_fixes import patch_interpreter
    patch_interpreter()          # engine kernels carry no interpreter work-arounds of their own
    key = (code.engine, code.version, code.origin)
    _CODES[key] = code
    try:
        module = _module(key, relpath, tuple(names))
    except KeyError as e:
        raise TunerError(f"{code.engine} {code.version} ({code.where}) has no function {e} in {relpath}: "
                         "its kernels changed; this launcher cannot run them") from None
    return [getattr(module, n) for n in names]


def changed_wrappers(code, mirrored: dict[str, str]) -> list[str]:
    """The mirrored wrapper functions whose source differs from the version the launcher
    was written against ('file:function' names); [] when all match."""
    from tuner.plan.kernel_sources import mirrored_hashes
    by_file: dict[str, list[str]] = {}
    for key in mirrored:
        rel, name = key.rsplit(":", 1)
        by_file.setdefault(rel, []).append(name)
    now = mirrored_hashes(code, by_file)
    return sorted(k for k, h in mirrored.items() if now.get(k) != h)


# -- the engine versions a launcher supports (data: configs/engines/, tuner/plan/engine_releases.py)
def files_read(kernel_functions: dict[str, dict[str, list[str]]], releases: dict[str, list[Release]]) -> list[str]:
    """Every file of the engine a launcher reads: its kernels' and its mirrored wrappers' (what
    `tuner engine-source extract` copies)."""
    return sorted({rel for fns in kernel_functions.values() for rel in fns}
                  | {key.rsplit(":", 1)[0] for rs in releases.values() for r in rs for key in r.mirrored})


def signature_hash(text: str, name: str) -> str:
    """A hash of a top-level function's parameter names, in order (KeyError when the file
    has no such function): what a launch must pass."""
    import ast

    from tuner.plan.kernel_sources import parse_source, source_hash
    for node in parse_source(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            args = node.args
            return source_hash(",".join(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs))
    raise KeyError(name)


def _signatures(code, kernel_files: dict[str, list[str]]) -> dict[str, str]:
    out = {}
    for rel, names in kernel_files.items():
        text = code.read(rel)
        for name in names:
            try:
                out[f"{rel}:{name}"] = signature_hash(text, name)
            except KeyError:
                out[f"{rel}:{name}"] = "missing"
    return out


def resolve_release(code, engine: str, kernel: str, releases: list[Release],
                    kernel_files: dict[str, list[str]]) -> Release:
    """The supported release whose wrappers and kernel signatures this engine code has (the
    one of its own version number when several match); anything else is refused in one
    line that says which versions work and what to do (the data's reason where it says the
    release's kernel is not launched, before any of its files is read)."""
    from tuner.plan.kernel_sources import mirrored_hashes
    why = refused_kernel(engine, kernel, code.version)
    if why:
        raise TunerError(f"{engine} {code.version} ({code.where}) cannot be launched for {kernel}: {why}; time our "
                         "kernels with --kernel-source ours")
    keys = sorted({k for r in releases for k in r.mirrored})
    by_file: dict[str, list[str]] = {}
    for key in keys:
        rel, name = key.rsplit(":", 1)
        by_file.setdefault(rel, []).append(name)
    hashes = mirrored_hashes(code, by_file)
    sigs = _signatures(code, kernel_files)
    matching = [r for r in releases if all(hashes.get(k) == h for k, h in r.mirrored.items())
                and all(sigs.get(k) == h for k, h in r.signatures.items())]
    for r in matching:
        if r.version == code.version:
            return r
    if matching:
        return max(matching, key=lambda r: version_key(r.version))
    supported = sorted({r.version for r in releases}, key=version_key)
    missing = [k.replace(":", " has no ") for k, h in sigs.items() if h == "missing"]
    same_kernel = [r for r in releases if all(sigs.get(k) == h for k, h in r.signatures.items())]
    if missing:
        why = f"its kernel moved or was renamed ({'; '.join(k.rsplit('/', 1)[-1] for k in missing)})"
    elif not same_kernel:
        newest = max(releases, key=lambda r: version_key(r.version))
        changed = sorted(k.rsplit(":", 1)[1] for k, h in newest.signatures.items() if sigs.get(k) != h)
        why = f"its {', '.join(changed)} takes other arguments than in any supported version"
    else:
        near = next((r for r in same_kernel if r.version == code.version),
                    max(same_kernel, key=lambda r: version_key(r.version)))
        changed = sorted(k.rsplit(":", 1)[1] for k, h in near.mirrored.items() if hashes.get(k) != h)
        why = (f"its wrappers differ from the released {near.version}'s" if near.version == code.version
               else f"its wrappers differ from every supported version's ({near.version}'s")
        why += f": {', '.join(changed)} changed" + (")" if near.version != code.version else "")
    raise TunerError(
        f"{engine} {code.version} ({code.where}) cannot be launched for {kernel}: {why}; tuner launches {engine} "
        f"{', '.join(supported)}: time with one of those (pip install '{engine}=={supported[-1]}', or "
        f"--engine-source a wheel of it), or time our kernels with --kernel-source ours")


def code_version(code, kernel_files: dict[str, list[str]], launcher_files: tuple[str, ...]) -> str:
    """A hash of the engine's kernel functions as read now and of our launcher's modules (its
    launch code and its spec)."""
    from tuner.plan.kernel_sources import function_source
    digest = hashlib.sha256()
    for path in launcher_files:
        digest.update(Path(path).read_bytes())
    digest.update(Path(__file__).read_bytes())
    for rel in sorted(kernel_files):
        text = code.read(rel)
        for name in kernel_files[rel]:
            try:
                digest.update(function_source(text, name).encode())
            except KeyError:
                raise TunerError(f"{code.engine} {code.version} ({code.where}) has no function {name} in {rel}: "
                                 "its kernels changed; time our kernels with --kernel-source ours") from None
    return digest.hexdigest()[:16]


def engine_spec(base: KernelSpec, code, engine: str, kernel_files: dict, releases: list[Release],
                launcher_files: tuple[str, ...], build, **changes) -> KernelSpec:
    """Our kernel's spec (problems, inputs, reference, cost model) with the engine's launch,
    defaults and keys. `build(release)` gives the version-dependent parts (run,
    compile_only, ...) for the release the engine's code is (the newest without code: a
    replay or a plan); a version the launcher does not support is refused here."""
    notes = dict(base.notes)
    supported = sorted({r.version for r in releases}, key=version_key)
    notes["launcher_supports"] = supported
    release = max(releases, key=lambda r: version_key(r.version))
    changes.update(source_version="", origin="", code_version="")     # known only from the code
    if code is not None:
        release = resolve_release(code, engine, base.name, releases, kernel_files)
        notes["launched_as"] = release.version
        notes["launcher_matches_engine"] = True
        # the files whose code runs, hashed against the known releases' (refused here, before
        # any work, unless identical to a release's or trusted: tuner/plan/kernel_sources.py)
        from tuner.plan.kernel_sources import vet_imported_file
        notes["engine_files"] = {rel: vet_imported_file(code, rel, code.read(rel)) for rel in sorted(kernel_files)}
        changes.update(source_version=code.version, origin=code.origin,
                       code_version=code_version(code, kernel_files, launcher_files))
    changes.update(build(release))
    return dataclasses.replace(base, source=engine, **changes, notes=notes)


def phantom(shape, dtype, device: str = COMPILE_DEVICE):
    """A contiguous tensor of `shape` that owns no memory (a meta tensor): for compiling a
    launch, which looks only at dtype, strides and alignment, without the gigabytes a full
    expert weight would take in every compile worker. (A view of a few real bytes would fail
    torch's storage bounds check, on a GPU as here.)"""
    import torch
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def gemm_phantoms(params, M: int, device: str = COMPILE_DEVICE):
    """(A, B, As, Bs, C) of a block-FP8 GEMM problem for compiling, B a phantom."""
    import torch
    N, K = params["N"], params["K"]
    bn, bk = params["block_shape"]
    fp8 = torch.float8_e4m3fn
    return (torch.empty((M, K), dtype=fp8, device=device), phantom((N, K), fp8, device),
            torch.empty((M, -(-K // bk)), dtype=torch.float32, device=device),
            torch.empty((-(-N // bn), -(-K // bk)), dtype=torch.float32, device=device),
            torch.empty((M, N), dtype=torch.bfloat16, device=device))
