"""What a study's timings are of (its identity), built in this one place.

A study's results are reused (a run started again resumes it, `tuner worker` joins it) only by a
run whose identity agrees on every key both name: the device, whose kernel code (source,
version, a hash of the code), the search space, the Triton that compiled it, and the
measurement policy (tuner/measure/policy.py: CUDA graphs or eager, L2 cold or warm, routing,
clocks). A key one side does not name (an older study, a landscape that does not say) is no
difference. Plans stored for workers carry the part known before anything is measured.
"""

from __future__ import annotations

from tuner.plan.kernel_api import KernelSpec

POLICY_KEYS = ("timing", "l2", "routing", "clocks")


def policy_fields(policy: dict | None) -> dict:
    """The measurement policy's keys as an identity names them (None where not recorded)."""
    policy = policy or {}
    return {k: policy.get(k) for k in POLICY_KEYS}


def study_identity(env: dict, kernel: KernelSpec, space_version: str, policy: dict | None = None) -> dict:
    """A study's identity from its measurer's environment: a replay takes the device, code,
    Triton and policy from the landscape (None where an old one does not say)."""
    return {"device": env.get("device"), "kernel": kernel.source_label,
            "code_version": env["code_version"] if "code_version" in env else (kernel.code_version or None),
            "space": space_version, "triton": env.get("triton"),
            **policy_fields(env.get("policy") if env.get("policy") is not None else policy)}


def plan_identity(device_name: str, kernel: KernelSpec, space_version: str, policy: dict | None = None) -> dict:
    """What a plan's studies will be timed on, as far as it is known before measuring."""
    return {"device": device_name, "kernel": kernel.source_label, "code_version": kernel.code_version or None,
            "space": space_version, **policy_fields(policy)}


def identity_differences(stored: dict, mine: dict) -> str:
    """'device A (now B), ...' over the keys both identities name that differ; '' when
    none do (a key one side does not know, e.g. an old landscape's code, is no difference)."""
    return ", ".join(f"{k} {stored[k]} (now {mine[k]})" for k in mine
                     if stored.get(k) and mine[k] and stored[k] != mine[k])
