"""Drain before removal through the reconciler (tests/fakes.py FakeKube and FakeEngines): the pods' routing
label and annotation as written, the engines asked (only the serving's own pods, at their pod IP and the
rendered port), the requeue while a drain lasts, status and events, a drain that an operator restart carries
on, a cancelled drain, and a one-group rollout through its surge group. Also the engine reader over real HTTP
on 127.0.0.1 and the Kube call that patches a pod. The plan's side is in test_plan.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flashserve.clock import iso_at, parse_iso
from flashserve.controller.drain import DRAIN_SETTLE_S, drain_targets, engine_address, parse_networks
from flashserve.controller.engine_metrics import EngineMetrics, requests_in_flight
from flashserve.controller.kube import Kube
from flashserve.controller.metrics import drain_gauge
from flashserve.controller.observe import DRAIN_SINCE_ANNOTATION, owned, pod_view
from flashserve.controller.reconciler import DRAIN_POLL_S, RECENT_WRITE_S
from flashserve.render.naming import (
    ROUTING_DRAIN,
    ROUTING_LABEL,
    ROUTING_SERVE,
    group_name,
    serving_label_value,
)
from kubernetes.client.rest import ApiException

from tests.builders import NS, body
from tests.fakes import (
    FakeApiClient,
    FakeEngines,
    FakeKube,
    api_error,
    conditions,
    controller,
    reconcile,
    routing_patches,
    settled,
)

LOG = logging.getLogger("test")


def G(i: int) -> str:
    return group_name("flash", i)


def pods(kube: FakeKube) -> dict[str, object]:
    return {p.name: p for p in kube.observed(NS, "flash").pods}


def serving_groups(kube: FakeKube) -> set[int]:
    """Groups whose every pod is ready and in routing: the ones that serve."""
    by_group: dict[int, list] = {}
    for p in kube.observed(NS, "flash").pods:
        by_group.setdefault(p.group, []).append(p)
    return {g for g, ps in by_group.items() if all(p.ready and p.routing == ROUTING_SERVE for p in ps)}


def reasons(events: list[dict]) -> list[str]:
    return [e["reason"] for e in events]


def test_scale_down_drains_then_deletes_once_the_engines_are_idle(events, clock):
    spec = {"replicas": 3, "parallelism": {"nodesPerReplica": 2}}
    engines = FakeEngines()
    kube, c, status = settled(spec, clock, engines)
    events.clear()
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status, generation=2))

    leaving = sorted(n for n in pods(kube) if n.startswith((G(1), G(2))))
    assert sorted(n for n, r in routing_patches(kube) if r == ROUTING_DRAIN) == leaving
    assert not [c for c in kube.calls if c[0] == "delete"], "nothing deleted while it drains"
    assert all(pods(kube)[n].routing == ROUTING_DRAIN for n in leaving)
    assert {parse_iso(pods(kube)[n].drain_since) for n in leaving} == {clock.time()}
    assert reasons(events) == ["DrainStarted", "DrainStarted"]
    assert [(d["group"], d["reason"], d["since"]) for d in status["drainingGroups"]] == [
        (2, "ScaleDown", iso_at(clock.time())), (1, "ScaleDown", iso_at(clock.time()))]
    assert conditions(status)["Progressing"]["reason"] == "Scaling"
    assert c.next_evaluation_in(body("flash", down)) == DRAIN_POLL_S, "polled while it drains, not at resync"
    assert engines.asked == [], "the engines are asked once their pods are out of routing"

    # Within the settle time the router may not have seen the label yet: idle engines do not end the drain.
    clock.advance(DRAIN_SETTLE_S - 1)
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", down, status=status, generation=2))
    assert kube.writes() == [], "the requests in flight, now known, are no status change"
    assert drain_gauge(c.drains).samples and {s.value for s in drain_gauge(c.drains).samples} == {0}
    assert sorted(engines.asked) == sorted((pods(kube)[n].ip, 8000) for n in leaving)

    clock.advance(1)
    events.clear()
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", down, status=status, generation=2))
    assert {c[1:] for c in kube.writes() if c[0] == "delete"} >= {("StatefulSet", G(1)), ("StatefulSet", G(2))}
    assert reasons(events).count("Drained") == 2 and "GroupsDeleted" in reasons(events)
    assert all("idle" in e["message"] and e["type"] == "Normal" for e in events if e["reason"] == "Drained")
    assert [(d["group"], d["endedBy"], d["requestsInFlight"]) for d in status["lastDrains"]] == [(2, "Idle", 0),
                                                                                                (1, "Idle", 0)]
    assert status["drainingGroups"] is None
    assert c.next_evaluation_in(body("flash", down)) == c.resync_seconds

    # Steady again: no request at all.
    clock.advance(RECENT_WRITE_S + 1)
    reconcile(c, kube, body("flash", down, status=status, generation=2))
    kube.calls.clear()
    engines.asked.clear()
    reconcile(c, kube, body("flash", down, status=status, generation=2))
    assert kube.calls == [] and engines.asked == []


def _busy_drain(clock, drain_seconds: int, load: int) -> tuple:
    """2 -> 1 groups, group 1 out of routing with `load` requests on its engine: (kube, controller, status,
    engines, the scaled-down spec)."""
    spec = {"replicas": 2, "rollout": {"drainSeconds": drain_seconds}}
    engines = FakeEngines()
    kube, c, status = settled(spec, clock, engines)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    engines.load[pods(kube)[f"{G(1)}-0"].ip] = load
    return kube, c, status, engines, down


def test_a_busy_group_goes_when_drain_seconds_pass_and_status_says_so(events, clock):
    kube, c, status, _, down = _busy_drain(clock, 30, 4)
    clock.advance(29)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, G(1)) in kube.objects
    assert [(s.labels["group"], s.value) for s in drain_gauge(c.drains).samples] == [("1", 4)]
    clock.advance(1)
    events.clear()
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, G(1)) not in kube.objects
    assert status["lastDrains"] == [{"group": 1, "reason": "ScaleDown", "endedBy": "Timeout", "seconds": 30.0,
                                     "requestsInFlight": 4, "time": iso_at(clock.time())}]  # fmt: skip
    (drained,) = [e for e in events if e["reason"] == "Drained"]
    assert drained["type"] == "Warning" and "timeout" in drained["message"] and "4 requests" in drained["message"]


def test_a_busy_engine_whose_readiness_fails_is_still_asked_and_not_cut(events, clock):
    """NotReady stops new requests, not the ones an engine holds (a health check that times out under load, a
    node gone NotReady): the drain asks the engine and waits for it, as for a ready one."""
    kube, c, status, engines, down = _busy_drain(clock, 300, 7)
    kube.unready.add(G(1))
    clock.advance(DRAIN_SETTLE_S + 1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, G(1)) in kube.objects
    assert [(s.labels["group"], s.value) for s in drain_gauge(c.drains).samples] == [("1", 7)]
    engines.load[pods(kube)[f"{G(1)}-0"].ip] = 0
    clock.advance(2)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, G(1)) not in kube.objects
    assert status["lastDrains"][0]["endedBy"] == "Idle"


def test_a_drain_survives_an_operator_restart(events, clock):
    spec = {"replicas": 2}
    kube, c, status = settled(spec, clock)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    since = pods(kube)[f"{G(1)}-0"].drain_since

    clock.advance(DRAIN_SETTLE_S + 1)
    fresh = controller(kube)  # a new operator process: nothing in memory, the state is on the pods
    kube.calls.clear()
    status = reconcile(fresh, kube, body("flash", down, status=status))
    assert not routing_patches(kube), "the pods are already out of routing: not written again"
    assert ("StatefulSet", NS, G(1)) not in kube.objects
    assert status["lastDrains"][0]["seconds"] == DRAIN_SETTLE_S + 1
    assert parse_iso(since) == clock.time() - DRAIN_SETTLE_S - 1


@pytest.mark.parametrize("since", ["9999-12-31T23:00:00-05:00", "2099-01-01T00:00:00Z"])
def test_a_drain_time_in_the_future_is_written_again_as_now(events, clock, since):
    """A hand edit, or a leader whose clock ran ahead: the drain neither waits out the gap nor fails to write
    a time past year 9999 into status."""
    spec = {"replicas": 2}
    kube, c, status = settled(spec, clock)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    kube.pod_meta[f"{G(1)}-0"]["annotations"][DRAIN_SINCE_ANNOTATION] = since
    clock.advance(RECENT_WRITE_S + 1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert parse_iso(pods(kube)[f"{G(1)}-0"].drain_since) == int(clock.time()), "labelled again, with the time now"
    clock.advance(DRAIN_SETTLE_S + 1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, G(1)) not in kube.objects
    assert status["lastDrains"][0]["endedBy"] == "Idle"


def test_a_drain_time_within_the_annotations_resolution_ahead_is_now_and_an_ended_pod_is_idle():
    from flashserve.controller.drain import in_flight, out_since
    from flashserve.controller.observe import Observed, PodView

    pod = PodView("g1-0", 1, "h", False, False, "Running", False, 0, "n", routing="drain",
                  drain_since="2026-01-01T00:00:01Z", ip="10.0.0.1", owner_uid="sts-uid")  # fmt: skip
    sts = {"g1": {"metadata": {"uid": "sts-uid"}}}
    now = parse_iso("2026-01-01T00:00:00.400Z")
    assert out_since(pod, now) == now, "a clock a fraction of a second ahead is no reason to relabel"
    assert out_since(pod, now - 2) is None
    observed = Observed(pods=[pod], in_flight={"g1-0": 3})
    assert in_flight(pod, observed) == 3 and drain_targets(Observed(pods=[pod], statefulsets=sts)) == [pod]
    for phase in ("Succeeded", "Failed"):
        ended = dataclasses.replace(pod, phase=phase)
        assert in_flight(ended, observed) == 0 and drain_targets(Observed(pods=[ended], statefulsets=sts)) == []


def test_scaling_back_up_puts_the_group_back_into_routing(events, clock):
    spec = {"replicas": 2}
    engines = FakeEngines(default=3)
    kube, c, status = settled(spec, clock, engines)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    clock.advance(RECENT_WRITE_S + 1)
    events.clear()
    kube.calls.clear()
    status = reconcile(c, kube, body("flash", spec, status=status))
    assert routing_patches(kube) == [(f"{G(1)}-0", ROUTING_SERVE)]
    assert pods(kube)[f"{G(1)}-0"].routing == ROUTING_SERVE and not pods(kube)[f"{G(1)}-0"].drain_since
    assert reasons(events)[0] == "DrainCancelled" and status["drainingGroups"] is None
    assert ("StatefulSet", NS, G(1)) in kube.objects


def test_a_single_group_keeps_serving_through_a_rollout_by_way_of_a_surge_group(events, clock):
    spec = {"replicas": 1, "parallelism": {"nodesPerReplica": 2}}
    kube, c, status = settled(spec, clock)
    new = {**spec, "engine": {"image": "vllm/vllm-openai:v0.33.1"}}
    seen: list[str] = []
    for _ in range(12):  # each step: reconcile, time passes, the watches catch up
        status = reconcile(c, kube, body("flash", new, status=status, generation=2))
        assert serving_groups(kube), f"no group serves after {reasons(events)}"
        seen += reasons(events)
        events.clear()
        clock.advance(DRAIN_SETTLE_S + RECENT_WRITE_S)
    assert seen.index("SurgeCreated") < seen.index("DrainStarted") < seen.index("GroupUpdating"), seen
    assert seen.count("DrainStarted") == 2 and seen.count("Drained") == 2, "group 0, then the surge group"
    assert ("StatefulSet", NS, G(1)) not in kube.objects and "GroupsDeleted" in seen
    assert status["updatedReplicas"] == 1 and conditions(status)["Progressing"]["reason"] == "Complete"
    assert serving_groups(kube) == {0}


def test_a_surge_group_no_node_takes_is_reported_and_the_old_group_keeps_serving(events, clock):
    spec = {"replicas": 1}
    kube, c, status = settled(spec, clock)
    new = {**spec, "engine": {"image": "vllm/vllm-openai:v0.33.1"}}
    status = reconcile(c, kube, body("flash", new, status=status, generation=2))
    assert ("StatefulSet", NS, G(1)) in kube.objects
    observed = kube.observed(NS, "flash")
    observed.pods = [dataclasses.replace(p, ready=False, unschedulable=True, phase="Pending") if p.group == 1 else p
                     for p in observed.pods]  # fmt: skip
    asyncio.run(c.reconcile(body("flash", new, status=status, generation=2), observed, LOG))
    status = kube.status[(NS, "flash")]
    assert conditions(status)["Degraded"]["reason"] == "SurgeUnschedulable"
    assert "spec.rollout.surge: false" in conditions(status)["Degraded"]["message"]
    assert serving_groups(kube) >= {0} and not routing_patches(kube)


# -- only the serving's own pods are asked, at their pod IP and the rendered port


def test_only_pods_the_servings_own_statefulsets_control_are_probed(events, clock):
    spec = {"replicas": 2, "engine": {"port": 8123}}
    engines = FakeEngines(default=1)
    kube, c, status = settled(spec, clock, engines)
    status = reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))
    observed = kube.observed(NS, "flash")
    mine = [p for p in observed.pods if p.group == 1]
    strays = [
        dataclasses.replace(mine[0], name=f"{G(1)}-7", owner_uid="uid-someone-else", ip="10.9.9.9"),
        dataclasses.replace(mine[0], name=f"{G(1)}-8", host_network=True, ip="172.16.0.4", owner_uid=mine[0].owner_uid),
        dataclasses.replace(mine[0], name=f"{G(1)}-9", ip="metadata.google.internal", owner_uid=mine[0].owner_uid),
        dataclasses.replace(mine[0], name="other--abcdefgh-g1-0", ip="10.9.9.10", owner_uid="uid-other-sts"),
    ]
    observed.pods += strays
    clock.advance(1)
    asyncio.run(c.reconcile(body("flash", {**spec, "replicas": 1}, status=status), observed, LOG))
    assert engines.asked == [(mine[0].ip, 8123)]

    # The same through the pure selection, for a serving whose uid rules out another's StatefulSet.
    other = kube.observed(NS, "flash")
    other.statefulsets["other--abcdefgh-g1"] = {**other.statefulsets[G(1)], "metadata": {
        **other.statefulsets[G(1)]["metadata"], "name": "other--abcdefgh-g1", "uid": "uid-other-sts",
        "ownerReferences": [{"controller": True, "uid": "uid-other", "kind": "DeepSeekServing"}]}}  # fmt: skip
    other.pods += [dataclasses.replace(p, routing=ROUTING_DRAIN) for p in strays]
    targets = drain_targets(owned(other, "uid-flash", serving_label_value("flash")))
    assert [p.name for p in targets] == [mine[0].name]


def test_engine_addresses_are_plain_ip_addresses():
    assert engine_address("10.64.0.3") == "10.64.0.3"
    assert engine_address("fd00::5") == "[fd00::5]"
    for bad in ("", "0.0.0.0", "::", "224.0.0.1", "10.0.0.1:80", "10.0.0.1/evil", "evil.example.com", "10.0.0.1 "):
        assert engine_address(bad) is None, bad


def test_pod_view_reads_the_drain_state_and_the_pod_ip():
    p = pod_view({"metadata": {"name": "flash--x-g1-0", "uid": "u1",
                               "labels": {"flashserve.io/group": "1", ROUTING_LABEL: ROUTING_DRAIN},
                               "annotations": {DRAIN_SINCE_ANNOTATION: "2026-01-01T00:00:05Z"},
                               "ownerReferences": [{"controller": True, "uid": "sts-uid"}]},
                  "spec": {"hostNetwork": True}, "status": {"podIP": "10.64.0.9", "phase": "Running"}})  # fmt: skip
    assert (p.routing, p.drain_since, p.ip, p.uid, p.owner_uid, p.host_network) == (
        ROUTING_DRAIN, "2026-01-01T00:00:05Z", "10.64.0.9", "u1", "sts-uid", True)
    assert parse_iso(p.drain_since) == 1_767_225_605.0 and parse_iso("yesterday") is None


# -- the reader over HTTP, and the Kube call


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="deepseek-flash"} 2.0
vllm:num_requests_running{engine="1",model_name="deepseek-flash"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="deepseek-flash"} 0.0
vllm:num_requests_waiting{engine="1",model_name="deepseek-flash"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="deepseek-flash"} 0.5
"""


