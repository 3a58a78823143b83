"""Reconciling the cluster's own objects (KWOK stages, simulated nodes) through the Kubernetes API."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from .pools import MANAGED_BY, MANAGED_LABEL

STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL = "kwok.x-k8s.io", "v1alpha1", "stages"
MANAGED_SELECTOR = f"{MANAGED_LABEL}={MANAGED_BY}"
SPEC_HASH = "flashserve.io/spec-hash"
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def api_client(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def crd_exists(api: client.ApiClient, name: str, settle_seconds: float = 20.0) -> bool:
    """Whether the CRD exists. A freshly restarted API server answers 404 for CRDs until its caches have
    synced, so a 404 is believed only once it has lasted `settle_seconds`."""
    deadline = time.monotonic() + settle_seconds
    while True:
        try:
            client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
            return True
        except ApiException as e:
            if e.status not in (404, 503) or time.monotonic() > deadline:
                if e.status in (404, 503):
                    return False
                raise
        time.sleep(1.0)


def wait_for_crd(api: client.ApiClient, name: str, timeout: float = 60) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") == "True":
                return
        except ApiException as e:
            if e.status != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
        time.sleep(0.3)


def apply_stages(api: client.ApiClient, stages: list[dict[str, Any]]) -> tuple[int, int]:
    """Create or replace our stages and delete the ones no longer wanted. Returns (changed, deleted)."""
    co = client.CustomObjectsApi(api)
    stages = [_with_hash(s) for s in stages]
    listed = co.list_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, label_selector=MANAGED_SELECTOR)
    existing = {s["metadata"]["name"]: s for s in listed["items"]}
    changed = deleted = 0
    for stage in stages:
        name = stage["metadata"]["name"]
        current = existing.pop(name, None)
        if current is None:
            co.create_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, stage)
            changed += 1
        elif _meta_differs(current, stage):
            body = dict(stage, metadata=dict(stage["metadata"], resourceVersion=current["metadata"]["resourceVersion"]))
            co.replace_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, name, body)
            changed += 1
    for name in existing:
        co.delete_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, name)
        deleted += 1
    return changed, deleted


def _with_hash(stage: dict[str, Any]) -> dict[str, Any]:
    # The API server fills in defaults, so a stored spec never equals the desired one; compare hashes instead.
    digest = hashlib.sha256(json.dumps(stage["spec"], sort_keys=True).encode()).hexdigest()[:16]
    meta = dict(stage["metadata"], annotations={**(stage["metadata"].get("annotations") or {}), SPEC_HASH: digest})
    return dict(stage, metadata=meta)


def _meta_differs(current: dict, desired: dict) -> bool:
    for key in ("labels", "annotations"):
        have = current["metadata"].get(key) or {}
        if any(have.get(k) != v for k, v in (desired["metadata"].get(key) or {}).items()):
            return True
    return False


def apply_nodes(api: client.ApiClient, nodes: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Create missing nodes, bring drifted ones back to their pool definition, delete nodes of shrunk pools.
    Returns (created, updated, deleted)."""
    core = client.CoreV1Api(api)
    existing = {n.metadata.name: n for n in core.list_node(label_selector=MANAGED_SELECTOR).items}
    created = updated = deleted = 0
    for node in nodes:
        name = node["metadata"]["name"]
        current = existing.pop(name, None)
        if current is not None and list(current.spec.pod_cidrs or []) != node["spec"]["podCIDRs"]:
            # podCIDR is immutable: a node from before the loopback address plan (or of another slot) is
            # recreated, and its pods with it, since they keep the addresses of the old range.
            _recreate_node(core, name)
            current = None
        if current is None:
            try:
                core.create_node(node)
                created += 1
                continue
            except ApiException as e:
                if e.status != 409:
                    raise
                current = core.read_node(name)
        if _node_drifted(current, node):
            # Taints go back to the pool's, keeping those the node lifecycle controller manages.
            kept = [api.sanitize_for_serialization(t) for t in (current.spec.taints or []) if t.key in NOT_READY_TAINTS]
            meta, status = node["metadata"], node["status"]
            core.patch_node(name, {"metadata": {"labels": meta["labels"], "annotations": meta["annotations"]},
                                   "spec": {"taints": node["spec"]["taints"] + kept}})
            resources = {"capacity": status["capacity"], "allocatable": status["allocatable"],
                         "addresses": status["addresses"]}
            core.patch_node_status(name, {"status": resources})
            updated += 1
    for name in existing:
        core.delete_node(name)
        deleted += 1
    return created, updated, deleted


def _recreate_node(core: client.CoreV1Api, name: str, timeout: float = 60) -> None:
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
    core.delete_node(name)
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {name} still exists {timeout:.0f}s after its deletion")
        time.sleep(0.3)


