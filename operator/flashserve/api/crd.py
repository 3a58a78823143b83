"""The CustomResourceDefinition, generated from the pydantic models in v1alpha1.py.

The API server requires a structural schema: no `$ref`, `nullable` instead of `anyOf: [X, null]`,
`x-kubernetes-int-or-string` for int-or-string fields, OpenAPI 3.0 boolean `exclusiveMinimum`, and no
`additionalProperties: false` (unknown fields are pruned instead). Object fields get `default: {}` so the API
server fills in nested defaults and the stored object shows what will be served.
Object fields default to their fully defaulted value, so the CEL rules always find the fields they read.
"""

from __future__ import annotations

import inspect
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter

from flashserve.api import kubevalues, quantity
from flashserve.api import v1alpha1 as api
from flashserve.facts import engine_choices, vllm_rules
from flashserve.facts.accelerators import ACCELERATORS
from flashserve.facts.managed import MANAGED_ENV, ROUTE_ENV, managed_arg_pattern

_MODELS: dict[str, type[BaseModel]] = {
    name: cls
    for name, cls in inspect.getmembers(api, inspect.isclass)
    if issubclass(cls, BaseModel) and cls.__module__ == api.__name__
}
_KEEP = {
    "type", "description", "default", "enum", "format", "minimum", "maximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "items", "properties", "required", "additionalProperties", "nullable",
    "exclusiveMinimum", "exclusiveMaximum", "x-kubernetes-int-or-string", "x-kubernetes-validations",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "maxProperties",
}  # fmt: skip

# The rules the API server enforces at admission: every cross-field rule of validation.py that CEL can state,
# generated from the same facts (docs/api-validation.md lists the rest). validation.py's messages are richer.
_ACC = "self.placement.accelerator"
_TP = "self.parallelism.tensorParallelSize"


def cel_list(values) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def cel_gpus_per_node(acc: str = _ACC) -> str:
    """CEL for the GPUs per node of the accelerator named by `acc`, from the accelerator table."""
    by_gpus: dict[int, list[str]] = {}
    for a in ACCELERATORS.values():
        by_gpus.setdefault(a.gpus_per_node, []).append(a.name)
    *rest, (last, _) = sorted(by_gpus.items())
    expr = str(last)
    for gpus, names in reversed(rest):
        expr = f"{acc} in {cel_list(names)} ? {gpus} : {expr}"
    return f"({expr})"


def cel_nvlink_domain_nodes(acc: str = _ACC) -> str:
    """CEL for the nodes one NVLink domain of `acc` holds (1 where NVLink stops at the node)."""
    expr = "1"
    for a in reversed(list(ACCELERATORS.values())):
        if a.nodes_per_nvlink_domain != 1:
            expr = f"{acc} == '{a.name}' ? {a.nodes_per_nvlink_domain} : {expr}"
    return f"({expr})"


