"""The one or two examples each command's help ends with (`tuner COMMAND --help`), in one place
so that a test runs every one of them through the parser. A new command adds its own here."""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "coverage": ["tuner coverage --gpu H200                                          # where tuning pays",
                 "tuner coverage --model my-model/config.json --gpu H100 H200 --json --plot coverage.png"],
    "moe": ["tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8            # on the GPU; TP8, the default",
            "tuner moe --model deepseek-v3 --gpu H200 --synthetic --batch-sizes 1 64   # no GPU: a SYNTHETIC try"],
    "gemm": ["tuner gemm --model deepseek-v3 --gpu H200 --dry-run                  # the plan",
             "tuner gemm --model deepseek-v3 --gpu H200 --only N=7168,K=2048"],
    "mla": ["tuner mla --model deepseek-v3 --gpu H200",
            "tuner mla --model deepseek-v3 --gpu H200 --contexts 4096 32768 --page-size 16"],
    "install": ["tuner install runs/moe-deepseek-v3-H200-tp8 --engine vllm --model deepseek-v3",
                "tuner install runs/moe-deepseek-v3-H200-tp8 --engine sglang --engine-version 0.5.23 "
                "--moe-config-dir /srv/sglang-moe"],
    "audit": ["tuner audit --engine vllm --model deepseek-v3 --gpu H200",
              "tuner audit --engine sglang --all"],
    "report": ["tuner report runs/moe-deepseek-v3-H200-tp8"],
    "diff": ["tuner diff runs/moe-deepseek-v3-H200-tp8 runs/moe-random"],
    "drift": ["tuner drift runs/moe-deepseek-v3-H200-tp8 --gpu H200 --model deepseek-v3"],
    "nightly": ["tuner nightly configs/nightly.yaml"],
    "check": ["tuner check --model configs/examples/small-moe.json --kernel moe --kernel-source ours "
              "--table runs/moe-deepseek-v3-H200-tp8/vllm/fused_moe/E=256,N=256,device_name=NVIDIA_H200,"
              "dtype=fp8_w8a8,block_shape=[128,128].json"],
    "bench": ["tuner bench --kernel moe --model deepseek-v3 --gpu H200 --tuned runs/moe-deepseek-v3-H200-tp8 "
              "--out runs/bench"],
    "ceilings": ["tuner ceilings --gpu H200"],
    "landscape": ["tuner landscape synth --kernel moe --model deepseek-v3 --gpu H200 --batch-sizes 1 64 "
                  "--out synthetic-moe.jsonl.gz",
                  "tuner landscape info synthetic-moe.jsonl.gz"],
    "engine-source": ["tuner engine-source fetch vllm==0.33.0",
                      "tuner engine-source extract --engine vllm --out engine-src/vllm"],
    "proof": ["tuner proof --device cpu --gpu H200 --minutes 8 --out /tmp/rehearsal --call gpu"],
    "worker": ["tuner worker --storage postgresql://host/tuner --study-prefix night1"],
    "repair-journal": ["tuner repair-journal runs/night1/studies.journal"],
    "collect": ["tuner collect --storage postgresql://host/tuner --study-prefix night1 --out runs/night1"],
}


def epilog(name: str) -> str | None:
    lines = EXAMPLES.get(name)
    if not lines:
        return None
    return ("example:" if len(lines) == 1 else "examples:") + "".join(f"\n  {line}" for line in lines)
