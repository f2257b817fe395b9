"""What an engine's rules say, as types: each engine's module (tuner/plan/engine_rules/vllm.py,
sglang.py) fills them in with facts read from that engine's source; the code that reads them
(tuner/plan/engines.py, the audit, install, the plan) never asks which engine it is."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from tuner.errors import TunerError


def _underscored(cuda_name: str) -> str:
    return cuda_name.replace(" ", "_")


_TRITON = re.compile(r"(\d{1,3})\.(\d{1,3})(\.\d{1,3})?((?:a|b|rc|\.post|\.dev)\d{1,6})*(\+[A-Za-z0-9.]{1,64})?")


def checked_triton(text: str) -> str:
    """A Triton version as triton.__version__ names it ('3.6.0', '3.5.1', '3.6.0+git1a2b'), what
    SGLang's loader builds its folder name from; '3.6' is '3.6.0' (Triton's releases have three
    parts). Anything else is one line."""
    m = _TRITON.fullmatch(text.strip())
    if m is None or (m.group(3) is None and (m.group(4) or m.group(5))):
        raise TunerError(f"not a Triton version: {text!r} (give X.Y.Z as triton.__version__ says it, e.g. 3.6.0)")
    return text.strip() if m.group(3) else f"{m.group(1)}.{m.group(2)}.0"


@dataclass(frozen=True)
class BackendFlag:
    """The server flag that makes an engine run its Triton kernel for one table family (so its
    tables are read) on Hopper, what runs without it, and where the engine's source defines the
    flag (tests/test_verdict.py finds `source_text` in one of `source_files` of every wheel)."""
    flag: str                   # "--linear-backend triton"
    default: str                # what runs without it, in words
    source_files: tuple[str, ...]   # the files of the engine's package that define the flag (one per release)
    source_text: str            # text that file holds where it defines it


@dataclass(frozen=True)
class BackendChoice:
    """Whether the engine's default backend choice on Hopper runs the Triton kernel that reads
    one table family, and what changes that: the lines `backend_reads_table` says, with
    {facts} for the engine's `reads_on_hopper` text and {variables} for the variables set."""
    by_default: bool
    default_line: str
    # variables that, set to 1, make another backend run (the tables are not read)
    turned_off_by: tuple[str, ...] = ()
    turned_off_line: str = ""
    # under expert parallelism (ep > 1) the tables are not read by default: the line saying so
    expert_parallel_line: str | None = None
    # variables that, set to 0, make the Triton kernel run (the tables are read)
    turned_on_by: tuple[str, ...] = ()
    turned_on_line: str = ""

    def reads(self, ep: int, env: dict, facts: str) -> tuple[bool, str]:
        def value(name: str) -> str:
            return str(env.get(name, "")).strip().lower()
        off = [v for v in self.turned_off_by if value(v) in ("1", "true", "yes")]
        if off:
            return False, self.turned_off_line.format(variables="/".join(off), facts=facts)
        if ep > 1 and self.expert_parallel_line is not None:
            return False, self.expert_parallel_line.format(facts=facts)
        on = [v for v in self.turned_on_by if value(v) in ("0", "false", "no")]
        if on:
            return True, self.turned_on_line.format(variables="/".join(on), facts=facts)
        return self.by_default, self.default_line.format(facts=facts)


@dataclass(frozen=True)
class PrecisionRule:
    """How an engine runs a fused MoE of one precision (a dtype and its scheme: block, group,
    channel, tensor or none; tuner/plan/precision.py) on its Triton kernel, and how its loader
    names that table: facts read from the engine's quantization methods and loader."""
    table_dtype: str | None         # the dtype= part its loader asks for (None: none, as for bf16)
    kernel: str                     # the engine's jit kernel the layer runs
    runs_when: str                  # what makes the engine run that kernel for such a checkpoint on Hopper
    by_default: bool = True         # whether it does so without a server flag
    per_channel_part: bool = False  # SGLang: the name ends ",per_channel_quant=True"
    packed_n: int = 1               # N in the name is the packed width of w2 (SGLang's INT4: N // 2)
    row_needs: tuple[str, ...] = ()  # keys a row must hold: the launch passes the row as the kernel's arguments