def test_requests_in_flight_sum_running_and_waiting_over_the_ranks():
    assert requests_in_flight(VLLM_METRICS) == 7
    assert requests_in_flight(VLLM_METRICS.replace(" 4.0", " NaN")) is None
    assert requests_in_flight("# TYPE up gauge\nup 1\n") is None, "not an engine's metrics"
    assert requests_in_flight("<html>not metrics</html>") is None


@pytest.fixture
def http_server(serve_http):
    """Servers on 127.0.0.1 answering with `routes[path] = (status, headers, body)`; every path asked is in `seen`."""

    def start(routes: dict) -> tuple[int, list[str]]:
        seen: list[str] = []

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                code, headers, data = routes.get(self.path, (404, {}, b""))
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        _, server = serve_http(H)
        return server.server_address[1], seen

    return start


def test_the_reader_asks_the_engine_directly_and_follows_no_redirect_nor_proxy(http_server, monkeypatch):
    port, seen = http_server({"/metrics": (200, {}, VLLM_METRICS.encode())})
    proxy_port, proxied = http_server({})
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy_port}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    reader = EngineMetrics(timeout=2.0)
    assert reader.requests_in_flight("127.0.0.1", port) == 7
    assert seen == ["/metrics"] and proxied == []

    elsewhere, asked = http_server({"/metrics": (200, {}, VLLM_METRICS.encode())})
    redirecting, _ = http_server({"/metrics": (302, {"Location": f"http://127.0.0.1:{elsewhere}/metrics"}, b"")})
    assert reader.requests_in_flight("127.0.0.1", redirecting) is None and asked == []
    failing, _ = http_server({"/metrics": (500, {}, b"boom")})
    assert reader.requests_in_flight("127.0.0.1", failing) is None
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    free = closed.server_address[1]
    closed.server_close()
    # Nothing listens: the engine is gone, so it holds no request (a drain need not wait for its timeout).
    assert reader.requests_in_flight("127.0.0.1", free) == 0
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers: says nothing of its requests
    try:
        assert EngineMetrics(timeout=0.5).requests_in_flight("127.0.0.1", silent.getsockname()[1]) is None
    finally:
        silent.close()


