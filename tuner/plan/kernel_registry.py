"""The one place that decides which KernelSpec a kernel gets: ours (a file in kernels/) or an
engine's own (its launcher in kernels/engines/ over the engine's code, read from the user's
engine, a wheel or an extracted folder), at which version and from where.

In: a kernel name, a source (ours, vllm, sglang, or "engine": the engine whose table it is),
an origin (--engine-source). Out: a KernelSpec (tuner/plan/kernel_api.py). kernels/ only
defines kernels and launchers; it never resolves one, so nothing there imports this module.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import re
from pathlib import Path

from tuner import __version__
from tuner.errors import TunerError
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.kernel_sources import locate, origin_for

KERNEL_MODULES = ("fp8_gemm", "fused_moe", "mla_decode")
KERNEL_SOURCES = ("ours", "vllm", "sglang")
KERNEL_SOURCE_MODES = ("engine", "ours")
KERNELS_DIR = Path(importlib.import_module("kernels").__file__ or "").resolve().parent


def _own_files(module: str) -> list[Path]:
    """A kernel module's file and every kernels/ module it imports, recursively."""
    seen: list[Path] = []
    todo = [module]
    while todo:
        path = KERNELS_DIR / f"{todo.pop()}.py"
        if path in seen:
            continue
        seen.append(path)
        todo += re.findall(r"^from kernels\.(\w+) import", path.read_text(), flags=re.M)
    return sorted(seen)


@functools.lru_cache(maxsize=None)
def ours(name: str):
    # the spec without its code (kernels/<name>_spec.py): a plan imports neither Triton nor
    # torch; the code (kernels/<name>.py, hashed below) loads when something runs it
    spec = importlib.import_module(f"kernels.{name}_spec").SPEC
    digest = hashlib.sha256()
    for path in _own_files(name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return dataclasses.replace(spec, source="ours", source_version=__version__, origin=str(KERNELS_DIR),
                               code_version=digest.hexdigest()[:16])


def batch_grid(name: str) -> list[int]:
    """The batch sizes a table of kernel `name` covers when none are given: its spec's, else
    the engines' grid (also for a kernel not registered here)."""
    from tuner.plan.engines import DEFAULT_BATCH_SIZES
    spec = ours(name) if name in KERNEL_MODULES else None
    return list(spec.batch_sizes if spec is not None and spec.batch_sizes else DEFAULT_BATCH_SIZES)


def get_kernel(name: str, source: str = "ours", origin: str | None = None, load_code: bool = True,
               module: str | None = None, variant: str = ""):
    """The KernelSpec of kernel `name` from `source`: our file in kernels/ ("ours"), or an
    engine's own kernel ("vllm", "sglang"), read from the installed engine or from
    `origin` (its wheel, or a folder of files extracted from it). load_code=False: an
    engine's kernel without its code (keys, space, defaults), to replay or plan. `module`:
    a kernel defined outside kernels/ (a test's), the module whose KERNEL it is. `variant`:
    an engine launcher's variant (engine_variant)."""
    if module:
        spec = getattr(importlib.import_module(module), "KERNEL", None)
        if not isinstance(spec, KernelSpec) or spec.name != name:
            raise TunerError(f"module {module} defines no KERNEL named {name!r}")
        return spec
    if name not in KERNEL_MODULES:
        raise TunerError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_MODULES)}")
    if source == "ours":
        return ours(name)
    if source not in KERNEL_SOURCES:
        raise TunerError(f"unknown kernel source {source!r}; known: {', '.join(KERNEL_SOURCES)}")
    return engine_kernel(name, source, origin or None, load_code, variant)


@functools.lru_cache(maxsize=None)
def launcher(engine: str, variant: str = ""):
    """An engine's launcher as a plan reads it (kernels/engines/<engine>_spec.py, or a variant's
    <engine>_<variant>_spec.py: its files, releases, defaults and specs, without the launch code,
    which loads when a kernel runs)."""
    try:
        return importlib.import_module(f"kernels.engines.{engine}{'_' + variant if variant else ''}_spec")
    except ModuleNotFoundError:
        raise TunerError(f"no launcher for {engine}'s kernels" + (f" ({variant})" if variant else "")) from None


@functools.lru_cache(maxsize=None)
def launcher_variants(engine: str) -> tuple[str, ...]:
    """The variants of an engine's launcher (kernels/engines/<engine>_<variant>_spec.py, each
    with a VARIANT name and `handles(params)`)."""
    folder = KERNELS_DIR / "engines"
    names = sorted(p.stem[len(engine) + 1:-len("_spec")] for p in folder.glob(f"{engine}_*_spec.py"))
    return tuple(n for n in names if getattr(launcher(engine, n), "VARIANT", None) == n)


def engine_variant(name: str, engine: str, params: dict | None) -> str:
    """The launcher variant that runs `engine`'s kernel `name` for a problem (its params): the
    first whose `handles` takes it, "" (the main launcher) for none or no params."""
    if params is None:
        return ""
    return next((v for v in launcher_variants(engine)
                 if name in launcher(engine, v).KERNEL_FUNCTIONS and launcher(engine, v).handles(params)), "")


