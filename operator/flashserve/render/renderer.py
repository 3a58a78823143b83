"""DeepSeekServing -> Kubernetes objects. Pure: the same input always gives the same objects, and nothing
here talks to a cluster.

Objects are laid out by the Jinja2 templates in templates/; every value enters a template through `tojson`
(enforced: any other interpolation raises), so no value can break or inject YAML structure. The values
themselves come from the small modules that own each concern: vllm_args (command line and environment),
placement (affinity and tolerations), naming (names and labels within Kubernetes limits).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

import jinja2
import yaml
from markupsafe import Markup

from flashserve.api.v1alpha1 import (
    API_VERSION,
    KIND,
    DeepSeekServing,
    DeepSeekServingSpec,
)
from flashserve.api.validation import parse_serving
from flashserve.facts.accelerators import GPU_RESOURCE
from flashserve.facts.layout import Layout, layout
from flashserve.facts import router as router_facts
from flashserve.render.naming import (
    COMPONENT_LABEL,
    GROUP_LABEL,
    GROUP_NAME_LABEL,
    MANAGED_BY,
    ROUTING_LABEL,
    ROUTING_SERVE,
    SERVING_LABEL,
    compute_domain_name,
    group_name,
    inference_pool_name,
    network_policy_name,
    pdb_name,
    router_name,
    service_name,
    serving_label_value,
)
from flashserve.render.placement import (
    group_pod_affinity,
    group_pod_anti_affinity,
    node_affinity,
    node_selector,
    tolerations,
)
from flashserve.render.startup import kernel_cache_volume, startup_objects, weights_cache_claim
from flashserve.render.vllm_args import (
    HF_HOME,
    MODEL_MOUNT,
    command,
    engine_env,
    vllm_args,
)

TEMPLATE_HASH_ANNOTATION = "flashserve.io/template-hash"
STARTUP_BUDGET_SECONDS = 3600  # DeepSeek-class replicas take 8-45 minutes to load; probes must allow it
TERMINATION_GRACE_SECONDS = 120  # let in-flight requests finish after the endpoint is removed
# The namespace the operator runs in, unless it says otherwise (`flashserve run --operator-namespace`, from
# the chart's POD_NAMESPACE): its pods may reach the engines' API port, since the operator reads the
# engines' /metrics directly while it drains a group.
OPERATOR_NAMESPACE = "flashserve-system"
ROUTER_UID = 65532  # the router image's unprivileged user (Dockerfile)


def _only_json(value: object) -> object:
    if isinstance(value, Markup) or value is None:
        return value if value is not None else ""
    raise jinja2.TemplateError(f"template value {value!r} was interpolated without `| tojson`")


# A JSON surrogate-pair escape (\ud83d\ude80) whose backslash is not itself escaped. YAML has no such pairs:
# its parsers read them as two lone surrogates (PyYAML) or refuse them (libyaml).
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE)


def _astral_as_yaml(text: str) -> str:
    """JSON text with each surrogate pair written as YAML's 8-digit escape of the character it stands for."""

    def one(m: re.Match) -> str:
        hi, lo = int(m[2], 16), int(m[3], 16)
        return f"{m[1]}\\U{0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00):08x}"

    return _SURROGATE_PAIR.sub(one, text)


@functools.cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        finalize=_only_json,
        autoescape=False,
        keep_trailing_newline=True,
    )
    builtin_tojson = env.filters["tojson"]

    def tojson(eval_ctx: object, value: object) -> Markup:
        if isinstance(value, jinja2.Undefined):
            value._fail_with_undefined_error()  # a missing value is an error, not "null"
        return Markup(_astral_as_yaml(str(builtin_tojson(eval_ctx, value))))

    env.filters["tojson"] = jinja2.pass_eval_context(tojson)
    return env


# libyaml's parser is about six times faster than PyYAML's pure-Python one (a StatefulSet: 5 ms, not 32 ms);
# the constructor and resolver are the same SafeLoader ones, so the objects are identical.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _render(template: str, **ctx: object) -> dict:
    text = _env().get_template(template).render(**ctx)
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


