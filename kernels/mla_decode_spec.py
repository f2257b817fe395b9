"""MLA decode's spec without its code: config keys, the engines' fixed launch, the cost
model, its pruning rule, and its own table format (written, read, looked up at run time), all a
plan reads; the Triton code (kernels/mla_decode.py) is imported only when something runs it
(tuner.plan.kernel_api from_code)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.plan.kernel_api import Config, KernelSpec, Params, from_code, read_table_file
from tuner.plan.space import rule

CODE = "kernels.mla_decode"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


LATENT, ROPE = 512, 64


CONFIG_KEYS = ("BLOCK_N", "BLOCK_H", "num_kv_splits", "num_warps", "num_stages", "merge_warps")


TABLE_FORMAT = "tuner-mla-table/1"


def default_config(params: Params, M: int) -> Config:
    """The engines' fixed launch; the split count by vLLM's heuristic for this context."""
    ctx = params.get("context", 4096)
    splits = min(_next_power_of_2(max(1, ctx // 512)), 2 * 132)
    return {"BLOCK_N": 32, "BLOCK_H": 16, "num_kv_splits": splits, "num_warps": 4, "num_stages": 2,
            "merge_warps": 4}


def sglang_default(params: Params, M: int) -> list[Config]:
    return [default_config(params, M) | {"num_kv_splits": 8}]   # SGLang's default cap


def table_filename(heads: int, page_size: int, device_name: str) -> str:
    return (f"heads={heads},kv_lora_rank={LATENT},qk_rope_dim={ROPE},page_size={page_size},"
            f"device_name={device_name.replace(' ', '_')}.json")


def lookup(table: dict, batch: int, context: int) -> Config:
    """Nearest context bucket, then nearest batch, ties to the smaller key (like the engines)."""
    def nearest(keys, x):
        return min(sorted(keys, key=int), key=lambda k: abs(int(k) - x))
    by_ctx = table["configs"]
    row = by_ctx[nearest(by_ctx, context)]
    return dict(row[nearest(row, batch)])


def find_table(heads: int, page_size: int, dev_name: str | None) -> dict | None:
    """The table for a GPU (CUDA name): $TUNER_MLA_CONFIG_DIR first, then tuned/<device>/."""
    if dev_name is None:
        return None
    name = table_filename(heads, page_size, dev_name)
    roots = [os.environ.get("TUNER_MLA_CONFIG_DIR")]
    roots.append(str(Path(__file__).resolve().parents[1] / "tuned" / dev_name.replace(" ", "_") / "tuner" / "mla_decode"))
    for root in roots:
        if root and (Path(root) / name).is_file():
            table = read_table_file(Path(root) / name)
            return table if isinstance(table, dict) else None
    return None


def emit_table(problem_results, cuda_name: str):
    """All contexts of one (heads, page size) into one table file.
    Returns ({relative path: table}, {problem key: relative path})."""
    files, file_of = {}, {}
    for problem, results in problem_results:
        p = problem.params
        rel = f"tuner/mla_decode/{table_filename(p['heads'], p['page_size'], cuda_name)}"
        table = files.setdefault(rel, {"format": TABLE_FORMAT, "heads": p["heads"], "kv_lora_rank": LATENT,
                                       "qk_rope_dim": ROPE, "page_size": p["page_size"],
                                       "device_name": cuda_name.replace(" ", "_"), "configs": {}})
        row = {str(r.M): r.config for r in sorted(results, key=lambda r: r.M) if r.config}
        if row:
            table["configs"][str(p["context"])] = row
            file_of[problem.key] = rel
    for table in files.values():
        table["configs"] = {k: table["configs"][k] for k in sorted(table["configs"], key=int)}
    return {rel: t for rel, t in files.items() if t["configs"]}, file_of


def read_table(obj: dict) -> list:
    """[(problem params, {batch: config})] of one of our tables, one per context bucket."""
    if not isinstance(obj, dict) or obj.get("format") != TABLE_FORMAT:
        return []
    base = {"heads": int(obj["heads"]), "kv_lora_rank": int(obj["kv_lora_rank"]),
            "qk_rope_dim": int(obj["qk_rope_dim"]), "page_size": int(obj["page_size"])}
    return [({**base, "context": int(ctx)}, {int(b): dict(cfg) for b, cfg in row.items()})
            for ctx, row in obj["configs"].items()]


def engine_hints(problem_results) -> list[str]:
    """What the engines can take from the tuned table today: nothing they read (facts from
    vLLM 0.33.0 and SGLang 0.5.23, ../shared/ENGINES.md)."""
    splits = sorted({r.config["num_kv_splits"] for _, rs in problem_results for r in rs if r.config})
    if not splits:
        return []
    per_ctx = ", ".join(f"{p.params['context']}: " + "/".join(str(r.config["num_kv_splits"]) for r in rs if r.config)
                        for p, rs in problem_results)
    return [f"tuned KV splits per context (over the batch sizes): {per_ctx}",
            "No engine reads this table: it is for kernels.mla_decode (looked up at run time). Neither engine "
            "runs its Triton MLA decode on Hopper by default (vLLM prefers FlashAttention-MLA, FlashMLA, "
            "FlashInfer-MLA; SGLang uses fa3), and where it does, BLOCK_N, BLOCK_H, warps and stages are fixed.",
            "SGLang (Triton attention backend): --triton-attention-num-kv-splits only raises a cap, which is "
            "already max(flag, min(next_pow2(SMs), next_pow2(context / 32))) = 256 on H100/H200; it changes "
            f"nothing unless set above 256, and cannot give the per-(batch, context) counts tuned here "
            f"({min(splits)} to {max(splits)}).",
            "vLLM (Triton MLA backend): splits are min(next_pow2(max_seq_len // 512), 2 * SMs), with no "
            "setting to change them."]


def flops(params: Params, M: int) -> float:
    return 2.0 * M * params["heads"] * params["context"] * (LATENT + ROPE + LATENT)


def bytes_moved(params: Params, M: int) -> float:
    # every cached row once (the value is part of it), q in, output out
    return M * (params["context"] * (LATENT + ROPE) * 2 + params["heads"] * (LATENT + ROPE + LATENT) * 2)


def shared_memory(params: Params, config: Config) -> int:
    # pipelined KV tiles plus the resident q tile
    return (config["num_stages"] * config["BLOCK_N"] + config["BLOCK_H"]) * (LATENT + ROPE) * 2


@rule("kv_splits_within_blocks", reads_m=False)
def _kv_splits_within_blocks(ctx, opts: dict, cfg: Config) -> bool:
    """More splits than BLOCK_N-token blocks in the shortest request leaves programs idle."""
    shortest = max(1, int(ctx.params["context"] * 0.75))
    return cfg["num_kv_splits"] <= max(1, _cdiv(shortest, cfg["BLOCK_N"]))


SPEC = KernelSpec(
    name="mla_decode",
    table_kind="mla_decode",
    problem_keys=("heads", "kv_lora_rank", "qk_rope_dim", "page_size", "context"),
    config_keys=CONFIG_KEYS,
    make_inputs=from_code(CODE, "make_inputs"),
    run=from_code(CODE, "run"),
    reference=from_code(CODE, "reference"),
    tolerance=1e-2,     # bf16 probabilities in the P.V product; fp32 everywhere else
    flops=flops,
    bytes_moved=bytes_moved,
    default_config=default_config,
    shared_memory=shared_memory,
    rows=lambda params, M: params["heads"],
    extra_seeds=sglang_default,
    compile_only=from_code(CODE, "compile_only"),
    compile_per_m=False,     # M is only the grid's first axis and the batch strides' dimension
    warm_across=("context",),
    batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),     # decode batches: requests, not tokens
    emit_table=emit_table,
    read_table=read_table,
    engine_hints=engine_hints,
    measurement_note=lambda p: (f"both stages, batch of M requests with lengths uniform in "
                                f"[0.75, 1.25] x {p['context']}, pages scattered"),
    description="MLA decode (paged, split-KV, two stages)",
)
