"""The router the operator renders per serving (spec.routing): its Deployment and RBAC, the Service pointing at
it, the engines' label and flag, the InferencePool, and the errors of the routing fields. The router's command
line is parsed by vllm-router 0.1.17's own launcher, so a flag it does not know (or reads differently) fails."""

from __future__ import annotations

import pytest
from flashserve.api.validation import SpecError, parse_serving
from flashserve.controller.observe import ROUTER_CONTAINER
from flashserve.facts import router as router_facts
from flashserve.render.naming import ROUTING_LABEL, ROUTING_SERVE, router_name
from flashserve.render.renderer import render, template_hash

from tests.builders import by_kind, cr
from tests.pod_security import violations

NS = "team-a"


def _render(spec: dict, name: str = "flash") -> list[dict]:
    c = cr(spec, name=name)
    c["metadata"]["namespace"] = NS
    return render(c)


def _router(objs: list[dict]) -> dict:
    (dep,) = by_kind(objs, "Deployment")
    return dep


def _container(objs: list[dict]) -> dict:
    (c,) = _router(objs)["spec"]["template"]["spec"]["containers"]
    return c


def _engine_args(objs: list[dict]) -> list[str]:
    return by_kind(objs, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def _client_service(objs: list[dict]) -> dict:
    return next(s for s in by_kind(objs, "Service") if s["spec"].get("clusterIP") != "None")


def test_default_router_command_line_is_the_contract():
    c = _container(_render({}))
    assert c["name"] == ROUTER_CONTAINER and c["command"] == ["vllm-router"]
    assert c["image"] == router_facts.ROUTER_IMAGE
    assert c["args"] == [
        "--host", "0.0.0.0", "--port", "8000", "--policy", "consistent_hash", "--service-discovery",
        "--selector", "flashserve.io/serving=flash", "app.kubernetes.io/component=engine", "flashserve.io/routing=serve",
        "--service-discovery-namespace", NS, "--service-discovery-port", "8000",
        "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000",
        "--intra-node-data-parallel-size", "4",
    ]  # fmt: skip
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 29000, "protocol": "TCP"}]  # fmt: skip
    assert c["env"] == [{"name": "RUST_LOG", "value": "warn"}]


@pytest.mark.parametrize("level", router_facts.LOG_LEVELS)
def test_the_log_level_goes_in_rust_log_not_the_flag_the_router_misreads(level):
    c = _container(_render({"routing": {"logLevel": level}}))
    assert c["env"] == [{"name": router_facts.LOG_ENV, "value": level}]
    assert "--log-level" not in c["args"]


@pytest.mark.parametrize("policy", router_facts.POLICIES)
def test_vllm_router_reads_the_rendered_command_line_as_meant(policy):
    launcher = pytest.importorskip("vllm_router.launch_router", reason="vllm-router 0.1.17 is installed with `make install`")
    spec = {"engine": {"port": 8100}, "routing": {"policy": policy, "port": 8200, "metricsPort": 29100,
                                                  "cacheAware": {"cacheThreshold": 0.55, "balanceAbsThreshold": 8,
                                                                 "balanceRelThreshold": 1.25, "evictionIntervalSeconds": 30,
                                                                 "maxTreeSize": 1048576}}}  # fmt: skip
    args = launcher.parse_router_args(_container(_render(spec))["args"])
    assert (args.host, args.port, args.policy) == ("0.0.0.0", 8200, policy)
    assert args.service_discovery and args.service_discovery_namespace == NS and args.service_discovery_port == 8100
    assert args.selector == {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "engine",
                             ROUTING_LABEL: ROUTING_SERVE}  # fmt: skip
    assert (args.prometheus_host, args.prometheus_port) == ("0.0.0.0", 29100)
    assert args.intra_node_data_parallel_size == 4  # the pod's local ranks: one GB200 node, TP 1
    knobs = (args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold, args.eviction_interval_secs,
             args.max_tree_size)  # fmt: skip
    if policy == "cache_aware":
        assert knobs == (0.55, 8, 1.25, 30, 1048576)
    else:  # the knobs are left out, so the router's defaults stand (they do nothing for other policies)
        assert knobs == (router_facts.CACHE_THRESHOLD, router_facts.BALANCE_ABS_THRESHOLD,
                         router_facts.BALANCE_REL_THRESHOLD, router_facts.EVICTION_INTERVAL_SECS,
                         router_facts.MAX_TREE_SIZE)  # fmt: skip


