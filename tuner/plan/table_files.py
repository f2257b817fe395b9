"""Table files read back: the problem an engine's table file is for, from its name (the
engines' naming rules), and our own format's tables (MLA decode). `tuner drift`, `tuner
check`, nightly and the warm starts read tables through here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.problems import Problem

_GEMM = re.compile(r"^N=(\d+),K=(\d+),device_name=([^,]+),dtype=(\w+),block_shape=\[(\d+),( ?)(\d+)\]\.json$")
_MOE = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]+?)(?:,dtype=(\w+))?"
                  r"(?:,block_shape=\[(\d+),( ?)(\d+)\])?(,per_channel_quant=True)?(_down)?\.json$")


# The largest size a table's name may hold (E, N, K, a block size): a name beyond it is no
# engine's table, and would ask the timing for tensors no GPU holds.
MAX_SHAPE = 1 << 20


@dataclass
class TableFile:
    path: Path
    engine: str           # the engine whose naming the file follows (_engine_of), or "tuner"
    device: str           # the device_name part
    problem: Problem
    table: dict
    # The table this one is tied to (SGLang's `_down` table -> its up table in the same
    # folder): its config is what the engine runs without this table.
    tied_to: "TableFile | None" = None


def _engine_of(kind: str, path: Path, block_sep: str | None, down: bool) -> str:
    """The engine a `kind` table file is written for, from the engines' naming rules as data
    (tuner/plan/engine_rules). Evidence in order, each kept only where some family fits it:
    a `_down` table (only a family with one writes it), the separator inside block_shape=[...]
    (the name a loader asks for), a triton_X_Y_Z folder (a family keyed by Triton version); a
    name that still fits several is the family's that keeps its tables outside Triton folders."""
    from tuner.plan.engines import TABLE_FAMILIES
    fits = [f for (_, k), f in TABLE_FAMILIES.items() if k == kind]
    prefix = next((f.triton_folder("") for f in fits if f.per_triton), None)        # "triton_"
    in_triton_folder = prefix is not None and re.match(re.escape(prefix) + r"\d", path.parent.name)
    for evidence in (lambda f: f.has_down or not down,
                     lambda f: block_sep is None or f.block_sep == block_sep,
                     lambda f: f.per_triton or not in_triton_folder,
                     lambda f: not f.per_triton):
        fits = [f for f in fits if evidence(f)] or fits
    return fits[0].engine


def _moe_precision(engine: str, model, dtype: str | None, block: bool, per_channel: bool, n: int) -> tuple[dict, int]:
    """(the precision params, the expert width N) a MoE table name stands for under `engine`'s
    naming rules: the precision whose rule gives this dtype part (a name without one is bf16's,
    or vLLM's INT8 W8A8 when the model's checkpoint is that), its K groups and zero points from
    the model's checkpoint, N unpacked where the engine names INT4 tables by the packed width."""
    from tuner.plan.engines import ENGINES
    from tuner.plan.precision import checkpoint_dtype, moe_precision
    own = checkpoint_dtype(model)
    candidates = [(d, scheme) for (d, scheme), rule in ENGINES[engine].moe_precisions.items()
                  if rule.table_dtype == (dtype or None) and rule.per_channel_part == per_channel
                  and (scheme == "block") == block]
    chosen = next((c for c in candidates if c[0] == own), None) or next((c for c in candidates if c[0] == dtype),
                                                                         ("bf16", "none") if not dtype else None)
    if chosen is None:                      # a dtype no precision of this engine's is named by
        return {"dtype": dtype or "bf16"}, n
    rule = ENGINES[engine].moe_precisions[chosen]
    params: dict = {"dtype": chosen[0]}
    if chosen[1] == "group":
        prec = moe_precision(model, chosen[0])
        params = {"dtype": chosen[0], "group_size": prec.group_size or 128, **({"zero_point": True}
                                                                               if prec.zero_point else {})}
    return params, n * rule.packed_n