def _node_drifted(current: client.V1Node, desired: dict) -> bool:
    labels = current.metadata.labels or {}
    if any(labels.get(k) != v for k, v in desired["metadata"]["labels"].items()):
        return True
    have_taints = {(t.key, t.value, t.effect) for t in (current.spec.taints or []) if t.key not in NOT_READY_TAINTS}
    want_taints = {(t["key"], t.get("value"), t["effect"]) for t in desired["spec"]["taints"]}
    if have_taints != want_taints:
        return True
    status = current.status
    have_addresses = [(a.type, a.address) for a in (status.addresses or [])]
    if have_addresses != [(a["type"], a["address"]) for a in desired["status"]["addresses"]]:
        return True
    for field in ("capacity", "allocatable"):
        have = getattr(status, field) or {}
        # The API server canonicalises quantities (978944Mi comes back as 956Gi).
        want = desired["status"][field]
        if any(k not in have or parse_quantity(have[k]) != parse_quantity(v) for k, v in want.items()):
            return True
    return False


def wait_nodes_ready(api: client.ApiClient, names: list[str], timeout: float = 180,
                     progress: Callable[[int, int], None] | None = None) -> None:
    """Until every node is Ready and free of the not-ready taint (the scheduler skips it until then)."""
    core = client.CoreV1Api(api)
    want = set(names)
    deadline = time.monotonic() + timeout
    last, last_report = -1, 0.0
    while True:
        listed = core.list_node(label_selector=MANAGED_SELECTOR).items
        ready = {n.metadata.name for n in listed if _schedulable(n)} & want
        now = time.monotonic()
        if progress and len(ready) != last and (ready == want or now - last_report >= 3):
            progress(len(ready), len(want))
            last, last_report = len(ready), now
        if ready == want:
            return
        if time.monotonic() > deadline:
            missing = sorted(want - ready)
            raise TimeoutError(f"{len(missing)} nodes not ready after {timeout:.0f}s: {', '.join(missing[:5])}...")
        time.sleep(0.5)


def _schedulable(node: client.V1Node) -> bool:
    conds = {c.type: c.status for c in (node.status.conditions or [])}
    taints = {t.key for t in (node.spec.taints or [])}
    return conds.get("Ready") == "True" and not taints & set(NOT_READY_TAINTS)


def wait_default_service_account(api: client.ApiClient, namespace: str = "default", timeout: float = 60) -> None:
    """Pods are refused until the namespace's `default` ServiceAccount exists (ServiceAccount admission)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def service_account_token(api: client.ApiClient, namespace: str, name: str, seconds: int,
                          rules: list[dict[str, Any]]) -> str:
    """A token of ServiceAccount namespace/name, bound cluster-wide to a ClusterRole of the same name holding
    `rules` (created or brought back to them)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    labels = {MANAGED_LABEL: MANAGED_BY}
    _create_or_replace(lambda b: core.create_namespaced_service_account(namespace, b), None,
                       {"metadata": {"name": name, "namespace": namespace, "labels": labels}})
    _create_or_replace(rbac.create_cluster_role, lambda b: rbac.replace_cluster_role(name, b),
                       {"metadata": {"name": name, "labels": labels}, "rules": rules})
    _create_or_replace(rbac.create_cluster_role_binding, lambda b: rbac.replace_cluster_role_binding(name, b),
                       {"metadata": {"name": name, "labels": labels},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    answer = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": seconds}})
    return answer.status.token


def _create_or_replace(create, replace, body: dict) -> None:
    try:
        create(body)
    except ApiException as e:
        if e.status != 409:
            raise
        if replace is not None:
            replace(body)


def write_token_kubeconfig(path: Path, admin_kubeconfig: Path, token: str) -> None:
    """A kubeconfig with the admin one's server and CA, and `token` as its only credential."""
    import yaml

    src = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = src["clusters"][0]
    doc = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
           "users": [{"name": "token", "user": {"token": token}}],
           "contexts": [{"name": "token", "context": {"cluster": cluster["name"], "user": "token"}}],
           "current-context": "token"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


def token_works(kubeconfig: Path) -> bool:
    """Whether the kubeconfig's credentials may still list pods (a token expires, a cluster is recreated)."""
    if not kubeconfig.is_file():
        return False
    try:
        api = api_client(kubeconfig)
    except Exception:  # a broken file: written anew
        return False
    try:
        client.CoreV1Api(api).list_pod_for_all_namespaces(limit=1, _request_timeout=10)
        return True
    except Exception:  # refused, expired, or the API server unreachable (urllib3 errors): written anew
        return False
    finally:
        api.close()