def test_kube_patches_a_pods_routing_with_its_uid_as_precondition():
    api = FakeApiClient()
    kube = Kube(api)  # type: ignore[arg-type]
    path = f"/api/v1/namespaces/{NS}/pods/{G(1)}-0"
    kube.patch_pod_routing(NS, f"{G(1)}-0", "uid-1", ROUTING_DRAIN, "2026-01-01T00:00:00Z")
    kube.patch_pod_routing(NS, f"{G(1)}-0", "uid-1", ROUTING_SERVE, None)
    drain, serve = api.requests
    assert (drain["method"], drain["path"], drain["headers"]["Content-Type"]) == (
        "PATCH", path, "application/merge-patch+json")
    assert drain["body"] == {"metadata": {"uid": "uid-1", "labels": {ROUTING_LABEL: ROUTING_DRAIN},
                                          "annotations": {DRAIN_SINCE_ANNOTATION: "2026-01-01T00:00:00Z"}}}  # fmt: skip
    assert serve["body"]["metadata"]["annotations"] == {DRAIN_SINCE_ANNOTATION: None}, "null removes it"
    for status in (404, 409):  # gone, or a new pod of the same name: nothing to do
        api.answers[("PATCH", path)] = (status, "gone or replaced")
        kube.patch_pod_routing(NS, f"{G(1)}-0", "uid-1", ROUTING_DRAIN, "2026-01-01T00:00:00Z")
    api.answers[("PATCH", path)] = (403, 'pods "x" is forbidden: cannot patch resource "pods"')
    with pytest.raises(ApiException):
        kube.patch_pod_routing(NS, f"{G(1)}-0", "uid-1", ROUTING_DRAIN, "2026-01-01T00:00:00Z")


