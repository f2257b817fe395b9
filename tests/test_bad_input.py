"""Bad input, as a careless user or an attacker would give it: every case ends with exit 2,
exactly one line on stderr, no traceback, and nothing written or changed in the folders
involved (a snapshot of them before and after). Landscapes here are SYNTHETIC."""

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from synthetic import write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space

MOE = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
GEMM = "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}
GEMM_ARGS = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--only", "N=7168,K=2048",
             "--batch-sizes", "1", "--kernel-source", "ours"]

REPO = Path(__file__).resolve().parents[1]


def snapshot(*roots: Path) -> dict:
    """Every file and folder under the roots: its content hash and mode."""
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")) if Path(root).exists() else []:
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out[str(p)] = (digest, st.st_mode)
    return out


def results_with(root: Path, files: dict, manifest=None) -> Path:
    """A results folder holding `files` (relative path -> JSON object or text) and a manifest
    listing each as a vLLM table (or the given manifest object/text)."""
    tables = []
    for i, (rel, content) in enumerate(files.items()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content if isinstance(content, str) else json.dumps(content))
        tables.append({"kernel": "fp8_gemm" if "fp8_gemm" in rel else "fused_moe", "problem": {"i": i},
                       "files": {"vllm": rel}, "environment": {"device": "NVIDIA H200", "triton": "3.6.0"},
                       "numerics_passed": True})
    if manifest is None:
        manifest = {"format": "tuner-manifest/1", "tables": tables}
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return root


def site(root: Path) -> Path:
    for pkg in ("vllm", "sglang"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "triton-3.6.0.dist-info").mkdir(exist_ok=True)
    return root


