"""Fakes shared by the tests: an in-memory API server behind the Kube interface and what the operator's
watches would show of it, the controller wired to it, and a Prometheus that answers canned values.

Test modules import fakes from here (builders from tests/builders.py, fixtures from conftest.py), never from
one another."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from flashserve.api.validation import parse_serving
from flashserve.clock import now_iso
from flashserve.autoscaling.allowlist import PrometheusAllowList
from flashserve.autoscaling.promql import Queries
from flashserve.controller.autoscale import Autoscaler
from flashserve.controller.observe import CHILDREN, DRAIN_SINCE_ANNOTATION, Observed, PodView, slim
from flashserve.controller.reconciler import RECENT_WRITE_S, Controller
from flashserve.render.naming import (
    GROUP_LABEL,
    ROUTING_LABEL,
    ROUTING_SERVE,
    SERVING_LABEL,
    legacy_serving_label_value,
    serving_label_value,
)
from flashserve.render.renderer import TEMPLATE_HASH_ANNOTATION
from kubernetes.client.rest import ApiException

from tests.builders import NS, body

# The kinds the operator's indexes hold by name, and the Observed field of each (pods are indexed apart)
WATCHED = {c.kind: c.field for c in CHILDREN if c.field != "pods"}
SERVING_KIND = "DeepSeekServing"  # the kind `errors` keys a status patch under


def api_error(status: int, message: str) -> ApiException:
    """An error as the API server sends it: a Status object with a message."""
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status}).encode()
    return ApiException(status=status, reason="Refused", body=body)


class FakeKube:
    """Objects by (kind, namespace, name). Apply replaces the object (enough for what the operator sets);
    StatefulSets get their pods at once, ready unless their name is in `unready` (Deployments likewise get
    their available replicas), none when `refuse_pods`
    made the API server refuse them (and recorded the StatefulSet controller's FailedCreate Event in `events`).

    Every call is recorded in `calls`, also the ones that fail. `errors[(verb, kind)]` is raised by every such
    call, or, when it is a list, by the next calls one each; before the call changes anything (verbs: apply,
    get, delete, replicas, patch, status, list; a pod's routing patch is a patch of kind Pod, a status patch is of kind DeepSeekServing, an Event list of kind Event). They are errors as they reach the
    controller through the real Kube, which already turns a 404 or 409 on delete into success."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple] = []
        self.status: dict[tuple[str, str], dict] = {}
        self.status_patches: list[dict] = []  # each status patch as sent
        self.unready: set[str] = set()
        self.refused: set[str] = set()  # StatefulSets whose pods the API server refuses
        self.events: list[dict] = []  # core/v1 Events, as other controllers record them
        self.errors: dict[tuple[str, str], BaseException | list[BaseException]] = {}
        self.requests = 0
        self.router_pods = False  # also show the router Deployments' pods (Running, ready, 10.65.0.0/16)
        self.router_started_at: float | None = None  # their router container's start (None: not in the status)
        self.engine_ready_at: float | None = None  # when ready engine pods turned Ready (None: not in the status)
        # Pods are made from their StatefulSet at each look; what was patched onto one lives here until it is
        # deleted (then the StatefulSet makes it again, with a new uid and its template's labels).
        self.pod_meta: dict[str, dict] = {}  # pod -> {"labels": ..., "annotations": ...}
        self.pod_generation: dict[str, int] = {}

    def _fail(self, verb: str, kind: str) -> None:
        exc = self.errors.get((verb, kind))
        if isinstance(exc, list):  # one error per call, then the calls succeed
            exc = exc.pop(0)
            if not self.errors[(verb, kind)]:
                del self.errors[(verb, kind)]
        if exc is not None:
            raise exc

    def writes(self) -> list[tuple]:
        """The calls that change something (all but reads)."""
        return [c for c in self.calls if c[0] != "get"]

    # -- the Kube interface

    def apply(self, obj: dict) -> None:
        self.requests += 1
        meta = obj["metadata"]
        self.calls.append(("apply", obj["kind"], meta["name"]))
        self._fail("apply", obj["kind"])
        key = (obj["kind"], meta["namespace"], meta["name"])
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"uid-{obj['kind']}-{meta['name']}")
        if obj["kind"] == "Deployment":  # its pods come up at once, unless its name is in `unready`
            ready = 0 if meta["name"] in self.unready else obj["spec"]["replicas"]
            # An unready one is still rolling out (Progressing True, ReplicaSetUpdated), as the Deployment
            # controller reports pods that do not pass their readiness probe yet.
            done = "ReplicaSetUpdated" if ready == 0 else "NewReplicaSetAvailable"
            stored["status"] = {"replicas": obj["spec"]["replicas"], "readyReplicas": ready, "availableReplicas": ready,
                                "conditions": [{"type": "Progressing", "status": "True", "reason": done}]}
        self.objects[key] = stored

    def get(self, namespace: str, kind: str, name: str) -> dict | None:
        self.requests += 1
        self.calls.append(("get", kind, name))
        self._fail("get", kind)
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def delete(self, namespace: str, kind: str, name: str, uid: str | None = None) -> bool:
        self.requests += 1
        self.calls.append(("delete", kind, name))
        self._fail("delete", kind)
        if kind == "Pod":
            self.pod_meta.pop(name, None)
            self.pod_generation[name] = self.pod_generation.get(name, 0) + 1
            return True
        obj = self.objects.get((kind, namespace, name))
        if obj is not None and (uid is None or obj["metadata"].get("uid") == uid):
            del self.objects[(kind, namespace, name)]
            return True
        return False  # the API server's 404 (or 409 on a uid precondition), which Kube.delete returns as False

    def pod_uid(self, name: str) -> str:
        return f"uid-Pod-{name}-{self.pod_generation.get(name, 0)}"

    def pod_ip(self, statefulset: str, k: int) -> str:
        """A pod's IP: one per pod of each StatefulSet the fake has seen, in 10.64.0.0/16."""
        order = sorted(n for kd, _, n in self.objects if kd == "StatefulSet")
        i = order.index(statefulset) if statefulset in order else 0
        return f"10.64.{i}.{k + 1}"

    def patch_pod_routing(self, namespace: str, name: str, uid: str, routing: str, since: str | None) -> None:
        self.requests += 1
        self.calls.append(("pod-routing", name, routing))
        self._fail("patch", "Pod")
        if uid and uid != self.pod_uid(name):
            return  # another pod of the same name: the uid precondition fails (409), which Kube takes as done
        meta = self.pod_meta.setdefault(name, {"labels": {}, "annotations": {}})
        meta["labels"][ROUTING_LABEL] = routing
        if since is None:
            meta["annotations"].pop(DRAIN_SINCE_ANNOTATION, None)
        else:
            meta["annotations"][DRAIN_SINCE_ANNOTATION] = since

    def patch_replicas(self, namespace: str, statefulset: str, replicas: int) -> None:
        self.requests += 1
        self.calls.append(("replicas", statefulset, replicas))
        self._fail("replicas", "StatefulSet")
        self.objects[("StatefulSet", namespace, statefulset)]["spec"]["replicas"] = replicas

    def failed_create_message(self, namespace: str, statefulset: str, uid: str | None = None,
                              not_before: str | None = None) -> str | None:
        self.requests += 1
        self.calls.append(("list", "Event", statefulset))
        self._fail("list", "Event")
        mine = [e for e in self.events if e["metadata"]["namespace"] == namespace and e["reason"] == "FailedCreate"
                and e["involvedObject"]["kind"] == "StatefulSet" and e["involvedObject"]["name"] == statefulset
                and (uid is None or e["involvedObject"]["uid"] == uid)
                and (not_before is None or e["lastTimestamp"][:19] >= not_before[:19])]  # fmt: skip
        return max(mine, key=lambda e: e["lastTimestamp"])["message"] if mine else None

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.requests += 1
        self.calls.append(("status", name))
        self._fail("status", SERVING_KIND)
        self.status_patches.append(copy.deepcopy(status))
        self.status[(namespace, name)] = {**self.status.get((namespace, name), {}), **copy.deepcopy(status)}

    def annotate(self, namespace: str, name: str, key: str, value: str) -> None:
        self.calls.append(("annotate", key, value))

    def patch_spec_replicas(self, namespace: str, name: str, replicas: int, resource_version: str | None) -> None:
        self.calls.append(("spec-replicas", name, replicas))

    # -- what other controllers do

    def refuse_pods(self, statefulset: str, why: str, at: str | None = None, uid: str | None = None) -> None:
        """The API server refuses the pods of `statefulset` (`why`, as admission words it): the StatefulSet
        gets none, and the StatefulSet controller records a FailedCreate Event on it, worded as it words them."""
        self.refused.add(statefulset)
        pod = f"{statefulset}-0"
        self.events.append({
            "metadata": {"name": f"{statefulset}.{len(self.events):x}", "namespace": NS},
            "involvedObject": {"kind": "StatefulSet", "name": statefulset, "namespace": NS,
                               "uid": uid or f"uid-StatefulSet-{statefulset}"},
            "reason": "FailedCreate", "type": "Warning", "lastTimestamp": at or now_iso(),
            "message": f"create Pod {pod} in StatefulSet {statefulset} failed error: pods \"{pod}\" is forbidden: {why}",
        })  # fmt: skip

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
                template = ((obj["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
                for k in range(0 if name in self.refused else obj["spec"]["replicas"]):
                    pod = f"{name}-{k}"
                    meta = self.pod_meta.get(pod, {"labels": {}, "annotations": {}})
                    routing = meta["labels"].get(ROUTING_LABEL, template.get(ROUTING_LABEL, ROUTING_SERVE))
                    ready_at = self.engine_ready_at if name not in self.unready else None
                    out.pods.append(PodView(pod, group, h, name not in self.unready, False, "Running", False, 0,
                                            "node", routing=routing,
                                            drain_since=meta["annotations"].get(DRAIN_SINCE_ANNOTATION, ""),
                                            ip=self.pod_ip(name, k), uid=self.pod_uid(pod),
                                            owner_uid=obj["metadata"]["uid"],
                                            ready_at=ready_at))  # fmt: skip
            if kind == "Deployment" and self.router_pods:
                for k in range(obj["spec"]["replicas"]):
                    out.pods.append(PodView(f"{name}-5d8f9c7b4-r{k}", -1, "", True, False, "Running", False, 0, "node",
                                            ip=f"10.65.0.{k + 1}", component="router",
                                            started_at=self.router_started_at))  # fmt: skip
        return out


# -- the controller wired to a FakeKube


class FakeEngines:
    """Engines' requests in flight by pod IP (`default` for the others), and every (host, port) asked."""

    def __init__(self, default: int | None = 0):
        self.load: dict[str, int | None] = {}
        self.default = default
        self.asked: list[tuple[str, int]] = []

    def requests_in_flight(self, host: str, port: int) -> int | None:
        self.asked.append((host, port))
        return self.load.get(host, self.default)


def controller(kube: FakeKube, engines: FakeEngines | None = None) -> Controller:
    c = Controller(api=None, engines=engines or FakeEngines())  # type: ignore[arg-type]
    c.kube = kube
    return c


def reconcile(c: Controller, kube: FakeKube, b: dict) -> dict:
    """One reconcile of `b`, seeing what the watches would show of `kube`; the serving's status after it."""
    name = b["metadata"]["name"]
    observed = kube.observed(NS, serving_label_value(name), legacy_serving_label_value(name))
    asyncio.run(c.reconcile(b, observed, logging.getLogger("test")))
    return kube.status.get((NS, name), {})


def install(kube: FakeKube, objs: list[dict]) -> None:
    """Objects that exist before the test starts (their writes are not the test's)."""
    for o in objs:
        kube.apply(o)
    kube.calls.clear()


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions", [])}


# -- a Prometheus with canned answers, and the autoscaler reading it

QUERIES = Queries("team-a", "flash", window_s=60, percentile=90)
BY_QUERY = {q: name for name, q in QUERIES.all().items()}
CANNED = {
    "sample_age": 4.0, "running": 500.0, "waiting": 20.0, "running_avg": 480.0,
    "generation_tokens_rate": 48_100.0, "first_tokens_rate": 100.0, "itl_steps_rate": 30_000.0,
    "tpot_requests_rate": 95.0, "tpot_at_percentile": 0.0095, "tpot_p50": 0.008, "itl_at_percentile": 0.016, "itl_p50": 0.012, "kv_usage_avg": 0.55, "kv_usage_max": 0.7,
    "ttft_at_percentile": 1.5, "replicas_reporting": 2.0,
}  # fmt: skip


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers the instant queries of QUERIES with `values`; `mode` makes it hang, fail, answer no series or NaN."""

    mode = "ok"
    seen: list[str] = []
    values: dict = CANNED

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        query = parse_qs(url.query).get("query", [""])[0]
        type(self).seen.append(query)
        if self.mode == "hang":
            time.sleep(3.0)
        if self.mode == "error" or url.path != "/api/v1/query":
            return self._send(500, {"status": "error", "error": "boom"})
        name = BY_QUERY.get(query)
        value = None if self.mode == "empty" else self.values.get(name) if name else None
        if self.mode == "nan" and name in ("itl_at_percentile", "tpot_at_percentile"):
            value = float("nan")
        result = [] if value is None else [{"metric": {}, "value": [time.time(), repr(float(value))]}]
        self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class RecordingKube:
    """The two writes the autoscaler makes, recorded instead of sent."""

    def __init__(self, objects: dict | None = None):
        self.calls: list[tuple] = []
        self.objects = objects or {}  # (kind, namespace, name) -> object, for the reads it makes

    def get(self, namespace, kind, name):
        self.calls.append(("get", kind, namespace, name))
        return self.objects.get((kind, namespace, name))

    def patch_spec_replicas(self, namespace, name, replicas, resource_version):
        self.calls.append(("replicas", namespace, name, replicas, resource_version))

    def annotate(self, namespace, name, key, value):
        self.calls.append(("annotate", key, json.loads(value)))


def loopback_scaler() -> Autoscaler:
    """The fake Prometheus listens on 127.0.0.1, which a serving may name only when the operator allows it."""
    return Autoscaler(allow=PrometheusAllowList(entries=("127.0.0.1",)))


def evaluate(scaler: Autoscaler, body: dict, observed: Observed, kube: RecordingKube):
    obj = parse_serving(body)
    # The StatefulSets carry no template hash here: readiness is what the autoscaler counts.
    return asyncio.run(scaler.evaluate(body, obj, observed, kube, logging.getLogger("test")))


# -- the HTTP side of the real Kube


class FakeResponse:
    def __init__(self, status: int, body: bytes):
        self.status, self.reason, self._body = status, "OK" if status < 400 else "Error", body

    def read(self) -> bytes:
        return self._body


class FakeApiClient:
    """Stands in for kubernetes.client.ApiClient under the real Kube: records each request and answers
    `answers[(method, path)]` (a status and a Status object's message, or a JSON body), else 200 `{}`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answers: dict[tuple[str, str], tuple[int, object]] = {}

    def param_serialize(self, method, resource_path, query_params, header_params, body, auth_settings):
        self._query = list(query_params)
        return method, resource_path, header_params, body, []

    def call_api(self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        self.requests.append({"method": method, "path": url, "query": self._query, "headers": header_params,
                              "body": body})  # fmt: skip
        status, answer = self.answers.get((method, url), (200, {}))
        if isinstance(answer, str):  # an error message: sent as the API server sends it
            return FakeResponse(status, api_error(status, answer).body)
        return FakeResponse(status, json.dumps(answer).encode())


class Clock:
    """The reconciler's clock, moved by hand: monotonic seconds and the ISO times conditions carry."""

    def __init__(self):
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        """The wall clock: 2026-01-01T00:00:00Z plus `now` (iso() names the same moment, within the hour)."""
        return 1_767_225_600.0 + self.now

    def iso(self) -> str:
        return f"2026-01-01T00:{int(self.now) // 60 % 60:02d}:{int(self.now) % 60:02d}Z"


def settled(spec: dict, clock, engines: FakeEngines | None = None) -> tuple:
    """A serving reconciled twice (children made, status written), past the recent-write window, calls cleared:
    what the drain tests start from. Returns (kube, controller, status)."""
    kube = FakeKube()
    c = controller(kube, engines)
    status = reconcile(c, kube, body("flash", spec))
    status = reconcile(c, kube, body("flash", spec, status=status))
    clock.advance(RECENT_WRITE_S + 1)
    kube.calls.clear()
    return kube, c, status


def routing_patches(kube: FakeKube) -> list[tuple[str, str]]:
    """(pod, routing label) of each routing patch the controller sent."""
    return [(c[1], c[2]) for c in kube.calls if c[0] == "pod-routing"]