def template_hash(spec: DeepSeekServingSpec) -> str:
    """Hash of everything that shapes a pod: the model, engine, parallelism and placement sections and the SLA
    target (it sets the histogram buckets). Replica count, autoscaling bounds, rollout pace and the network
    policy are left out, so changing them never restarts an engine."""
    pod_inputs = spec.dump()
    pod_inputs = {k: pod_inputs[k] for k in ("model", "engine", "parallelism", "placement")}
    pod_inputs["sla"] = spec.autoscaling.sla.per_user_tokens_per_second
    if spec.routing.renders_prompts():
        # The engines' --enable-scale-out; only when on, so servings without it keep their hash.
        pod_inputs["scaleOut"] = True
    if spec.startup is not None:  # only when set: servings without it keep their hash across this release
        pod_inputs["startup"] = _startup_pod_inputs(spec)
    digest = hashlib.sha256(json.dumps(pod_inputs, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def _startup_pod_inputs(spec: DeepSeekServingSpec) -> dict:
    """What of spec.startup shapes an engine pod: not the pre-pull, nor whether a prefetch fills the cache."""
    startup = spec.startup.dump() if spec.startup else {}
    startup.pop("imagePrepull", None)
    startup.get("weightsCache", {}).pop("prefetch", None)
    return startup


def labels(serving: str) -> dict[str, str]:
    value = serving_label_value(serving)
    return {
        "app.kubernetes.io/name": "deepseek-serving",
        "app.kubernetes.io/instance": value,
        "app.kubernetes.io/part-of": "flashserve",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVING_LABEL: value,
    }


def selector(serving: str) -> dict[str, str]:
    return {SERVING_LABEL: serving_label_value(serving)}


def group_pod_selector(serving: str, index: int) -> dict[str, str]:
    """Labels that pick the pods of one group. The group's own name is among them, so a group under the
    current name never selects (nor, through pod affinity, follows) the pods of the same group under an
    earlier name while both exist during the move to the current names."""
    return {SERVING_LABEL: serving_label_value(serving), GROUP_LABEL: str(index), GROUP_NAME_LABEL: group_name(serving, index)}


def engine_selector(serving: str) -> dict[str, str]:
    """Every engine pod of the serving (serving or draining), and no router pod."""
    return {SERVING_LABEL: serving_label_value(serving), COMPONENT_LABEL: "engine"}


def serve_selector(serving: str) -> dict[str, str]:
    """The engine pods that take new requests: what the router, the plain Service and the InferencePool
    select. A group being drained carries `flashserve.io/routing: drain` and drops out."""
    return {**engine_selector(serving), ROUTING_LABEL: ROUTING_SERVE}


def router_selector(serving: str) -> dict[str, str]:
    return {SERVING_LABEL: serving_label_value(serving), COMPONENT_LABEL: "router"}


def selector_string(serving: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(serving).items())


def endpoint(serving: str, namespace: str, spec: DeepSeekServingSpec) -> str:
    return f"http://{service_name(serving)}.{namespace}.svc:{spec.engine.port}/v1"


def _owner(obj: DeepSeekServing) -> dict | None:
    uid = obj.metadata.get("uid")
    if not uid:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": obj.metadata["name"],
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _volumes(spec: DeepSeekServingSpec) -> tuple[list[dict], list[dict]]:
    res = spec.engine.resources
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(res.shm_size)}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    src = spec.model.source
    if src.pvc is not None:
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": src.pvc.claim_name, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True})
    else:
        cache_pvc = weights_cache_claim(spec) or (src.hugging_face.cache_pvc_name if src.hugging_face else None)
        cache = {"persistentVolumeClaim": {"claimName": cache_pvc}} if cache_pvc else {"emptyDir": {}}
        volumes.append({"name": "hf-cache", **cache})
        mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    kernel_cache = kernel_cache_volume(spec)
    if kernel_cache is not None:
        volumes.append(kernel_cache[0])
        mounts.append(kernel_cache[1])
    # vLLM, Triton and torch.compile write caches under $HOME and /tmp.
    volumes.append({"name": "tmp", "emptyDir": {}})
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    return volumes, mounts


def _group_context(obj: DeepSeekServing, lay: Layout, index: int) -> dict:
    spec = obj.spec
    name, namespace = obj.metadata["name"], obj.metadata.get("namespace", "default")
    group = group_name(name, index)
    group_selector = group_pod_selector(name, index)
    group_labels = {**labels(name), COMPONENT_LABEL: "engine", **group_selector}
    leader = f"{group}-0.{group}.{namespace}.svc" if lay.multi_node else None

    affinity: dict = {"nodeAffinity": node_affinity(spec)}
    pod_affinity = group_pod_affinity(spec, lay, group_selector)
    if pod_affinity:
        affinity["podAffinity"] = pod_affinity
    if lay.multi_node:
        affinity["podAntiAffinity"] = group_pod_anti_affinity(lay, group_selector)

    cd = spec.placement.compute_domain
    claim_template = None
    if cd.resource_claim_template_name:
        claim_template = cd.resource_claim_template_name
    elif cd.enabled:
        claim_template = f"{compute_domain_name(name, index)}-channel"

    port, rpc_port = spec.engine.port, spec.parallelism.rpc_port
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    service_ports = [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]
    if lay.multi_node:
        ports.append({"name": "dp-rpc", "containerPort": rpc_port, "protocol": "TCP"})
        service_ports.append({"name": "dp-rpc", "port": rpc_port, "targetPort": rpc_port, "protocol": "TCP"})

    res = spec.engine.resources
    gpus = str(lay.gpus_per_pod)
    resources: dict = {
        "requests": {"cpu": str(res.cpu), "memory": str(res.memory), GPU_RESOURCE: gpus},
        "limits": {"memory": str(res.memory), GPU_RESOURCE: gpus},
    }
    if claim_template:
        resources["claims"] = [{"name": "imex-channel"}]

    capabilities: dict = {"drop": ["ALL"]}
    if spec.engine.ipc_lock:
        capabilities["add"] = ["IPC_LOCK"]  # RDMA memory registration; outside Pod Security baseline
    volumes, mounts = _volumes(spec)
    thash = template_hash(spec)
    return {
        "group": group,
        "namespace": namespace,
        "owner": _owner(obj),
        "nodes": lay.nodes,
        "group_labels": group_labels,
        "pod_labels": {**group_labels, ROUTING_LABEL: ROUTING_SERVE},
        "group_selector": group_selector,
        "sts_annotations": {TEMPLATE_HASH_ANNOTATION: thash},
        "pod_annotations": {
            TEMPLATE_HASH_ANNOTATION: thash,
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        },
        "termination_grace_seconds": TERMINATION_GRACE_SECONDS,
        "pod_security_context": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "container_security_context": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": capabilities,
        },
        "affinity": affinity,
        "node_selector": node_selector(spec),
        "tolerations": tolerations(spec),
        "priority_class_name": spec.placement.priority_class_name,
        "claim_template": claim_template,
        "compute_domain": compute_domain_name(name, index),
        "image": spec.engine.image,
        "image_pull_policy": spec.engine.image_pull_policy,
        "command": command(lay),
        "args": vllm_args(spec, lay, leader),
        "env": engine_env(spec, lay),
        "ports": ports,
        "service_ports": service_ports,
        "resources": resources,
        "startup_failure_threshold": STARTUP_BUDGET_SECONDS // 10,
        "volume_mounts": mounts,
        "volumes": volumes,
    }


