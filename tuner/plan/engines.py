"""How each serving engine names, places and reads its config tables: the engines' rules
(one module each in tuner/plan/engine_rules/, facts read from the source of the releases
configs/engines/ lists, see ../shared/ENGINES.md) gathered in one place, and the rules every
engine shares, so that the rest of the tool never branches on an engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from tuner.errors import TunerError
from tuner.plan import engine_releases
from tuner.plan.engine_rules import RULES
from tuner.plan.engine_rules.schema import Engine, ServingMetrics, TableFamily

ENGINE_NAMES = tuple(r.ENGINE.name for r in RULES)

# The batch sizes both engines' tuners write, and our default grid.
DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
# the grid's largest: `tuner audit` looks at M = 1 to this by default, and a run checks its own tables so
GRID_TOP = max(DEFAULT_BATCH_SIZES)

ENGINES: dict[str, Engine] = {r.ENGINE.name: r.ENGINE for r in RULES}

# What each engine's /metrics says of the batches it runs (tuner/plan/traffic.py reads these).
SERVING_METRICS: dict[str, ServingMetrics] = {r.ENGINE.name: r.SERVING_METRICS for r in RULES}


class _LoaderFunctions(Mapping):
    """{engine: {release: {'file:function': hash}}}: per release, the hash of every engine
    function the loader rules were read from (tuner.plan.kernel_sources.source_hash of its
    source), read from configs/engines/ when first asked for; tests/test_loader_rules.py fails
    when a wheel's functions differ from them, and `tuner audit` warns when the engine it
    audits has other ones."""

    def __getitem__(self, engine: str) -> dict[str, dict[str, str]]:
        if engine not in ENGINES:
            raise KeyError(engine)
        return engine_releases.loader_functions(engine)

    def __iter__(self) -> Iterator[str]:
        return iter(ENGINES)

    def __len__(self) -> int:
        return len(ENGINES)


LOADER_FUNCTIONS: Mapping[str, dict[str, dict[str, str]]] = _LoaderFunctions()

# Each engine's table families, as its loaders read them.
TABLE_FAMILIES: dict[tuple[str, str], TableFamily] = {
    (r.ENGINE.name, kind): family for r in RULES for kind, family in r.TABLE_FAMILIES.items()}


def lookup_nearest(table: dict, M: int):
    """The entry an engine uses for batch size M: nearest integer key, ties to the
    earlier key in file order (both engines use min() over the keys in order)."""
    keys = [int(k) for k in table if k != "triton_version"]
    if not keys:
        raise KeyError("empty table")
    best = min(keys, key=lambda k: abs(k - M))
    return table[str(best)]


# Triton's CUDA launch options: a table key among these is taken by the launch, not the kernel.
TRITON_CUDA_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "launch_cooperative_grid",
                       "enable_fp_fusion", "debug", "sanitize_overflow", "arch", "ptx_version",
                       "max_num_imprecise_acc_default", "extern_libs", "instrumentation_mode")


def table_family(engine: str, kind: str) -> TableFamily:
    return TABLE_FAMILIES[(engine, kind)]


def loader_release(engine: str, version: str | None) -> str:
    """The release whose loader rules apply to `version`: itself when known, else the newest
    known release (the audit then compares the engine's loader functions with it)."""
    known = LOADER_FUNCTIONS[engine]
    if version and version.split("+")[0] in known:
        return version.split("+")[0]
    return max(known, key=engine_releases.version_key)


def release_reads(engine: str, version: str, kind: str) -> bool:
    """Whether the loader rules cover `kind` tables of this release: its data records the
    family's loader function (a release laid out otherwise has none recorded for it)."""
    return table_family(engine, kind).loader in LOADER_FUNCTIONS[engine][loader_release(engine, version)]


def supported_releases(engine: str) -> list[str]:
    """The releases of `engine` the data holds (configs/engines/), oldest first."""
    return engine_releases.supported_versions(engine)


def check_known_release(engine: str, version: str) -> None:
    """Where no package of `engine` is at hand (an install into a config folder, an audit of
    override folders only) its --engine-version alone picks the loader rules: a release the data
    does not hold is one line (with a package, the audit applies the newest rules and compares
    the package's loader functions with them: `loader_changed`)."""
    if version.split("+")[0] not in supported_releases(engine):
        raise TunerError(f"--engine-version {version}: tuner knows the loader rules of {engine} "
                         f"{', '.join(supported_releases(engine))} only")


def parse_table_keys(raw, family: TableFamily) -> dict[int, object]:
    """A table's JSON object as the loader turns it into {M: entry}: its dropped keys
    removed, every other key through int() (a ValueError there is the loader's crash)."""
    if not isinstance(raw, dict):
        raise TypeError(f"a JSON {type(raw).__name__}, not an object of batch sizes")
    table = {k: v for k, v in raw.items() if k not in family.dropped_keys}
    return {int(key): val for key, val in table.items()}


def backend_reads_table(engine: str, kind: str, ep: int, env: dict, params: dict | None = None) -> tuple[bool, str]:
    """(whether the engine's default backend choice on Hopper reads this table family, and
    a line saying what runs and the server setting that makes it read the table). Read from
    the source of vLLM 0.33.0 and SGLang 0.5.23 (same order of backends in the earlier
    releases); `env` is the engine's environment (its variables decide too); `params`, a
    fused-MoE problem's: its precision's rule (a weight-only MoE runs Marlin by default)."""
    from tuner.plan.engine_rules.schema import precision_rule
    eng = ENGINES[engine]
    facts = eng.reads_on_hopper.get(kind, "")
    rule = precision_rule(eng.moe_precisions, params) if params is not None and kind == "fused_moe" else None
    if rule is not None and not rule.by_default:
        return False, f"not read by default: {rule.runs_when}"
    choice = eng.hopper_backends.get(kind)
    if choice is None:
        return True, facts
    return choice.reads(ep, env, facts)


def reading_note(engine: str, kind: str, params: dict | None = None) -> str | None:
    """When the engine reads tables of this kind on Hopper, in words (None: no fact recorded);
    for a fused MoE of an integer precision (`params`), what runs it first: a weight-only MoE
    runs Marlin by default, and its tables only with the flag its rule names."""
    from tuner.plan.engine_rules.schema import precision_rule
    eng = ENGINES[engine]
    base = eng.reads_on_hopper.get(kind)
    rule = precision_rule(eng.moe_precisions, params) if params is not None and kind == "fused_moe" else None
    if rule is None or params is None or params.get("dtype") in ("bf16", "fp8_w8a8"):
        return base
    return f"{rule.runs_when}; {base}" if rule.by_default and base else rule.runs_when


# The nesting at which an engine's json.load raises RecursionError: Python's default recursion
# limit (1000) less the frames of the engine's loader (a few dozen).
ENGINE_JSON_DEPTH = 950


def load_table(family: TableFamily, raw: bytes) -> tuple[dict[int, object] | None, str | None]:
    """({M: entry} as the loader returns it, None) or (None, why the loader raises on it)."""
    import json

    from tuner.reading import nests_deeper
    # what the engine's json.load does under Python's default recursion limit (1000), whatever
    # this process's limit is
    if nests_deeper(raw, ENGINE_JSON_DEPTH):
        return None, "nested too deeply for Python's JSON reader: json.load raises RecursionError"
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"not valid JSON ({str(e).splitlines()[0]}): json.load raises"
    except RecursionError:
        return None, "nested too deeply for Python's JSON reader: json.load raises RecursionError"
    try:
        return parse_table_keys(obj, family), None
    except ValueError:
        bad = next(k for k in obj if k not in family.dropped_keys and not _int_like(k))
        return None, f"key {bad!r} is not a batch size: the loader's int() raises ValueError"
    except TypeError as e:
        return None, f"{e}: the loader raises on it"


def _int_like(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


# -- after an install: what undoes the tables, and what the config-folder variables cover -------
# (the engines' own log lines for a table loaded or not found are quoted from their loader
# source at run time: tuner/emit/engine_tables.py log_lines, printed by tuner install)
def install_notes(engine: str, into_package: bool) -> list[str]:
    """What `tuner install` tells after putting tables where `engine` reads them (besides the
    engine's log lines for each table): that tables inside the package are gone when the
    engine is upgraded or reinstalled, and what the config-folder variable covers."""
    covered = {kind: fam.env_var for (e, kind), fam in TABLE_FAMILIES.items() if e == engine and fam.env_var}
    variable = " / ".join(sorted(set(covered.values())))
    lines = []
    if into_package:
        lines.append(f"tables in {engine}'s package folder are removed when {engine} is upgraded or reinstalled "
                     f"(pip replaces the folder): install them again after that"
                     + (f", or keep the MoE tables outside with --moe-config-dir ({variable})" if "fused_moe" in covered
                        else ""))
    if covered:
        lines.append(f"{variable} covers {' and '.join(sorted(covered))} tables only: the other tables are read from "
                     "the package's own folder")
    return lines
