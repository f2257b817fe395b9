"""A study's identity: what its timings are of, so that stored results are resumed (a run
started again resumes it, `tuner worker` joins it) only by a run that would time the same
thing. The one place identities are built (a study's, a plan's), compared, and read back from
what an older tuner stored.

The keys: the device; whose kernel code (source and version, a hash of the code); the search
space; the Triton that compiled it; where the times came from (`times`): the GPU, the CPU
device, a SYNTHETIC cost model, or a recorded landscape named by the hash of its content; and
the measurement policy (tuner/measure/policy.py: CUDA graphs or eager, L2 cold or warm,
routing, clocks). A study timed on a synthetic landscape is never resumed by a run on a GPU or
on a recorded landscape, nor one timed on one landscape by a replay of another, nor one timed
under another policy. A key one side does not name (an older study, a landscape that does not
say) is no difference. Plans stored for workers carry the part known before anything is
measured.
"""

from __future__ import annotations

from tuner.measure.provenance import TIMES_CPU_DEVICE as CPU_DEVICE
from tuner.measure.provenance import TIMES_GPU as GPU
from tuner.measure.provenance import TIMES_SYNTHETIC as SYNTHETIC
from tuner.measure.provenance import landscape_times, measured_times, times_of

__all__ = ["CPU_DEVICE", "GPU", "SYNTHETIC", "landscape_times", "measured_times", "times_of"]

POLICY_KEYS = ("timing", "l2", "routing", "clocks")


def policy_fields(policy: dict | None) -> dict:
    """The measurement policy's keys as an identity names them (None where not recorded)."""
    policy = policy or {}
    return {k: policy.get(k) for k in POLICY_KEYS}


def study_identity(kernel, space, measurer, policy: dict | None = None) -> dict:
    """What a study's timings are of. A replay takes the device, code, Triton and policy from
    the landscape (None where an old one does not say); `policy` is the run's, for a measurer
    whose environment does not carry one."""
    env = measurer.environment() or {}
    return {"device": env.get("device"), "kernel": kernel.source_label,
            "code_version": env["code_version"] if "code_version" in env else (kernel.code_version or None),
            "space": space.version, "triton": env.get("triton"), "times": times_of(measurer),
            **policy_fields(env.get("policy") if env.get("policy") is not None else policy)}


def plan_identity(device: str, kernel, space, times: str | None, policy: dict | None = None) -> dict:
    """What a plan's studies will be timed on, as far as it is known before measuring (each
    study adds the Triton and, for a replay, the landscape's code)."""
    return {"device": device, "kernel": kernel.source_label, "code_version": kernel.code_version or None,
            "space": space.version, "times": times, **policy_fields(policy)}


def stored_identity(user_attrs: dict) -> dict | None:
    """A stored study's identity, None for one stored before identities with no environment
    (taken as it is). One stored before `times` was recorded gets it from the environment it
    stored where that says SYNTHETIC or the CPU device (never to be resumed by anything else);
    one stored before identities, its device too."""
    from tuner.measure.provenance import is_cpu_device
    stored = user_attrs.get("identity")
    env = user_attrs.get("environment") or {}
    legacy = {"times": SYNTHETIC} if env.get("synthetic") else {"times": CPU_DEVICE} if is_cpu_device(env) else {}
    if stored is None:
        known = {**({"device": env["device"]} if env.get("device") else {}), **legacy}
        return known or None
    return {**stored, **legacy} if not stored.get("times") else stored


def identity_differences(stored: dict, mine: dict) -> str:
    """'device A (now B), ...' over the keys both identities name that differ; '' when
    none do (a key one side does not know, e.g. an old landscape's code, is no difference)."""
    from tuner.plan.code_carry import same_code
    return ", ".join(f"{_name(k)} {stored[k]} (now {mine[k]})" for k in mine
                     if stored.get(k) and mine[k] and stored[k] != mine[k]
                     and not (k == "code_version" and same_code(stored[k], mine[k])))


def _name(key: str) -> str:
    return "source of times" if key == "times" else key
