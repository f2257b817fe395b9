"""An override folder an engine reads none of a deployment's tables from.

vLLM searches VLLM_TUNED_CONFIG_FOLDER before its package: where the folder gives none of the
deployment's tables, it quietly runs its package's, and nothing in the audit said so (pointed at
SGLang's results folder, or at a results folder's root, the audit showed the package's table). One
warning says so and why: the table it looks for lies in a subfolder (a results folder's
<engine>/fused_moe/), the folder holds the other engine's tables, this engine's for other shapes or
GPUs, or none. Engines that read the folder in place of their package (SGLang) say so per table
already (no_table, crashes_loader)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.emit.audit_rules import Finding
from tuner.plan.engines import ENGINE_NAMES, table_family

LOOK_ENTRIES = 4096           # entries (files and folders) of the folder looked at at most...
LOOK_DEPTH = 4                # ... this many levels down (a results folder's sglang/fused_moe/configs/triton_*/)


def _shown(name: str) -> str:
    """A file name as one line says it: control characters escaped (a name holding a newline
    would forge a line of the report)."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", name)


def _tables_under(folder: Path) -> list[str]:
    """The .json files under `folder`, as paths relative to it, bounded in depth and entries."""
    found: list[str] = []
    seen = 0
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        if len(rel.parts) >= LOOK_DEPTH - 1:
            dirs[:] = []
        seen += len(dirs) + len(files)
        found += [str(rel / f) if rel.parts else f for f in files if f.endswith(".json")]
        if seen > LOOK_ENTRIES:
            break
    return found


def override_unused(engine: str, folder: Path, kernels: list, package: bool) -> list[Finding]:
    """The warning, where the folder gave the engine none of the deployment's tables (see above)."""
    looked = [ka for ka in kernels if ka.family.env_var and not ka.family.env_replaces_root]
    if not looked or any(ka.resolved.found and ka.resolved.how == "override folder" for ka in looked):
        return []
    family = looked[0].family
    wanted = sorted({ka.resolved.name for ka in looked})
    tables = _tables_under(folder)
    deeper = [t for t in tables if Path(t).name in wanted and len(Path(t).parts) > 1]
    own = family.name_pattern()
    whose: dict[str, list[str]] = {}
    for other in ENGINE_NAMES:
        pattern = table_family(other, "fused_moe").name_pattern()
        # the other engine's names are those its loader asks for and this one's never would
        found = [t for t in tables if pattern.match(Path(t).name) and (other == engine or not own.match(Path(t).name))]
        if found:
            whose[other] = found
    others = [e for e in whose if e != engine]
    if deeper:
        sub = Path(deeper[0]).parent
        what = (f"the table it looks for lies in its subfolder {_shown(str(sub))}/, which {engine} does not search: "
                f"point {family.env_var} at {_shown(str(folder / sub))}")
    elif others:
        what = (f"{len(whose[others[0]])} of its tables are named as {others[0]} names them "
                f"({_shown(Path(whose[others[0]][0]).name)}): install a results folder for {engine} with "
                f"`tuner install RESULTS --engine {engine}`")
    elif whose:
        what = f"its {engine} tables are for other shapes or GPUs ({_shown(Path(whose[engine][0]).name)})"
    else:
        what = f"it holds no {engine} table"
    return [Finding("warning", "override_unused", f"{engine} reads none of this deployment's tables from "
                    f"{family.env_var}={_shown(str(folder))} (it looks there for {', '.join(wanted)}): {what}; "
                    + ("it reads its package's instead" if package else "its default configs run"), str(folder))]
