"""Validation of a DeepSeekServing: field types and limits (pydantic) plus rules that relate fields.

Each error names the field path as users write it (`spec.parallelism.dataParallelSizeLocal`) and says how to
fix it. The API server enforces the same rules at admission through CEL (see `crd.py`), except the few that
docs/api-validation.md lists; these checks are the complete set, used by `flashserve render` offline and by
the operator for objects that got past an older CRD.
"""

from __future__ import annotations

import datetime
import functools
import re
from dataclasses import dataclass

from pydantic import ValidationError

from flashserve.api import context_length, kubevalues, quantity
from flashserve.api.startup_validation import startup_errors
from flashserve.api.v1alpha1 import (
    CHANNEL_MESSAGE,
    OPERATOR_CHANNEL_TEMPLATE,
    OPERATOR_ROUTER_NAME,
    ROUTER_NAME_MAX,
    ROUTER_NAME_MESSAGE,
    DeepSeekServing,
    DeepSeekServingSpec,
)
from flashserve.facts import vllm_rules
from flashserve.facts.accelerators import accelerator
from flashserve.facts.cache_env import CACHE_ENV_NAMES, DEEP_GEMM_WARMUP_ENV
from flashserve.facts.layout import layout
from flashserve.facts.managed import MANAGED_ENV, ROUTE_ENV, ROUTES_HINT, extra_args_errors


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A DeepSeekServing that cannot be served as written."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(map(str, errors)))


def _path(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        elif item in ("int", "str", "float", "bool") or "[" in str(item) or str(item).startswith("function-"):
            continue  # pydantic's union-member and validator tags, not fields
        else:
            parts.append(str(item))
    return ".".join(parts)


def _pydantic_errors(exc: ValidationError, prefix: str) -> list[FieldError]:
    out: dict[str, FieldError] = {}
    for err in exc.errors(include_url=False):
        loc = (prefix, *err["loc"]) if prefix else err["loc"]
        path = _path(loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            # The last item is the user's own key, whatever it is called (`int` would read as a union tag).
            key = str(loc[-1])
            path = _path(loc[:-1]) + (f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f"[{key!r}]")
            msg = "unknown field: remove it or check its spelling (`kubectl explain deepseekserving.spec`)"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err['input']!r})"
        elif err["type"] == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") in kubevalues.HINTS:
            msg = f"{str(err['input'])[:80]!r} is not {kubevalues.HINTS[err['ctx']['pattern']]}"
        out.setdefault(path, FieldError(path, msg))  # unions report once per member: keep the first
    return list(out.values())


def _pod_placement_errors(path: str, tolerations: list, node_selector: dict) -> list[FieldError]:
    """Tolerations and nodeSelector keys as Kubernetes validates them, for the engines' and the router's pods."""
    errs = []
    for i, tol in enumerate(tolerations):
        for field, message in kubevalues.toleration_errors(tol.key, tol.operator, tol.value, tol.effect,
                                                           tol.toleration_seconds):  # fmt: skip
            errs.append(FieldError(f"{path}.tolerations[{i}].{field}", message))
    for key in node_selector:
        if message := kubevalues.prefix_error(key):
            errs.append(FieldError(f"{path}.nodeSelector[{key[:40]!r}]", message))
    return errs


def _quantity_errors(path: str, values: dict[str, int | str]) -> list[FieldError]:
    """Each value (by its field name under `path`) that is not a positive Kubernetes quantity."""
    errs = []
    for key, value in values.items():
        try:
            quantity.check(value)
        except ValueError as exc:
            errs.append(FieldError(f"{path}.{key}", str(exc)))
    return errs