def test_a_refused_pod_patch_is_reported_and_the_group_is_not_deleted(events, clock):
    kube, c, status = settled({"replicas": 2}, clock)
    kube.errors[("patch", "Pod")] = api_error(403, 'pods "flash-g1-0" is forbidden: cannot patch resource "pods"')
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert "cannot patch resource" in conditions(status)["Degraded"]["message"]
    assert "DrainStarted" not in reasons(events)
    clock.advance(600)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert ("StatefulSet", NS, G(1)) in kube.objects, "a group never taken out of routing is not removed"


def test_engine_networks_bound_the_addresses_asked(events, clock):
    """The local cluster runs the operator with --engine-networks 127.0.0.0/8: a pod IP outside is never asked
    (its drain then ends by drainSeconds), so the operator sends nothing off the machine."""
    from flashserve.controller.main import _parser

    args = _parser().parse_args(["--engine-networks", "127.0.0.0/8, fd00::/8"])
    assert [str(n) for n in args.engine_networks] == ["127.0.0.0/8", "fd00::/8"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["--engine-networks", "10.0.0.0/33"])

    engines = FakeEngines()
    kube, c, status = settled({"replicas": 2}, clock, engines)
    c.engine_networks = args.engine_networks
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    clock.advance(DRAIN_SETTLE_S)
    status = reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert engines.asked == [], "FakeKube's pod IPs are in 10.64.0.0/16"
    assert ("StatefulSet", NS, G(1)) in kube.objects and not drain_gauge(c.drains).samples
    ip = pods(kube)[f"{G(1)}-0"].ip
    c.engine_networks = parse_networks("10.64.0.0/16")
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert [a for a, _ in engines.asked] == [ip]
    assert ("StatefulSet", NS, G(1)) not in kube.objects, "asked, idle, gone"