def render_group(obj: DeepSeekServing, index: int) -> list[dict]:
    """The objects of replica group `index`: [ComputeDomain], headless Service, StatefulSet."""
    lay = layout(obj.spec)
    ctx = _group_context(obj, lay, index)
    out = []
    if obj.spec.placement.compute_domain.enabled:
        out.append(_render("computedomain.yaml.j2", **ctx))
    out.append(_render("group-service.yaml.j2", **ctx))
    out.append(_render("statefulset.yaml.j2", **ctx))
    return out


# Where the API server answers, as (CIDR, port) pairs (controller/api_server.py reads them).
ApiServer = tuple[tuple[str, int], ...]


def _namespace_peers(namespaces: list[str]) -> list[dict]:
    # kubernetes.io/metadata.name is set by the API server on every namespace and cannot be changed, so a
    # namespace cannot claim another's name.
    return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}} for ns in dict.fromkeys(namespaces)]


def router_ranks(spec: DeepSeekServingSpec) -> int:
    """Workers the router makes of each engine pod: one per local data-parallel rank (`http://pod:port@rank`:
    a rank index is what vLLM reads from the X-data-parallel-rank header, local to the pod under
    --data-parallel-hybrid-lb) when routing.dataParallelAware, else the pod alone."""
    ranks = layout(spec).dp_local
    return ranks if spec.routing.data_parallel_aware and ranks > 1 else 1


