"""The Helm chart and manifests/install.yaml against the real API server.

The operator image cannot run on KWOK nodes (no containers), so the chart's pods are only scheduled and
marked Running; what is tested is the objects and, above all, the RBAC: the operator runs as a local process
authenticated as the chart's ServiceAccount (a token from the TokenRequest API), so every call it makes is
authorised by exactly the chart's roles.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from flashserve.render.naming import group_name, router_name

from e2e.conftest import CRD_NAME
from e2e.support import OperatorProcess, condition, get_json, wait_established, wait_until

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "flashserve"
INSTALL = ROOT / "manifests" / "install.yaml"
SAMPLE = ROOT / "manifests" / "samples" / "gb200-minimal.yaml"


@pytest.fixture(scope="module")
def helm(cluster):
    from flashserve_testbed.localcluster import ToolchainMissing, toolchain_bin

    try:
        path = toolchain_bin() / "helm"
    except ToolchainMissing as e:
        pytest.skip(f"helm comes with the local cluster's toolchain: {e}")
    kubeconfig = str(cluster.kubeconfig)

    def run(*args: str, check: bool = True, timeout: float = 180):
        import subprocess

        proc = subprocess.run([str(path), "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    return run


@pytest.fixture
def make_namespace(kube):
    """Extra namespaces for a test, deleted afterwards."""
    from flashserve_testbed.localcluster.kube import wait_default_service_account
    from kubernetes import client

    core, made = client.CoreV1Api(kube), []

    def make(prefix: str) -> str:
        name = f"e2e-{prefix}-{uuid.uuid4().hex[:5]}"
        core.create_namespace({"metadata": {"name": name, "labels": {"flashserve.io/e2e": "true"}}})
        wait_default_service_account(kube, name)
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name, propagation_policy="Background")


def sa_kubeconfig(cluster, kubectl, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, with a token from the TokenRequest API."""
    token = kubectl("-n", namespace, "create", "token", sa, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    entry = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": entry["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "cluster", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }))  # fmt: skip
    path.chmod(0o600)
    return path