_NVLINK_NAMES = [a.name for a in ACCELERATORS.values() if a.multi_node_nvlink]
_NVLINK = cel_list(_NVLINK_NAMES)
_GPUS = cel_gpus_per_node()
_DPL = f"(has(self.parallelism.dataParallelSizeLocal) ? self.parallelism.dataParallelSizeLocal : {_GPUS} / {_TP})"
# Generated from the vLLM flag table (facts/managed.py): the item-by-item part of the extraArgs guard.
# validation.py also refuses unknown flags, positional arguments and missing values, which need context.
_MANAGED_ARG_RE = managed_arg_pattern()
_GROUPS_MESSAGE = f"one serving holds at most {api.MAX_GROUPS} replica groups: split a larger fleet into several servings"
RULES: dict[str, list[dict[str, str]]] = {
    "spec": [
        {
            "rule": f"{_TP} <= {_GPUS} && ({_GPUS} % {_TP}) == 0 && {_TP} * {_DPL} == {_GPUS}",
            "message": "tensorParallelSize x dataParallelSizeLocal must equal the accelerator's GPUs per node ("
            + ", ".join(f"{a.gpus_per_node} for {a.name}" for a in ACCELERATORS.values()) + ")",
            "fieldPath": ".parallelism.dataParallelSizeLocal",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"!self.parallelism.dbo.enabled || (self.parallelism.expertParallel && "
            f"{_DPL} * self.parallelism.nodesPerReplica > 1)",
            "message": "dual-microbatch overlap (dbo) needs expertParallel: true and more than one data-parallel rank",
            "fieldPath": ".parallelism.dbo.enabled",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!self.parallelism.dbo.enabled || !has(self.engine.speculative.enabled) "
            "|| !self.engine.speculative.enabled",
            "message": "vLLM cannot combine dual-microbatch overlap with speculative decoding: set "
            "engine.speculative.enabled: false (or leave it unset) or parallelism.dbo.enabled: false",
            "fieldPath": ".engine.speculative.enabled",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"self.parallelism.nodesPerReplica == 1 || !({_ACC} in {_NVLINK}) "
            "|| self.placement.nvlinkDomain.enabled",
            "message": "multi-node groups on multi-node NVLink systems must stay in one NVLink domain: "
            "set placement.nvlinkDomain.enabled: true",
            "fieldPath": ".placement.nvlinkDomain.enabled",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"self.parallelism.nodesPerReplica == 1 || !({_ACC} in {_NVLINK}) "
            f"|| self.parallelism.nodesPerReplica <= {cel_nvlink_domain_nodes()}",
            "message": "a multi-node group must fit one NVLink domain ("
            + ", ".join(f"{a.nodes_per_nvlink_domain} nodes on {a.name}" for a in ACCELERATORS.values()
                        if a.multi_node_nvlink) + "): lower nodesPerReplica",
            "fieldPath": ".parallelism.nodesPerReplica",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "self.parallelism.nodesPerReplica == 1 || self.engine.port != self.parallelism.rpcPort",
            "message": "a multi-node group's leader listens on engine.port for the API and on parallelism.rpcPort "
            "for data-parallel RPC: change one of them",
            "fieldPath": ".parallelism.rpcPort",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"{_ACC} in {_NVLINK} || (!self.placement.computeDomain.enabled "
            "&& !has(self.placement.computeDomain.resourceClaimTemplateName))",
            "message": f"ComputeDomains provide multi-node NVLink (IMEX) on {'/'.join(_NVLINK_NAMES)} only: "
            "disable placement.computeDomain",
            "fieldPath": ".placement.computeDomain",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"self.replicas <= {api.MAX_GROUPS}",
            "message": _GROUPS_MESSAGE,
            "fieldPath": ".replicas",
            "reason": "FieldValueInvalid",
        },
    ],
    "ModelSpec": [
        {
            "rule": "self.servedModelNames.all(n, self.servedModelNames.exists_one(m, m == n))",
            "message": "servedModelNames must be unique: remove the duplicate",
            "fieldPath": ".servedModelNames",
        },
    ],
    "ParallelismSpec": [
        {
            "rule": "!self.eplb.enabled || self.expertParallel",
            "message": "EPLB needs expertParallel: true",
            "fieldPath": ".eplb.enabled",
        },
        {
            "rule": "!has(self.all2allBackend) || self.expertParallel",
            "message": "an all-to-all backend only applies with expertParallel: true: enable it or unset all2allBackend",
            "fieldPath": ".all2allBackend",
        },
        *vllm_rules.CEL_RULES,
    ],
    "ComputeDomainSpec": [
        {
            "rule": "!self.enabled || !has(self.resourceClaimTemplateName)",
            "message": "either create a ComputeDomain (enabled: true) or reference an existing "
            "ResourceClaimTemplate, not both",
            "fieldPath": ".resourceClaimTemplateName",
        },
        {
            "rule": f"!has(self.resourceClaimTemplateName) || "
            f"!self.resourceClaimTemplateName.matches('{api.OPERATOR_CHANNEL_TEMPLATE}')",
            "message": api.CHANNEL_MESSAGE,
            "fieldPath": ".resourceClaimTemplateName",
        },
    ],
    "AutoscalingSpec": [
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "minReplicas must not exceed maxReplicas",
            "fieldPath": ".minReplicas",
        },
        {
            "rule": f"self.maxReplicas <= {api.MAX_GROUPS}",
            "message": _GROUPS_MESSAGE,
            "fieldPath": ".maxReplicas",
        },
    ],
    "WeightsSource": [
        {"rule": "!(has(self.huggingFace) && has(self.pvc))", "message": "set exactly one of huggingFace or pvc"},
    ],
    "EngineSpec": [
        {
            "rule": f"self.extraArgs.all(a, !a.matches('{_MANAGED_ARG_RE}'))",
            "message": "extraArgs may not set what the operator manages (parallelism, port, model, cache, "
            "batching, buckets), secrets, a config file or options that open admin routes on the engines, in any "
            "spelling vLLM accepts: use the matching spec field or remove it (flashserve validate says which)",
            "fieldPath": ".extraArgs",
        },
        {
            "rule": "self.maxNumBatchedTokens >= self.maxNumSeqs",
            "message": "maxNumBatchedTokens must be at least maxNumSeqs, as vLLM requires",
            "fieldPath": ".maxNumBatchedTokens",
        },
        {
            "rule": "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "message": "env names must be unique: keep one of each",
            "fieldPath": ".env",
        },
    ],
    "EnvVar": [
        {
            "rule": "!(self.name.upperAscii().contains('TOKEN') && (self.name.upperAscii().startsWith('HF_') "
            "|| self.name.upperAscii().contains('HUGGING')))",
            "message": "a Hugging Face token goes in a Secret named by spec.model.source.huggingFace.tokenSecretRef, "
            "not in env",
            "fieldPath": ".name",
        },
        {
            "rule": f"!(self.name in {cel_list(sorted(MANAGED_ENV))})",
            "message": "this variable is managed by the operator: remove it",
            "fieldPath": ".name",
        },
        {
            "rule": f"!(self.name in {cel_list(sorted(ROUTE_ENV))})",
            "message": "this variable opens admin routes on every engine, where any client of the serving can call "
            "them (the router forwards every path to the engines): remove it",
            "fieldPath": ".name",
        },
        {"rule": "!(has(self.value) && has(self.valueFrom))", "message": "set value or valueFrom, not both"},
    ],
    "Toleration": kubevalues.TOLERATION_RULES,
    "NVLinkDomainSpec": [
        {"rule": kubevalues.cel_prefix("self.topologyKey"),
         "message": f"topologyKey's prefix must be at most {kubevalues.PREFIX_MAX} characters", "fieldPath": ".topologyKey"},
    ],
    "RoutingSpec": [
        {
            "rule": "self.port != self.metricsPort",
            "message": "the router's metrics port must differ from its API port: change port or metricsPort",
            "fieldPath": ".metricsPort",
        },
    ],
    "RouterResourcesSpec": [
        {
            "rule": f"!self.dedicatedCpus || type(self.cpu) == int || self.cpu.matches('{quantity.WHOLE_RE}')",
            "message": f"dedicated CPUs are whole cores: set cpu to {quantity.WHOLE_HINT}, or dedicatedCpus: false",
            "fieldPath": ".cpu",
        },
    ],
    "EndpointPickerRef": [
        {
            "rule": "self.kind != 'Service' || has(self.port)",
            "message": "an endpoint picker that is a Service needs its port: set port.number (the Service port)",
            "fieldPath": ".port",
        },
    ],
    "EnvVarSource": [
        {
            "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
            "message": "set exactly one of secretKeyRef or configMapKeyRef",
        },
    ],
}