def engine_files(engine: str, version: str | None = None) -> list[str]:
    """Every file of the engine its launcher and their variants read (what `tuner engine-source
    extract` copies); at `version`, without the files only kernels tuner does not launch at that
    release read (configs/engines/: SGLang 0.5.19 and 0.5.20 have no sm_90 GEMM file to copy)."""
    from tuner.plan.engine_releases import refused_kernel
    mods = [launcher(engine), *(launcher(engine, v) for v in launcher_variants(engine))]
    files = {f for m in mods for f in m.FILES}
    if version is None:
        return sorted(files)
    refused = {k for m in mods for k in m.KERNEL_FUNCTIONS if refused_kernel(engine, k, version)}
    launched = {f for m in mods for k, fns in m.KERNEL_FUNCTIONS.items() if k not in refused for f in fns}
    return sorted(files - ({f for m in mods for k in refused for f in m.KERNEL_FUNCTIONS.get(k, {})} - launched))


def refused_kernels(engine: str, version: str) -> dict[str, str]:
    """{kernel: why} of the kernels of `engine`'s launchers tuner does not launch at `version`."""
    from tuner.plan.engine_releases import refused_kernel
    kernels = {k for m in [launcher(engine), *(launcher(engine, v) for v in launcher_variants(engine))]
               for k in m.KERNEL_FUNCTIONS}
    return {k: why for k in sorted(kernels) if (why := refused_kernel(engine, k, version))}


def engine_kernel(name: str, engine: str, origin: str | None = None, load_code: bool = True, variant: str = ""):
    """The KernelSpec of `engine`'s own kernel `name` (from its launcher's `variant`). With
    load_code=False only what needs no engine code (config keys, space, defaults: for replaying
    a landscape recorded on that kernel, or a plan); running it then fails with one clear line."""
    return launcher(engine, variant).kernel_spec(name, locate(engine, origin) if load_code else None)


def has_engine_kernel(name: str, engine: str) -> bool:
    """Whether `engine` reads tables for kernel `name` and we can launch its own kernel."""
    try:
        return name in launcher(engine).KERNEL_FUNCTIONS
    except TunerError:
        return False


def kernel_for(name: str, engine: str, mode: str, origins: list[str] | None = None, load_code: bool = True,
               params: dict | None = None):
    """The kernel that times `engine`'s table of kernel `name`: with mode "engine", the
    engine's own kernel where it has one we can launch (else ours: tables no engine
    reads, such as MLA decode); with "ours", ours; with an engine's name, that engine's (its
    launcher's variant for a problem's `params`, engine_variant)."""
    source = engine if mode == "engine" else mode
    if source == "ours" or not has_engine_kernel(name, source):
        if mode not in ("engine", "ours"):
            raise TunerError(f"{source} has no {name} kernel that reads a table; use --kernel-source ours")
        return get_kernel(name)
    origin = origin_for(source, origins)
    if origins and origin is None and load_code:
        raise TunerError(f"none of --engine-source {' '.join(origins)} holds {source}'s code "
                         f"(a {source}-<version>-....whl or a folder from `tuner engine-source extract`)")
    return get_kernel(name, source, origin, load_code=load_code, variant=engine_variant(name, source, params))


def source_mode(kernel_source: str | None, replay: str | None) -> str:
    """engine, ours, or an engine's name: what times the tables. With a replayed landscape,
    the kernel it was recorded on (a landscape holds one kernel's timings); a different
    explicit --kernel-source is refused."""
    if not replay:
        return kernel_source or "engine"
    from tuner.reading import landscape_header
    try:
        header = landscape_header(replay)
    except TunerError:
        return kernel_source if kernel_source not in (None, "engine") else "ours"  # the full read says why
    recorded = header.get("kernel_source", "ours") if isinstance(header, dict) else "ours"
    if kernel_source not in (None, "engine") and kernel_source != recorded:
        raise TunerError(f"--kernel-source {kernel_source}, but landscape {replay} was recorded on "
                         f"{recorded}'s kernel")
    return recorded


def as_recorded(kernel, replay: str | None):
    """An engine's kernel set up without its code, for replaying a landscape: the version
    it was recorded at, from the landscape's header (manifests and install compare it)."""
    if not replay or kernel.source == "ours" or kernel.source_version:
        return kernel
    from tuner.reading import landscape_header
    try:
        version = str(landscape_header(replay).get("kernel_source_version") or "")
    except (TunerError, AttributeError):
        return kernel
    return dataclasses.replace(kernel, source_version=version)


def imported_files_of() -> dict[str, list[str]]:
    """{engine: the files whose jit code its launcher imports}, from the launchers."""
    import kernels.engines as engines_pkg
    out: dict[str, list[str]] = {}
    for info in sorted(p.stem.removesuffix("_spec") for p in Path(engines_pkg.__file__ or "").parent.glob("*_spec.py")):
        module = importlib.import_module(f"kernels.engines.{info}_spec")
        functions = getattr(module, "KERNEL_FUNCTIONS", None)
        if isinstance(functions, dict):
            engine = getattr(module, "ENGINE", info)          # a launcher's variant: its engine's files
            out[engine] = sorted(set(out.get(engine, [])) | {rel for files in functions.values() for rel in files})
    return out
