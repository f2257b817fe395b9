"""Each serving engine's rules as data, one module per engine (facts read from its source):
its table names, folders and loaders, the backend that reads its tables, its /metrics. Add an
engine here (CONTRIBUTING.md); tuner/plan/engines.py gathers them, and nothing else in tuner/
asks which engine it is."""

from tuner.plan.engine_rules import sglang, vllm

# In the order the engines are listed everywhere (plans, tables, help).
RULES = (vllm, sglang)