# spec.startup (api/startup_validation.py holds the same rules with richer messages).
_MULTITHREAD = cel_list(engine_choices.MULTITHREAD_LOAD_FORMATS)
RULES["spec"] = RULES["spec"] + [
    {
        "rule": "!has(self.startup) || !has(self.startup.weightsCache) || !has(self.model.source.pvc)",
        "message": "the weights already come from spec.model.source.pvc: remove startup.weightsCache or source "
        "the weights from huggingFace",
        "fieldPath": ".startup.weightsCache",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.startup) || !has(self.startup.weightsCache) || !has(self.model.source.huggingFace) "
        "|| !has(self.model.source.huggingFace.cachePvcName)",
        "message": "spec.model.source.huggingFace.cachePvcName already names a Hugging Face cache: keep it or "
        "startup.weightsCache, not both",
        "fieldPath": ".startup.weightsCache",
        "reason": "FieldValueInvalid",
    },
]
RULES["LoaderSpec"] = [
    {
        "rule": f"!has(self.threads) || self.format in {_MULTITHREAD}",
        "message": f"threads applies to vLLM's multi-threaded safetensors load, formats {_MULTITHREAD} only",
        "fieldPath": ".threads",
    },
    {
        "rule": f"!has(self.safetensorsLoadStrategy) || self.format in {_MULTITHREAD}",
        "message": f"safetensorsLoadStrategy is read by vLLM's default loader, formats {_MULTITHREAD} only",
        "fieldPath": ".safetensorsLoadStrategy",
    },
    {
        "rule": "!has(self.threads) || !has(self.safetensorsLoadStrategy) || self.safetensorsLoadStrategy == 'lazy'",
        "message": "vLLM's multi-threaded load only memory-maps: set safetensorsLoadStrategy to lazy or unset threads",
        "fieldPath": ".safetensorsLoadStrategy",
    },
    {
        "rule": "!has(self.runaiStreamer) || self.format == 'runai_streamer'",
        "message": "runaiStreamer options need format: runai_streamer",
        "fieldPath": ".runaiStreamer",
    },
]