def can_i(kubectl, sa_user: str, verb: str, resource: str, *where: str) -> bool:
    proc = kubectl("auth", "can-i", verb, resource, *where, f"--as={sa_user}", check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


def status_code(fn) -> int:
    from kubernetes.client.rest import ApiException

    try:
        fn()
    except ApiException as exc:
        return exc.status
    return 200


def test_the_api_server_enforces_owner_reference_permissions(cluster, kubectl, namespace):
    """OwnerReferencesPermissionEnforcement is on (the local cluster enables it, as OpenShift does): a child that
    sets blockOwnerDeletion needs `update` on its owner's finalizers. So the chart tests below, whose operator
    runs as the chart's ServiceAccount and sets blockOwnerDeletion on every child, check that grant."""
    if not cluster.local:
        pytest.skip("whether another cluster enables the plugin is its own choice")
    kubectl("-n", namespace, "create", "serviceaccount", "writer")
    kubectl("-n", namespace, "create", "role", "writer", "--verb=create,get", "--resource=configmaps")
    kubectl("-n", namespace, "create", "rolebinding", "writer", "--role=writer", f"--serviceaccount={namespace}:writer")
    kubectl("-n", namespace, "create", "configmap", "owner")
    uid = get_json(kubectl, "-n", namespace, "configmap", "owner")["metadata"]["uid"]
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": True}]}}
    user = f"--as=system:serviceaccount:{namespace}:writer"
    refused = kubectl("-n", namespace, "create", "-f", "-", user, input=json.dumps(child), check=False)
    assert refused.returncode != 0 and "blockOwnerDeletion" in refused.stderr, refused.stdout + refused.stderr
    del child["metadata"]["ownerReferences"][0]["blockOwnerDeletion"]
    kubectl("-n", namespace, "create", "-f", "-", user, input=json.dumps(child))


def test_helm_install_namespaced_operator_reconciles_and_autoscales_with_chart_rbac(
    cluster, helm, kubectl, kube, namespace, make_namespace, tmp_path
):
    cluster.require_pools()
    release_ns, target, other = namespace, make_namespace("target"), make_namespace("other")
    release = f"fs-{uuid.uuid4().hex[:5]}"
    op = f"{release}-flashserve-operator"
    sa_user = f"system:serviceaccount:{release_ns}:{op}"
    crd_existed = kubectl("get", "crd", CRD_NAME, check=False).returncode == 0

    out = helm("install", release, str(CHART), "-n", release_ns, "--set", f"watchNamespaces={{{target}}}",
               "--wait", "--timeout", "120s").stdout  # fmt: skip
    assert "kind: DeepSeekServing" in out  # NOTES.txt: what to apply next
    try:
        wait_established(kubectl, CRD_NAME)
        if not crd_existed:
            assert get_json(kubectl, "crd", CRD_NAME)["metadata"]["name"] == CRD_NAME  # helm installed it from crds/
        dep = get_json(kubectl, "-n", release_ns, "deploy", op)
        assert dep["spec"]["replicas"] == 2 and dep["status"].get("readyReplicas") == 2  # KWOK marks them Ready
        for kind, ns in (("role", target), ("rolebinding", target), ("role", release_ns), ("rolebinding", release_ns),
                         ("serviceaccount", release_ns), ("service", release_ns), ("pdb", release_ns)):
            name = f"{op}-leader-election" if kind.startswith("role") and ns == release_ns else op
            name = f"{op}-metrics" if kind == "service" else name
            kubectl("-n", ns, "get", kind, name)
        kubectl("get", "clusterrole", f"{op}-discovery")
        assert kubectl("get", "clusterrole", op, check=False).returncode != 0, "no cluster-wide role when scoped"

        # RBAC as the API server sees it, for the chart's ServiceAccount.
        assert can_i(kubectl, sa_user, "patch", "deepseekservings", "-n", target)
        assert can_i(kubectl, sa_user, "patch", "deepseekservings", "--subresource=status", "-n", target)
        assert can_i(kubectl, sa_user, "create", "statefulsets.apps", "-n", target)
        assert can_i(kubectl, sa_user, "delete", "pods", "-n", target)
        assert can_i(kubectl, sa_user, "update", f"leases.coordination.k8s.io/{op}", "-n", release_ns)
        assert not can_i(kubectl, sa_user, "update", "leases.coordination.k8s.io/someone-else", "-n", release_ns)
        assert not can_i(kubectl, sa_user, "list", "statefulsets.apps", "-n", other)
        assert not can_i(kubectl, sa_user, "create", "deepseekservings", "-n", target)
        assert not can_i(kubectl, sa_user, "list", "secrets", "-n", target)
        assert not can_i(kubectl, sa_user, "create", "pods", "-n", target)

        # The operator, authenticated as the chart's ServiceAccount, with the Deployment's scope.
        kc = sa_kubeconfig(cluster, kubectl, release_ns, op, tmp_path / "sa-kubeconfig")
        operator = OperatorProcess(kc, target, tmp_path, resync=5,
                                   extra=["--lease-namespace", release_ns, "--lease-name", op]).start()  # fmt: skip
        try:
            operator.wait_serving(timeout=60)
            lease = get_json(kubectl, "-n", release_ns, "lease", op)
            assert lease["spec"]["holderIdentity"], "the operator holds the chart's Lease"

            # Autoscaling on, spec.replicas below minReplicas: the autoscaler itself raises spec.replicas (a
            # resourceVersion-guarded PATCH), persists its state annotation and writes status; the reconciler
            # then creates both groups. No Prometheus is needed for the min/max bounds.
            cr = yaml.safe_load(SAMPLE.read_text())
            cr["metadata"]["namespace"] = target
            cr["spec"].update({"replicas": 1, "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 3,
                                                              "evaluationIntervalSeconds": 2}})  # fmt: skip
            kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

            def ready_at(n: int) -> bool:
                obj = get_json(kubectl, "-n", target, "dss", "flash")
                st = obj.get("status") or {}
                return (obj["spec"]["replicas"] == n and condition(obj, "Ready").get("status") == "True"
                        and st.get("readyReplicas") == n and st.get("observedGeneration") == obj["metadata"]["generation"])  # fmt: skip

            wait_until(lambda: ready_at(2), 120, what="autoscaler raised replicas to 2 and both groups Ready")
            obj = get_json(kubectl, "-n", target, "dss", "flash")
            from flashserve.controller.autoscale import STATE_ANNOTATION

            assert STATE_ANNOTATION in obj["metadata"].get("annotations", {}), "autoscaler state annotation written"
            assert obj["status"].get("slaState") == "Unknown"  # no metrics: the autoscaler says so in status
            events = get_json(kubectl, "-n", target, "events", "--field-selector", "involvedObject.name=flash")
            reasons = {e["reason"] for e in events["items"]}
            assert "Scaled" in reasons and "GroupsCreated" in reasons, reasons
            assert {s["metadata"]["name"] for s in get_json(kubectl, "-n", target, "sts")["items"]} == {group_name("flash", 0), group_name("flash", 1)}

            # The router pods may connect to their engines and the API server only (docs/routing.md, "Who can
            # steer the router"): the operator read the API server's addresses by name with the chart's RBAC.
            assert can_i(kubectl, sa_user, "get", "endpointslices.discovery.k8s.io/kubernetes", "-n", "default")
            assert not can_i(kubectl, sa_user, "list", "endpointslices.discovery.k8s.io", "-n", "default")
            api_slice = get_json(kubectl, "-n", "default", "endpointslice", "kubernetes")
            want = {(f"{a}/32", p["port"]) for ep in api_slice["endpoints"] for a in ep["addresses"]
                    for p in api_slice["ports"]}  # fmt: skip
            netpol = get_json(kubectl, "-n", target, "networkpolicy", router_name("flash"))
            got = {(peer["ipBlock"]["cidr"], port["port"]) for rule in netpol["spec"].get("egress", [])
                   for peer in rule["to"] if "ipBlock" in peer for port in rule["ports"]}  # fmt: skip
            assert netpol["spec"]["policyTypes"] == ["Ingress", "Egress"] and got == want, netpol["spec"]

            # A hand edit of the autoscaler's bounds goes through the same path: scale down to the new minimum.
            kubectl("-n", target, "patch", "dss", "flash", "--type=merge",
                    "-p", json.dumps({"spec": {"autoscaling": {"minReplicas": 1, "maxReplicas": 1}}}))  # fmt: skip
            wait_until(lambda: ready_at(1), 120, what="autoscaler lowered replicas to maxReplicas 1")
            wait_until(lambda: len(get_json(kubectl, "-n", target, "sts")["items"]) == 1, 60, what="group 1 deleted")
        finally:
            operator.stop()
        # OwnerReferencesPermissionEnforcement resolves an owner's kind with a RESTMapper that learns a new CRD
        # only at its next refresh: for a few seconds after helm installed it, every child with
        # blockOwnerDeletion is refused as "cannot find RESTMapping" (the API server's lag, not the chart's RBAC;
        # the next reconcile writes them). Any other refusal is an RBAC gap.
        logs = "\n".join(line for line in operator.logs().splitlines() if "cannot find RESTMapping" not in line)
        for bad in ("Forbidden", "forbidden", "Not enough permissions"):
            assert bad not in logs, f"operator hit {bad!r} with the chart's RBAC:\n{logs}"

        # Outside its role, the same identity is refused.
        from kubernetes import client, config

        sa_api = config.new_client_from_config(config_file=str(kc))
        try:
            core, apps = client.CoreV1Api(sa_api), client.AppsV1Api(sa_api)
            assert status_code(lambda: core.list_namespaced_secret(other)) == 403
            assert status_code(lambda: core.list_namespaced_secret(target)) == 403
            assert status_code(lambda: core.list_secret_for_all_namespaces()) == 403
            assert status_code(lambda: apps.list_namespaced_stateful_set(other)) == 403
            assert status_code(lambda: core.list_node()) == 403
            assert status_code(lambda: client.ApiextensionsV1Api(sa_api).delete_custom_resource_definition(CRD_NAME)) == 403
            assert status_code(lambda: client.CustomObjectsApi(sa_api).create_namespaced_custom_object(
                "flashserve.io", "v1alpha1", other, "deepseekservings",
                {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "x"}, "spec": {}})) == 403
            assert status_code(lambda: core.list_namespaced_pod(target)) == 200
        finally:
            sa_api.close()

        # helm upgrade: change values; objects follow.
        helm("upgrade", release, str(CHART), "-n", release_ns, "--reuse-values", "--set", "replicaCount=1",
             "--set", f"watchNamespaces={{{target},{other}}}", "--wait", "--timeout", "120s")  # fmt: skip
        dep = get_json(kubectl, "-n", release_ns, "deploy", op)
        assert dep["spec"]["replicas"] == 1
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--namespace={target}" in args and f"--namespace={other}" in args
        assert kubectl("-n", release_ns, "get", "pdb", op, check=False).returncode != 0, "no PDB for one replica"
        assert can_i(kubectl, sa_user, "list", "statefulsets.apps", "-n", other)
        history = helm("history", release, "-n", release_ns, "-o", "json").stdout
        assert [h["revision"] for h in json.loads(history)] == [1, 2]
    finally:
        proc = helm("uninstall", release, "-n", release_ns, "--wait", "--timeout", "120s", check=False)

    # helm uninstall: the release's objects are gone; the CRD (and so every serving) is kept, as Helm does.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert kubectl("-n", release_ns, "get", "deploy,sa,role,rolebinding,svc,pdb", "-l",
                   f"app.kubernetes.io/instance={release}", "-o", "name").stdout.strip() == ""  # fmt: skip
    for ns in (target, other):
        assert kubectl("-n", ns, "get", "role,rolebinding", "-l", f"app.kubernetes.io/instance={release}",
                       "-o", "name").stdout.strip() == ""  # fmt: skip
    assert kubectl("get", "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={release}",
                   "-o", "name").stdout.strip() == ""  # fmt: skip
    kubectl("get", "crd", CRD_NAME)
    kubectl("-n", target, "get", "dss", "flash")
    assert not can_i(kubectl, sa_user, "patch", "deepseekservings", "-n", target)


