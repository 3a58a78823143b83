"""The Helm chart: lint, golden renderings, Kubernetes 1.35 schema, least-privilege RBAC checked against the
operator's code, the CRD copy, manifests/install.yaml, values schema, and the Prometheus rules and dashboard
queries checked with promtool."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.conftest import CHART, COMBOS, NAMESPACE, RELEASE, ROOT
from tests.k8s_schema import validate

GOLDEN = Path(__file__).resolve().parent / "golden"
CRD = ROOT / "crds" / "flashserve.io_deepseekservings.yaml"
INSTALL = ROOT / "manifests" / "install.yaml"
# The arguments mk/chart.mk's `make manifests` renders manifests/install.yaml with.
INSTALL_ARGS = ["template", "flashserve", str(CHART), "--namespace", "flashserve-system", "--include-crds",
                "--set", "createNamespace=true"]  # fmt: skip
OP = "flashserve-operator"
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

# Exactly the access the operator has in a namespace it manages: (API group, resource) -> verbs.
# Least privilege: a verb here that the code does not use, or a use the code makes that is not here, fails
# test_namespaced_rules_match_what_the_code_does.
NAMESPACED_ACCESS = {
    ("flashserve.io", "deepseekservings"): {"get", "list", "watch", "patch"},
    ("flashserve.io", "deepseekservings/status"): {"patch"},
    ("flashserve.io", "deepseekservings/finalizers"): {"update"},
    ("apps", "statefulsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch", "patch", "delete"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("apps", "daemonsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "serviceaccounts"): {"get", "list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "list", "watch", "create", "patch", "delete"},
    ("inference.networking.k8s.io", "inferencepools"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "events"): {"create", "list"},
    ("resource.nvidia.com", "computedomains"): {"get", "create", "patch", "delete"},
}
# Kinds the reconciler deletes (plan.py: groups beyond replicas, pods of a group in a rollout, a NetworkPolicy
# turned off, children under the names of an earlier version).
DELETED_KINDS = {"StatefulSet", "Service", "Pod", "ComputeDomain", "NetworkPolicy", "PodDisruptionBudget",
                 "Deployment", "ServiceAccount", "Role", "RoleBinding", "InferencePool", "DaemonSet", "Job"}  # fmt: skip


# A serving that makes the renderer produce every kind it can: multi-node groups with a ComputeDomain, and
# the engines' NetworkPolicy. It has a uid, as a stored serving does, so the children get owner references.
_FULL_SERVING = {
    "apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
    "metadata": {"name": "flash", "namespace": "team-a", "uid": "0b9f7d3e-5c1a-4e8b-9d2f-6a4c3b2e1f00"},
    "spec": {"parallelism": {"nodesPerReplica": 2}, "networkPolicy": {"enabled": True},
             "placement": {"accelerator": "GB200", "computeDomain": {"enabled": True}},
             "routing": {"inferencePool": {"enabled": True}},
             "startup": {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"}, "imagePrepull": {"enabled": True}}},
}  # fmt: skip


def _golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file for {name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"the chart renders {name} differently: review, then UPDATE_GOLDEN=1"


def _rules(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


# ------------------------------------------------------------------------------------------ lint, golden


@pytest.mark.parametrize("combo", COMBOS)
def test_helm_lint(helm, combo):
    proc = subprocess.run([helm, "lint", "--strict", str(CHART), *COMBOS[combo]], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("combo", COMBOS)
def test_golden(render, combo):
    _golden(combo, render(*COMBOS[combo]).text)


@pytest.mark.parametrize("combo", COMBOS)
def test_every_object_is_valid(render, combo):
    docs = render(*COMBOS[combo]).docs
    assert docs
    for doc in docs:
        if doc["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
            continue  # CRD kinds: checked structurally and with promtool below
        validate(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if doc["kind"] not in {"ClusterRole", "ClusterRoleBinding", "Namespace"}:
            assert doc["metadata"]["namespace"], f"{doc['kind']} {doc['metadata']['name']} has no namespace"


def test_crd_in_chart_is_the_generated_one():
    assert (CHART / "crds" / CRD.name).read_bytes() == CRD.read_bytes(), "run `make manifests` (copies the CRD)"
    assert [p.name for p in (CHART / "crds").iterdir()] == [CRD.name]


def test_install_manifest_is_the_rendered_chart(helm):
    proc = subprocess.run([helm, *INSTALL_ARGS], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = INSTALL.read_text()
    body = text[text.index("---"):]
    assert body == proc.stdout, "manifests/install.yaml is stale: run `make manifests`"
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds[:2] == ["CustomResourceDefinition", "Namespace"], "CRD and Namespace must come first"
    assert docs[0] == yaml.safe_load(CRD.read_text())
    assert docs[1]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service"} <= set(kinds)
    assert not PROMETHEUS_OPERATOR_KINDS & set(kinds), "install.yaml must not need the Prometheus Operator"


# ----------------------------------------------------------------------------------------------- RBAC


def test_namespaced_rules_match_what_the_code_does(render):
    """Derive the API use from the operator's code and compare with the chart's role, both ways."""
    import flashserve.controller.handlers  # noqa: F401  (registers the watches)
    import kopf
    from flashserve.controller import kube
    from flashserve.render.renderer import render as render_serving

    role = _rules(render().find("ClusterRole", OP))
    assert role == NAMESPACED_ACCESS

    needed: dict[tuple[str, str], set[str]] = {}

    def need(group: str, resource: str, *verbs: str) -> None:
        needed.setdefault((group, resource), set()).update(verbs)

    # The shared weights cache is filled by a Job, the node-local one by a DaemonSet: one serving of each.
    shared_cache = {**_FULL_SERVING, "spec": {**_FULL_SERVING["spec"], "startup": {
        "weightsCache": {"scope": "Shared", "claimName": "weights"}}}}  # fmt: skip
    children = render_serving(_FULL_SERVING) + render_serving(shared_cache)
    applied = {(o["apiVersion"], o["kind"]) for o in children}
    if any(ref.get("blockOwnerDeletion") for o in children for ref in o["metadata"].get("ownerReferences", [])):
        # OwnerReferencesPermissionEnforcement: setting blockOwnerDeletion needs update on the owner's finalizers.
        need("flashserve.io", "deepseekservings/finalizers", "update")
    assert ("resource.nvidia.com/v1beta1", "ComputeDomain") in applied and ("networking.k8s.io/v1", "NetworkPolicy") in applied
    assert {("apps/v1", "Deployment"), ("rbac.authorization.k8s.io/v1", "Role"),
            ("inference.networking.k8s.io/v1", "InferencePool")} <= applied  # fmt: skip
    # A Role may grant only verbs its maker holds (the API server's escalation check): the router's Roles
    # grant nothing the operator lacks.
    for granted in (o for o in children if o["kind"] == "Role"):
        for rule in granted["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    need(group, resource, *rule["verbs"])
    # The drain (issue 18): a group leaves routing when its pods' flashserve.io/routing label becomes `drain`.
    need("", "pods", "patch")
    for (api_version, kind), path in kube._PATHS.items():
        group = api_version.rpartition("/")[0]
        resource = path.split("/")[-2]
        assert re.fullmatch(r"[a-z]+", resource), path
        if (api_version, kind) in applied:
            # Server-side apply creates what is missing; Kube.get reads a name first, to check who owns it.
            need(group, resource, "create", "patch", "get")
        if kind in DELETED_KINDS:
            need(group, resource, "delete")
    assert applied <= set(kube._PATHS), "the renderer makes a kind kube.py cannot apply"
    registry = kopf.get_default_registry() if hasattr(kopf, "get_default_registry") else kopf._core.intents.registries.get_default_registry()  # noqa: E501
    for h in [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]:
        need(h.selector.group or "", h.selector.plural or h.selector.any_name, "list", "watch")
    need("flashserve.io", "deepseekservings", "patch")  # Kube.patch_spec_replicas, Kube.annotate (autoscaler)
    need("flashserve.io", "deepseekservings/status", "patch")  # Kube.patch_status
    need("", "events", "create")  # kopf.event
    need("", kube.EVENTS_PATH.split("/")[-1], "list")  # Kube.failed_create_message: why pods are refused

    for key, verbs in needed.items():
        assert verbs <= role.get(key, set()), f"the operator needs {sorted(verbs)} on {key}, the chart grants {role.get(key)}"
    for key, verbs in role.items():
        # `get` on something listed adds nothing; everything else granted must be used.
        extra = verbs - needed.get(key, set()) - ({"get"} if "list" in needed.get(key, set()) else set())
        assert not extra, f"the chart grants {sorted(extra)} on {key}, which the operator does not use"


def test_rbac_is_least_privilege_everywhere(render):
    for combo in COMBOS:
        for doc in render(*COMBOS[combo]).docs:
            if doc["kind"] not in ("ClusterRole", "Role"):
                continue
            for rule in doc["rules"]:
                text = json.dumps(rule)
                assert "*" not in text, f"wildcard in {doc['kind']} {doc['metadata']['name']}: {rule}"
                assert "secrets" not in rule.get("resources", []), f"{doc['metadata']['name']} touches Secrets"
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_the_api_servers_addresses_are_readable_by_name_only_in_every_variant(render):
    """The operator reads one object for the router pods' egress rule (controller/api_server.py): the chart
    lets it get that one by name, in the namespace it lives in, and nothing else there."""
    from flashserve.controller import api_server, kube

    for combo in COMBOS:
        role = render(*COMBOS[combo]).find("Role", f"{OP}-api-server-addresses", api_server.NAMESPACE)
        assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                                  "resourceNames": [api_server.SLICE], "verbs": ["get"]}], combo  # fmt: skip
        binding = render(*COMBOS[combo]).find("RoleBinding", f"{OP}-api-server-addresses", api_server.NAMESPACE)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OP, "namespace": NAMESPACE}]
    assert ("discovery.k8s.io/v1", "EndpointSlice") in kube._PATHS


def test_cluster_wide_by_default(render):
    r = render()
    assert r.find("ClusterRoleBinding", OP)["subjects"] == [{"kind": "ServiceAccount", "name": OP, "namespace": NAMESPACE}]
    assert not r.all("RoleBinding", OP)
    discovery = _rules(r.find("ClusterRole", f"{OP}-discovery"))
    assert discovery == {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"}}
    lease = r.find("Role", f"{OP}-leader-election", NAMESPACE)
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [OP], "verbs": ["get", "update"]},
    ]
    args = r.find("Deployment", OP)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--namespace")]


def test_watch_namespaces_gives_a_role_per_namespace(render):
    r = render(*COMBOS["watch-namespaces"])
    assert not r.all("ClusterRole", OP) and not r.all("ClusterRoleBinding", OP)
    for ns in ("team-a", "team-b"):
        assert _rules(r.find("Role", OP, ns)) == NAMESPACED_ACCESS
        binding = r.find("RoleBinding", OP, ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OP}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OP, "namespace": NAMESPACE}]
    # kopf lists and watches namespaces when it serves a list of them
    assert _rules(r.find("ClusterRole", f"{OP}-discovery"))[("", "namespaces")] == {"list", "watch"}
    args = r.find("Deployment", OP)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_finalizers_subresource_in_every_variant(render):
    """Without it every child create fails under OwnerReferencesPermissionEnforcement (OpenShift)."""
    for r, kind, ns in ((render(), "ClusterRole", None), (render(*COMBOS["watch-namespaces"]), "Role", "team-b")):
        assert _rules(r.find(kind, OP, ns))[("flashserve.io", "deepseekservings/finalizers")] == {"update"}


def test_compute_domains_can_be_left_out(render):
    role = _rules(render("--set", "rbac.computeDomains=false").find("ClusterRole", OP))
    assert ("resource.nvidia.com", "computedomains") not in role


def test_user_roles_aggregate(render):
    r = render()
    view = r.find("ClusterRole", f"{RELEASE}-deepseekservings-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in view["rules"])
    edit = r.find("ClusterRole", f"{RELEASE}-deepseekservings-edit")["metadata"]["labels"]
    assert edit["rbac.authorization.k8s.io/aggregate-to-edit"] == edit["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert not render("--set", "rbac.aggregateToDefaultRoles=false").all("ClusterRole", f"{RELEASE}-deepseekservings-view")


# ------------------------------------------------------------------------------------------ Deployment


def test_deployment_is_restricted_and_highly_available(render):
    r = render()
    dep = r.find("Deployment", OP)
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OP
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/flashserve/flashserve-operator:0.1.0"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"mountPath": "/tmp", "name": "tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert c["env"][0] == {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8081, "metrics": 8082}
    svc = r.find("Service", f"{OP}-metrics")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert r.find("PodDisruptionBudget", OP)["spec"]["maxUnavailable"] == 1
    assert r.find("ServiceAccount", OP)["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is True


def test_operator_pod_meets_restricted_pod_security(render):
    from tests.pod_security import violations

    pod = render().find("Deployment", OP)["spec"]["template"]["spec"]
    assert violations(pod, "restricted") == []


def test_operator_network_policy(render):
    """Evaluated with Kubernetes' NetworkPolicy semantics: Prometheus's namespace reaches the metrics and
    health ports and nothing else; other namespaces reach nothing; off with one value."""
    from tests.netpol_eval import Pod, allowed

    r = render()
    pol = r.find("NetworkPolicy", OP, NAMESPACE)
    dep = r.find("Deployment", OP)
    operator = Pod(NAMESPACE, dep["spec"]["template"]["metadata"]["labels"])
    prometheus, stranger = Pod("monitoring", {"app": "prometheus"}), Pod("team-a", {"app": "x"})
    neighbour = Pod(NAMESPACE, {"app": "x"})
    for port, want in ((8082, True), (8081, True), (9999, False)):
        assert allowed([pol], prometheus, operator, port) is want, port
        assert not allowed([pol], stranger, operator, port) and not allowed([pol], neighbour, operator, port)
    moved = render("--set", "networkPolicy.monitoringNamespaces={observability}", "--set", "operator.metricsPort=9100")
    pol = moved.find("NetworkPolicy", OP, NAMESPACE)
    assert allowed([pol], Pod("observability", {}), operator, 9100)
    assert not allowed([pol], prometheus, operator, 9100) and not allowed([pol], Pod("observability", {}), operator, 8082)
    none = render("--set", "networkPolicy.monitoringNamespaces=null").find("NetworkPolicy", OP, NAMESPACE)
    assert none["spec"]["ingress"] == [] and not allowed([none], prometheus, operator, 8082)
    assert not render("--set", "networkPolicy.enabled=false").all("NetworkPolicy")


def test_deployment_args_are_what_flashserve_run_accepts(render):
    from flashserve.controller.main import _parser

    dep = render(*COMBOS["monitoring"]).find("Deployment", OP)
    args = _parser().parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.liveness == "http://0.0.0.0:8081/healthz"
    assert args.metrics_address == "0.0.0.0:8082"
    assert args.leader_elect is True and args.lease_name == OP
    assert args.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert args.resync_seconds == 30 and args.namespace is None
    assert args.prometheus_allow is None and args.prometheus_allow_own_namespace is True
    args = _parser().parse_args(render(*COMBOS["watch-namespaces"]).find("Deployment", OP)["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.namespace == ["team-a", "team-b"]
    dep = render("--set", "operator.prometheusAllow={*.monitoring.svc,https://thanos.example.com/prom}",
                 "--set", "operator.prometheusAllowOwnNamespace=false").find("Deployment", OP)  # fmt: skip
    args = _parser().parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.prometheus_allow == ["*.monitoring.svc", "https://thanos.example.com/prom"]
    assert args.prometheus_allow_own_namespace is False


def test_image_digest_and_names(render):
    c = render("--set", "image.digest=sha256:" + "a" * 64, "--set", "image.tag=9.9.9").find("Deployment", OP)
    assert c["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/flashserve/flashserve-operator@sha256:" + "a" * 64
    c = render("--set", "image.repository=registry.local/fs", "--set", "image.tag=dev").find("Deployment", OP)
    assert c["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/fs:dev"
    r = render("--set", "fullnameOverride=fs")
    assert r.find("Deployment", "fs-operator") and r.find("Role", "fs-operator-leader-election")["rules"][1]["resourceNames"] == ["fs-operator"]


@pytest.mark.parametrize("args, message", [
    (["--set", "foo=1"], "additional properties 'foo' not allowed"),
    (["--set", "replicaCount=-1"], "/replicaCount"),
    (["--set", "watchNamespaces={Bad_NS}"], "/watchNamespaces/0"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "monitoring.prometheusRule.sla.percentile=abc"], "/monitoring/prometheusRule/sla/percentile"),
    (["--set", "operator.prometheusUrl=prometheus:9090"], "/operator/prometheusUrl"),
    (["--set", "operator.prometheusAllow={has space}"], "/operator/prometheusAllow/0"),
    (["--set", "operator.leaderElection.enabled=false"], "replicaCount > 1 needs operator.leaderElection.enabled"),
    (["--set", "monitoring.enabled=true", "--set", "metrics.service.enabled=false"], "needs metrics.service.enabled"),
    (["--set", "metrics.auth=mtls"], "/metrics/auth"),
    # a string the template wrote as it is could carry whole objects (a ClusterRoleBinding) into the release
    (["--set-string", "podDisruptionBudget.maxUnavailable=1\n---\nkind: ClusterRoleBinding"], "/podDisruptionBudget/maxUnavailable"),
    (["--set", "podDisruptionBudget.maxUnavailable=0"], "/podDisruptionBudget/maxUnavailable"),
    (["--set", "monitoring.enabled=true", "--set-string", "monitoring.dashboard.namespace=x\n  evil: yes"], "/monitoring/dashboard/namespace"),
    (["--set", "podLabels.app\\.kubernetes\\.io/instance=other"], "podLabels: app.kubernetes.io/instance is a label the chart sets itself"),
    (["--set", "monitoring.serviceMonitor.labels.helm\\.sh/chart=x"], "monitoring.serviceMonitor.labels: helm.sh/chart is a label"),
    (["--set", "operator.healthPort=8082", "--set", "operator.metricsPort=8082"], "operator.healthPort and operator.metricsPort are both 8082"),
    # decimals reach the schema as strings (`--set` keeps them so), so their ranges are the template's to check
    (["--set", "operator.resyncSeconds=0.0"], "operator.resyncSeconds: 0.0 is out of range"),
    (["--set", "monitoring.prometheusRule.sla.percentile=0.00001"], "sla.percentile: 0.00001 is out of range"),
    (["--set", "monitoring.prometheusRule.kvCacheUsageWarning=5.0"], "kvCacheUsageWarning: 5.0 is out of range"),
    (["--set", "monitoring.prometheusRule.window=0s"], "monitoring.prometheusRule.window: 0s is no time"),
    (["--set", "monitoring.podMonitor.interval=0h0m"], "monitoring.podMonitor.interval: 0h0m is no time"),
    # Prometheus keeps durations in int64 nanoseconds (sprig's int64 overflows first)
    (["--set", "monitoring.serviceMonitor.interval=293y"], "interval: 293y is beyond what Prometheus takes"),
    (["--set", "monitoring.prometheusRule.window=99999999999999999999s"], "window: 99999999999999999999s is beyond"),
    (["--set", "monitoring.serviceMonitor.interval=9999999999999y"], "interval: 9999999999999y is beyond"),
    # Prometheus reads units from the largest down, each once
    (["--set", "monitoring.serviceMonitor.interval=30s1m"], "/monitoring/serviceMonitor/interval"),
    (["--set", "monitoring.serviceMonitor.interval=1s1s"], "/monitoring/serviceMonitor/interval"),
    (["--set", "nameOverride=Bad Name"], "/nameOverride"),
    (["--set", "fullnameOverride=" + "a" * 47], "/fullnameOverride"),
    (["--set", "image.repository=foo bar"], "/image/repository"),
    # Prometheus refuses a scrape timeout longer than the interval; the operator's metrics would go unscraped
    (["--set", "monitoring.enabled=true", "--set", "monitoring.serviceMonitor.scrapeTimeout=31s"], "scrapeTimeout: 31s is longer than monitoring.serviceMonitor.interval (30s)"),
    (["--set", "monitoring.enabled=true", "--set", "monitoring.serviceMonitor.scrapeTimeout=1m1ms", "--set", "monitoring.serviceMonitor.interval=1m"], "scrapeTimeout: 1m1ms is longer"),
    # leading zeros are decimal to Prometheus (sprig's int64 would read 010 as octal, 8)
    (["--set", "monitoring.enabled=true", "--set", "monitoring.serviceMonitor.scrapeTimeout=010s", "--set", "monitoring.serviceMonitor.interval=9s"], "scrapeTimeout: 010s is longer"),
    (["--set", "monitoring.enabled=true", "--set", "monitoring.serviceMonitor.scrapeTimeout=09s", "--set", "monitoring.serviceMonitor.interval=1s"], "scrapeTimeout: 09s is longer"),
])  # fmt: skip
def test_bad_values_are_refused(render, args, message):
    proc = render(*args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("timeout, interval", [("1m", "1m"), ("900ms", "1s"), ("59s", "1m"), ("2d", "1w"), ("1h", "1h30m"),
                                               ("10s", "010s"), ("100ms", "0h1m")])
def test_a_scrape_timeout_up_to_the_interval_is_taken(render, timeout, interval):
    sm = render("--set", "monitoring.enabled=true", "--set", f"monitoring.serviceMonitor.scrapeTimeout={timeout}",
                "--set", f"monitoring.serviceMonitor.interval={interval}").find("ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["scrapeTimeout"] == timeout and sm["spec"]["endpoints"][0]["interval"] == interval


def test_names_stay_within_their_limits_for_the_longest_release_name(render):
    """Helm allows release names of 53 characters; the metrics Service, whose name is longest, must still be a
    DNS label (63)."""
    r = render("--set", "metrics.service.enabled=true", release="r" * 53)
    (svc,) = r.all("Service")
    assert len(svc["metadata"]["name"]) <= 63 and svc["metadata"]["name"].endswith("-operator-metrics")


def test_a_disruption_budget_takes_a_count_or_a_percentage(render):
    assert render().find("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert render("--set-string", "podDisruptionBudget.maxUnavailable=2").find("PodDisruptionBudget")["spec"]["maxUnavailable"] == 2
    assert render("--set", "podDisruptionBudget.maxUnavailable=50%").find("PodDisruptionBudget")["spec"]["maxUnavailable"] == "50%"


def test_single_replica_without_leader_election(render):
    r = render("--set", "replicaCount=1", "--set", "operator.leaderElection.enabled=false")
    args = r.find("Deployment", OP)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-elect" in args
    assert not r.all("Role", f"{OP}-leader-election") and not r.all("PodDisruptionBudget")


# ---------------------------------------------------------------------------------------- monitoring


def test_monitoring_is_off_by_default_and_on_with_one_value(render):
    assert not {d["kind"] for d in render().docs} & PROMETHEUS_OPERATOR_KINDS
    on = render(*COMBOS["monitoring"])
    assert {d["kind"] for d in on.docs} >= PROMETHEUS_OPERATOR_KINDS | {"ConfigMap"}
    off = render(*COMBOS["monitoring"], "--set", "monitoring.podMonitor.enabled=false")
    assert not off.all("PodMonitor")


def test_service_monitor_selects_the_metrics_service(render):
    r = render(*COMBOS["monitoring"])
    sm, svc = r.find("ServiceMonitor"), r.find("Service", f"{OP}-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == svc["spec"]["ports"][0]["name"] and ep["path"] == "/metrics" and ep["honorLabels"] is True


def test_pod_monitor_selects_the_engine_pods_the_operator_renders(render):
    """The PodMonitor's selector and port must match what the renderer puts on engine pods."""
    from flashserve.render.renderer import render as render_serving

    objs = render_serving(_FULL_SERVING)
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}

    pm = render(*COMBOS["monitoring"]).find("PodMonitor", "flashserve-engines")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] in port_names
    relabel = {r["targetLabel"]: r["sourceLabels"][0] for r in ep["relabelings"]}
    assert relabel == {"serving": "__meta_kubernetes_pod_label_flashserve_io_serving",
                       "group": "__meta_kubernetes_pod_label_flashserve_io_group"}  # fmt: skip
    assert "flashserve.io/serving" in pod_labels and "flashserve.io/group" in pod_labels
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    scoped = render("--set", "monitoring.enabled=true", "--set", "watchNamespaces={team-a}")
    scoped = scoped.find("PodMonitor", "flashserve-engines")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_router_pod_monitor_selects_the_router_pods_on_their_metrics_port_with_the_serving_label(render):
    """The autoscaler's arrival rate (promql.Queries.arrival_rate) selects the routers by `serving`: the
    monitor must find the router pods the operator renders, on the port vllm-router serves /metrics on."""
    from flashserve.render.renderer import render as render_serving

    objs = render_serving(_FULL_SERVING)
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}  # fmt: skip
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    pm = render(*COMBOS["monitoring"]).find("PodMonitor", "flashserve-routers")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    engines = render_serving(_FULL_SERVING)
    sts = next(o for o in engines if o["kind"] == "StatefulSet")
    assert not pm["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert str(ports[ep["port"]]) == args[args.index("--prometheus-port") + 1]
    relabel = {r["targetLabel"]: r.get("sourceLabels", [r.get("replacement")])[0] for r in ep["relabelings"]}
    assert relabel == {"serving": "__meta_kubernetes_pod_label_flashserve_io_serving", "job": "vllm-router"}
    assert pod_labels["flashserve.io/serving"] == sts["spec"]["template"]["metadata"]["labels"]["flashserve.io/serving"]
    off = render(*COMBOS["monitoring"], "--set", "monitoring.podMonitor.enabled=false")
    assert not off.all("PodMonitor")


def test_pod_monitor_labels_match_the_autoscaler_queries():
    from flashserve.autoscaling import promql

    assert (promql.NAMESPACE_LABEL, promql.SERVING_LABEL, promql.GROUP_LABEL) == ("namespace", "serving", "group")


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool not found (Debian package prometheus: `make deps`)")
    return path


def _rule_file(render, tmp_path, *args: str) -> Path:
    spec = render(*COMBOS["monitoring"], *args).find("PrometheusRule")["spec"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_prometheus_rules_are_valid(render, promtool, tmp_path):
    path = _rule_file(render, tmp_path)
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {r.get("alert") for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]} - {None}
    assert {"FlashServePerUserSpeedBelowSLA", "FlashServeServingSLANotMet", "FlashServeOperatorDown"} <= names


def _series(labels: str, values: str) -> dict:
    return {"series": labels, "values": values}


def _engine(serving: str, fast: bool) -> list[dict]:
    """One minute = 1000 decode steps, 1810 output tokens, 10 first tokens: 1.8 tokens per step. A slow engine
    has every inter-token latency in (25 ms, 50 ms] (p90 = 47.5 ms, 38 tok/s per user); a fast one <= 10 ms
    (p90 = 9 ms, 200 tok/s)."""
    sel = f'namespace="ns",serving="{serving}",group="0",engine="0"'
    itl = "vllm:inter_token_latency_seconds"
    buckets = {"0.01": "0+1000x40" if fast else "0+0x40", "0.025": "0+1000x40" if fast else "0+0x40",
               "0.05": "0+1000x40", "+Inf": "0+1000x40"}  # fmt: skip
    out = [_series(f'{itl}_bucket{{{sel},le="{le}"}}', v) for le, v in buckets.items()]
    out += [
        _series(f"{itl}_count{{{sel}}}", "0+1000x40"),
        _series(f"vllm:generation_tokens_total{{{sel}}}", "0+1810x40"),
        _series(f"vllm:time_to_first_token_seconds_count{{{sel}}}", "0+10x40"),
        _series(f'vllm:time_to_first_token_seconds_bucket{{{sel},le="1"}}', "0+10x40"),
        _series(f'vllm:time_to_first_token_seconds_bucket{{{sel},le="+Inf"}}', "0+10x40"),
        _series(f"vllm:num_requests_running{{{sel}}}", "50x40"),
        _series(f"vllm:num_requests_waiting{{{sel}}}", "0x40"),
        _series(f"vllm:kv_cache_usage_perc{{{sel}}}", "0.5x40"),
    ]
    return out


def test_sla_alerts_fire_on_slow_servings_only(render, promtool, tmp_path):
    """promtool unit test: synthetic engine series for a slow and a fast serving, and operator series."""
    path = _rule_file(render, tmp_path)
    rules = yaml.safe_load(path.read_text())
    for group in rules["groups"]:  # the alert texts are for people; this test checks expressions and labels
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path.write_text(yaml.safe_dump(rules))
    job = f'job="{OP}-metrics"'
    op_series = [
        _series(f'up{{{job},namespace="{NAMESPACE}",pod="{OP}-a"}}', "1x40"),
        _series(f'up{{{job},namespace="{NAMESPACE}",pod="{OP}-b"}}', "0x40"),  # the standby serves no metrics
        _series(f'flashserve_child_writes_total{{{job},namespace="{NAMESPACE}"}}', "0+5x40"),
        _series(f'flashserve_sla_met{{{job},namespace="ns",serving="slow"}}', "0x40"),
        _series(f'flashserve_sla_met{{{job},namespace="ns",serving="fast"}}', "1x40"),
        _series(f'flashserve_autoscaler_decisions_total{{{job},namespace="ns",serving="slow",reason="AtMax"}}', "0+4x40"),
        _series(f'flashserve_autoscaler_decisions_total{{{job},namespace="ns",serving="fast",reason="Steady"}}', "0+4x40"),
    ]
    alerts = lambda name, *servings, sev="warning": {  # noqa: E731
        "eval_time": "25m", "alertname": name,
        "exp_alerts": [{"exp_labels": {"severity": sev, "namespace": "ns", "serving": s}} for s in servings],
    }  # fmt: skip
    test = {
        "rule_files": [str(path)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _engine("slow", fast=False) + _engine("fast", fast=True) + op_series,
                "alert_rule_test": [
                    alerts("FlashServePerUserSpeedBelowSLA", "slow"),
                    alerts("FlashServeServingSLANotMet", "slow", sev="critical"),
                    alerts("FlashServeAutoscalerAtMaxReplicas", "slow"),
                    alerts("FlashServeAutoscalerBlind"),
                    alerts("FlashServeTimeToFirstTokenHigh"),
                    alerts("FlashServeRequestsQueued"),
                    alerts("FlashServeKVCacheNearlyFull"),
                    {"eval_time": "25m", "alertname": "FlashServeOperatorDown", "exp_alerts": []},
                    {"eval_time": "25m", "alertname": "FlashServeOperatorWriteStorm", "exp_alerts": []},
                ],
                "promql_expr_test": [
                    {"expr": 'round(namespace_serving:vllm_per_user_tokens_per_second:p90{serving="slow"})', "eval_time": "25m",
                     "exp_samples": [{"labels": '{namespace="ns",serving="slow"}', "value": 38}]},
                    {"expr": 'round(namespace_serving:vllm_per_user_tokens_per_second:p90{serving="fast"})', "eval_time": "25m",
                     "exp_samples": [{"labels": '{namespace="ns",serving="fast"}', "value": 200}]},
                    {"expr": "sum by (namespace, serving) (namespace_serving:vllm_replica_groups:count)", "eval_time": "25m",
                     "exp_samples": [{"labels": '{namespace="ns",serving="fast"}', "value": 1},
                                     {"labels": '{namespace="ns",serving="slow"}', "value": 1}]},
                ],
            },
            {  # no replica serves metrics: no leader
                "interval": "1m",
                "input_series": [_series(f'up{{{job},namespace="{NAMESPACE}",pod="{OP}-a"}}', "0x20")],
                "alert_rule_test": [{"eval_time": "10m", "alertname": "FlashServeOperatorDown",
                                     "exp_alerts": [{"exp_labels": {"severity": "critical"}}]}],
            },
        ],
    }  # fmt: skip
    test_path = tmp_path / "test.yaml"
    test_path.write_text(yaml.safe_dump(test))
    proc = subprocess.run([promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard(render, promtool, tmp_path):
    cm = render(*COMBOS["monitoring"], "--set", "monitoring.dashboard.gpuHourlyCost=2.5").find("ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["flashserve.json"])
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["gpu_hourly_cost"]["query"] == "2.5" and variables["sla"]["query"] == "100"
    assert variables["quantile"]["current"]["value"] == "0.9"
    assert "__" not in json.dumps(variables).replace("$__all", "")
    titles = " ".join(p["title"] for p in dash["panels"])
    for needle in ("Per-user decode speed", "SLA", "Replica groups", "Tokens per dollar"):
        assert needle in titles
    # Every panel query is valid PromQL once Grafana's variables are substituted.
    subst = {"$__rate_interval": "1m", "$quantile": "0.9", "$sla": "100", "$gpu_hourly_cost": "2.5",
             "$gpus_per_engine": "1", "$namespace": ".*", "$serving": ".*"}  # fmt: skip
    rules = []
    for p in dash["panels"]:
        for i, t in enumerate(p.get("targets", [])):
            expr = t["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            assert "$" not in expr, expr
            rules.append({"record": f"panel_{p['id']}_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(rules) >= 10


def test_dashboard_source_is_valid_json():
    json.loads((CHART / "dashboards" / "flashserve.json").read_text())


# ------------------------------------------------------------------------------------------- packaging


def test_chart_metadata_and_notes(helm):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["watchNamespaces"] == [] and values["replicaCount"] == 2
    assert values["image"]["repository"] == "ghcr.io/flashserve/flashserve-operator"
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "kind: DeepSeekServing" in notes and "helm show crds" in notes
    # the Lease exists only with leader election: NOTES name it only then
    lease_lines = [i for i, line in enumerate(notes.splitlines()) if re.search(r"\b[Ll]ease\b", line)]
    guarded = [i for i, line in enumerate(notes.splitlines()) if "if .Values.operator.leaderElection.enabled" in line]
    assert lease_lines and all(any(0 < i - g <= 1 for g in guarded) for i in lease_lines)


def test_dockerfile_shape():
    """The image cannot be built in this test suite (no container engine); check its shape instead."""
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert [name for _, name in froms] == ["builder", "mock-builder", "product-env", "mock-env", "runtime",
                                           "router-builder", "router", "mock-engine", "operator"]
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), "pin an exact slim tag"
    final = text[text.index("AS runtime"):]
    assert "USER 65532:65532" in final and "apt-get" not in final and "gcc" not in final
    assert 'ENTRYPOINT ["flashserve", "run"]' in text.split("AS operator")[1]
    assert 'ENTRYPOINT ["vllm"]' in text.split("AS mock-engine")[1].split("AS operator")[0]
    assert "FLASHSERVE_MOCK_BIND_ANY=1" in text
    # The operator image gets the product's environment; only the mock's stages see the test bed.
    operator_stage = text.split("AS operator")[1]
    assert "COPY --from=product-env /opt/flashserve" in operator_stage and "testbed" not in operator_stage
    product_env = text.split("AS product-env")[1].split("\nFROM ")[0]
    assert "testbed" not in text.split("AS builder")[1].split("AS mock-builder")[0] + product_env
    assert "COPY --from=mock-env /opt/flashserve" in text.split("AS mock-engine")[1].split("AS operator")[0]
    # The router image: the vllm-router wheel the facts name, on the runtime stage (non-root), nothing else.
    from flashserve.facts.router import VLLM_ROUTER_VERSION

    router_builder = text.split("AS router-builder")[1].split("\nFROM ")[0]
    assert f"ARG VLLM_ROUTER_VERSION={VLLM_ROUTER_VERSION}" in router_builder
    assert '"vllm-router==${VLLM_ROUTER_VERSION}"' in router_builder and "--only-binary=:all:" in router_builder
    router_stage = text.split("AS router\n")[1].split("\nFROM ")[0]
    assert text.split("AS router\n")[0].rstrip().endswith("FROM runtime"), "the router runs as the runtime's user"
    assert "COPY --from=router-builder /opt/vllm-router /opt/vllm-router" in router_stage
    assert 'ENTRYPOINT ["vllm-router"]' in router_stage and "/opt/flashserve" not in router_stage, "nothing of the operator"
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:][:4] == ["!pyproject.toml", "!README.md", "!operator/", "!testbed/"]


def test_authenticated_metrics(render):
    """metrics.auth=token: the operator checks scrapers' tokens (and may create the reviews that needs), the
    chart offers the reader role, and its ServiceMonitor scrapes with Prometheus's token."""
    docs = render(*COMBOS["metrics-auth"]).docs
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert "--metrics-auth=token" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    reviews = {r for role in roles.values() for rule in role["rules"] for r in rule.get("resources", [])}
    assert {"tokenreviews", "subjectaccessreviews"} <= reviews
    reader = next(r for n, r in roles.items() if n.endswith("-metrics-reader"))
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["bearerTokenFile"].endswith("serviceaccount/token")
    plain = render().docs
    assert not any(d["metadata"]["name"].endswith("-metrics-reader") for d in plain)
    assert "--metrics-auth=token" not in next(d for d in plain if d["kind"] == "Deployment")["spec"]["template"][
        "spec"]["containers"][0]["args"]


def test_metrics_over_tls_mount_the_secret_and_the_service_monitor_checks_the_services_name(render):
    """metrics.tls.secretName: the operator serves the Secret's certificate (the files `flashserve run` is told
    are the ones the volume holds), and the ServiceMonitor scrapes over https, checking the certificate against
    the Secret's CA for the metrics Service's name, so Prometheus's token never crosses in the clear."""
    from flashserve.controller.main import _parser

    r = render(*COMBOS["metrics-tls"])
    pod = r.find("Deployment", OP)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = _parser().parse_args(c["args"])
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "metrics-tls"]
    assert mount["readOnly"] and args.metrics_auth == "token"
    where = mount["mountPath"]
    assert (args.metrics_cert_file, args.metrics_key_file) == (f"{where}/tls.crt", f"{where}/tls.key")
    (vol,) = [v for v in pod["volumes"] if v["name"] == "metrics-tls"]
    assert vol["secret"]["secretName"] == "flashserve-metrics-tls"
    (endpoint,) = r.find("ServiceMonitor")["spec"]["endpoints"]
    svc = r.find("Service", f"{OP}-metrics")
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == f"{svc['metadata']['name']}.{NAMESPACE}.svc"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "flashserve-metrics-tls", "key": "ca.crt"}
    plain = render(*COMBOS["metrics-auth"])
    assert "scheme" not in plain.find("ServiceMonitor")["spec"]["endpoints"][0]
    plain_args = plain.find("Deployment", OP)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--metrics-cert-file") for a in plain_args)