def _default_for(cls: type[BaseModel], field_name: str) -> Any:
    field = cls.model_fields[field_name]
    if field.default_factory is None:
        return None
    value = field.default_factory()
    if isinstance(value, BaseModel):
        # The whole defaulted object, not {}: the API server checks defaults against the CEL rules, which
        # read nested fields that an empty default would not have yet.
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    return TypeAdapter(field.annotation).dump_python(value, by_alias=True, mode="json", exclude_none=True)


def _convert(node: dict, defs: dict, model: type[BaseModel] | None = None) -> dict:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        out = _convert(defs[name], defs, _MODELS.get(name))
        for key in ("description", "default"):
            if key in node:
                out[key] = node[key]
        return out
    if node.get("x-kubernetes-int-or-string"):
        out = {"x-kubernetes-int-or-string": True}
        out.update({k: node[k] for k in ("description", "default", "x-kubernetes-validations") if k in node})
        if "description" in out:
            out["description"] = " ".join(out["description"].split())
        return out
    if "anyOf" in node:
        members = [m for m in node["anyOf"] if m.get("type") != "null"]
        nullable = len(members) < len(node["anyOf"])
        if len(members) != 1:
            raise ValueError(f"cannot express union {node['anyOf']} in a structural schema")
        out = _convert(members[0], defs)
        out.update({k: node[k] for k in ("description", "default") if k in node and node[k] is not None})
        if "description" in out:
            out["description"] = " ".join(out["description"].split())
        if nullable:
            out["nullable"] = True
        return out
    out = {k: v for k, v in node.items() if k in _KEEP}
    if "description" in out:
        out["description"] = " ".join(out["description"].split())  # docstrings wrap at source width
    if "const" in node:
        out["enum"] = [node["const"]]
    if isinstance(out.get("exclusiveMinimum"), (int, float)) and not isinstance(out["exclusiveMinimum"], bool):
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    if isinstance(out.get("exclusiveMaximum"), (int, float)) and not isinstance(out["exclusiveMaximum"], bool):
        out["maximum"], out["exclusiveMaximum"] = out["exclusiveMaximum"], True
    if out.get("default", 0) is None:
        del out["default"]
    names = node.get("propertyNames") or {}
    key_max, key_pattern = names.get("maxLength"), names.get("pattern")
    if "patternProperties" in node:  # pydantic's form of a map whose keys have a pattern: a map plus a key rule
        ((key_pattern, value_schema),) = node["patternProperties"].items()
        out["additionalProperties"] = value_schema
    if key_max is not None:  # structural schemas have no propertyNames: the same bounds as rules
        out["x-kubernetes-validations"] = [{"rule": f"self.all(k, size(k) <= {key_max})",
                                            "message": f"keys must be at most {key_max} characters"}]  # fmt: skip
    if key_pattern is not None:
        hint = kubevalues.HINTS.get(key_pattern, f"match {key_pattern}")
        out.setdefault("x-kubernetes-validations", []).append(
            {"rule": f"self.all(k, {kubevalues.cel_matches('k', key_pattern)})", "message": f"each key must be {hint}"})
        if key_pattern == kubevalues.QUALIFIED_NAME:
            out["x-kubernetes-validations"].append(
                {"rule": f"self.all(k, {kubevalues.cel_prefix('k')})",
                 "message": f"a key's prefix must be at most {kubevalues.PREFIX_MAX} characters"})  # fmt: skip
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(out["additionalProperties"], defs)
    if "items" in out:
        out["items"] = _convert(out["items"], defs)
    if "properties" in node:
        props = {}
        for key, sub in node["properties"].items():
            prop = _convert(sub, defs)
            if model is not None:
                fname = next((n for n, f in model.model_fields.items() if (f.alias or n) == key), None)
                if fname is not None and "default" not in prop:
                    default = _default_for(model, fname)
                    if default is not None:
                        prop["default"] = default
            props[key] = prop
        out["properties"] = props
        out["type"] = "object"
    if model is not None and model.__name__ in RULES:
        out["x-kubernetes-validations"] = RULES[model.__name__]
    return out


