"""The few API calls the controller makes, on the synchronous Kubernetes client (run them in a thread).

Children are written with server-side apply under one field manager and `force`, so the operator's intent
wins over hand edits of the fields it owns, while fields it does not set (e.g. annotations added by other
tools) are left alone.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kubernetes import client
from kubernetes.client.rest import ApiException

from flashserve.api.v1alpha1 import GROUP, PLURAL, VERSION
from flashserve.controller.observe import DRAIN_SINCE_ANNOTATION
from flashserve.render.naming import ROUTING_LABEL

FIELD_MANAGER = "flashserve-operator"
log = logging.getLogger(__name__)

_PATHS = {
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services/{name}",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods/{name}",
    ("apps/v1", "StatefulSet"): "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}",
    ("networking.k8s.io/v1", "NetworkPolicy"): "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}",
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): "/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains/{name}",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}",
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
    ("inference.networking.k8s.io/v1", "InferencePool"): "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}",
    ("discovery.k8s.io/v1", "EndpointSlice"): "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{name}",
}  # fmt: skip
_KIND_VERSION = {kind: api for api, kind in _PATHS}
EVENTS_PATH = "/api/v1/namespaces/{ns}/events"


class NotLeading(RuntimeError):
    """A write asked for while this replica does not hold the leader Lease (leader.LeaseElector.leading)."""


class WriteGate:
    """Asked before every write the operator makes (to the API server and to routers' worker routes): a replica
    that lost the Lease, or is releasing it, must not write beside the new leader, and its reconciles may still
    be running in threads when it notices. Counts the writes in flight, so that a clean shutdown releases the
    Lease only once those that passed the gate have landed."""

    def __init__(self, may_write: Callable[[], bool] | None = None):
        self.may_write = may_write
        self._lock = threading.Lock()
        self.in_flight = 0

    @contextmanager
    def write(self, what: str) -> Iterator[None]:
        with self._lock:
            if self.may_write is not None and not self.may_write():
                raise NotLeading(f"not written ({what}): this replica no longer leads")
            self.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1


class Kube:
    def __init__(self, api: client.ApiClient, gate: WriteGate | None = None):
        self.api = api
        self.requests = 0  # API calls made, for the benchmark's requests-per-reconcile figure
        self.gate = gate or WriteGate()

    def _call(self, method: str, path: str, body: object = None, content_type: str | None = None, query=None):
        if method != "GET":
            with self.gate.write(f"{method} {path}"):
                return self._send(method, path, body, content_type, query)
        return self._send(method, path, body, content_type, query)

    def _send(self, method: str, path: str, body: object, content_type: str | None, query) -> bytes:
        self.requests += 1
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, header_params=headers, body=body, post_params=post, _request_timeout=15)
        data = resp.read()
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=resp.reason, body=data)
        return data

    def apply(self, obj: dict) -> None:
        meta = obj["metadata"]
        path = _PATHS[(obj["apiVersion"], obj["kind"])].format(ns=meta["namespace"], name=meta["name"])
        # JSON is YAML, and a string body passes through the client untouched.
        self._call("PATCH", path, json.dumps(obj), "application/apply-patch+yaml",
                   [("fieldManager", FIELD_MANAGER), ("force", "true")])  # fmt: skip

    def patch_replicas(self, namespace: str, statefulset: str, replicas: int) -> None:
        path = _PATHS[("apps/v1", "StatefulSet")].format(ns=namespace, name=statefulset)
        self._call("PATCH", path, {"spec": {"replicas": replicas}}, "application/merge-patch+json",
                   [("fieldManager", FIELD_MANAGER)])  # fmt: skip

    def patch_pod_routing(self, namespace: str, name: str, uid: str, routing: str, since: str | None) -> None:
        """Set a pod's routing label, and its drain-since annotation (None removes it). The uid in the patch is
        a precondition: a pod re-created under the same name (a StatefulSet's are) is left alone, with a 409
        the caller takes for success, as it does a 404 (gone is as good as out of routing)."""
        path = _PATHS[("v1", "Pod")].format(ns=namespace, name=name)
        meta: dict = {"labels": {ROUTING_LABEL: routing}, "annotations": {DRAIN_SINCE_ANNOTATION: since}}
        if uid:
            meta["uid"] = uid
        try:
            self._call("PATCH", path, {"metadata": meta}, "application/merge-patch+json",
                       [("fieldManager", FIELD_MANAGER)])  # fmt: skip
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def get(self, namespace: str, kind: str, name: str) -> dict | None:
        """The object, or None when there is none of that name."""
        path = _PATHS[(_KIND_VERSION[kind], kind)].format(ns=namespace, name=name)
        try:
            return json.loads(self._call("GET", path))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, namespace: str, kind: str, name: str, uid: str | None = None) -> bool:
        """Delete an object (only the one with `uid`, when given: a same-named successor is left alone). False
        when there was nothing to delete (already gone, or replaced by another object)."""
        path = _PATHS[(_KIND_VERSION[kind], kind)].format(ns=namespace, name=name)
        body: dict = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", path, body, "application/json")
        except ApiException as exc:
            if exc.status not in (404, 409):  # already gone (or replaced by another object) is the goal
                raise
            return False
        return True

    def failed_create_message(self, namespace: str, statefulset: str, uid: str | None = None,
                              not_before: str | None = None) -> str | None:
        """The message of the latest FailedCreate Event the StatefulSet controller recorded on a StatefulSet
        (only on the one with `uid`, when given: not on an earlier one of the same name; only one last seen at
        or after `not_before`, RFC 3339, when given: not one left over from an earlier shortage), else None."""
        selector = f"involvedObject.kind=StatefulSet,involvedObject.name={statefulset},reason=FailedCreate"
        if uid:
            selector += f",involvedObject.uid={uid}"
        items = json.loads(self._call("GET", EVENTS_PATH.format(ns=namespace), query=[("fieldSelector", selector)]))
        events = [e for e in (items or {}).get("items") or [] if isinstance(e, dict)]
        if not_before:
            events = [e for e in events if _event_time(e)[:19] >= not_before[:19]]
        if not events:
            return None
        latest = max(events, key=_event_time)
        return str(latest.get("message") or "")

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        self._call("PATCH", path, {"status": status}, "application/merge-patch+json",
                   [("fieldManager", FIELD_MANAGER)])  # fmt: skip

    def annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
        body = {"metadata": {"annotations": {key: value}}}
        self._call("PATCH", path, body, "application/merge-patch+json", [("fieldManager", FIELD_MANAGER)])

    def patch_spec_replicas(self, namespace: str, name: str, replicas: int, resource_version: str | None) -> None:
        """Set spec.replicas, guarded by resourceVersion so a concurrent user edit is never overwritten blind."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
        meta = {"resourceVersion": resource_version} if resource_version else {}
        body = {"metadata": meta, "spec": {"replicas": replicas}}
        self._call("PATCH", path, body, "application/merge-patch+json", [("fieldManager", FIELD_MANAGER)])


def _event_time(event: dict) -> str:
    """When an Event was last seen (RFC 3339, which sorts as text): an aggregated one's last occurrence."""
    series = event.get("series") or {}
    return (event.get("lastTimestamp") or series.get("lastObservedTime") or event.get("eventTime")
            or (event.get("metadata") or {}).get("creationTimestamp") or "")  # fmt: skip
