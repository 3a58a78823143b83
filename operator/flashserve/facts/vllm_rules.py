"""Combinations vLLM 0.33 refuses when it builds the engine config, which the API refuses first.

Each fact here is what `create_engine_config` answers on a Blackwell platform; the contract tests
(tests/contract/test_engine_contract.py::test_backend_rules_are_vllms) run every all2all backend through the
real vLLM with DBO and with EPLB and fail when these lists and vLLM disagree. The CEL rules of the CRD are
generated from the same lists.
"""

from __future__ import annotations

# Dual-batch overlap needs an all2all backend that can split microbatches (vLLM: "Microbatching currently
# only supports ..."); vLLM's default, allgather_reducescatter, cannot.
DBO_ALL2ALL_BACKENDS: tuple[str, ...] = ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")

# Backends whose replicated expert layout EPLB cannot rearrange.
NO_EPLB_ALL2ALL_BACKENDS: tuple[str, ...] = ("moonep",)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


CEL_RULES: list[dict[str, str]] = [
    {
        "rule": "!self.dbo.enabled || (has(self.all2allBackend) && self.all2allBackend in "
        f"{_cel_list(DBO_ALL2ALL_BACKENDS)})",
        "message": "dual-microbatch overlap needs all2allBackend " + ", ".join(DBO_ALL2ALL_BACKENDS)
        + " (vLLM's default, allgather_reducescatter, cannot split microbatches)",
        "fieldPath": ".all2allBackend",
    },
    {
        "rule": f"!self.eplb.enabled || !has(self.all2allBackend) || !(self.all2allBackend in "
        f"{_cel_list(NO_EPLB_ALL2ALL_BACKENDS)})",
        "message": "EPLB does not work with the all2all backend " + ", ".join(NO_EPLB_ALL2ALL_BACKENDS)
        + ": choose another backend or set eplb.enabled: false",
        "fieldPath": ".eplb.enabled",
    },
]