def semantic_errors(spec: DeepSeekServingSpec) -> list[FieldError]:
    """Rules that relate several fields. Returns every broken rule, not just the first."""
    errs: list[FieldError] = []
    acc = accelerator(spec.placement.accelerator)
    par, eng, auto = spec.parallelism, spec.engine, spec.autoscaling
    lay = layout(spec)

    if lay.gpus_per_pod != acc.gpus_per_node:
        errs.append(
            FieldError(
                "spec.parallelism.dataParallelSizeLocal",
                f"tensorParallelSize ({par.tensor_parallel_size}) x dataParallelSizeLocal ({lay.dp_local}) = "
                f"{lay.gpus_per_pod} GPUs, but a {acc.name} node has {acc.gpus_per_node}: make the product "
                f"{acc.gpus_per_node} (e.g. dataParallelSizeLocal: {max(1, acc.gpus_per_node // par.tensor_parallel_size)})",
            )
        )
    if par.dbo.enabled and not (par.expert_parallel and lay.dp_size > 1):
        errs.append(
            FieldError(
                "spec.parallelism.dbo.enabled",
                "dual-microbatch overlap needs expertParallel: true and more than one data-parallel rank "
                f"(now expertParallel={str(par.expert_parallel).lower()}, data-parallel size {lay.dp_size}): "
                "enable expert parallelism or set dbo.enabled: false",
            )
        )
    if par.dbo.enabled and par.all2all_backend not in vllm_rules.DBO_ALL2ALL_BACKENDS:
        errs.append(
            FieldError(
                "spec.parallelism.all2allBackend",
                f"dual-microbatch overlap needs an all-to-all backend that splits microbatches, not "
                f"{par.all2all_backend or 'the default (allgather_reducescatter)'}: set all2allBackend to "
                + " or ".join(vllm_rules.DBO_ALL2ALL_BACKENDS) + ", or dbo.enabled: false",
            )
        )
    if par.eplb.enabled and par.all2all_backend in vllm_rules.NO_EPLB_ALL2ALL_BACKENDS:
        errs.append(
            FieldError(
                "spec.parallelism.eplb.enabled",
                f"EPLB cannot rearrange experts with the {par.all2all_backend} all-to-all backend: "
                "set eplb.enabled: false or choose another all2allBackend",
            )
        )
    if par.eplb.enabled and not par.expert_parallel:
        errs.append(
            FieldError(
                "spec.parallelism.eplb.enabled",
                "EPLB balances experts across an expert-parallel group: set parallelism.expertParallel: true "
                "or eplb.enabled: false",
            )
        )
    if par.all2all_backend and not par.expert_parallel:
        errs.append(
            FieldError(
                "spec.parallelism.all2allBackend",
                "an all-to-all backend only applies with expertParallel: true: enable it or unset all2allBackend",
            )
        )
    if lay.multi_node and acc.multi_node_nvlink and not spec.placement.nvlink_domain.enabled:
        errs.append(
            FieldError(
                "spec.placement.nvlinkDomain.enabled",
                f"a {lay.nodes}-node group on {acc.name} must stay inside one NVLink domain: "
                "set placement.nvlinkDomain.enabled: true",
            )
        )
    if lay.multi_node and acc.multi_node_nvlink and lay.nodes > acc.nodes_per_nvlink_domain:
        errs.append(
            FieldError(
                "spec.parallelism.nodesPerReplica",
                f"{lay.nodes} nodes do not fit one {acc.name} NVLink domain of {acc.nodes_per_nvlink_domain} "
                f"nodes: use at most {acc.nodes_per_nvlink_domain}",
            )
        )
    cd = spec.placement.compute_domain
    if (cd.enabled or cd.resource_claim_template_name) and not acc.multi_node_nvlink:
        errs.append(
            FieldError(
                "spec.placement.computeDomain",
                f"ComputeDomains provide multi-node NVLink (IMEX) on GB200/GB300, not on {acc.name}: "
                "disable computeDomain",
            )
        )
    if cd.enabled and cd.resource_claim_template_name:
        errs.append(
            FieldError(
                "spec.placement.computeDomain.resourceClaimTemplateName",
                "either create a ComputeDomain (enabled: true) or reference an existing "
                "ResourceClaimTemplate, not both",
            )
        )
    if cd.resource_claim_template_name and re.search(OPERATOR_CHANNEL_TEMPLATE, cd.resource_claim_template_name):
        errs.append(FieldError("spec.placement.computeDomain.resourceClaimTemplateName", CHANNEL_MESSAGE))
    src = spec.model.source
    if src.hugging_face is not None and src.pvc is not None:
        errs.append(
            FieldError("spec.model.source", "set exactly one of huggingFace or pvc, not both")
        )
    if len(set(spec.model.served_model_names)) != len(spec.model.served_model_names):
        errs.append(FieldError("spec.model.servedModelNames", "names must be unique: remove the duplicate"))
    if lay.multi_node and eng.port == par.rpc_port:
        errs.append(
            FieldError(
                "spec.parallelism.rpcPort",
                f"a multi-node group's leader listens on engine.port for the API and on rpcPort for data-parallel "
                f"RPC, both {eng.port} here: change one of them",
            )
        )
    if eng.max_num_batched_tokens < eng.max_num_seqs:
        errs.append(
            FieldError(
                "spec.engine.maxNumBatchedTokens",
                f"must be at least maxNumSeqs ({eng.max_num_seqs}), as vLLM requires: raise it or lower maxNumSeqs",
            )
        )
    try:
        context_length.tokens(eng.max_model_len)
    except ValueError as exc:
        errs.append(FieldError("spec.engine.maxModelLen", str(exc)))
    if par.dbo.enabled and eng.speculative.enabled:
        errs.append(
            FieldError(
                "spec.engine.speculative.enabled",
                "vLLM cannot combine dual-microbatch overlap (spec.parallelism.dbo.enabled: true) with speculative "
                "decoding: set engine.speculative.enabled: false (or leave it unset, which turns it off with DBO) "
                "or parallelism.dbo.enabled: false",
            )
        )
    res = eng.resources
    errs += _quantity_errors("spec.engine.resources", {"cpu": res.cpu, "memory": res.memory, "shmSize": res.shm_size})
    place = spec.placement
    errs += _pod_placement_errors("spec.placement", place.tolerations, place.node_selector)
    errs += _pod_placement_errors("spec.routing", spec.routing.tolerations, spec.routing.node_selector)
    if message := kubevalues.prefix_error(place.nvlink_domain.topology_key):
        errs.append(FieldError("spec.placement.nvlinkDomain.topologyKey", message))
    for i, message in extra_args_errors(eng.extra_args):
        errs.append(FieldError(f"spec.engine.extraArgs[{i}]", message))
    seen_env: set[str] = set()
    for i, env in enumerate(eng.env):
        if _is_hub_token(env.name):
            errs.append(
                FieldError(
                    f"spec.engine.env[{i}].name",
                    f"{env.name} would hand the engine a Hugging Face token outside the operator's control (an "
                    "inline value is readable by anyone who can read the serving): put the token in a Secret "
                    "and name it in spec.model.source.huggingFace.tokenSecretRef",
                )
            )
        elif env.name in ROUTE_ENV:
            opens = f"{env.name} opens {ROUTE_ENV[env.name]} {ROUTES_HINT}"
            errs.append(FieldError(f"spec.engine.env[{i}].name", opens))
        elif env.name in MANAGED_ENV:
            hint = "use spec.model.source" if env.name.startswith("HF_") else _MANAGED_ENV_FIELDS.get(env.name, "remove it")
            errs.append(
                FieldError(f"spec.engine.env[{i}].name", f"{env.name} is managed by the operator: {hint}")
            )
        if env.name in seen_env:
            errs.append(FieldError(f"spec.engine.env[{i}].name", f"{env.name} is set twice: keep one"))
        seen_env.add(env.name)
        if env.value is not None and env.value_from is not None:
            errs.append(FieldError(f"spec.engine.env[{i}]", "set value or valueFrom, not both"))
        if env.value_from is not None and (env.value_from.secret_key_ref is None) == (
            env.value_from.config_map_key_ref is None
        ):
            errs.append(
                FieldError(f"spec.engine.env[{i}].valueFrom", "set exactly one of secretKeyRef or configMapKeyRef")
            )
    routing = spec.routing
    rres = routing.resources
    cpu_errs = _quantity_errors("spec.routing.resources", {"cpu": rres.cpu})
    errs += cpu_errs + _quantity_errors("spec.routing.resources", {"memory": rres.memory})
    if rres.dedicated_cpus and not cpu_errs and not quantity.is_whole(rres.cpu):
        errs.append(FieldError(
            "spec.routing.resources.cpu",
            f"dedicated CPUs are whole cores and {rres.cpu!r} is not: set cpu to {quantity.WHOLE_HINT}, or "
            "dedicatedCpus: false"))
    if routing.port == routing.metrics_port:
        errs.append(
            FieldError(
                "spec.routing.metricsPort",
                f"the router's metrics port must differ from its API port ({routing.port}): change one of them",
            )
        )
    picker = routing.inference_pool.endpoint_picker_ref
    if picker is not None and picker.kind == "Service" and picker.port is None:
        errs.append(
            FieldError(
                "spec.routing.inferencePool.endpointPickerRef.port",
                "an endpoint picker that is a Service needs its port: set port.number (the Service port, "
                "e.g. 9002)",
            )
        )
    errs += [FieldError(path, message) for path, message in startup_errors(spec)]
    if auto.min_replicas > auto.max_replicas:
        errs.append(
            FieldError(
                "spec.autoscaling.minReplicas",
                f"minReplicas ({auto.min_replicas}) is above maxReplicas ({auto.max_replicas}): lower it or raise maxReplicas",
            )
        )
    return errs