def landscape(path: Path, mutate=None, gpu="H200", device="NVIDIA H200") -> Path:
    """A small SYNTHETIC GEMM landscape of the o_proj shape at M=1; `mutate(lines)` edits it."""
    kernel = get_kernel("fp8_gemm")
    raw = path.with_name(path.name + ".raw")
    write_synthetic_landscape(raw, kernel, load_space(kernel), get_gpu(gpu),
                              [{"N": 7168, "K": 2048, "block_shape": [128, 128]}], [1], device=device)
    lines = raw.read_text().splitlines()
    raw.unlink()
    if mutate:
        lines = mutate(lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def set_time(value):
    """Line 4's time replaced by `value`, written as the literal JSON text (NaN, Infinity...)."""
    def mutate(lines):
        rec = json.loads(lines[3])
        rec.pop("error", None)
        rec["time_us"] = "__T__"
        return lines[:3] + [json.dumps(rec).replace('"__T__"', value)] + lines[4:]
    return mutate


def off_grid(lines):
    """Every config moved off the search space (a K tile no space has)."""
    out = [lines[0]]
    for line in lines[1:]:
        rec = json.loads(line)
        rec["config"]["BLOCK_SIZE_K"] = 48
        out.append(json.dumps(rec))
    return out


def model_file(path: Path, **fields) -> Path:
    base = {"hidden_size": 256, "num_attention_heads": 2, "head_dim": 128, "n_routed_experts": 8,
            "moe_intermediate_size": 256, "num_experts_per_tok": 2,
            "quantization_config": {"weight_block_size": [128, 128]}}
    path.write_text(json.dumps({**base, **fields}))
    return path


def sqlite_of_another_program(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
    con.commit()
    con.close()
    return path


def backups_with_record(root: Path, record) -> Path:
    folder = root / "backups" / "vllm-20260101T000000-1"
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return root / "backups"


def huge_gzip_line(path: Path) -> Path:
    """A small gzip file that expands to one 8 MiB line (a reader that takes a line whole
    would hold all of it)."""
    import gzip
    with gzip.open(path, "wb") as f:
        f.write(b'{"format": "tuner-landscape/1", "kernel": "fp8_gemm", "pad": "' + b"a" * (8 << 20) + b'"}\n')
    return path


def laughs(path: Path) -> Path:
    """A YAML model file of nested aliases: 10 lines that expand to 9^9 values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    path.write_text("\n".join(lines) + "\n")
    return path


def nightly_config(root: Path, state: str | None = None) -> Path:
    """A nightly config whose runs_dir is under root, with `state` as its state.json."""
    (root / "runs").mkdir(exist_ok=True)
    if state is not None:
        (root / "runs" / "state.json").write_text(state)
    path = root / "n.yaml"
    path.write_text(f"runs_dir: {root / 'runs'}\njobs:\n- {{name: a, kernel: gemm, model: deepseek-v3, gpu: H200}}\n")
    return path


def vllm_wheel(root: Path, kernel_file: bytes) -> Path:
    """A wheel named as vLLM 0.33.0's holding only its fused MoE kernel file, as given."""
    import zipfile
    path = root / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        # the integer launcher's file, read first (sorted), as plain Python: the fault is the kernel file's
        z.writestr("vllm/model_executor/layers/fused_moe/experts/triton_moe.py", b"x = 1\n")
        z.writestr("vllm/model_executor/layers/fused_moe/fused_moe.py", kernel_file)
    return path


def linked_engine_folder(root: Path) -> Path:
    """An extracted vLLM folder whose kernel file is a link to a file outside it."""
    folder = root / "engine"
    kernel_file = folder / "vllm/model_executor/layers/fused_moe/fused_moe.py"
    kernel_file.parent.mkdir(parents=True)
    kernel_file.symlink_to(root / "victim.json")
    (folder / "vllm/model_executor/layers/fused_moe/experts").mkdir()
    (folder / "vllm/model_executor/layers/fused_moe/experts/triton_moe.py").write_text("x = 1\n")
    (folder / "tuner-engine-source.json").write_text(json.dumps({"engine": "vllm", "version": "0.33.0"}))
    return folder


# -- round four (issue 33) -----------------------------------------------------------------------
def sglang_dump(path: Path, running: str = "64.0") -> Path:
    """A one-scrape SGLang /metrics dump whose running-batch gauge reads `running`."""
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    passes = 'mode="decode_cuda_graph",' + labels
    path.write_text(f"sglang:num_running_reqs{{{labels}}} {running}\n"
                    f"sglang:cuda_graph_passes_total{{{passes}}} 90.0\n")
    return path


def vllm_dump(path: Path, counts: tuple[str, str] = ("10.0", "20.0"), engines: int = 1) -> Path:
    """A vLLM /metrics histogram of `engines` series: `counts` passes at le=8 and le=+Inf."""
    lines = []
    for e in range(engines):
        for le, c in (("8.0", counts[0]), ("+Inf", counts[1])):
            lines.append(f'vllm:iteration_tokens_total_bucket{{engine="{e}",le="{le}",model_name="m"}} {c}')
    path.write_text("\n".join(lines) + "\n")
    return path


def deep_json(path: Path, depth: int, inside: str = "[]") -> Path:
    """JSON nested `depth` arrays deep, one bracket a line (no line is long)."""
    path.write_text("[\n" * depth + inside + "\n" + "]\n" * depth)
    return path


def wal_database_of_another_program(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
    con.commit()
    con.close()
    return path


def wal_header_without_a_database(path: Path) -> Path:
    """SQLite's header with the write-ahead-log version bytes, then nothing a database holds."""
    path.write_bytes(b"SQLite format 3\x00\x10\x00\x02\x02" + b"\x00" * 300)
    return path


def run_of_another_gpu(t: Path) -> Path:
    """--out holding a finished run timed on an H100 (a replay of an H100 landscape)."""
    land = landscape(t / "h100.jsonl", gpu="H100", device="NVIDIA H100 80GB HBM3")
    assert main([*GEMM_ARGS, "--gpu", "H100", "--per-rank", "--replay", str(land), "--trials", "4", "--out", str(t / "o"),
                 "--quiet"]) == 0
    return t / "o"


def nightly_job(root: Path, **fields) -> Path:
    """A nightly config of one gemm job (deepseek-v3 on an H200) with `fields` added."""
    job = {"name": "a", "kernel": "gemm", "model": "deepseek-v3", "gpu": "H200", **fields}
    path = root / "n.yaml"
    path.write_text(f"runs_dir: {root / 'runs'}\njobs:\n- {json.dumps(job)}\n")
    return path


_HELD: list = []          # lock files held open by a case's "other process", for the test's length


def night_running(root: Path) -> Path:
    """A nightly config whose runs_dir another night holds (its lock, flocked here)."""
    import fcntl
    (root / "l.jsonl").write_text("")          # a job that replays: it needs no GPU to reach the lock
    config = nightly_job(root, replay=str(root / "l.jsonl"))
    (root / "runs").mkdir(exist_ok=True)
    f = open(root / "runs" / ".nightly.lock", "a")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    _HELD.append(f)
    return config


def stored_plan(root: Path, plan) -> str:
    """A journal storage holding `plan` as a run's stored plan (tuner/pipeline/stored_plans.py)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    path = root / "plan.journal"
    study = optuna.create_study(study_name="tuner-plan:fp8_gemm", storage=JournalStorage(JournalFileBackend(str(path))))
    study.set_user_attr("plan", plan)
    return f"journal:///{path}"


def table_file(path: Path) -> Path:
    path.write_text(json.dumps({"1": CFG}))
    return path


def traffic_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# (name, build(tmp) -> argv, text the one line must hold). Every path a case uses is under tmp.
CASES = [
    # -- tuning commands: options ----------------------------------------------------------
    ("huge batch size", lambda t: [*GEMM_ARGS, "--batch-sizes", "100000000000000000000"], "must be from 1 to"),
    ("zero batch size", lambda t: [*GEMM_ARGS, "--batch-sizes", "0"], "--batch-sizes"),
    ("negative compile workers", lambda t: [*GEMM_ARGS, "--compile-workers", "-3"], "--compile-workers"),
    ("tp zero", lambda t: [*GEMM_ARGS, "--tp", "0"], "--tp"),
    ("tp not dividing heads", lambda t: [*GEMM_ARGS, "--tp", "3"], "--tp 3 does not divide"),
    ("ep not dividing experts", lambda t: ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                                           "--ep", "3", "--kernel-source", "ours"], "--ep 3"),
    ("page size not a power of two", lambda t: ["mla", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                                                "--page-size", "7"], "power of two"),
    ("context zero", lambda t: ["mla", "--model", "deepseek-v3", "--gpu", "H200", "--contexts", "0"], "--contexts"),
    ("dtype the kernel lacks", lambda t: [*GEMM_ARGS, "--dtype", "int4"], "--dtype int4"),
    ("unknown model", lambda t: [*GEMM_ARGS, "--model", "no-such-model"], "unknown model"),
    ("model not JSON", lambda t: ["gemm", "--model", str((t / "m.json").write_text("{oops") and t / "m.json"),
                                  "--gpu", "H200"], "not valid JSON"),
    ("more experts per token than experts", lambda t: [
        "moe", "--model", str(model_file(t / "m.json", num_experts_per_tok=9)), "--gpu", "H200",
        "--kernel-source", "ours"], "exceeds the 8 routed experts"),
    ("K not a multiple of the weight block", lambda t: [
        "gemm", "--model", str(model_file(t / "m.json", hidden_size=200, head_dim=100)), "--gpu", "H200",
        "--kernel-source", "ours"], "not a multiple of the 128-wide weight blocks"),
    ("unknown GPU", lambda t: [*GEMM_ARGS, "--gpu", "B200"], "unknown GPU"),
    ("unknown sampler", lambda t: [*GEMM_ARGS, "--sampler", "annealing"], "--sampler"),
    ("--only matching nothing", lambda t: [*GEMM_ARGS, "--only", "N=1,K=1"], "--only N=1,K=1 matches none"),
    ("space file not YAML", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")),
                                       "--space", str((t / "s.yaml").write_text("params: [") and t / "s.yaml")],
     "not valid YAML"),
    ("space with an unknown rule", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--space", str(
        (t / "s.yaml").write_text(
            "params: {BLOCK_SIZE_M: [16], BLOCK_SIZE_N: [64], BLOCK_SIZE_K: [128], GROUP_SIZE_M: [1], "
            "num_warps: [4], num_stages: [3]}\nconstraints: {magic: {}}\n") and t / "s.yaml")], "unknown constraint"),
    # -- landscapes ------------------------------------------------------------------------
    ("landscape missing", lambda t: [*GEMM_ARGS, "--replay", str(t / "none.jsonl")], "not found"),
    ("landscape a folder", lambda t: [*GEMM_ARGS, "--replay", str(t)], "is not a regular file"),
    ("landscape NaN time", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl", set_time("NaN")))],
     "line 4 is malformed"),
    ("landscape Infinity time", lambda t: [*GEMM_ARGS, "--replay",
                                           str(landscape(t / "l.jsonl", set_time("Infinity")))], "line 4"),
    ("landscape negative time", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl", set_time("-3.5")))],
     "positive finite"),
    ("landscape zero time", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl", set_time("0")))],
     "positive finite"),
    ("landscape line not JSON", lambda t: [*GEMM_ARGS, "--replay", str(landscape(
        t / "l.jsonl", lambda ls: ls[:2] + ["{not json"] + ls[2:]))], "line 3 is malformed"),
    ("landscape config key missing", lambda t: [*GEMM_ARGS, "--replay", str(landscape(
        t / "l.jsonl", lambda ls: ls[:2] + [ls[2].replace('"num_stages"', '"stages"')] + ls[3:]))], "line 3"),
    ("landscape of only off-grid configs", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl", off_grid))],
     "holds no config of the search space"),
    ("landscape of another device", lambda t: [*GEMM_ARGS, "--replay", str(landscape(
        t / "l.jsonl", gpu="H100", device="NVIDIA H100 80GB HBM3"))], "recorded on 'NVIDIA H100"),
    ("landscape of another kernel", lambda t: ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                                               "--replay", str(landscape(t / "l.jsonl"))], "holds kernel 'fp8_gemm'"),
    ("landscape empty", lambda t: [*GEMM_ARGS, "--replay", str((t / "e.jsonl").write_text("") is None or t / "e.jsonl")],
     "landscape"),
    ("replay and record together", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--record",
                                              str(t / "r.jsonl")], "cannot be combined"),
    # -- output and storage ----------------------------------------------------------------
    ("--out is a file", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out",
                                   str((t / "f").write_text("x") and t / "f")], "is a file"),
    ("--out holds another program's manifest.json", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out",
        str(results_with(t / "o", {}, manifest='{"name": "my-app"}'))], "not ours"),
    ("--storage is another program's SQLite file", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", f"sqlite:///{sqlite_of_another_program(t / 'app.db')}"], "another program's database"),
    ("--storage is not a database", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", f"sqlite:///{(t / 'notes.txt').write_text('hello there, not sqlite at all') and t / 'notes.txt'}"],
     "not a SQLite database"),
    ("--storage journal is another program's file", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", f"journal:///{(t / 'notes.txt').write_text('dear diary') and t / 'notes.txt'}"],
     "not a journal of Optuna operations"),
    ("--out holds a studies.journal of another program", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out",
        str((t / "o").mkdir() or (t / "o" / "studies.journal").write_text("{\"name\": \"x\"}\n") and t / "o")],
     "not a journal of Optuna operations"),
    ("--storage not a URL", lambda t: [*GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
                                       "--storage", "studies.db"], "is not a storage URL"),
    ("--storage of an unreachable server", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", "postgresql://nobody@127.0.0.1:1/none"], "cannot open storage"),
    ("--baseline with a broken table", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"), "--baseline",
        str((t / "b").mkdir() or (t / "b" / GEMM).write_text("{broken") and t / "b")], "not readable JSON"),
    ("--baseline with an entry lacking keys", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"), "--baseline",
        str((t / "b").mkdir() or (t / "b" / GEMM).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}})) and t / "b")],
     "unusable entry"),
    ("--baseline not a folder", lambda t: [*GEMM_ARGS, "--baseline", str(t / "nowhere")], "is not a folder"),
    ("worker with a bad storage URL", lambda t: ["worker", "--storage", "nonsense"], "not a storage URL"),
    ("collect with another program's database", lambda t: [
        "collect", "--storage", f"sqlite:///{sqlite_of_another_program(t / 'app.db')}", "--out", str(t / "o")],
     "another program's database"),
    # -- install ------------------------------------------------------------------------------
    ("manifest path climbing out with ../", lambda t: [
        "install", str(results_with(t / "r", {"vllm/fp8_gemm/../../../../escape.json": {"1": CFG}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "not a plain"),
    ("manifest absolute path", lambda t: [
        "install", str(results_with(t / "r", {}, manifest={"format": "tuner-manifest/1", "tables": [
            {"kernel": "fp8_gemm", "problem": {}, "files": {"vllm": "/etc/passwd"}}]})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "not a plain"),
    ("manifest of the wrong shape", lambda t: [
        "install", str(results_with(t / "r", {}, manifest={"format": "tuner-manifest/1", "tables": {"a": 1}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site"))], "'tables' is not a list"),
    ("manifest not JSON", lambda t: [
        "install", str(results_with(t / "r", {}, manifest="{truncated")), "--engine", "vllm",
        "--site-packages", str(site(t / "site"))], "not valid JSON"),
    ("truncated table", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": '{"1": {"BLOCK_SIZE_M": 16, "BLOC'})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "is not valid JSON"),
    ("table with a key the engine does not take", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fused_moe/{MOE}": {"1": {**CFG, "SWAP_AB": True}}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "does not take (SWAP_AB)"),
    ("table with a non-integer batch size", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"one": CFG}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "is not a batch size"),
    ("GEMM table with triton_version", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"triton_version": "3.6.0", "1": CFG}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "'triton_version'"),
    ("table with a tile that is no power of two", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"1": {**CFG, "BLOCK_SIZE_N": 48}}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "not a power of two"),
    ("table with a string value", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"1": {**CFG, "num_warps": "4"}}})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "positive integer"),
    ("table file missing", lambda t: [
        "install", str(results_with(t / "r", {}, manifest={"format": "tuner-manifest/1", "tables": [
            {"kernel": "fp8_gemm", "problem": {}, "files": {"vllm": f"vllm/fp8_gemm/{GEMM}"}}]})),
        "--engine", "vllm", "--site-packages", str(site(t / "site")), "--force"], "is missing"),
    ("results folder missing", lambda t: ["install", str(t / "none"), "--engine", "vllm",
                                          "--site-packages", str(site(t / "site"))], "not found"),
    ("site-packages without the engine", lambda t: [
        "install", str(results_with(t / "r", {f"vllm/fp8_gemm/{GEMM}": {"1": CFG}})), "--engine", "vllm",
        "--site-packages", str(t)], "no vllm package"),
    ("restore with no backups", lambda t: ["install", "--restore", "--engine", "vllm"], "no vllm install to restore"),
    ("restore with a corrupt record", lambda t: ["install", "--restore", "--engine", "vllm"], "is corrupt"),
    ("restore of a forged record", lambda t: ["install", "--restore", "--engine", "vllm"], "refusing to touch it"),
    ("restore with a missing backup file", lambda t: ["install", "--restore", "--engine", "vllm"], "is missing"),
    # -- drift, report, diff ------------------------------------------------------------------
    ("drift table lacking keys", lambda t: [
        "drift", str((t / GEMM).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}})) and t / GEMM), "--gpu", "H200",
        "--replay", str(landscape(t / "l.jsonl")), "--kernel-source", "ours"], "is not a config"),
    ("drift table with non-integer keys", lambda t: [
        "drift", str((t / GEMM).write_text(json.dumps({"small": CFG})) and t / GEMM), "--gpu", "H200",
        "--replay", str(landscape(t / "l.jsonl"))], "is not one"),
    ("drift noise negative", lambda t: ["drift", str(t), "--gpu", "H200", "--noise", "-5"], "--noise"),
    ("drift noise NaN", lambda t: ["drift", str(t), "--gpu", "H200", "--noise", "nan"], "--noise"),
    ("drift over nothing", lambda t: ["drift", str(t), "--gpu", "H200"], "no config tables"),
    ("drift MoE table without a model", lambda t: [
        "drift", str((t / MOE).write_text(json.dumps({"1": CFG})) and t / MOE), "--gpu", "H200"], "give --model"),
    ("report without a manifest", lambda t: ["report", str(t)], "holds no manifest.json"),
    ("landscape synth --out a folder", lambda t: [
        "landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
        "--batch-sizes", "1", "--out", str(t)], "is a folder: give the path of a file"),
    ("report of a folder that does not exist", lambda t: ["report", str(t / "no-such-run")], "no-such-run does not exist"),
    ("report of a manifest of the wrong shape", lambda t: [
        "report", str(results_with(t / "r", {}, manifest={"format": "tuner-manifest/1", "tables": [7]}))],
     "table 1 is not an object"),
    ("diff noise of 2", lambda t: ["diff", str(t), str(t), "--noise", "2"], "--noise"),
    # -- nightly -----------------------------------------------------------------------------
    ("nightly job name climbing out", lambda t: [
        "nightly", str((t / "n.yaml").write_text(
            "jobs:\n- {name: ../../etc, kernel: gemm, model: deepseek-v3, gpu: H200}\n") and t / "n.yaml")],
     "job name"),
    ("nightly config not YAML", lambda t: ["nightly", str((t / "n.yaml").write_text("jobs: [") and t / "n.yaml")],
     "not valid YAML"),
    ("nightly without jobs", lambda t: ["nightly", str((t / "n.yaml").write_text("runs_dir: x\n") and t / "n.yaml")],
     "non-empty 'jobs' list"),
    # -- bench, check, landscape, proof ------------------------------------------------------
    ("bench --out is a file", lambda t: ["bench", "--model", "deepseek-v3", "--gpu", "H200", "--kernel", "gemm",
                                         "--out", str((t / "f").write_text("x") and t / "f")], "is a file"),
    ("bench --tuned without a manifest", lambda t: [
        "bench", "--model", "deepseek-v3", "--gpu", "H200", "--kernel", "gemm", "--replay", str(landscape(t / "l.jsonl")),
        "--tuned", str(t), "--out", str(t / "b")], "holds no manifest.json"),
    ("check a missing table", lambda t: ["check", "--model", "deepseek-v3", "--kernel", "gemm", "--table",
                                         str(t / "none.json")], "not found"),
    # named as the other kernel's table: its rows were run as this kernel's configs and passed (found by a new-user pass)
    ("check a MoE table as a GEMM's", lambda t: [
        "check", "--model", str(REPO / "configs/examples/small-moe.json"), "--kernel", "gemm", "--kernel-source", "ours",
        "--device", "cpu", "--table", str(REPO / "tuned/NVIDIA_H200/vllm/fused_moe" / MOE)],
     "is named as vllm's fused_moe table, not a fp8_gemm one: give --kernel moe"),
    ("check a GEMM table as a MoE's", lambda t: [
        "check", "--model", str(REPO / "configs/examples/small-moe.json"), "--kernel", "moe", "--kernel-source", "ours",
        "--device", "cpu", "--table", str((t / GEMM).write_text(json.dumps({"1": CFG})) and t / GEMM)],
     "is named as vllm's fp8_gemm table, not a fused_moe one: give --kernel gemm"),
    ("check a table that is not JSON", lambda t: [
        "check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "ours",
        "--table", str((t / "x.json").write_text("[1, 2") and t / "x.json")], "not valid JSON"),
    ("landscape info of a text file", lambda t: ["landscape", "info", str((t / "x.txt").write_text("hi") and t / "x.txt")],
     "cannot read the header"),
    ("synthetic landscape over an existing file", lambda t: [
        "landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H200",
        "--out", str((t / "l.jsonl").write_text("mine") and t / "l.jsonl")], "exists"),
    ("proof with no time", lambda t: ["proof", "--device", "cpu", "--minutes", "0", "--out", str(t / "p")],
     "--minutes"),
    ("ceilings --out is a folder", lambda t: ["ceilings", "--gpu", "H200", "--out", str(t)], "is a folder"),
    # -- round three: hostile files, paths and state ------------------------------------------
    ("landscape info of one huge gzipped line", lambda t: ["landscape", "info", str(huge_gzip_line(t / "l.jsonl.gz"))],
     "is longer than"),
    ("model YAML with nested aliases", lambda t: ["gemm", "--model", str(laughs(t / "m.yaml")), "--gpu", "H200"],
     "billion laughs"),
    ("nightly --night climbing out", lambda t: ["nightly", str(nightly_config(t)), "--night", "../../elsewhere"],
     "plain folder name"),
    ("nightly state truncated", lambda t: ["nightly", str(nightly_config(t, '{"a": {"run": "ru'))], "nightly state"),
    ("nightly state of the wrong type", lambda t: ["nightly", str(nightly_config(t, "[1, 2]"))],
     "not a JSON object of jobs"),
    ("nightly state with wrong field types", lambda t: [
        "nightly", str(nightly_config(t, '{"a": {"run": 3, "environment": {}}}'))], "must hold"),
    ("report of a manifest whose kernel_source is not an object", lambda t: ["report", str(results_with(
        t / "r", {}, manifest={"format": "tuner-manifest/1", "tables": [
            {"kernel": "fp8_gemm", "kernel_source": "vllm", "problem": {}, "files": {"vllm": "x.json"}}]}))],
     "'kernel_source' is not an object"),
    ("model with 10^12 experts", lambda t: [
        "landscape", "synth", "--kernel", "moe", "--model", str(model_file(t / "m.json", n_routed_experts=10 ** 12)),
        "--gpu", "H200", "--batch-sizes", "1", "--out", str(t / "l.jsonl")], "beyond any model"),
    ("model with hidden size 2^63", lambda t: [
        "landscape", "synth", "--kernel", "gemm", "--model", str(model_file(t / "m.json", hidden_size=2 ** 63)),
        "--gpu", "H200", "--batch-sizes", "1", "--out", str(t / "l.jsonl")], "beyond any model"),
    ("model with 1x1 weight blocks", lambda t: [
        "moe", "--model", str(model_file(t / "m.json", quantization_config={"weight_block_size": [1, 1]})),
        "--gpu", "H200", "--kernel-source", "ours", "--dry-run"], "weight_block_size"),
    ("check a table with an absurd M", lambda t: [
        "check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "ours", "--table",
        str((t / "x.json").write_text(json.dumps({"99999999999999": CFG})) and t / "x.json")], "is not a batch size"),
    ("check a table with string values", lambda t: [
        "check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "ours", "--table",
        str((t / "x.json").write_text(json.dumps({"1": {**CFG, "BLOCK_SIZE_M": "16"}})) and t / "x.json")],
     "not a launch-config value"),
    ("--baseline table of the wrong type", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"), "--baseline",
        str((t / "b").mkdir() or (t / "b" / GEMM).write_text("[1, 2, 3]") and t / "b")],
     "not a JSON object of batch sizes"),
    ("collect on a storage in a missing folder", lambda t: [
        "collect", "--storage", f"sqlite:///{t / 'none' / 'studies.db'}", "--out", str(t / "o")], "not found"),
    ("engine-source extract from a wheel lacking a file", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--from", str(vllm_wheel(t, b"x = 1\n")), "--out",
        str(t / "ex")], "has no vllm/model_executor/layers/fused_moe/moe_align_block_size.py"),
    ("engine-source extract of a kernel file that is not Python", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--from", str(vllm_wheel(t, b"\x00\x01 binary")), "--out",
        str(t / "ex")], "is not Python source"),
    ("engine-source extract of a zip bomb", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--from", str(vllm_wheel(t, b"#" * (9 << 20))), "--out",
        str(t / "ex")], "zip bomb"),
    ("engine-source extract from a FIFO", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--from", str(os.mkfifo(t / "v.whl") or t / "v.whl"), "--out",
        str(t / "ex")], "is neither a wheel nor a folder"),
    ("engine-source extract into a folder of other files", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--out", str((t / "mine").mkdir() or (
            t / "mine" / "notes.txt").write_text("mine") and t / "mine")], "holds other files"),
    ("engine folder whose kernel file links outside", lambda t: [
        "engine-source", "extract", "--engine", "vllm", "--from", str(linked_engine_folder(t)), "--out",
        str(t / "ex")], "a link leading out of the folder"),
    ("proof into a folder whose steps.json is not a proof's", lambda t: [
        "proof", "--device", "cpu", "--out", str((t / "p").mkdir() or (t / "p" / "steps.json").write_text(
            '{"steps": [{"name": "smoke", "status": 3}]}') and t / "p"), "--steps", "environment"],
     "not a proof's record"),
    # -- round four (issue 33): internal errors, refusals that wrote, inputs read wrong ------------
    ("--seed 2^64 with the random sampler", lambda t: [
        *GEMM_ARGS, "--sampler", "random", "--seed", str(2 ** 64), "--replay", str(landscape(t / "l.jsonl")),
        "--out", str(t / "o")], "--seed"),
    ("--seed negative", lambda t: [*GEMM_ARGS, "--seed", "-1", "--replay", str(landscape(t / "l.jsonl")),
                                   "--out", str(t / "o")], "--seed"),
    ("check --seed 2^64", lambda t: [
        "check", "--model", "deepseek-v3", "--kernel", "gemm", "--kernel-source", "ours", "--seed", str(2 ** 64),
        "--table", str((t / "x.json").write_text(json.dumps({"1": CFG})) and t / "x.json")], "--seed"),
    ("audit --seed 2^70", lambda t: ["audit", "--engine", "vllm", "--engine-version", "0.33.0", "--model",
                                     "deepseek-v3", "--gpu", "H200", "--seed", str(2 ** 70)], "--seed"),
    ("traffic JSON nested 3000 deep", lambda t: [*GEMM_ARGS, "--dry-run", "--traffic",
                                                 str(deep_json(t / "t.json", 3000))], "nested too deeply"),
    ("traffic gauge +Inf", lambda t: [*GEMM_ARGS, "--dry-run", "--traffic", str(sglang_dump(t / "m.txt", "+Inf"))],
     "not a finite count"),
    ("traffic histogram count +Inf", lambda t: [*GEMM_ARGS, "--dry-run", "--traffic",
                                                str(vllm_dump(t / "m.txt", ("10.0", "+Inf")))], "not a finite count"),
    ("traffic CSV weights adding up past a float", lambda t: [
        *GEMM_ARGS, "--dry-run", "--traffic", str(traffic_file(t / "t.csv", "M,weight\n16,1e308\n64,1e308\n"))],
     "add up beyond"),
    ("traffic JSON weights adding up past a float", lambda t: [
        *GEMM_ARGS, "--dry-run", "--traffic", str(traffic_file(t / "t.json", '{"16": 1.5e308, "16 ": 1.5e308}'))],
     "add up beyond"),
    ("traffic histograms adding up past a float", lambda t: [
        *GEMM_ARGS, "--dry-run", "--traffic", str(vllm_dump(t / "m.txt", ("1e308", "1.5e308"), engines=2))],
     "add up beyond"),
    ("--replay lacking the traffic's M", lambda t: [
        *GEMM_ARGS[:-4], "--kernel-source", "ours", "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--traffic", str(traffic_file(t / "t.csv", "M,weight\n300,1\n"))], "lacks M=300"),
    ("--storage a WAL database of another program", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", f"sqlite:///{wal_database_of_another_program(t / 'app.db')}"], "another program's database"),
    ("--storage a WAL header and no database", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--out", str(t / "o"),
        "--storage", f"sqlite:///{wal_header_without_a_database(t / 'x.db')}"], "not a SQLite database"),
    ("--dry-run with --storage another program's database", lambda t: [
        *GEMM_ARGS, "--dry-run", "--storage", f"sqlite:///{wal_database_of_another_program(t / 'app.db')}"],
     "another program's database"),
    ("--dry-run with --storage a driver not installed", lambda t: [
        *GEMM_ARGS, "--dry-run", "--storage", "postgresql+nosuchdriver://u:S3cret@localhost/db"],
     "cannot open storage postgresql+nosuchdriver://u:***@localhost/db"),
    ("--dry-run with --storage a SQLite driver not installed", lambda t: [
        *GEMM_ARGS, "--dry-run", "--storage", f"sqlite+nosuchdriver:///{t / 'x.db'}"], "cannot open storage"),
    ("collect on a WAL database of another program", lambda t: [
        "collect", "--storage", f"sqlite:///{wal_database_of_another_program(t / 'app.db')}", "--out",
        str(t / "c")], "another program's database"),
    ("--out holding another GPU's plan", lambda t: [
        *GEMM_ARGS, "--replay", str(landscape(t / "l.jsonl")), "--trials", "4", "--out", str(run_of_another_gpu(t))],
     "holds tables for H100"),          # its manifest's, before its storage's plan (test_study_identity)
    ("--out holding another GPU's plan, recording", lambda t: [
        *GEMM_ARGS, "--device", "cpu", "--record", str(t / "rec.jsonl"), "--trials", "4", "--out",
        str(run_of_another_gpu(t))], "holds tables for H100"),
    ("proof --bundle where no folder can be", lambda t: [
        "proof", "--device", "cpu", "--gpu", "H200", "--out", str(t / "p"), "--bundle",
        str((t / "f").write_text("x") and t / "f" / "b"), "--steps", "environment"], "--bundle"),
    ("nightly job with a bad traffic profile", lambda t: [
        "nightly", str(nightly_job(t, traffic=str(traffic_file(t / "t.csv", "M,weight\n0,1\n"))))], "job 'a'"),
    ("nightly job with a missing traffic profile", lambda t: [
        "nightly", str(nightly_job(t, traffic=str(t / "none.csv")))], "not found"),
    ("nightly job on an unknown GPU", lambda t: ["nightly", str(nightly_job(t, gpu="B300"))], "unknown GPU"),
    ("nightly job of an unknown model", lambda t: ["nightly", str(nightly_job(t, model="no-such-model"))],
     "unknown model"),
    ("nightly job with a negative trial count", lambda t: ["nightly", str(nightly_job(t, trials=-3))], "--trials"),
    ("nightly while another night holds its runs_dir", lambda t: ["nightly", str(night_running(t))],
     "another tuner nightly is running"),
    ("nightly job with a misspelt option", lambda t: ["nightly", str(nightly_job(t, trails=8))],
     "job 'a': unknown key 'trails'"),
    ("nightly job with a dtype its kernel lacks", lambda t: ["nightly", str(nightly_job(t, dtype="bf16"))],
     "--dtype bf16 is not supported by `tuner gemm`"),
    ("nightly job with a sampler that is a mapping", lambda t: ["nightly", str(nightly_job(t, sampler={"x": 1}))],
     "--sampler {'x': 1} is not one of"),
    ("worker on a stored plan of another kind", lambda t: [
        "worker", "--storage", stored_plan(t, {"format": "tuner-plan/1", "kernel": "conv2d"}),
        "--replay", str(landscape(t / "l.jsonl"))], "the stored plan tuner-plan:fp8_gemm: unknown kernel 'conv2d'"),
    ("worker on a stored plan with fields missing", lambda t: [
        "worker", "--storage", stored_plan(t, {"format": "tuner-plan/1", "kernel": "fp8_gemm"}),
        "--replay", str(landscape(t / "l.jsonl"))], "is not one this tuner can read (KeyError: 'space')"),
    ("collect of a stored plan of garbage", lambda t: [
        "collect", "--storage", stored_plan(t, {"format": "tuner-plan/1", "kernel_ref": {"name": "fp8_gemm", "x": 1},
                                                "space": 5}), "--out", str(t / "out")], "is not one this tuner can read"),
    ("drift table named with a zero shape", lambda t: [
        "drift", str(table_file(t / "E=0,N=0,device_name=NVIDIA_H200.json")), "--gpu", "H200",
        "--model", "deepseek-v3", "--replay", str(landscape(t / "l.jsonl"))], "must be from 1 to 1048576"),
    ("drift table named with a huge shape", lambda t: [
        "drift", str(table_file(t / "N=7168,K=99999999999,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")),
        "--gpu", "H200", "--replay", str(landscape(t / "l.jsonl"))], "must be from 1 to 1048576"),
    ("audit --moe-config-dir missing", lambda t: [
        "audit", "--engine", "vllm", "--engine-version", "0.33.0", "--model", "deepseek-v3", "--gpu", "H200",
        "--moe-config-dir", str(t / "nowhere")], "not found"),
    ("audit --moe-config-dir a file", lambda t: [
        "audit", "--engine", "vllm", "--engine-version", "0.33.0", "--model", "deepseek-v3", "--gpu", "H200",
        "--moe-config-dir", str((t / "f.json").write_text("{}") and t / "f.json")], "is not a folder"),
]

# cases whose world needs more than their argv
PREPARE = {
    "restore with a corrupt record": lambda t: backups_with_record(t, "{oops"),
    "restore of a forged record": lambda t: backups_with_record(t, {
        "engine": "vllm", "files": [{"dest": str(t / "victim.json"), "backup": None}]}),
    "restore with a missing backup file": lambda t: backups_with_record(t, {
        "engine": "vllm", "roots": [str(t / "site" / "vllm/model_executor/layers/fused_moe/configs")],
        "files": [{"dest": str(t / "site" / "vllm/model_executor/layers/fused_moe/configs" / MOE),
                   "backup": str(t / "backups" / "vllm-20260101T000000-1" / "files" / "0000-x.json"),
                   "root": str(t / "site" / "vllm/model_executor/layers/fused_moe/configs")}]}),
}


def test_there_are_enough_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize("name,build,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, build, needle, tmp_path, capsys, monkeypatch):
    from tuner.emit import install
    monkeypatch.chdir(tmp_path)                       # default --out folders land here, if any
    monkeypatch.setattr(install, "BACKUP_ROOT", tmp_path / "backups")
    (tmp_path / "victim.json").write_text('{"keep": true}')
    if name in PREPARE:
        PREPARE[name](tmp_path)
    argv = build(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()                               # what building the case's world printed
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "S3cret" not in err                        # a database password is never printed
    assert err.startswith("tuner: error: ") and needle in err, err
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before, "a refused command changed files"


def test_read_only_out_is_refused(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("runs as root, for whom folder permissions do not apply")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    rc = main([*GEMM_ARGS, "--replay", str(landscape(tmp_path / "l.jsonl")), "--out", str(out / "run")])
    err = capsys.readouterr().err
    out.chmod(0o755)
    assert rc == 2 and len(err.splitlines()) == 1 and "cannot write" in err


def test_broken_pipe_is_quiet(tmp_path):
    """`tuner ... | head`: the reader goes away; no traceback, no 'internal error'."""
    import subprocess
    import sys
    land = landscape(tmp_path / "l.jsonl")
    cmd = f"{sys.executable} -m tuner landscape info {land} | head -1"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.stdout.startswith("landscape ") and "Traceback" not in r.stderr and "internal error" not in r.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_proof_paths_are_the_users_not_the_checkouts(tmp_path, monkeypatch):
    """The proof's steps run from the repository root: a relative --out, --bundle or
    --engine-source is taken from where the user stands, never from the checkout."""
    from tuner.jobs import proof
    seen = {}
    monkeypatch.setattr(proof.Proof, "execute", lambda self, steps, log=print: seen.update(p=self) or 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    assert main(["proof", "--device", "cpu", "--gpu", "H200", "--out", "rel/p", "--bundle", "b",
                 "--engine-source", "src", "--steps", "environment"]) == 0
    p = seen["p"]
    assert p.out == tmp_path / "rel" / "p" and p.bundle == tmp_path / "b"
    assert p.engine_source == [str(tmp_path / "src")]


def test_writes_never_go_through_a_planted_link(tmp_path):
    """The one guarded writer every command writes through (plots of report and bench, tables,
    the night's files): a link planted at the file is replaced, never followed; a link planted
    as a folder on the way, or a '..' climbing out of the root, is refused in one line."""
    from tuner.errors import TunerError
    from tuner.paths import atomic_write_text, open_for_append
    victim, root = tmp_path / "victim.json", tmp_path / "out"
    victim.write_text('{"keep": true}')
    (root / "plots").mkdir(parents=True)
    (root / "plots" / "m.png").symlink_to(victim)
    atomic_write_text(root / "plots" / "m.png", "a plot", root=root)
    assert victim.read_text() == '{"keep": true}' and (root / "plots" / "m.png").read_text() == "a plot"
    assert not (root / "plots" / "m.png").is_symlink()
    (tmp_path / "elsewhere").mkdir()
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    for path, needle in ((root / "linked" / "x.json", "is a symbolic link"),
                         (root / ".." / "escape.json", "is outside")):
        with pytest.raises(TunerError, match=needle):
            atomic_write_text(path, "x", root=root)
    (root / "log.txt").symlink_to(victim)
    with pytest.raises(TunerError, match="symbolic link"):
        open_for_append(root / "log.txt", root)
    assert victim.read_text() == '{"keep": true}' and list((tmp_path / "elsewhere").iterdir()) == []
    assert not (tmp_path / "escape.json").exists()


def _wheels() -> Path:
    folder = os.environ.get("TUNER_ENGINE_WHEELS")
    if not folder or not list(Path(folder).glob("vllm-*.whl")):
        pytest.skip("needs the engines' wheels ($TUNER_ENGINE_WHEELS; .ci/run downloads them)")
    return Path(folder)


@pytest.mark.ci_variables
def test_the_known_engine_files_are_the_released_ones():
    """The recorded hashes of the engine files whose code tuner imports are those of the
    released wheels (facts, recomputed here from every wheel in the folder)."""
    import importlib.util
    wheels = _wheels()
    spec = importlib.util.spec_from_file_location(
        "engine_release_files", Path(__file__).resolve().parents[1] / "scripts" / "engine_release_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from tuner.plan.kernel_sources import known_release_files
    recorded, computed = known_release_files(), module.release_files(wheels)
    assert computed and all(recorded[e][v] == files for e, vs in computed.items() for v, files in vs.items())


@pytest.mark.ci_variables
def test_a_tampered_engine_source_is_refused_unless_trusted(tmp_path, capsys):
    """An extracted engine folder whose kernel file was changed (one line added) is refused in
    one line before any of its code runs; --trust-engine-source runs it and the plan says
    which file, from where, with its hash; an untouched one is named as released."""
    from tuner.plan.kernel_registry import launcher
    from tuner.plan.kernel_sources import TRUST_ENV, extract
    folder = extract("vllm", str(next(_wheels().glob("vllm-0.33.0-*.whl"))), tmp_path / "ex", launcher("vllm").FILES)
    plan = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--batch-sizes", "1", "--dry-run",
            "--engines", "vllm", "--engine-source", str(folder), "--out", str(tmp_path / "o")]
    assert main(plan) == 0
    out = capsys.readouterr().out
    assert "imports code from vllm/model_executor/layers/fused_moe/fused_moe.py (sha256" in out
    assert "as released in 0.33.0" in out and str(folder) in out
    kernel_file = folder / "vllm/model_executor/layers/fused_moe/fused_moe.py"
    kernel_file.write_text(kernel_file.read_text() + "import os  # planted\n")
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"1": CFG}))
    before = snapshot(tmp_path)
    rc = main(["check", "--model", "configs/examples/small-moe.json", "--kernel", "moe", "--kernel-source", "vllm",
               "--table", str(table), "--engine-source", str(folder)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "matches no release tuner knows" in err, err
    assert "--trust-engine-source" in err and snapshot(tmp_path) == before
    assert main([*plan, "--trust-engine-source"]) == 0
    assert "matching no known release: imported because of --trust-engine-source" in capsys.readouterr().out
    assert TRUST_ENV not in os.environ                     # the trust ends with the command


def test_a_storage_urls_password_is_never_shown():
    from tuner.search.storage_urls import shown
    assert shown("postgresql://alice:S3c:r@t@db.example.com:5432/tuner") == "postgresql://alice:***@db.example.com:5432/tuner"
    assert shown("postgresql+psycopg2://alice:pw@db/tuner") == "postgresql+psycopg2://alice:***@db/tuner"
    for url in ("postgresql://alice@db/tuner", "postgresql://db:5432/tuner", "journal:///runs/a:b@c/studies.journal",
                "sqlite:///x:y@z.db"):
        assert shown(url) == url