def test_relabelling_a_pod_never_takes_it_from_its_statefulset():
    """A StatefulSet releases pods its selector no longer matches: the routing label must stay out of it (and
    out of every selector that owns pods), or a drain would orphan the group's pods."""
    from flashserve.api.validation import parse_serving
    from flashserve.render.renderer import render_serving

    objs = render_serving(parse_serving(body("flash", {"replicas": 2, "parallelism": {"nodesPerReplica": 2}})))
    stss = [o for o in objs if o["kind"] == "StatefulSet"]
    assert len(stss) == 2
    for sts in stss:
        assert ROUTING_LABEL not in sts["spec"]["selector"]["matchLabels"]
        assert not sts["spec"]["selector"].get("matchExpressions")
    assert sts["spec"]["updateStrategy"]["type"] == "OnDelete", "nor does it rewrite the labels of its pods"


def test_a_busy_drain_writes_status_only_when_it_starts_and_ends(events, clock):
    spec = {"replicas": 4, "rollout": {"drainSeconds": 60}}
    engines = FakeEngines(default=9)
    kube, c, status = settled(spec, clock, engines)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status, generation=2))
    started = len(kube.status_patches)
    assert [d["group"] for d in status["drainingGroups"]] == [3, 2, 1]
    for load in range(10, 30):  # every poll finds other counts on the busy engines
        engines.default = load
        clock.advance(DRAIN_POLL_S)
        status = reconcile(c, kube, body("flash", down, status=status, generation=2))
    assert len(kube.status_patches) == started, "no status write while the drain waits"
    assert {s.value for s in drain_gauge(c.drains).samples} == {29}, "the counts are in the gauge"
    engines.default = 0
    clock.advance(DRAIN_POLL_S)
    status = reconcile(c, kube, body("flash", down, status=status, generation=2))
    assert len(kube.status_patches) == started + 1 and status["drainingGroups"] is None
    assert [d["requestsInFlight"] for d in status["lastDrains"]] == [0, 0, 0]
    assert drain_gauge(c.drains).samples == [], "no drain, no sample"