# Managed variables that a spec field sets, and the field.
_MANAGED_ENV_FIELDS: dict[str, str] = {
    **{name: "use spec.startup.kernelCache (it places every kernel cache)" for name in CACHE_ENV_NAMES},
    DEEP_GEMM_WARMUP_ENV: "use spec.startup.warmup.deepGemm",
}


def _is_hub_token(name: str) -> bool:
    """HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HUGGINGFACE_TOKEN, HUGGINGFACEHUB_API_TOKEN, HF_API_TOKEN, ...:
    every spelling the Hub client libraries read a token from."""
    n = name.upper()
    return "TOKEN" in n and (n.startswith("HF_") or "HUGGING" in n)


def _kind(value: object) -> str:
    """What a YAML value is, in YAML's words."""
    names = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
             datetime.date: "a date", datetime.datetime: "a date and time"}
    return names.get(type(value), type(value).__name__)


@functools.cache
def _spec_schema() -> dict:
    from flashserve.api.crd import generate_crd

    return generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def prune_nulls(value: object, schema: dict | None) -> object:
    """`value` as the API server keeps it under the structural `schema`: a null in a field that is not nullable
    is dropped before defaulting (so `engine:` left empty in a file means the defaults), as apiextensions does.
    Fields the schema does not know are left for the validation to name."""
    if schema is None:
        return value
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key) if props is not None else (extra if isinstance(extra, dict) else None)
            if item is None and sub is not None and not sub.get("nullable"):
                continue
            out[key] = prune_nulls(item, sub)
        return out
    if isinstance(value, list) and schema.get("type") == "array":
        return [prune_nulls(item, schema.get("items")) for item in value]
    return value