def test_a_policy_taken_through_the_worker_api_renders_an_igw_router_without_discovery():
    """rendezvous_hash: --policy refuses it (tests/router/test_vllm_router.py), so the router runs in IGW mode,
    discovers nothing, and the operator registers the engines. Its policy admits the operator on its port, as
    under every policy (the operator lists the workers of discovering routers to confirm drains)."""
    launcher = pytest.importorskip("vllm_router.launch_router", reason="installed with `make install`")
    objs = _render({"routing": {"policy": "rendezvous_hash", "port": 8200, "metricsPort": 29100}})
    args = launcher.parse_router_args(_container(objs)["args"])
    assert args.enable_igw and not args.service_discovery and args.worker_urls == []
    assert (args.host, args.port, args.policy) == ("0.0.0.0", 8200, "consistent_hash")
    assert args.intra_node_data_parallel_size == 4
    assert (args.prometheus_host, args.prometheus_port) == ("0.0.0.0", 29100)
    (policy,) = [p for p in by_kind(objs, "NetworkPolicy") if p["metadata"]["name"] == router_name("flash")]
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "flashserve-system"}}}
    assert {"from": [operator], "ports": [{"port": 8200, "protocol": "TCP"}]} in policy["spec"]["ingress"]
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding"), "the router reads nothing of the API"
    (deployment,) = by_kind(objs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, "and holds no token"
    for other in router_facts.POLICIES:
        (p,) = [p for p in by_kind(_render({"routing": {"policy": other}}), "NetworkPolicy")
                if p["metadata"]["name"] == router_name("flash")]  # fmt: skip
        assert {"from": [operator], "ports": [{"port": 8000, "protocol": "TCP"}]} in p["spec"]["ingress"], other
        (d,) = by_kind(_render({"routing": {"policy": other}}), "Deployment")
        assert d["spec"]["template"]["spec"]["automountServiceAccountToken"] is True, other  # its pod watch


def test_the_api_defaults_are_the_routers_own():
    launcher = pytest.importorskip("vllm_router.launch_router", reason="vllm-router 0.1.17 is installed with `make install`")
    defaults = launcher.parse_router_args([])
    ca = parse_serving(cr({})).spec.routing.cache_aware
    assert (ca.cache_threshold, ca.balance_abs_threshold, ca.balance_rel_threshold, ca.eviction_interval_seconds,
            ca.max_tree_size) == (defaults.cache_threshold, defaults.balance_abs_threshold,
                                  defaults.balance_rel_threshold, defaults.eviction_interval_secs,
                                  defaults.max_tree_size)  # fmt: skip
    assert defaults.prometheus_port == router_facts.DEFAULT_METRICS_PORT


def test_router_pod_is_locked_down_and_probed_on_its_real_routes():
    objs = _render({})
    pod = _router(objs)["spec"]["template"]["spec"]
    assert violations(pod, "restricted") == []
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]} and not sc["allowPrivilegeEscalation"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["serviceAccountName"] == router_name("flash") and pod["automountServiceAccountToken"] is True
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    ann = _router(objs)["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == "29000"


@pytest.mark.parametrize("cpu", ["2", 2, "16"])
def test_dedicated_cpus_make_the_router_pod_guaranteed(cpu):
    """Limits equal to the requests for CPU and memory: the Guaranteed QoS class, the one the kubelet's static
    CPU manager gives whole cores to."""
    res = _container(_render({"routing": {"resources": {"cpu": cpu, "dedicatedCpus": True}}}))["resources"]
    assert res["limits"] == res["requests"] == {"cpu": str(cpu), "memory": "2Gi"}


def test_router_rbac_reads_pods_and_nothing_else():
    objs = _render({})
    name = router_name("flash")
    (role,) = by_kind(objs, "Role")
    assert role["metadata"]["name"] == name
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    (binding,) = by_kind(objs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
    (sa,) = by_kind(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == name


def test_labels_and_selectors_of_router_engines_and_service():
    objs = _render({"replicas": 2})
    dep = _router(objs)
    router_sel = {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "router"}
    assert dep["spec"]["selector"]["matchLabels"] == router_sel
    assert router_sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert _client_service(objs)["spec"]["selector"] == router_sel
    for sts in by_kind(objs, "StatefulSet"):
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[ROUTING_LABEL] == ROUTING_SERVE and pod_labels["app.kubernetes.io/component"] == "engine"
        assert ROUTING_LABEL not in sts["spec"]["selector"]["matchLabels"], "a drained pod stays its group's"


def test_router_budget_only_with_two_replicas_or_more():
    def budgets(replicas: int) -> list[dict]:
        objs = _render({"routing": {"replicas": replicas}})
        return [p for p in by_kind(objs, "PodDisruptionBudget") if p["metadata"]["name"] == router_name("flash")]

    assert budgets(1) == []
    (pdb,) = budgets(2)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert _router(_render({"routing": {"replicas": 3}}))["spec"]["replicas"] == 3


def test_routing_off_gives_the_plain_service_over_serving_engines():
    objs = _render({"routing": {"enabled": False, "policy": "cache_aware"}})
    assert not {"Deployment", "ServiceAccount", "Role", "RoleBinding"} & {o["kind"] for o in objs}
    assert _client_service(objs)["spec"]["selector"] == {
        "flashserve.io/serving": "flash", "app.kubernetes.io/component": "engine", ROUTING_LABEL: ROUTING_SERVE}
    assert "--enable-scale-out" not in _engine_args(objs), "no router asks the engines to render"
    assert [p["metadata"]["name"] for p in by_kind(objs, "PodDisruptionBudget")] == ["flash"]


def test_only_cache_aware_gives_the_engines_the_render_routes():
    for policy in router_facts.POLICIES:
        args = _engine_args(_render({"routing": {"policy": policy}}))
        assert ("--enable-scale-out" in args) == (policy == "cache_aware"), policy


def test_routing_changes_restart_engines_only_when_their_command_line_changes():
    h = lambda spec: template_hash(parse_serving(cr(spec)).spec)  # noqa: E731
    base = h({})
    assert base == h({"routing": {"enabled": False}}) == h({"routing": {"policy": "power_of_two", "replicas": 5}})
    assert h({"routing": {"policy": "cache_aware"}}) != base
    assert h({"routing": {"policy": "cache_aware", "enabled": False}}) == base


def test_inference_pool_selects_the_serving_engines_on_the_engine_port():
    assert not by_kind(_render({}), "InferencePool"), "off by default"
    objs = _render({"engine": {"port": 8100}, "routing": {"inferencePool": {"enabled": True}}})
    (pool,) = by_kind(objs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["metadata"]["name"] == "flash"
    assert pool["spec"] == {
        "selector": {"matchLabels": {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "engine",
                                     ROUTING_LABEL: ROUTING_SERVE}},
        "targetPorts": [{"number": 8100}],
    }  # fmt: skip
    picked = _render({"routing": {"inferencePool": {"enabled": True, "endpointPickerRef": {
        "name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}}})  # fmt: skip
    assert by_kind(picked, "InferencePool")[0]["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"}
    # The pool is independent of the router: routing off keeps it.
    assert by_kind(_render({"routing": {"enabled": False, "inferencePool": {"enabled": True}}}), "InferencePool")


@pytest.mark.parametrize(
    ("routing", "path", "words"),
    [
        ({"metricsPort": 8000}, "spec.routing.metricsPort", "must differ"),
        ({"policy": "kv_aware"}, "spec.routing.policy", "consistent_hash"),
        ({"logLevel": "warning"}, "spec.routing.logLevel", "'warn'"),
        ({"replicas": 0}, "spec.routing.replicas", "greater than or equal to 1"),
        ({"port": 80}, "spec.routing.port", "greater than or equal to 1024"),
        ({"cacheAware": {"cacheThreshold": 1.5}}, "spec.routing.cacheAware.cacheThreshold", "less than or equal to 1"),
        ({"cacheAware": {"balanceRelThreshold": 0.5}}, "spec.routing.cacheAware.balanceRelThreshold", "greater than"),
        ({"image": "has space"}, "spec.routing.image", "image reference"),
        ({"resources": {"cpu": "abc"}}, "spec.routing.resources.cpu", "positive Kubernetes quantity"),
        ({"resources": {"memory": "0"}}, "spec.routing.resources.memory", "not positive"),
        ({"resources": {"dedicatedCpus": True, "cpu": "1500m"}}, "spec.routing.resources.cpu", "whole number"),
        ({"resources": {"dedicatedCpus": True, "cpu": "0.5"}}, "spec.routing.resources.cpu", "dedicatedCpus: false"),
        ({"resources": {"dedicatedCpus": True, "cpu": "2000m"}}, "spec.routing.resources.cpu", "written as digits"),
        ({"inferencePool": {"enabled": True, "endpointPickerRef": {"name": "epp"}}},
         "spec.routing.inferencePool.endpointPickerRef.port", "set port.number"),
        ({"inferencePool": {"endpointPickerRef": {"name": "epp", "kind": "not/a/kind"}}},
         "spec.routing.inferencePool.endpointPickerRef.kind", "pattern"),
        ({"inferencePool": {"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Maybe"}}},
         "spec.routing.inferencePool.endpointPickerRef.failureMode", "FailOpen"),
        ({"nodeSelector": {"bad key!": "x"}}, "spec.routing.nodeSelector.bad key!", "qualified name"),
        ({"nodeSelector": {"pool": "bad value!"}}, "spec.routing.nodeSelector.pool", "label value"),
        ({"nodeSelector": {"a" * 260 + "/x": "y"}}, f"spec.routing.nodeSelector[{'a' * 40!r}]", "shorten it"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.routing.tolerations[0].operator",
         "set the key or operator: Exists"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.routing.tolerations[0].value",
         "remove the value"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "spec.routing.tolerations[0].tolerationSeconds",
         "NoExecute"),
    ],
)  # fmt: skip
def test_bad_routing_fields_are_named_with_the_fix(routing, path, words):
    with pytest.raises(SpecError) as err:
        parse_serving(cr({"routing": routing}))
    assert any(e.path == path and words in e.message for e in err.value.errors), err.value.errors


def test_a_picker_of_another_kind_needs_no_port():
    objs = _render({"routing": {"inferencePool": {"enabled": True, "endpointPickerRef": {
        "group": "gateway.example.com", "kind": "Picker", "name": "epp"}}}})  # fmt: skip
    assert "port" not in by_kind(objs, "InferencePool")[0]["spec"]["endpointPickerRef"]


def test_the_router_lands_where_the_scheduler_puts_it_unless_the_spec_pins_it():
    pod = _router(_render({}))["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod and "affinity" not in pod
    spec = {"routing": {"nodeSelector": {"node-pool": "cpu"},
                        "tolerations": [{"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]}}
    objs = _render(spec)
    pod = _router(objs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-pool": "cpu"}
    assert pod["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]
    engines = by_kind(objs, "StatefulSet")[0]["spec"]["template"]["spec"]
    assert "node-pool" not in engines.get("nodeSelector", {}) and pod["tolerations"] != engines["tolerations"]
    assert template_hash(parse_serving(cr(spec)).spec) == template_hash(parse_serving(cr({})).spec), (
        "pinning the router restarts no engine")


@pytest.mark.parametrize(("spec", "ranks"), [
    ({}, 4),                                                                  # GB200 node, TP 1: 4 ranks a pod
    ({"parallelism": {"tensorParallelSize": 2}}, 2),                          # TP 2: 2 ranks a pod
    ({"parallelism": {"tensorParallelSize": 4}}, None),                       # one rank a pod: nothing to pick
    ({"routing": {"dataParallelAware": False}}, None),                        # off: vLLM picks the rank
    ({"parallelism": {"nodesPerReplica": 2}}, 4),                             # hybrid LB: ranks local to the pod
])  # fmt: skip
def test_the_router_picks_a_rank_of_the_pod_unless_there_is_one_or_it_is_off(spec, ranks):
    args = _container(_render(spec))["args"]
    flag = router_facts.DP_AWARE_FLAG
    assert (args[args.index(flag) + 1] if flag in args else None) == (None if ranks is None else str(ranks))


@pytest.mark.parametrize("policy", router_facts.POLICIES)
def test_a_policy_with_state_per_router_pod_keeps_each_client_on_one_pod(policy):
    """cache_aware's prefix tree and sticky_least_loaded's session table live in each router pod: the client
    Service sends a client to one pod (ClientIP affinity). Stateless policies, and routing off, write None,
    so that turning a stateful policy off is a change the operator applies."""
    svc = _client_service(_render({"routing": {"policy": policy}}))["spec"]
    if policy in ("cache_aware", "sticky_least_loaded"):
        assert svc["sessionAffinity"] == "ClientIP"
        assert svc["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    else:
        assert svc["sessionAffinity"] == "None" and "sessionAffinityConfig" not in svc
    off = _client_service(_render({"routing": {"policy": policy, "enabled": False}}))["spec"]
    assert off["sessionAffinity"] == "None" and "sessionAffinityConfig" not in off


def test_turning_a_stateful_policy_off_is_a_change_to_apply():
    from flashserve.controller.plan import _needs_apply

    sticky = _client_service(_render({"routing": {"policy": "sticky_least_loaded"}}))
    plain = _client_service(_render({"routing": {"policy": "consistent_hash"}}))
    assert _needs_apply(plain, sticky) and _needs_apply(sticky, plain)
    assert not _needs_apply(sticky, sticky)


def test_sticky_least_loaded_gets_its_session_expiry_in_the_router_env_and_other_policies_none():
    """The binary has no flag for it: sessionIdleSeconds reaches the router as VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S
    (tests/router/test_vllm_router.py: the binary reads it), only under the policy that keeps a session table."""
    def env(routing: dict) -> dict:
        (c,) = _router(_render({"routing": routing}))["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in c["env"]}

    assert env({"policy": "sticky_least_loaded"})[router_facts.SLL_EXPIRY_ENV] == "120"
    given = {"policy": "sticky_least_loaded", "stickyLeastLoaded": {"sessionIdleSeconds": 900}}
    assert env(given)[router_facts.SLL_EXPIRY_ENV] == "900"
    for policy in ("consistent_hash", "cache_aware"):
        assert router_facts.SLL_EXPIRY_ENV not in env({"policy": policy})
    with pytest.raises(SpecError) as err:
        parse_serving(cr({"routing": {"stickyLeastLoaded": {"sessionIdleSeconds": 5}}}))
    assert [e.path for e in err.value.errors] == ["spec.routing.stickyLeastLoaded.sessionIdleSeconds"], err.value.errors
    assert "60" in err.value.errors[0].message
