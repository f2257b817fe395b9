"""Where the modules of the flat tuner/ of before 0.2 went (issue 25: packages by stage).

Scripts and notebooks written against the old names keep working: `import tuner.models` or
`from tuner.study_storage import open_storage` get the module at its new place (the same
module object, so patching one patches the other). `tuner.search` and `tuner.measure` are
packages now; the names the old modules of that name held are forwarded by the packages.
Code in this repository uses the new names (a test checks it).
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Callable

MOVED = {
    "tuner.models": "tuner.plan.models",
    "tuner.problems": "tuner.plan.problems",
    "tuner.gpus": "tuner.plan.gpus",
    "tuner.space": "tuner.plan.space",
    "tuner.traffic": "tuner.plan.traffic",
    "tuner.engines": "tuner.plan.engines",
    "tuner.kernel_api": "tuner.plan.kernel_api",
    "tuner.kernel_sources": "tuner.plan.kernel_sources",
    "tuner.stopping": "tuner.search.stopping",
    "tuner.study_storage": "tuner.search.storage",
    "tuner.surrogate": "tuner.search.surrogate",
    "tuner.offline": "tuner.search.offline",
    "tuner.measure_gpu": "tuner.measure.device_measurer",
    "tuner.device": "tuner.measure.device",
    "tuner.gpu_timing": "tuner.measure.timing",
    "tuner.isolation": "tuner.measure.isolation",
    "tuner.process_tree": "tuner.measure.process_tree",
    "tuner.numerics": "tuner.measure.numerics",
    "tuner.failures": "tuner.measure.failures",
    "tuner.environment": "tuner.measure.environment",
    "tuner.provenance": "tuner.measure.provenance",
    "tuner.landscape": "tuner.measure.landscape",
    "tuner.landscape_kernel": "tuner.measure.landscape_kernel",
    "tuner.synthetic": "tuner.measure.synthetic",
    "tuner.results": "tuner.emit.results",
    "tuner.install": "tuner.emit.install",
    "tuner.audit": "tuner.emit.audit",
    "tuner.audit_report": "tuner.emit.audit_report",
    "tuner.engine_tables": "tuner.emit.engine_tables",
    "tuner.tune": "tuner.commands.tune",
    "tuner.bench": "tuner.commands.bench",
    "tuner.check": "tuner.commands.check",
    "tuner.ceilings": "tuner.commands.ceilings",
    "tuner.drift": "tuner.commands.drift",
    "tuner.nightly": "tuner.commands.nightly",
    "tuner.proof": "tuner.commands.proof",
    "tuner.proof_summary": "tuner.commands.proof_summary",
    "tuner.report": "tuner.commands.report",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module ran at its new place."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves an old module name to the module at its new place."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def forward_old_names(package: str, module: str, package_file: str) -> Callable[[str], object]:
    """The `__getattr__` of a package that took the name of an old module (tuner.search,
    tuner.measure): the old module's names still import from the package, from `module`
    where they live now; the package's own submodules are left to the import system."""
    folder = Path(package_file).parent

    def __getattr__(name: str) -> object:
        if name.startswith("_") or (folder / f"{name}.py").exists():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return getattr(importlib.import_module(module), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__

