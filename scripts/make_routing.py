#!/usr/bin/env python3
"""A SYNTHETIC routing file shaped like DeepSeek-V3's router (a generator, not a recording).

    python scripts/make_routing.py --out routing.npy [--tokens 4096] [--layers 2] [--format npy|sglang]

No small MoE model is at hand here to record real routing from, so this generates top-k expert
ids with DeepSeek-V3's published router (its technical report, arXiv 2412.19437, sections 2.1.2
and 4.5): 256 routed experts in 8 groups, sigmoid affinities, each token restricted to the 4
groups with the highest sum of their two best affinities, then the top 8 experts, chosen on
affinity plus a per-expert bias term. The bias is the report's auxiliary-loss-free balancing:
fitted here as the report describes (after each batch, lowered by gamma = 0.001 for the experts
over the mean load and raised for those under it) until the load over the whole file is
balanced. Tokens come in runs sharing a topic (a batch as a server sees it), each topic
favouring some experts, so a batch is skewed the way the report's per-domain expert loads are
(experts specialize by domain while the overall load stays balanced) and not the way `zipf` is
(one expert taking most tokens). The statistics it reaches (seed 0, 8192 tokens, one layer): over the
file the busiest expert has 1.35x the mean load (coefficient of variation 0.13: balanced, as the
report's bias keeps it); in a batch of 64 tokens the busiest expert has 6.6x the batch's mean
(about 13 of the 64 tokens; uniform routing gives about 2.5x, `zipf` far more). They are
printed and stored beside the file; they are this generator's, not a measurement of the served
model, and the exact per-expert loads of the report's figures are not reproduced.

--format sglang writes SGLang's per-token expert-distribution dump instead (a torch.save'd dict
of "records", each with "topk_ids_of_layer" [layers, tokens, 8], and
"last_physical_to_logical_map"), as SGLang's recorder writes it, for `--routing FILE`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

EXPERTS, GROUPS, TOPK_GROUPS, TOPK = 256, 8, 4, 8      # DeepSeek-V3's router
GAMMA = 0.001                                           # the report's bias update speed
TOPIC_RUN = 16                                          # tokens in a row sharing a topic (a sequence's)


def route(affinity: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """DeepSeek-V3's node-limited top-k: [tokens, EXPERTS] sigmoid affinities -> [tokens, TOPK] ids."""
    score = affinity + bias
    per_group = score.reshape(len(score), GROUPS, -1)
    group_score = np.sort(per_group, axis=2)[:, :, -2:].sum(axis=2)
    keep = np.argsort(-group_score, axis=1)[:, :TOPK_GROUPS]
    kept = np.zeros(group_score.shape, dtype=bool)
    np.put_along_axis(kept, keep, True, axis=1)
    masked = np.where(kept[:, :, None], per_group, -np.inf).reshape(len(score), -1)
    return np.argsort(-masked, axis=1)[:, :TOPK].astype(np.int32)


def affinities(rng: np.random.Generator, tokens: int, topics: np.ndarray) -> np.ndarray:
    """Sigmoid affinities of tokens drawn around their topic's direction."""
    dim = topics.shape[1]
    which = np.repeat(rng.integers(0, len(topics), size=-(-tokens // TOPIC_RUN)), TOPIC_RUN)[:tokens]
    x = topics[which] + rng.standard_normal((tokens, dim))
    return 1 / (1 + np.exp(-x @ ROUTER))


ROUTER = np.zeros((0, 0))


def generate(tokens: int, layers: int, seed: int) -> tuple[np.ndarray, dict]:
    global ROUTER
    rng = np.random.default_rng(seed)
    out, stats = [], []
    for _ in range(layers):
        dim = 64
        ROUTER = rng.standard_normal((dim, EXPERTS)) / np.sqrt(dim) * 0.5
        topics = rng.standard_normal((32, dim))
        bias = np.zeros(EXPERTS)
        for _ in range(200):                            # fit the balancing bias as the report updates it
            ids = route(affinities(rng, 4096, topics), bias)
            load = np.bincount(ids.ravel(), minlength=EXPERTS)
            bias -= GAMMA * np.sign(load - load.mean())
        ids = route(affinities(rng, tokens, topics), bias)
        load = np.bincount(ids.ravel(), minlength=EXPERTS)
        per_batch = [np.bincount(ids[i:i + 64].ravel(), minlength=EXPERTS) for i in range(0, tokens, 64)]
        stats.append({"overall_max_over_mean": float(load.max() / load.mean()),
                      "overall_cv": float(load.std() / load.mean()),
                      "batch_of_64_max_over_mean": float(np.mean([b.max() / b.mean() for b in per_batch])),
                      "batch_of_64_experts_used": float(np.mean([(b > 0).mean() for b in per_batch]))})
        out.append(ids)
    return np.stack(out), {"generator": "scripts/make_routing.py (SYNTHETIC: DeepSeek-V3's router shape, not a "
                                        "recording)", "tokens": tokens, "layers": layers, "seed": seed,
                           "per_layer": stats}


def write(ids: np.ndarray, info: dict, out: Path, fmt: str) -> None:
    """[layers, tokens, topk] ids as a .npy, or as SGLang's per-token dump (one record per 64
    tokens, identity physical-to-logical map); the generator's statistics beside it (.json)."""
    if fmt == "npy":
        np.save(out, ids[0] if len(ids) == 1 else ids)
    else:
        import torch
        records = [{"forward_pass_id": i // 64, "rank": 0, "gatherer_key": "primary",
                    "topk_ids_of_layer": torch.from_numpy(ids[:, i:i + 64].copy())}
                   for i in range(0, ids.shape[1], 64)]
        torch.save({"records": records, "last_physical_to_logical_map":
                    torch.arange(EXPERTS).repeat(len(ids), 1)}, out)
    Path(str(out) + ".json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("npy", "sglang"), default="npy")
    args = ap.parse_args()
    ids, info = generate(args.tokens, args.layers, args.seed)
    write(ids, info, Path(args.out), args.format)
    print(json.dumps(info["per_layer"][0]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
