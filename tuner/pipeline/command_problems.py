"""A kernel command's problems from its options (`tuner gemm|moe|mla`, bench, landscape,
audit): the TP that serves the model when --tp is not given, and model -> problems as tuning
builds them. `args`: the parsed options or a request with the same fields."""

from __future__ import annotations


def resolve_tp(args, model, gpu, say=print):
    """args.tp set to the deployment's (tuner/plan/deployment.py check_tp), its line said."""
    from tuner.plan.deployment import check_tp
    from tuner.plan.precision import checkpoint_dtype
    chosen = check_tp(model, gpu, args.tp, args.ep, checkpoint_dtype(model), getattr(args, "per_rank", False))
    args.tp = chosen.tp
    if chosen.line:
        say(chosen.line)
    return chosen


def problem_builder(args, command: str):
    """(kernel name, model -> problems) of a kernel command, as tuning builds them."""
    from tuner.plan.models import DEFAULT_CONTEXTS, gemm_problems, mla_problems, moe_problems
    if command == "gemm":
        return "fp8_gemm", lambda model: gemm_problems(model, args.tp, args.ep)
    if command == "moe":
        return "fused_moe", lambda model: moe_problems(model, args.tp, args.ep, args.dtype, args.routing, args.engines)
    return "mla_decode", lambda model: mla_problems(model, args.tp, args.contexts or DEFAULT_CONTEXTS,
                                                    args.page_size)[0]