def _router_args(obj: DeepSeekServing, namespace: str) -> list[str]:
    """The router's command line: discovery of this serving's engines that take traffic, then the policy's
    knobs. --host and --prometheus-host are the pod's every address (its probes and Service reach it there)."""
    spec, routing = obj.spec, obj.spec.routing
    if routing.registers_workers():
        # No discovery: the operator registers the engines with their policy (controller/router_workers.py);
        # --policy is what requests for another model name get.
        args = ["--host", "0.0.0.0", "--port", str(routing.port), "--policy", "consistent_hash",
                router_facts.IGW_FLAG]  # fmt: skip
    else:
        selector = [f"{k}={v}" for k, v in serve_selector(obj.metadata["name"]).items()]
        args = ["--host", "0.0.0.0", "--port", str(routing.port), "--policy", routing.policy, "--service-discovery",
                "--selector", *selector, "--service-discovery-namespace", namespace,
                "--service-discovery-port", str(spec.engine.port)]  # fmt: skip
    args += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(routing.metrics_port)]
    ranks = router_ranks(spec)
    if ranks > 1:
        args += [router_facts.DP_AWARE_FLAG, str(ranks)]
    if routing.policy == "cache_aware":
        ca = routing.cache_aware
        args += ["--cache-threshold", f"{ca.cache_threshold:g}", "--balance-abs-threshold", str(ca.balance_abs_threshold),
                 "--balance-rel-threshold", f"{ca.balance_rel_threshold:g}",
                 "--eviction-interval-secs", str(ca.eviction_interval_seconds), "--max-tree-size", str(ca.max_tree_size)]  # fmt: skip
    return args


def _router_env(routing) -> list[dict]:
    """The router's log level; under sticky_least_loaded, its session expiry, which has no flag."""
    env = [{"name": router_facts.LOG_ENV, "value": routing.log_level}]
    if routing.policy == "sticky_least_loaded":
        idle = routing.sticky_least_loaded.session_idle_seconds
        env.append({"name": router_facts.SLL_EXPIRY_ENV, "value": str(idle)})
    return env


def _router_context(obj: DeepSeekServing, namespace: str) -> dict:
    name, routing = obj.metadata["name"], obj.spec.routing
    res = routing.resources
    return {
        "router": router_name(name),
        "router_labels": {**labels(name), COMPONENT_LABEL: "router"},
        "router_selector": router_selector(name),
        "reads_api": not routing.registers_workers(),
        "router_port": routing.port,
        "metrics_port": routing.metrics_port,
        "replicas": routing.replicas,
        "pod_annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(routing.metrics_port),
            "prometheus.io/path": "/metrics",
        },
        "termination_grace_seconds": TERMINATION_GRACE_SECONDS,
        "pod_security_context": {
            "runAsNonRoot": True,
            "runAsUser": ROUTER_UID,
            "runAsGroup": ROUTER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "container_security_context": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "image": routing.image,
        "image_pull_policy": routing.image_pull_policy,
        "args": _router_args(obj, namespace),
        "env": _router_env(routing),
        "ports": [
            {"name": "http", "containerPort": routing.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": routing.metrics_port, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": str(res.cpu), "memory": str(res.memory)},
            # equal to the requests, the pod is Guaranteed: what the static CPU manager gives whole cores to
            "limits": {"memory": str(res.memory), **({"cpu": str(res.cpu)} if res.dedicated_cpus else {})},
        },
        "liveness_path": router_facts.LIVENESS_PATH,
        "readiness_path": router_facts.READINESS_PATH,
        "router_node_selector": dict(routing.node_selector),
        "router_tolerations": [t.dump() for t in routing.tolerations],
    }


def _api_server_peers(api_server: ApiServer) -> list[dict]:
    """Egress rules to the API server, one per port: its addresses as single-address blocks."""
    by_port: dict[int, list[str]] = {}
    for cidr, port in api_server:
        by_port.setdefault(port, []).append(cidr)
    return [{"to": [{"ipBlock": {"cidr": c}} for c in cidrs], "ports": [{"port": port, "protocol": "TCP"}]}
            for port, cidrs in sorted(by_port.items())]  # fmt: skip


