"""The contract corpus: DeepSeekServings whose every engine pod the real vLLM must accept.

Topologies are written out (each accelerator, 1 to 4 nodes per replica, DBO on and off, speculative decoding on
and off, extraArgs); every value of every enum field of the engine and parallelism specs is then swept on a
base that admits it, from the API's own Literal types, so a value added to the API is checked without editing
this file.
"""

from __future__ import annotations

import copy
import typing
from pathlib import Path

import yaml
from flashserve.api import v1alpha1 as api
from flashserve.api.validation import SpecError, parse_spec

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"


def _cr(name: str, spec: dict) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def _wide(acc: str, nodes: int, **parallelism) -> dict:
    return {
        "placement": {"accelerator": acc},
        "parallelism": {"nodesPerReplica": nodes, "all2allBackend": "deepep_low_latency", **parallelism},
    }


TOPOLOGIES: dict[str, dict] = {
    "defaults": {},
    "gb300-1node": {"placement": {"accelerator": "GB300"}},
    "b200-1node": {"placement": {"accelerator": "B200"}},
    "b300-1node": {"placement": {"accelerator": "B300"}},
    "b200-tp2": {"placement": {"accelerator": "B200"}, "parallelism": {"tensorParallelSize": 2}},
    "b300-tp8": {"placement": {"accelerator": "B300"}, "parallelism": {"tensorParallelSize": 8, "expertParallel": False}},
    "gb200-2node-dbo": _wide("GB200", 2, dbo={"enabled": True}, eplb={"enabled": True}),
    "gb200-2node-dbo-high-throughput": _wide("GB200", 2, dbo={"enabled": True}, all2allBackend="deepep_high_throughput"),
    "gb200-2node-spec": _wide("GB200", 2),
    "gb300-4node-dbo": _wide("GB300", 4, dbo={"enabled": True}, eplb={"enabled": True, "numRedundantExperts": 32}),
    "gb300-3node-spec": _wide("GB300", 3, eplb={"enabled": True}),
    "b200-2node-dbo": _wide("B200", 2, dbo={"enabled": True}),
    "b300-4node-spec": _wide("B300", 4),
    "b300-2node-no-spec": {**_wide("B300", 2), "engine": {"speculative": {"enabled": False}}},
    "gb200-no-spec-no-ep": {"parallelism": {"expertParallel": False}, "engine": {"speculative": {"enabled": False}}},
    "spec-4-tokens": {"engine": {"speculative": {"enabled": True, "numSpeculativeTokens": 4}}},
    "async-on": {"engine": {"asyncScheduling": True}},
    "async-off": {"engine": {"asyncScheduling": False}},
    "async-off-dbo": {**_wide("GB200", 2, dbo={"enabled": True}), "engine": {"asyncScheduling": False}},
    "context-auto": {"engine": {"maxModelLen": "auto"}},
    "context-32k": {"engine": {"maxModelLen": "32k"}},
    "context-1M": {"engine": {"maxModelLen": "1M"}},
    "context-25.6k": {"engine": {"maxModelLen": "25.6k"}},
    "batching": {"engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 8192, "gpuMemoryUtilization": 0.85}},
    "no-prefix-cache": {"engine": {"prefixCaching": False}},
    "revision-and-names": {"model": {"revision": "0123456789abcdef0123456789abcdef01234567",
                                     "servedModelNames": ["flash", "deepseek-v4.1-flash"]}},
    "pvc-weights": {"model": {"source": {"pvc": {"claimName": "weights", "path": "deepseek/v4.1-flash"}}}},
    "gated-token": {"model": {"source": {"huggingFace": {"tokenSecretRef": {"name": "hf"}}}}},
    "ttft-and-sla": {"autoscaling": {"sla": {"perUserTokensPerSecond": 150, "ttftSeconds": 2}}},
    "extra-args": {"engine": {"extraArgs": ["--enable-log-requests", "--tool-call-parser", "deepseek_v41",
                                            "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_v41",
                                            "--seed", "7"]}},
    "routing-cache-aware": {"routing": {"policy": "cache_aware"}},  # the engines get --enable-scale-out
    "routing-cache-aware-2node": {**_wide("GB300", 2), "routing": {"policy": "cache_aware"}},
    "routing-off-cache-aware": {"routing": {"enabled": False, "policy": "cache_aware"}},
    "env-and-resources": {"engine": {"env": [{"name": "VLLM_LOG_STATS_INTERVAL", "value": "5"}],
                                     "resources": {"cpu": "64", "memory": "512Gi", "shmSize": "128Gi"}}},
}

# Enum fields swept one value at a time, on the base that admits every value.
_SWEEP_BASE = _wide("GB200", 2, eplb={"enabled": True})
_SWEPT = {
    ("engine", "kvCacheDtype"): api.EngineSpec.model_fields["kv_cache_dtype"],
    ("engine", "attentionBackend"): api.EngineSpec.model_fields["attention_backend"],
    ("engine", "cudaGraphMode"): api.EngineSpec.model_fields["cuda_graph_mode"],
    ("parallelism", "all2allBackend"): api.ParallelismSpec.model_fields["all2all_backend"],
}


def _literal_values(field) -> list[str]:
    values: list[str] = []
    ann = field.annotation
    for arg in ([ann] if typing.get_origin(ann) is typing.Literal else typing.get_args(ann)):
        if typing.get_origin(arg) is typing.Literal:
            values += list(typing.get_args(arg))
    assert values, f"{field} is not an enum"
    return values


def enum_sweep() -> dict[str, dict]:
    """One CR per value; where the base's EPLB does not go with a value, without EPLB (the API refuses the
    pair, and test_backend_rules_are_vllms checks that vLLM does too)."""
    out = {}
    for (section, key), field in _SWEPT.items():
        for value in _literal_values(field):
            spec = copy.deepcopy(_SWEEP_BASE)
            spec.setdefault(section, {})[key] = value
            try:
                parse_spec(spec)
            except SpecError:
                spec["parallelism"]["eplb"] = {"enabled": False}
            out[f"{key}-{value}"] = spec
    return out


def corpus() -> dict[str, dict]:
    """Every CR of the corpus by name: the samples, the topologies and the enum sweep."""
    crs = {f"sample-{p.stem}": yaml.safe_load(p.read_text()) for p in sorted(SAMPLES.glob("*.yaml"))}
    for name, spec in {**TOPOLOGIES, **enum_sweep()}.items():
        crs[name] = _cr(name.lower().replace(".", "-").replace("_", "-"), spec)
    return crs