def _spec_schema() -> dict:
    schema = api.DeepSeekServingSpec.model_json_schema(by_alias=True, mode="validation")
    out = _convert(schema, schema.get("$defs", {}), api.DeepSeekServingSpec)
    out["x-kubernetes-validations"] = RULES["spec"]
    out["description"] = "Desired state of a DeepSeekServing."
    return out


def _status_schema() -> dict:
    schema = api.DeepSeekServingStatus.model_json_schema(by_alias=True, mode="serialization")
    out = _convert(schema, schema.get("$defs", {}))
    out["description"] = "Observed state of a DeepSeekServing."
    conditions = out["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["description"] = ", ".join(api.CONDITION_TYPES[:-1]) + f" and {api.CONDITION_TYPES[-1]} conditions."
    return out


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready replica groups"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas", "description": "Desired groups"},
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.placement.accelerator"},
    {
        "name": "Tok/s/User",
        "type": "number",
        "jsonPath": ".status.sla.perUserTokensPerSecondP90",
        "description": "Per-user decode speed at the SLA percentile",
    },
    {"name": "SLA", "type": "string", "jsonPath": ".status.slaState"},
    {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def generate_crd() -> dict:
    """The CRD as a dict, ready to apply."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "flashserve", "app.kubernetes.io/part-of": "flashserve"},
        },
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["flashserve", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (api.DeepSeekServing.__doc__ or "").strip(),
                            # On create only (optionalOldSelf): an update of a serving made before the rule
                            # must not be refused for a name it cannot change.
                            "x-kubernetes-validations": [
                                {"rule": f"oldSelf.hasValue() || size(self.metadata.name) > {api.ROUTER_NAME_MAX} "
                                         f"|| !self.metadata.name.matches('{api.OPERATOR_ROUTER_NAME}')",
                                 "message": f"metadata.name {api.ROUTER_NAME_MESSAGE}", "optionalOldSelf": True},
                            ],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": _spec_schema(),
                                "status": _status_schema(),
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # shared lists would otherwise become &id001 anchors
        return True


def crd_yaml() -> str:
    return yaml.dump(generate_crd(), Dumper=_Dumper, sort_keys=False, width=120)


CRD_FILE = f"{api.GROUP}_{api.PLURAL}.yaml"
