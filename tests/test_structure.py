"""The house by stage (issue 25): no import cycle anywhere, a stage imports only the stages
below it (docs/architecture.md), kernels/ imports only the kernel contract from tuner/, every
package and module says what it is for."""

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:` (never run: not an import cycle)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for b in node.body for n in ast.walk(b) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def imports(path: Path, known: dict[str, Path]) -> dict[str, int]:
    """{module of ours: line} that `path` imports, at module level or inside a function."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if node.lineno in skip if hasattr(node, "lineno") else False:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.setdefault(name, node.lineno)
    return found


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: {t: line for t, line in imports(path, known).items() if t != name} for name, path in known.items()}


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in g:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere():
    g = graph()
    assert len(g) > 50 and g["tuner.pipeline.run"]             # the graph is really read
    found = cycles(g)
    detail = [[f"{a} -> {b} (line {g[a][b]})" for a in c for b in g[a] if b in c] for c in found]
    assert not found, f"import cycles: {detail}"


def test_the_cycle_finder_finds_one():
    g = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(g) == [["a", "b", "c"]]


# What kernels/ may use from tuner/: the contract (KernelSpec and its types, the space's rule
# decorator, the one exception) and, for the engines' launchers, how engine code is read and
# which target a compile worker compiles for, and the releases they launch (data read by
# tuner/plan/engine_releases.py). Never the registry, the search, or anything above.
KERNEL_CONTRACT = {"tuner.errors", "tuner.plan.kernel_api", "tuner.plan.space", "tuner.plan.kernel_sources",
                   "tuner.measure.device", "tuner.plan.engine_releases"}


def test_kernels_import_only_the_contract_from_tuner():
    g = graph()
    used = {t for name, targets in g.items() if name.startswith("kernels") for t in targets if t.startswith("tuner")}
    assert "tuner.plan.kernel_api" in used
    assert used <= KERNEL_CONTRACT, f"kernels/ imports {sorted(used - KERNEL_CONTRACT)} from tuner/"


# The stages of tuner/, bottom first (docs/architecture.md draws them): a module imports only
# modules of its own stage and of the stages below it. kernels/ is no stage: it keeps the
# contract rule above, and only the kernel registry imports it.
STAGES = ("base", "plan", "measure", "search", "emit", "pipeline", "jobs", "api", "commands", "cli")
BASE = {"errors", "paths", "reading", "progress", "textwidth", "file_kinds"}

# The imports that break the rule, each with its reason. The test fails on any other upward
# import, and on an entry here that is no longer imported: fix one, remove its entry. None now.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def stage_of(module: str) -> str | None:
    """The stage of a module of tuner/ (None for kernels/)."""
    parts = module.split(".")
    if parts[0] != "tuner":
        return None
    if len(parts) == 1 or parts[1] in BASE:
        return "base"
    if parts[1] in ("plan", "measure", "search", "emit", "pipeline", "jobs", "commands", "api"):
        return parts[1]
    if parts[1] in ("cli", "__main__"):
        return "cli"
    raise AssertionError(f"{module} is in no stage: place it in STAGES (tests/test_structure.py) and in "
                         "docs/architecture.md")


def upward_imports(g: dict[str, dict[str, int]]) -> dict[tuple[str, str], int]:
    """{(module, what it imports): line} of the imports of a higher stage."""
    found = {}
    for name, targets in g.items():
        mine = stage_of(name)
        for target, line in targets.items():
            theirs = stage_of(target)
            if mine is not None and theirs is not None and STAGES.index(theirs) > STAGES.index(mine):
                found[(name, target)] = line
    return found


def test_every_module_of_tuner_is_in_a_stage():
    stages = {stage_of(name) for name in modules()}
    assert stages == {*STAGES, None}


def test_a_stage_imports_only_the_stages_below_it():
    found = upward_imports(graph())
    unknown = [f"{a} ({stage_of(a)}) imports {b} ({stage_of(b)}), line {line}"
               for (a, b), line in sorted(found.items()) if (a, b) not in KNOWN_UPWARD]
    assert not unknown, f"imports of a higher stage: {unknown}"
    fixed = sorted(set(KNOWN_UPWARD) - set(found))
    assert not fixed, f"no longer imported: remove from KNOWN_UPWARD in tests/test_structure.py: {fixed}"


def test_nothing_below_the_commands_imports_them():
    """A tuning run is the pipeline's (tuner/pipeline/), not a command module's: only the
    command line and the commands themselves import tuner.commands."""
    g = graph()
    found = sorted(f"{name} -> {target} (line {line})" for name, targets in g.items() for target, line in targets.items()
                   if target.startswith("tuner.commands") and name.startswith("tuner.")
                   and not name.startswith(("tuner.commands", "tuner.cli", "tuner.__main__")))
    assert g["tuner.pipeline.tune"] and not found, found


def test_the_layering_check_finds_an_upward_import():
    g = {"tuner.plan.models": {"tuner.search.runner": 3, "tuner.errors": 1},
         "tuner.search.runner": {"tuner.plan.models": 7}, "tuner.cli": {"tuner.api": 2}, "kernels.x": {"tuner.cli": 1},
         # the pipeline: above emit/, below the API and the commands
         "tuner.pipeline.run": {"tuner.emit.results": 4, "tuner.commands.report": 9},
         "tuner.emit.results": {"tuner.pipeline.run_plan": 5}, "tuner.api": {"tuner.pipeline.tune": 6},
         "tuner.commands.worker": {"tuner.pipeline.stored_plans": 8}}
    assert upward_imports(g) == {("tuner.plan.models", "tuner.search.runner"): 3,
                                 ("tuner.pipeline.run", "tuner.commands.report"): 9,
                                 ("tuner.emit.results", "tuner.pipeline.run_plan"): 5}


def test_only_the_kernel_registry_imports_kernels():
    importers = {name for name, targets in graph().items() if name.startswith("tuner")
                 for target in targets if target.split(".")[0] == "kernels"}
    assert importers == {"tuner.plan.kernel_registry"}


def test_every_package_and_module_says_what_it_is_for():
    missing = [name for name, path in modules().items()
               if path.name != "__main__.py" and not ast.get_docstring(ast.parse(path.read_text()))]
    assert not missing, f"no docstring: {missing}"


# No module of tuner/ or kernels/ over 500 lines (a module does one job: split by responsibility).
MAX_LINES = 500
# Modules still over the limit, each with its reason; the test fails on any other module over
# it, and on an entry here that is no longer over it (remove it then).
OVER_MAX_LINES: dict[str, str] = {}


def module_lengths() -> dict[str, int]:
    return {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in modules().values()}


def test_no_module_is_over_500_lines():
    lengths = module_lengths()
    assert len(lengths) > 50 and max(lengths.values()) > 100             # the files are really read
    over = sorted(f"{path} ({n} lines)" for path, n in lengths.items() if n > MAX_LINES and path not in OVER_MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines (split them by responsibility): {over}"
    fixed = sorted(path for path in OVER_MAX_LINES if lengths.get(path, 0) <= MAX_LINES)
    assert not fixed, f"no longer over {MAX_LINES} lines: remove from OVER_MAX_LINES in tests/test_structure.py: {fixed}"


ENGINE_NAMES_LOWER = ("vllm", "sglang")


def engine_name_comparisons(source: str) -> list[tuple[int, str]]:
    """[(line, comparison)] of the comparisons (==, !=, in, not in, is) with an engine's name as
    a string constant: code that branches on which engine it is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if any(name.lower() in ENGINE_NAMES_LOWER for name in names):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_nothing_in_tuner_branches_on_an_engines_name():
    """Engine differences are data in the engines' rules (tuner/plan/engine_rules/), read from
    the engines' own source; code asks the rules, never which engine it is."""
    from tuner.plan.engines import ENGINE_NAMES
    assert set(ENGINE_NAMES) == set(ENGINE_NAMES_LOWER)
    found = [f"{path.relative_to(REPO)}:{line}: {text}" for path in sorted((REPO / "tuner").rglob("*.py"))
             for line, text in engine_name_comparisons(path.read_text())]
    assert not found, f"branches on an engine's name (make the difference data in its rules): {found}"


def test_the_engine_name_check_finds_a_branch():
    code = ('a = engine == "vllm" and kind == "fused_moe"\nif name in ("vllm", "sglang"):\n    pass\n'
            'b = "SGLang" != e\nc = engine == ENGINE\nd = {"vllm": 1}["vllm"]\n')
    assert sorted(line for line, _ in engine_name_comparisons(code)) == [1, 2, 4]


# The command layer stays thin (issue 53): a command parses its options into a request, calls
# one function below it and prints; the jobs themselves live in tuner/jobs/.
MAX_COMMAND_LINES, MAX_COMMANDS_LINES = 250, 2000


def test_the_commands_are_thin():
    lengths = {path: n for path, n in module_lengths().items() if path.startswith("tuner/commands/")}
    assert len(lengths) > 10
    over = sorted(f"{path} ({n} lines)" for path, n in lengths.items() if n > MAX_COMMAND_LINES)
    assert not over, f"command modules over {MAX_COMMAND_LINES} lines (move the job to tuner/jobs/): {over}"
    assert sum(lengths.values()) < MAX_COMMANDS_LINES, f"tuner/commands/ holds {sum(lengths.values())} lines"