def parse_spec(spec: dict | None) -> DeepSeekServingSpec:
    """Validate a spec dict (camelCase, as in the API). Raises SpecError listing every problem."""
    if spec is not None and not isinstance(spec, dict):
        raise SpecError([FieldError("spec", f"must be a mapping of the serving's settings, not {_kind(spec)}")])
    try:
        parsed = DeepSeekServingSpec.model_validate({} if spec is None else spec)
    except ValidationError as exc:
        raise SpecError(_pydantic_errors(exc, "spec")) from None
    errs = semantic_errors(parsed)
    if errs:
        raise SpecError(errs)
    return parsed


ANNOTATIONS_MAX_BYTES = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB


def metadata_errors(meta: dict) -> list[FieldError]:
    """Labels and annotations as the API server takes them: maps of strings, qualified keys, label values of
    at most 63 characters, annotations of at most 256 KiB in all. A YAML `1` or `true` is not a string there
    (kubectl refuses the file), so offline it is refused as well, not quietly turned into one."""
    errs: list[FieldError] = []
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            errs.append(FieldError(f"metadata.{field}", "must be a mapping of names to strings"))
            continue
        size = 0
        for key, value in values.items():
            path = f"metadata.{field}[{str(key)[:80]!r}]"
            if not isinstance(key, str) or not re.fullmatch(kubevalues.QUALIFIED_NAME, key) or kubevalues.prefix_error(key):
                errs.append(FieldError(path, f"the key is not {kubevalues.QUALIFIED_HINT}"))
                continue
            if isinstance(value, bool):
                # yes, no, on, off, true and false unquoted are YAML booleans: which one was written is lost
                errs.append(FieldError(path, "must be a string, not a boolean (YAML reads yes, no, on, off, true and "
                                             "false unquoted as booleans): quote the value"))  # fmt: skip
                continue
            if not isinstance(value, str):
                errs.append(FieldError(path, f"must be a string, not {_kind(value)} {str(value)[:40]}: "
                                             f"quote it ({key}: \"{str(value)[:40]}\")"))  # fmt: skip
                continue
            if field == "labels" and not re.fullmatch(kubevalues.LABEL_VALUE, value):
                errs.append(FieldError(path, f"{value[:80]!r} is not {kubevalues.LABEL_VALUE_HINT}"))
            size += len(key) + len(value.encode())
        if field == "annotations" and size > ANNOTATIONS_MAX_BYTES:
            errs.append(FieldError("metadata.annotations", f"{size} bytes in all; the API server takes at most "
                                                           f"{ANNOTATIONS_MAX_BYTES}: remove the largest"))  # fmt: skip
    return errs