def moe_scheme(params: dict) -> str:
    """A fused-MoE problem's weight scheme (tuner/plan/precision.py MoePrecision.scheme)."""
    if params.get("block_shape"):
        return "block"
    if params.get("group_size"):
        return "group"
    dtype = params.get("dtype")
    if dtype in ("int8_w8a8", "int8_w8a16"):
        return "channel"
    return "tensor" if dtype == "fp8_w8a8" else "none"


def precision_rule(precisions: dict, params: dict) -> PrecisionRule | None:
    """The engine's rule for a fused-MoE problem's precision (None: it runs none)."""
    return precisions.get((params.get("dtype"), moe_scheme(params)))


def moe_name_args(precisions: dict, params: dict) -> dict:
    """What an engine's MoE loader names a problem's table by: E, N (the packed width where the
    engine names it so), the dtype part, the block shape and the per-channel part."""
    rule = precision_rule(precisions, params)
    if rule is None:
        raise ValueError(f"no table of precision {params.get('dtype')} ({moe_scheme(params)})")
    return {"E": params["E"], "N": params["N"] // rule.packed_n, "dtype": rule.table_dtype,
            "block_shape": params.get("block_shape"), "per_channel": rule.per_channel_part}


@dataclass(frozen=True)
class Engine:
    name: str
    block_shape_sep: str            # "," (vLLM) or ", " (SGLang) inside block_shape=[...]
    # Which models' shared expert the engine folds into its fused MoE as expert E-1 (SGLang:
    # DeepSeek-V3/R1's, at expert-parallel size 1 on NVIDIA GPUs); None: it never does.
    shared_expert_fusion: dict | None
    gemm_folder: str                # where the package reads block-FP8 GEMM tables
    moe_folder: str                 # where the package reads fused-MoE tables
    moe_folder_per_triton: bool     # SGLang keys its MoE folder by Triton version
    # The folder, under the one its MoE config-folder variable names, that holds the tables
    # (SGLang: SGLANG_MOE_CONFIG_DIR/configs/triton_X_Y_Z/); a results folder's <engine>/fused_moe/
    # has it too, so that it serves as the variable's folder as it is.
    moe_env_subfolder: str = ""
    # What makes this engine read each table family on Hopper (H100/H200), read from the
    # source of the version named in `facts_for`; printed by the plan and by tuner install.
    reads_on_hopper: dict = field(default_factory=dict)
    facts_for: str = ""
    # Config keys a table family's second (`_down`) table must share with the first at
    # every M ({table kind: keys}): SGLang runs the two MoE GEMMs with one BLOCK_SIZE_M.
    down_table_tied_keys: dict = field(default_factory=dict)
    # How the device_name= part of the tables it writes is built: the table kinds for which
    # every H200 variant folds onto NVIDIA_H200, and whether '/' becomes '_' too.
    device_name_folds_h200: tuple[str, ...] = ()
    device_name_drops_slash: bool = False
    # Expert parallelism in the fused MoE: True (vLLM) when it replaces tensor parallelism
    # inside the experts (each GPU holds whole experts); False (SGLang) when the experts are
    # split by TP / EP as well.
    ep_holds_whole_experts: bool = False
    # {table kind: BackendChoice}: whether its default backend on Hopper reads the tables
    hopper_backends: dict = field(default_factory=dict)
    # {table kind: BackendFlag}: the flag that makes the Triton kernel (and so the tables) run
    triton_flags: dict = field(default_factory=dict)
    # {(dtype, scheme): PrecisionRule}: the MoE precisions its Triton kernels run, and
    # {(dtype, scheme): why not} for those it runs on none
    moe_precisions: dict = field(default_factory=dict)
    moe_precisions_refused: dict = field(default_factory=dict)

    def tied_keys(self, kind: str) -> tuple[str, ...]:
        return tuple((self.down_table_tied_keys or {}).get(kind, ()))

    def fuses_shared_expert(self, architecture: str | None, routed: int, shared: int, ep: int,
                            checkpoint: tuple[str, str] | None = None) -> bool:
        """Whether the engine folds the model's shared expert into its fused MoE; `checkpoint`
        (quant_method, MoE dtype) when known: some quantized checkpoints keep it apart."""
        rule = self.shared_expert_fusion
        if not rule:
            return False
        return (architecture in rule["architectures"] and routed in rule["routed_experts"]
                and shared == rule["shared_experts"] and ep <= rule["max_ep"]
                and (checkpoint is None or tuple(checkpoint) not in rule.get("not_for", ())))

    def device_name(self, cuda_name: str, kind: str = "fused_moe") -> str:
        """The device_name= part of the file name of a `kind` table ("fused_moe", "fp8_gemm")
        for a GPU CUDA calls `cuda_name`."""
        # vLLM's MoE loader folds every H200 variant onto one name (its GEMM loader does not:
        # an H200 NVL reads NVIDIA_H200_NVL GEMM tables) and drops '/'.
        if kind in self.device_name_folds_h200 and re.search(r"\bH200\b", cuda_name):
            return "NVIDIA_H200"
        name = _underscored(cuda_name)
        return name.replace("/", "_") if self.device_name_drops_slash else name

    def block_shape(self, block_shape) -> str:
        bn, bk = block_shape
        return f"[{bn}{self.block_shape_sep}{bk}]"

    def gemm_filename(self, N: int, K: int, cuda_name: str, block_shape, dtype: str = "fp8_w8a8") -> str:
        return (
            f"N={N},K={K},device_name={self.device_name(cuda_name, 'fp8_gemm')},"
            f"dtype={dtype},block_shape={self.block_shape(block_shape)}.json"
        )

    def moe_filename(self, E: int, N: int, cuda_name: str, dtype: str | None,
                     block_shape=None, down: bool = False, per_channel: bool = False) -> str:
        name = f"E={E},N={N},device_name={self.device_name(cuda_name)}"
        if dtype:
            name += f",dtype={dtype}"
        if block_shape:
            name += f",block_shape={self.block_shape(block_shape)}"
        if per_channel:
            name += ",per_channel_quant=True"
        return name + ("_down" if down else "") + ".json"

    def moe_subfolder(self, triton_version: str) -> str:
        """The folder under the MoE root that holds tables for a Triton version."""
        if not self.moe_folder_per_triton:
            return ""
        return "triton_" + triton_version.split("+")[0].replace(".", "_")

    def table_relpath(self, kind: str, params: dict, cuda_name: str, triton_version: str,
                      down: bool = False) -> str:
        """Where a table goes under a results folder: <engine>/<kind>/[configs/<triton>/]<file>,
        mirroring the layout the engine reads (see tuner install): <engine>/fused_moe/ is a folder
        its MoE config-folder variable takes as it is."""
        if kind == "fp8_gemm":
            name = self.gemm_filename(params["N"], params["K"], cuda_name, params["block_shape"])
            return f"{self.name}/{kind}/{name}"
        if kind == "fused_moe":
            down = down or params.get("part") == "down"
            a = moe_name_args(self.moe_precisions, params)
            name = self.moe_filename(a["E"], a["N"], cuda_name, a["dtype"], a["block_shape"], down, a["per_channel"])
            sub = "/".join(p for p in (self.moe_env_subfolder, self.moe_subfolder(triton_version)) if p)
            return f"{self.name}/{kind}/{sub + '/' if sub else ''}{name}"
        raise ValueError(f"no {self.name} table family {kind!r}")