def parse_table_file(path: Path, model=None, routing: str = "uniform") -> list[TableFile]:
    """The problems a table file is for ([] for files that are not config tables): one for
    an engine's table, one per problem it holds for a kernel's own format (MLA decode).
    MoE names lack the hidden size and top-k: they come from `model`."""
    from tuner.plan.kernel_api import MAX_TABLE_M
    from tuner.reading import read_json_file
    name = path.name
    named = bool(_GEMM.match(name) or _MOE.match(name))
    try:
        raw = read_json_file(path, "table ")
    except TunerError:
        if named:               # named like an engine's table: a broken one is said, not skipped
            raise
        return []
    if not isinstance(raw, dict):
        if named:
            raise TunerError(f"{path} is named like an engine table but is not one: not a JSON object")
        return []
    table = {k: v for k, v in raw.items() if k != "triton_version"}
    from tuner.plan.batch_keys import is_batch_key
    if named and not all(is_batch_key(k, MAX_TABLE_M) and isinstance(v, dict)
                         for k, v in table.items()):
        raise TunerError(f"{path} is named like an engine table but is not one: its keys must be batch sizes "
                         f"(1 to {MAX_TABLE_M}) and its values configs")
    if named:
        shape = (_GEMM.match(name) or _MOE.match(name)).groups()  # type: ignore[union-attr]
        if any(g and g.isdigit() and not 0 < int(g) <= MAX_SHAPE for g in shape):
            raise TunerError(f"{path} is named like an engine table but is not one: the numbers in its name "
                             f"(E, N, K, block sizes) must be from 1 to {MAX_SHAPE}")
    if m := _GEMM.match(name):
        n, k, dev, dtype, bn, space, bk = m.groups()
        engine = _engine_of("fp8_gemm", path, "," + space, down=False)
        return [TableFile(path, engine, dev, Problem("fp8_gemm", {"N": int(n), "K": int(k),
                                                                  "block_shape": [int(bn), int(bk)]}), table)]
    if m := _MOE.match(name):
        if model is None:
            raise TunerError(f"{name} is a fused-MoE table: give --model so its hidden size and top-k are known")
        e, n, dev, dtype, bn, space, bk, channel, down = m.groups()
        engine = _engine_of("fused_moe", path, "," + space if bn else None, down=bool(down))
        precision, n = _moe_precision(engine, model, dtype, bool(bn), bool(channel), int(n))
        from tuner.plan.engines import ENGINES, table_family
        arch = model.architecture
        # expert E-1 of SGLang's E = routed + 1 tables is the fused shared expert
        shared = ({"shared_experts": 1} if int(e) == (model.n_routed_experts or 0) + 1 and ENGINES[engine]
                  .fuses_shared_expert(arch, model.n_routed_experts, model.n_shared_experts, 1) else {})
        routed = model.n_routed_experts or 0
        # a table with a share of the model's experts is one GPU's under expert parallelism
        ep = {"ep": routed // int(e)} if 0 < int(e) < routed and routed % int(e) == 0 else {}
        params = {"E": int(e), "N": n, "K": model.hidden_size, "topk": model.num_experts_per_tok, **ep,
                  "dtype": precision.pop("dtype"), "block_shape": [int(bn), int(bk)] if bn else None, **precision,
                  **shared,
                  "part": "down" if down else ("up" if table_family(engine, "fused_moe").has_down else "op"),
                  "routing": routing}
        return [TableFile(path, engine, dev, Problem("fused_moe", params), table)]
    from tuner.plan.kernel_registry import KERNEL_MODULES, get_kernel
    for kernel in map(get_kernel, KERNEL_MODULES):
        if kernel.read_table is None:
            continue
        held = kernel.read_table(raw)
        if held:
            dev = str(raw.get("device_name", ""))
            return [TableFile(path, "tuner", dev, Problem(kernel.name, params), {str(M): c for M, c in rows.items()})
                    for params, rows in held]
    return []


def find_tables(paths: list[str], model=None, routing: str = "uniform") -> list[TableFile]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise TunerError(f"{p} not found")
    tables = [t for f in files for t in parse_table_file(f, model, routing)]
    by_path = {t.path: t for t in tables}
    for t in tables:
        if t.path.name.endswith("_down.json"):
            t.tied_to = by_path.get(t.path.with_name(t.path.name[: -len("_down.json")] + ".json"))
    if not tables:
        raise TunerError(f"no config tables (the engines' fp8_gemm or fused_moe files, or our MLA decode "
                         f"tables) in {', '.join(paths)}")
    return tables