def test_helm_install_cluster_wide_rbac(cluster, helm, kubectl, namespace, make_namespace):
    elsewhere = make_namespace("elsewhere")
    release = f"fs-{uuid.uuid4().hex[:5]}"
    op = f"{release}-flashserve-operator"
    sa_user = f"system:serviceaccount:{namespace}:{op}"
    helm("install", release, str(CHART), "-n", namespace, "--set", "monitoring.enabled=false")
    try:
        crb = get_json(kubectl, "clusterrolebinding", op)
        assert crb["subjects"] == [{"kind": "ServiceAccount", "name": op, "namespace": namespace}]
        for ns in (elsewhere, "default"):
            assert can_i(kubectl, sa_user, "watch", "deepseekservings", "-n", ns)
            assert can_i(kubectl, sa_user, "patch", "deepseekservings", "--subresource=status", "-n", ns)
            assert can_i(kubectl, sa_user, "create", "statefulsets.apps", "-n", ns)
            assert can_i(kubectl, sa_user, "delete", "networkpolicies.networking.k8s.io", "-n", ns)
            assert can_i(kubectl, sa_user, "create", "events", "-n", ns)
            assert not can_i(kubectl, sa_user, "get", "secrets", "-n", ns)
            assert not can_i(kubectl, sa_user, "create", "pods", "-n", ns)
            assert not can_i(kubectl, sa_user, "update", "deepseekservings", "-n", ns)
            assert not can_i(kubectl, sa_user, "create", "leases.coordination.k8s.io", "-n", ns)
        assert can_i(kubectl, sa_user, "list", "customresourcedefinitions.apiextensions.k8s.io")
        assert not can_i(kubectl, sa_user, "list", "namespaces"), "cluster-wide kopf does not list namespaces"
        assert not can_i(kubectl, sa_user, "list", "secrets", "--all-namespaces")
        assert not can_i(kubectl, sa_user, "delete", "nodes")
        # A namespace user with the built-in `edit` role can manage servings (aggregated ClusterRole).
        assert can_i(kubectl, f"system:serviceaccount:{elsewhere}:default", "get", "deepseekservings", "-n", elsewhere) is False
        kubectl("-n", elsewhere, "create", "rolebinding", "editors", "--clusterrole=edit",
                f"--serviceaccount={elsewhere}:default")  # fmt: skip
        wait_until(lambda: can_i(kubectl, f"system:serviceaccount:{elsewhere}:default", "create", "deepseekservings",
                                 "-n", elsewhere), 30, what="edit aggregates DeepSeekServing access")  # fmt: skip
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    assert kubectl("get", "clusterrolebinding", op, check=False).returncode != 0


