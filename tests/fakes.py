"""Fakes shared by the controller tests: an in-memory API server behind the Kube interface, and what the
operator's watches would show of it."""

from __future__ import annotations

import copy
import json

from flashserve.controller.observe import Observed, PodView, slim
from flashserve.render.naming import GROUP_LABEL, SERVING_LABEL
from flashserve.render.renderer import TEMPLATE_HASH_ANNOTATION
from kubernetes.client.rest import ApiException

WATCHED = {"StatefulSet": "statefulsets", "Service": "services", "PodDisruptionBudget": "pdbs",
           "NetworkPolicy": "netpols"}  # fmt: skip


def api_error(status: int, message: str) -> ApiException:
    """An error as the API server sends it: a Status object with a message."""
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status}).encode()
    return ApiException(status=status, reason="Refused", body=body)


class FakeKube:
    """Objects by (kind, namespace, name). Apply replaces the object (enough for what the operator sets);
    StatefulSets get their pods at once, ready unless their name is in `unready`."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple] = []
        self.status: dict[tuple[str, str], dict] = {}
        self.unready: set[str] = set()
        self.refuse: dict[str, ApiException] = {}  # kind -> error every write of that kind gets
        self.requests = 0

    # -- the Kube interface

    def apply(self, obj: dict) -> None:
        self.requests += 1
        meta = obj["metadata"]
        self.calls.append(("apply", obj["kind"], meta["name"]))
        if obj["kind"] in self.refuse:
            raise self.refuse[obj["kind"]]
        key = (obj["kind"], meta["namespace"], meta["name"])
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"uid-{obj['kind']}-{meta['name']}")
        self.objects[key] = stored

    def get(self, namespace: str, kind: str, name: str) -> dict | None:
        self.requests += 1
        self.calls.append(("get", kind, name))
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def delete(self, namespace: str, kind: str, name: str, uid: str | None = None) -> None:
        self.requests += 1
        self.calls.append(("delete", kind, name))
        obj = self.objects.get((kind, namespace, name))
        if obj is not None and (uid is None or obj["metadata"].get("uid") == uid):
            del self.objects[(kind, namespace, name)]

    def patch_replicas(self, namespace: str, statefulset: str, replicas: int) -> None:
        self.requests += 1
        self.calls.append(("replicas", statefulset, replicas))
        self.objects[("StatefulSet", namespace, statefulset)]["spec"]["replicas"] = replicas

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.requests += 1
        self.calls.append(("status", name))
        self.status[(namespace, name)] = {**self.status.get((namespace, name), {}), **copy.deepcopy(status)}

    def annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        self.calls.append(("annotate", key, value))

    def patch_spec_replicas(self, namespace: str, name: str, replicas: int, resource_version: str | None) -> None:
        self.calls.append(("spec-replicas", name, replicas))

    # -- what the watches show

    def names(self, kind: str) -> set[str]:
        return {n for k, _, n in self.objects if k == kind}

    def observed(self, namespace: str, *label_values: str) -> Observed:
        """Children carrying one of `label_values` (as the operator's label-keyed indexes hold them), with
        the pods of each StatefulSet."""
        out = Observed()
        for (kind, ns, name), obj in self.objects.items():
            if ns != namespace or kind not in WATCHED:
                continue
            if (obj["metadata"].get("labels") or {}).get(SERVING_LABEL) not in label_values:
                continue
            getattr(out, WATCHED[kind])[name] = slim(obj)
            if kind == "StatefulSet":
                h = (obj["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION, "")
                group = int(obj["metadata"]["labels"].get(GROUP_LABEL, "-1"))
                for k in range(obj["spec"]["replicas"]):
                    out.pods.append(PodView(f"{name}-{k}", group, h, name not in self.unready, False, "Running",
                                            False, 0, "node"))  # fmt: skip
        return out
