"""`tuner audit`: which table and row an engine version really uses for a deployment (or every
table it ships), and whether it is right (tuner/emit/audit.py does the audit)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.commands.options import batch, parallel_options, seed, triton_version
from tuner.errors import TunerError
from tuner.paths import CONFIGS_DIR
from tuner.pipeline.command_problems import resolve_tp
from tuner.plan.engine_releases import versions_text
from tuner.plan.engines import ENGINE_NAMES, GRID_TOP
from tuner.plan.gpus import gpu_keys_text
from tuner.plan.precision import MOE_DTYPES

# the small model --numerics runs rows on without a GPU: the repository's, wherever the user stands
NUMERICS_MODEL = CONFIGS_DIR / "examples" / "small-moe.json"


def add_parser(sub, common) -> None:
    """`tuner audit` and its options."""
    aud = sub.add_parser(
        "audit", help="which table and row an engine really uses, and whether it is right",
        description="For a deployment (--model, --gpu, --tp, --ep, --dtype): resolve every table the engine version's "
        "loader reads, say per batch size which entry runs and what the kernel gets after the engine's rewrites, and "
        "list findings (error / warning / info). --all: every table an installation or wheel ships. Exit 1 when an "
        "error finding is present, 0 otherwise, 2 for bad input.")
    aud.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    aud.add_argument("--all", action="store_true", help="audit every table the engine ships instead of a deployment")
    aud.add_argument("--model", default=None, help="name in configs/models/ or a Hugging Face config.json")
    aud.add_argument("--gpu", default=None, help=gpu_keys_text())
    parallel_options(aud)
    aud.add_argument("--dtype", default=None, choices=MOE_DTYPES,
                     help="default: the checkpoint's (its quantization_config: fp8_w8a8, int8_w8a8, int8_w8a16, "
                          "int4_w4a16; bf16 when it has none)")
    aud.add_argument("--disable-shared-experts-fusion", action="store_true",
                     help="SGLang's flag of that name: the shared expert is not folded into the fused MoE (E counts "
                          "the routed experts only)")
    aud.add_argument("--engine-version", default=None, metavar="V",
                     help="the engine's version (checked against the package's; alone: audit override folders only); "
                     f"the releases tuner knows: {versions_text()}")
    aud.add_argument("--triton", type=triton_version, default=None, metavar="V",
                     help="the Triton version the engine runs (default: the site-packages', else this Python's)")
    aud.add_argument("--site-packages", default=None, metavar="DIR", help="the environment that runs the engine")
    aud.add_argument("--engine-source", nargs="+", default=None, metavar="PATH",
                     help="the engine's wheel, or folders holding wheels (default: the installed engine, then "
                     "$TUNER_ENGINE_WHEELS)")
    aud.add_argument("--moe-config-dir", default=None, metavar="DIR",
                     help="the MoE override folder (default: $VLLM_TUNED_CONFIG_FOLDER / $SGLANG_MOE_CONFIG_DIR; "
                     "'' for none)")
    aud.add_argument("--max-batch", type=batch, default=GRID_TOP, help=f"audit M = 1 .. this (default {GRID_TOP})")
    aud.add_argument("--batch-sizes", type=batch, nargs="+", metavar="M", default=None,
                     help="audit these batch sizes only (instead of 1 .. --max-batch)")
    aud.add_argument("--numerics", action="store_true",
                     help="run every row in use on the engine's own kernel against the float64 reference")
    aud.add_argument("--numerics-model", default=None, metavar="MODEL",
                     help="without a GPU, the (small) model whose shapes the rows run on in Triton's interpreter "
                     "(default configs/examples/small-moe.json); on a GPU the deployment's own shapes")
    aud.add_argument("--seed", type=seed, default=None,
                     help="--numerics input seed, 0 to 2^32-1 (default: fresh random inputs)")
    aud.add_argument("--out", default=None, metavar="DIR", help="also write audit.json and audit.md there")
    aud.add_argument("--traffic", default=None, metavar="FILE",
                     help="a traffic profile (an engine's /metrics dump, or CSV/JSON of M,weight): weigh each table's "
                          "keys by the forward passes they serve")


def policy_lines(report, engine: str) -> list[str]:
    """How each table read was timed, where `tuner install` recorded it (the measurement
    policy: tuner/measure/policy.py); shipped tables say nothing of it."""
    from tuner.emit import partial
    from tuner.emit.audit_report import wrap
    from tuner.emit.install import BACKUP_ROOT
    from tuner.emit.merge_rule import installed_entry, installed_times
    from tuner.emit.table_origin import results_folder
    from tuner.measure.policy import policy_text
    lines = []
    for ka in getattr(report, "kernels", []):
        if not ka.resolved.found:
            continue
        found = installed_times(Path(ka.where), engine, BACKUP_ROOT)
        timed = found[1] if found else None
        run = None if timed else results_folder(Path(ka.where))
        if timed:
            mark = timed.get("not_a_gpu")
            said = (f"{mark} times, never measured on a GPU (for {timed.get('device')}; installed by tuner)" if mark
                    else f"{policy_text({k: v for k, v in timed.items() if k != 'device'})} on {timed.get('device')} "
                         "(installed by tuner)")
        elif run is not None:            # the folder audited is a tuner run's own, not an engine's
            from tuner.emit.run_table import run_source
            try:
                source = run_source(run)
            except TunerError as e:      # said here, after the report: never an error that contradicts its exit status
                source = f"its manifest cannot be read ({e})"
            said = f"a table of the tuner run {run}, not installed: {source}"
        else:
            said = "not recorded (a shipped table, or installed before tuner recorded it)"
        lines.append(f"measurement of {Path(ka.where).name}: {said}")
        entry = installed_entry(Path(ka.where), engine, BACKUP_ROOT)
        if entry is not None and (line := partial.audit_line(Path(ka.where).name, entry)):
            lines += wrap(line)
        elif run is not None and (line := partial.run_line(run, Path(ka.where))):
            lines += wrap(line)
    return lines


def run(args) -> int:
    from tuner.emit.audit import audit_deployment, traffic_audit
    from tuner.emit.audit_all import audit_all
    from tuner.emit.audit_numerics import run_numerics
    from tuner.emit.audit_report import terminal_lines, wrap, write_outputs
    from tuner.emit.audit_rules import Batches
    from tuner.emit.engine_tables import locate_installation
    from tuner.plan.engines import table_family

    if args.all:
        extra = [o for o, v in (("--model", args.model), ("--gpu", args.gpu), ("--numerics", args.numerics),
                                ("--dtype", args.dtype)) if v]
        if extra:
            raise TunerError(f"--all audits every table the engine ships; {', '.join(extra)} "
                             f"{'describes' if len(extra) == 1 else 'describe'} one deployment (drop --all, or drop "
                             f"{'it' if len(extra) == 1 else 'them'})")
    elif not args.model or not args.gpu:
        raise TunerError("give --model and --gpu (the deployment to audit), or --all (every table the engine ships)")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise TunerError(f"--out {out} is a file, not a folder")
    if out is not None:
        from tuner.emit.audit_report import check_out
        check_out(out)
    if args.numerics:
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports Triton's jit
    env_var = table_family(args.engine, "fused_moe").env_var or ""
    override = args.moe_config_dir if args.moe_config_dir is not None else os.environ.get(env_var)
    override_dir = Path(override) if override else None
    if args.moe_config_dir and override_dir is not None and not override_dir.is_dir():
        # named on the command line: a typo is said, not audited as an empty folder (the
        # variable's folder, from the engine's environment, is a note of the audit instead)
        raise TunerError(f"--moe-config-dir {override_dir} " + ("is not a folder" if override_dir.exists()
                                                                else "not found") + " ('' audits no override folder)")
    batches = Batches(args.max_batch, tuple(sorted(set(args.batch_sizes))) if args.batch_sizes else None)
    model = gpu = None
    if not args.all:
        from tuner.plan.gpus import get_gpu
        from tuner.plan.models import load_model
        gpu = get_gpu(args.gpu)
        model = load_model(args.model)
        resolve_tp(args, model, gpu)            # the deployment audited: --tp, or the one that serves the model
    profile = None
    if args.traffic:
        from tuner.plan.traffic import load_profile
        profile = load_profile(args.traffic, args.tp or 1)
    inst = locate_installation(args.engine, args.site_packages, args.engine_source, args.engine_version, args.triton)
    if model is None or gpu is None:
        report = audit_all(inst, batches, override_dir)
    else:
        from tuner.plan.models import load_model
        from tuner.plan.precision import resolve_dtype
        dtype = resolve_dtype(model, args.dtype, MOE_DTYPES, "audit")
        numerics_model = load_model(args.numerics_model or str(NUMERICS_MODEL)) if args.numerics else None
        report = audit_deployment(inst, model, gpu, args.tp, args.ep, dtype, batches, override_dir, dict(os.environ),
                                  fuse_shared=not args.disable_shared_experts_fusion)
        if args.numerics:
            seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
            run_numerics(report, inst, numerics_model, seed, log=lambda line: print(line, flush=True))
    if profile is not None:
        traffic_audit(report, profile)
    from tuner.emit.audit_provenance import not_measured_findings
    from tuner.emit.install import BACKUP_ROOT
    report.findings += not_measured_findings(getattr(report, "kernels", []), args.engine, BACKUP_ROOT)
    for line in terminal_lines(report):
        print(line)
    for line in policy_lines(report, args.engine):
        print(line)
    if out is not None:
        json_path, md_path = write_outputs(report, out)
        for line in wrap(f"written: {json_path} and {md_path}"):
            print(line)
    return report.exit_code