def test_kubectl_apply_install_manifest(cluster, kubectl):
    """`kubectl apply --server-side -f manifests/install.yaml` installs everything; remove it again, except
    the CRD that the rest of the suite shares."""
    docs = [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]
    ns = next(d for d in docs if d["kind"] == "Namespace")["metadata"]["name"]
    if kubectl("-n", ns, "get", "deploy", "flashserve-operator", check=False).returncode == 0:
        pytest.skip(f"the operator is already installed in {ns} on this cluster: not touching it")
    wait_until(lambda: (kubectl("get", "namespace", ns, "-o", "jsonpath={.status.phase}", check=False).stdout
                        != "Terminating"), 90, what=f"namespace {ns} from an earlier run deleted")  # fmt: skip
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(INSTALL))
    rest = yaml.safe_dump_all([d for d in docs if d["kind"] != "CustomResourceDefinition"])
    try:
        wait_established(kubectl, CRD_NAME)
        sa = f"system:serviceaccount:{ns}:flashserve-operator"
        wait_until(lambda: get_json(kubectl, "-n", ns, "deploy", "flashserve-operator").get("status", {}).get("replicas") == 2,
                   60, what="Deployment created its pods")  # fmt: skip
        assert can_i(kubectl, sa, "patch", "deepseekservings", "-n", "default")
        assert not can_i(kubectl, sa, "list", "secrets", "-n", "default")
        labels = get_json(kubectl, "namespace", ns)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        # The restricted Pod Security admission admitted the operator's pods.
        assert len(get_json(kubectl, "-n", ns, "pods")["items"]) == 2
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=rest)
    kubectl("get", "crd", CRD_NAME)