def parse_serving(obj: dict) -> DeepSeekServing:
    """Validate a whole DeepSeekServing object. Raises SpecError listing every problem."""
    if not isinstance(obj, dict):
        raise SpecError([FieldError("(document)", "expected a DeepSeekServing object (a YAML mapping)")])
    errs: list[FieldError] = []
    if obj.get("apiVersion") != "flashserve.io/v1alpha1":
        errs.append(FieldError("apiVersion", f"must be flashserve.io/v1alpha1 (got {obj.get('apiVersion')!r})"))
    if obj.get("kind") != "DeepSeekServing":
        errs.append(FieldError("kind", f"must be DeepSeekServing (got {obj.get('kind')!r})"))
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        errs.append(FieldError("metadata", f"must be a mapping with at least a name, not {_kind(meta)}"))
        meta = None
    meta = meta or {}  # none at all: the name's error below says what is missing
    name, namespace = meta.get("name"), meta.get("namespace")
    if name is None or name == "":
        errs.append(FieldError("metadata.name", "required: name the serving"))
    elif not isinstance(name, str):
        errs.append(FieldError("metadata.name", f"must be a string, not {_kind(name)}: quote it (name: \"...\")"))
    elif not kubevalues.OBJECT_NAME.fullmatch(name):
        errs.append(FieldError("metadata.name", f"{name!r} is not a Kubernetes name: lowercase letters, digits, "
                                                "'-' and '.', starting and ending with a letter or digit, at most 253"))  # fmt: skip
    elif len(name) <= ROUTER_NAME_MAX and re.fullmatch(OPERATOR_ROUTER_NAME, name):
        errs.append(FieldError("metadata.name", f"{name!r} {ROUTER_NAME_MESSAGE}"))
    if namespace is not None and (not isinstance(namespace, str) or not kubevalues.NAMESPACE_NAME.fullmatch(namespace)):
        errs.append(FieldError("metadata.namespace", f"{namespace!r} is not a namespace name: lowercase letters, "
                                                     "digits and '-', at most 63"))  # fmt: skip
    errs += metadata_errors(meta)
    try:
        spec = parse_spec(prune_nulls(obj.get("spec"), _spec_schema()))
    except SpecError as exc:
        errs += exc.errors
    if errs:
        raise SpecError(errs)
    return DeepSeekServing(apiVersion=obj["apiVersion"], kind=obj["kind"], metadata=meta, spec=spec)


__all__ = ["FieldError", "SpecError", "parse_serving", "parse_spec", "semantic_errors"]