@dataclass(frozen=True)
class ServingMetrics:
    """What one engine's /metrics exports about the tokens each forward pass runs."""
    engine: str
    facts_for: str
    prefix: str                                  # every metric of the engine starts with it
    tokens_histogram: str | None = None          # tokens per forward pass (cumulative _bucket series)
    batch_gauge: str | None = None               # the running decode batch, one sample per scrape
    passes_counter: str | None = None            # forward passes, by `mode_label`
    tokens_counter: str | None = None            # tokens, by `mode_label`
    mode_label: str = "mode"
    decode_pass_modes: tuple[str, ...] = ()
    prefill_pass_modes: tuple[str, ...] = ()
    decode_token_modes: tuple[str, ...] = ()
    prefill_token_modes: tuple[str, ...] = ()
    skip_gauge_labels: dict = field(default_factory=dict)   # label -> values whose samples are not decode batches
    graph_sizes: Callable[[int | None], list[int]] | None = None   # tp -> the captured sizes passes pad to
    pads_every_pass: bool = False                # True: any pass up to the largest size is padded; False: decode only
    padding_note: str = ""


@dataclass(frozen=True)
class TableFamily:
    """One table family (fused MoE, block-FP8 GEMM) of one engine, as its loader reads it."""
    engine: str
    kind: str                          # "fused_moe" or "fp8_gemm"
    folder: str                        # the package folder the loader reads (under site-packages)
    per_triton: bool                   # SGLang's MoE: <folder>/triton_X_Y_Z/<name>, other versions as fallback
    env_var: str | None                # the override folder's variable (None: none exists)
    env_replaces_root: bool            # SGLang: the variable replaces the package folder; vLLM: searched first
    fold_h200: bool                    # vLLM MoE: any device name with an H200 word looks up NVIDIA_H200
    device_pattern: str                # what the device name's characters become "_": regex
    block_sep: str                     # inside block_shape=[bn<sep>bk]
    dtypes: tuple                      # the dtype= parts the loader can ask for (None: no dtype part)
    dropped_keys: tuple[str, ...]      # top-level keys the loader drops before int()
    has_down: bool                     # SGLang's optional `_down` table, falling back to the up table
    clamp_block_k: bool                # the launch clamps BLOCK_SIZE_K to the smaller weight-block side
    raise_block_k: bool                # the loader raises a BLOCK_SIZE_K that does not divide block_k to it
    forced: tuple = ()                 # (key, value) pairs the launch sets whatever the table says
    per_channel_part: bool = False     # SGLang's MoE names end ",per_channel_quant=True" for per-channel scales
    accepted_keys: tuple[str, ...] = ()   # row keys the launch passes to the kernel besides Triton options
    tied_down_keys: tuple[str, ...] = ()  # keys the down GEMM takes from the up config at every M
    # Other loaders of the same engine reading the same folder (file-name patterns), whose
    # tables are not this family's: they are counted, not audited.
    other_loaders: tuple[tuple[str, str], ...] = ()
    # Where the loader function lives and which of its log calls say "loaded" / "not loaded" /
    # "fell back": (what, level, a local variable the call names, first (0) or last (-1) such
    # call), to quote the engine's own lines from its source.
    loader: str = ""
    log_calls: tuple = ()
    # fused MoE: {(dtype, scheme): PrecisionRule}, as the engine's Engine.moe_precisions
    precisions: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.engine} {self.kind}"

    def device_file_name(self, cuda_name: str) -> str:
        """The device_name= part this loader builds on a GPU CUDA calls `cuda_name`."""
        name = re.sub(self.device_pattern, "_", cuda_name)
        if self.fold_h200 and "H200" in name.split("_"):
            return "NVIDIA_H200"
        return name

    def lookup_name(self, cuda_name: str, *, E: int | None = None, N: int, K: int | None = None,
                    dtype: str | None = None, block_shape=None, down: bool = False, per_channel: bool = False) -> str:
        """The file name this loader asks for (get_config_file_name / get_w8a8_block_fp8_configs)."""
        dev = self.device_file_name(cuda_name)
        block = ""
        if block_shape and all(block_shape):
            block = f",block_shape=[{block_shape[0]}{self.block_sep}{block_shape[1]}]"
        if self.kind == "fp8_gemm":
            return f"N={N},K={K},device_name={dev},dtype=fp8_w8a8{block}.json"
        channel = ",per_channel_quant=True" if per_channel and self.per_channel_part else ""
        return (f"E={E},N={N},device_name={dev}" + (f",dtype={dtype}" if dtype else "") + block + channel
                + ("_down" if down and self.has_down else "") + ".json")

    def name_pattern(self) -> re.Pattern:
        """File names this loader can ask for, with groups E, N, K, device, dtype, bn, bk, down."""
        sep = re.escape(self.block_sep)
        block = rf"(?:,block_shape=\[(?P<bn>\d+){sep}(?P<bk>\d+)\])"
        if self.kind == "fp8_gemm":
            return re.compile(rf"^N=(?P<N>\d+),K=(?P<K>\d+),device_name=(?P<device>[^,]*),dtype=(?P<dtype>fp8_w8a8)"
                              rf"{block}\.json$")
        dtypes = "|".join(re.escape(d) for d in self.dtypes if d)
        down = r"(?P<down>_down)?" if self.has_down else r"(?P<down>(?!))?"
        channel = r"(?:,per_channel_quant=True)?" if self.per_channel_part else ""
        return re.compile(rf"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]*?)(?:,dtype=(?P<dtype>{dtypes}))?"
                          rf"{block}?{channel}{down}\.json$")

    def triton_folder(self, triton_version: str) -> str:
        """SGLang's folder for a Triton version, built as its loader builds it (dots to
        underscores, nothing stripped)."""
        return "triton_" + triton_version.replace(".", "_")

    def loaded_config(self, entry: dict, block_shape=None, up_entry: dict | None = None) -> tuple[dict, list[str]]:
        """What the loader hands the launch for a table entry, and its rewrites in words:
        SGLang's GEMM loader raises a BLOCK_SIZE_K that does not divide block_k to it, and
        SGLang runs the down GEMM with the up entry's BLOCK_SIZE_M (`up_entry`)."""
        cfg = dict(entry)
        changes: list[str] = []
        bk = cfg.get("BLOCK_SIZE_K")
        if self.raise_block_k and block_shape and isinstance(bk, int) and 0 < bk < block_shape[1] \
                and block_shape[1] % bk:
            cfg["BLOCK_SIZE_K"] = block_shape[1]
            changes.append(f"BLOCK_SIZE_K {bk}->{block_shape[1]} (raised by the loader)")
        if up_entry is not None:
            for key in self.tied_down_keys:
                if key in up_entry and cfg.get(key) != up_entry[key]:
                    changes.append(f"{key} {cfg.get(key)}->{up_entry[key]} (the up table's)")
                    cfg[key] = up_entry[key]
        return cfg, changes

    def effective(self, entry: dict, block_shape=None, up_entry: dict | None = None) -> tuple[dict, list[str]]:
        """What the kernel gets for a table entry after every rewrite of the engine: the
        loader's (loaded_config) and the launch's (vLLM clamps BLOCK_SIZE_K to the weight
        block and launches SPLIT_K=1), with the rewrites in words."""
        cfg, changes = self.loaded_config(entry, block_shape, up_entry)
        bk = cfg.get("BLOCK_SIZE_K")
        if self.clamp_block_k and block_shape and isinstance(bk, int) and bk > min(block_shape):
            cfg["BLOCK_SIZE_K"] = min(block_shape)
            changes.append(f"BLOCK_SIZE_K {bk}->{min(block_shape)} (clamped at launch)")
        for key, value in self.forced:
            if key in cfg and cfg[key] != value:
                changes.append(f"{key} {cfg[key]}->{value} (set at launch)")
            if key in cfg:
                cfg[key] = value
        return cfg, changes

    def block_k_runs_wrong(self, block_shape, K: int | None) -> bool:
        """Whether a BLOCK_SIZE_K above the weight block computes wrong results here: the
        kernels read one scale per K step, so a step over two scale groups mixes them
        (unless the launch clamps it, or K holds one group only)."""
        return not self.clamp_block_k and (K is None or K > block_shape[1])