def render_shared(obj: DeepSeekServing, operator_namespace: str = OPERATOR_NAMESPACE,
                  api_server: ApiServer = ()) -> list[dict]:  # fmt: skip
    """Objects shared by all groups (spec.startup's prefetch and pre-pull included): the client Service, the engines' PodDisruptionBudget, [their
    NetworkPolicy], [the router: ServiceAccount, Role, RoleBinding, Deployment, its PodDisruptionBudget and
    NetworkPolicy], [an InferencePool]. `operator_namespace` is where the operator runs (its pods may reach
    the engines' API port). `api_server`: where the API server answers, as (CIDR, port) pairs; given, the
    router's NetworkPolicy lets its pods connect there and to the serving's engines only; empty, it leaves
    their egress open (controller/api_server.py)."""
    name, namespace = obj.metadata["name"], obj.metadata.get("namespace", "default")
    routing = obj.spec.routing
    ctx = {
        "service": service_name(name),
        "pdb": pdb_name(name),
        "policy": network_policy_name(name),
        "namespace": namespace,
        "labels": labels(name),
        "engine_selector": engine_selector(name),
        "service_selector": router_selector(name) if routing.enabled else serve_selector(name),
        "client_affinity_seconds": router_facts.CLIENT_AFFINITY_SECONDS
        if routing.enabled and routing.policy in router_facts.STATEFUL_POLICIES else None,
        "owner": _owner(obj),
        "port": obj.spec.engine.port,
        "nodes": layout(obj.spec).nodes,
    }
    out = [_render("service.yaml.j2", **ctx), _render("pdb.yaml.j2", **ctx)]
    netpol = obj.spec.network_policy
    client_peers = [{"podSelector": {}}] + _namespace_peers(netpol.allowed_namespaces)
    monitoring_peers = _namespace_peers(netpol.monitoring_namespaces)
    if netpol.enabled:
        out.append(
            _render(
                "networkpolicy.yaml.j2",
                **ctx,
                client_peers=client_peers,
                router_selector=router_selector(name) if routing.enabled else None,
                monitoring_peers=monitoring_peers,
                operator_peers=_namespace_peers([operator_namespace]),
            )
        )
    if routing.enabled:
        rctx = {**ctx, **_router_context(obj, namespace)}
        out.append(_render("router-serviceaccount.yaml.j2", **rctx))
        if not routing.registers_workers():  # discovery reads pods; a router the operator feeds reads nothing
            out.append(_render("router-role.yaml.j2", **rctx))
            out.append(_render("router-rolebinding.yaml.j2", **rctx))
        out.append(_render("router-deployment.yaml.j2", **rctx))
        if routing.replicas >= 2:
            out.append(_render("router-pdb.yaml.j2", **rctx))
        if netpol.enabled:
            out.append(_render("router-networkpolicy.yaml.j2", **rctx, client_peers=client_peers,
                               monitoring_peers=monitoring_peers, operator_peers=_namespace_peers([operator_namespace]),
                               api_server_egress=_api_server_peers(api_server)))  # fmt: skip
    if routing.inference_pool.enabled:
        picker = routing.inference_pool.endpoint_picker_ref
        out.append(_render("inferencepool.yaml.j2", **ctx, pool=inference_pool_name(name),
                           pool_selector=serve_selector(name), picker=picker.dump() if picker else None))  # fmt: skip
    return out + render_startup(obj)


def render_startup(obj: DeepSeekServing) -> list[dict]:
    """The start-up children of spec.startup: [the weights prefetch Job or DaemonSet], [the image pre-pull
    DaemonSet]."""
    ctx = {"namespace": obj.metadata.get("namespace", "default"), "owner": _owner(obj)}
    return [_render(template, **c) for template, c in startup_objects(obj, ctx)]


def render_serving(obj: DeepSeekServing, replicas: int | None = None,
                   operator_namespace: str = OPERATOR_NAMESPACE, api_server: ApiServer = ()) -> list[dict]:  # fmt: skip
    """Every object of a validated serving, groups 0..replicas-1 (default spec.replicas)."""
    count = obj.spec.replicas if replicas is None else replicas
    out: list[dict] = []
    for i in range(count):
        out += render_group(obj, i)
    return out + render_shared(obj, operator_namespace, api_server)


def render(cr: dict, operator_namespace: str = OPERATOR_NAMESPACE, api_server: ApiServer = ()) -> list[dict]:
    """Validate a DeepSeekServing dict and render it. Raises SpecError naming each bad field."""
    return render_serving(parse_serving(cr), operator_namespace=operator_namespace, api_server=api_server)

