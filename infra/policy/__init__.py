"""CrossGuard guardrails for the gpuyard stack (``infra/policy/rules.py``)."""
