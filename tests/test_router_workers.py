"""The router's workers where the operator keeps them (`routing.policy: rendezvous_hash`): which engines and
ranks it registers, what it removes, which router pods it asks, and the reconcile that does it; under the
discovery policies, the reads that confirm a drained group has left the routers.
tests/router/test_vllm_router.py runs the same client against the real vllm-router."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from flashserve.api.v1alpha1 import DEFAULT_SERVED_NAME
from flashserve.clock import parse_iso
from flashserve.controller.drain import DRAIN_SETTLE_S, parse_networks
from flashserve.controller.observe import Observed, PodView
from flashserve.controller.reconciler import RECENT_WRITE_S
from flashserve.controller.router_workers import (
    REPAIR_GRACE_S,
    Repair,
    RouterUnreachable,
    RouterWorkersClient,
    Sync,
    Worker,
    desired_workers,
    discovery_repair,
    listed_workers,
    out_of_routing,
    router_targets,
    still_routed,
    sync_steps,
)
from flashserve.render.naming import router_name

from tests.builders import NS
from tests.fakes import FakeEngines, FakeKube, body, controller, reconcile

LOG = logging.getLogger("test")


def _pod(name: str, ip: str, ready: bool = True, routing: str = "serve", **kw) -> PodView:
    return PodView(name, 0, "h", ready, kw.pop("terminating", False), kw.pop("phase", "Running"), False, 0, "node",
                   routing=routing, ip=ip, **kw)  # fmt: skip


def test_one_worker_per_rank_of_each_ready_engine_that_takes_traffic():
    observed = Observed(pods=[
        _pod("g0-0", "10.0.0.1"), _pod("g1-0", "fd00::7"),
        _pod("g2-0", "10.0.0.3", ready=False),  # starting: the router would send requests it cannot serve
        _pod("g3-0", "10.0.0.4", routing="drain"),  # being drained
        _pod("g4-0", "10.0.0.5", terminating=True),
        _pod("g5-0", ""),  # no IP yet
        _pod("g6-0", "10.0.0.6", host_network=True),
        _pod("g7-0", "0.0.0.0"),
    ])  # fmt: skip
    got = desired_workers(observed, 8000, 2, "dsv4")
    assert got == {Worker("http://10.0.0.1:8000@0", "dsv4"), Worker("http://10.0.0.1:8000@1", "dsv4"),
                   Worker("http://[fd00::7]:8000@0", "dsv4"), Worker("http://[fd00::7]:8000@1", "dsv4")}  # fmt: skip
    one, two = Worker("http://10.0.0.1:8000", "m"), Worker("http://[fd00::7]:8000", "m")
    assert desired_workers(observed, 8000, 1, "m") == {one, two}
    assert desired_workers(observed, 8000, 1, "m", parse_networks("10.0.0.0/8")) == {one}


def test_router_pods_are_asked_running_ready_or_not_and_inside_the_networks():
    observed = Observed(router_pods=[
        _pod("r-b", "10.1.0.2", ready=False), _pod("r-a", "10.1.0.1"),
        _pod("r-c", "10.1.0.3", phase="Pending"), _pod("r-d", "10.1.0.4", terminating=True), _pod("r-e", "192.0.2.9"),
    ])  # fmt: skip
    assert router_targets(observed, 8100) == [("r-a", "http://10.1.0.1:8100"), ("r-b", "http://10.1.0.2:8100"),
                                              ("r-e", "http://192.0.2.9:8100")]  # fmt: skip
    assert [n for n, _ in router_targets(observed, 8100, parse_networks("10.1.0.0/16"))] == ["r-a", "r-b"]


def test_what_the_router_lists_is_made_what_is_desired():
    listing = {"workers": [
        {"url": "http://10.0.0.1:8000@0", "model_id": "dsv4", "metadata": {"policy": "rendezvous_hash"}},
        {"url": "http://10.0.0.1:8000@1", "model_id": "other", "metadata": {"policy": "rendezvous_hash"}},
        {"url": "http://10.0.0.9:8000@0", "model_id": "dsv4", "metadata": {"policy": "rendezvous_hash"}},
        {"url": "http://203.0.113.5:80", "model_id": "unknown", "metadata": {}},  # what a client added
        {"url": "http://10.0.0.2:8000@0", "model_id": "dsv4", "metadata": {"policy": "consistent_hash"}},
        {"no": "url"}, "junk",
    ]}  # fmt: skip
    listed = listed_workers(listing, "rendezvous_hash")
    desired = {Worker(f"http://10.0.0.{i}:8000@{r}", "dsv4") for i in (1, 2) for r in (0, 1)}
    steps = sync_steps(listed, desired)
    assert steps.remove == ("http://10.0.0.1:8000@1", "http://10.0.0.2:8000@0", "http://10.0.0.9:8000@0",
                            "http://203.0.113.5:80")  # fmt: skip
    assert [w.url for w in steps.add] == ["http://10.0.0.1:8000@1", "http://10.0.0.2:8000@0", "http://10.0.0.2:8000@1"]
    # Once done, the same listing asks for nothing.
    done = {"workers": [{"url": w.url, "model_id": w.model, "metadata": {"policy": "rendezvous_hash"}}
                        for w in desired]}  # fmt: skip
    assert sync_steps(listed_workers(done, "rendezvous_hash"), desired) == Sync()
    assert listed_workers({"workers": None}, "rendezvous_hash") == {} and listed_workers([], "x") == {}


class FakeRouters:
    """Router pods' worker routes: those in `fail` time out, those in `refuse` refuse the connection."""

    def __init__(self, fail: set[str] = frozenset(), listing: dict[str, list[str]] | None = None,
                 refuse: set[str] = frozenset()):  # fmt: skip
        self.calls: list[tuple[str, frozenset, str]] = []
        self.fail, self.refuse = fail, refuse
        self.listing = listing or {}  # base -> the worker URLs a discovering router pod lists
        self.reads: list[str] = []
        self.repairs: list[tuple[str, Repair]] = []

    def _answer(self, base: str) -> None:
        if base in self.fail:
            raise RouterUnreachable(f"GET {base}/workers: timed out")
        if base in self.refuse:
            raise RouterUnreachable(f"GET {base}/workers: connection refused", refused=True)

    def workers(self, base: str) -> list[str]:
        self.reads.append(base)
        self._answer(base)
        return list(self.listing.get(base, []))

    def repair(self, base: str, steps, budget_s: float) -> Repair:
        self.reads.append(base)
        self._answer(base)
        done = steps(list(self.listing.get(base, [])))
        self.repairs.append((base, done))
        return done

    def sync(self, base: str, desired: set, policy: str, budget_s: float | None = None) -> Sync:
        self.calls.append((base, frozenset(desired), policy))
        self._answer(base)
        return Sync(add=tuple(sorted(desired, key=lambda w: w.url)))


def test_the_reconcile_registers_the_engines_ranks_with_each_router_pod(events, clock):
    kube = FakeKube()
    kube.router_pods = True
    c = controller(kube)
    c.router_workers = routers = FakeRouters()
    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash", "port": 8100}}
    reconcile(c, kube, body("flash", spec))
    reconcile(c, kube, body("flash", spec))
    assert {base for base, _, _ in routers.calls} == {"http://10.65.0.1:8100", "http://10.65.0.2:8100"}
    base, desired, policy = routers.calls[-1]
    assert policy == "rendezvous_hash"
    assert {w.url.rsplit("@", 1)[1] for w in desired} == {"0", "1", "2", "3"}  # GB200 node, 4 local ranks
    hosts = {w.url.split("//")[1].split(":")[0] for w in desired}
    assert hosts == {kube.pod_ip(s, 0) for s in kube.names("StatefulSet")}
    assert {w.model for w in desired} == {DEFAULT_SERVED_NAME}  # the first of model.servedModelNames
    assert any(e["reason"] == "GroupsCreated" for e in events) and not any(e["type"] == "Warning" for e in events)


def test_a_router_pod_that_does_not_answer_is_reported_once_per_streak(events, clock):
    kube = FakeKube()
    kube.router_pods = True
    c = controller(kube)
    c.router_workers = FakeRouters(fail={"http://10.65.0.1:8000"})
    spec = {"replicas": 1, "routing": {"policy": "rendezvous_hash"}}
    for _ in range(3):
        reconcile(c, kube, body("flash", spec))
    warned = [e for e in events if e["reason"] == "RouterWorkersUnsynced"]
    assert len(warned) == 1 and f"{router_name('flash')}-5d8f9c7b4-r0" in warned[0]["message"]
    assert "timed out" in warned[0]["message"]
    c.router_workers = FakeRouters()
    reconcile(c, kube, body("flash", spec))
    c.router_workers = FakeRouters(fail={"http://10.65.0.1:8000"})
    reconcile(c, kube, body("flash", spec))
    assert len([e for e in events if e["reason"] == "RouterWorkersUnsynced"]) == 2, "a new streak is reported"


def test_under_a_discovery_policy_a_young_router_pod_is_only_read_at_each_reconcile(events, clock):
    kube = FakeKube()
    kube.router_pods = True
    c = controller(kube)
    c.router_workers = routers = FakeRouters()  # lists nothing: its watch has not caught up yet
    status = reconcile(c, kube, body("flash", {"replicas": 2}))  # makes the router Deployment
    for _ in range(2):
        status = reconcile(c, kube, body("flash", {"replicas": 2}, status=status))
    assert sorted(routers.reads) == sorted(["http://10.65.0.1:8000", "http://10.65.0.2:8000"] * 2)
    assert routers.calls == [] and routers.repairs == [], "its pod watch owns its workers: nothing written"
    assert not [e for e in events if e["type"] == "Warning"]


def test_under_a_discovery_policy_what_a_client_did_to_a_router_pods_workers_is_undone(events, clock):
    """A pod taken out of the list (POST /remove_worker) comes back, a server a client added goes; a pod that
    turned Ready within the grace, or is out of routing, is the watch's."""
    spec = {"replicas": 3}
    kube, c, status = _settled(clock, spec)
    kube.router_started_at = clock.time() - 3600
    groups = sorted(kube.names("StatefulSet"))
    ip = [kube.pod_ip(g, 0) for g in groups]
    kube.engine_ready_at = clock.time() - REPAIR_GRACE_S
    kube.unready = {groups[2]}
    listing = [f"http://{ip[0]}:8000@{r}" for r in range(4)] + ["http://203.0.113.5:80@0", "http://203.0.113.5:80@1"]
    full = [f"http://{ip[g]}:8000@{r}" for g in (0, 1) for r in range(4)]
    c.router_workers = routers = FakeRouters(listing={"http://10.65.0.1:8000": listing, "http://10.65.0.2:8000": full})
    reconcile(c, kube, body("flash", spec, status=status))
    repairs = dict(routers.repairs)
    assert repairs["http://10.65.0.1:8000"].add == (f"http://{ip[1]}:8000",)
    assert repairs["http://10.65.0.1:8000"].remove == ("http://203.0.113.5:80",)
    (warned,) = [e for e in events if e["reason"] == "RouterWorkersRepaired"]
    assert "-r0: added back" in warned["message"] and "removed http://203.0.113.5:80" in warned["message"]
    assert warned["type"] == "Warning"

    # what a client adds is its own: the event names a few of many, each bounded
    many = [f"http://198.51.100.{i}:80/{'x' * 300}@0" for i in range(40)]
    c.router_workers = routers = FakeRouters(listing={"http://10.65.0.1:8000": full + many,
                                                     "http://10.65.0.2:8000": full})  # fmt: skip
    reconcile(c, kube, body("flash", spec, status=status))
    assert len(dict(routers.repairs)["http://10.65.0.1:8000"].remove) == 40
    last = [e for e in events if e["reason"] == "RouterWorkersRepaired"][-1]["message"]
    assert "and 35 more" in last and len(last) < 1500, len(last)

    # within the grace, not added; the other router pod, which lists every pod, needs nothing
    kube.engine_ready_at = clock.time() - REPAIR_GRACE_S + 1
    routers.repairs.clear()
    reconcile(c, kube, body("flash", spec, status=status))
    assert dict(routers.repairs)["http://10.65.0.1:8000"].add == ()
    assert dict(routers.repairs)["http://10.65.0.2:8000"] == Repair(listed=tuple(full))


def test_discovery_repair_keeps_to_the_serving_pods():
    now = 1000.0
    old = now - REPAIR_GRACE_S
    observed = Observed(pods=[
        _pod("g0-0", "10.0.0.1", ready_at=old),  # listed by rank
        _pod("g1-0", "10.0.0.2", ready_at=old),  # missing: added back
        _pod("g2-0", "fd00::7", ready_at=old),  # missing, IPv6
        _pod("g3-0", "10.0.0.4", routing="drain", ready_at=old),  # out of routing: the watch's; listed, not foreign
        _pod("g4-0", "10.0.0.5", ready_at=now - 1),  # Ready a moment ago: the watch's
        _pod("g5-0", "10.0.0.6", ready=False),
        _pod("g6-0", "192.0.2.7", ready_at=old),  # outside the operator's networks: not added, not foreign
    ])  # fmt: skip
    urls = ["http://10.0.0.1:8000@0", "http://10.0.0.1:8000@1", "http://10.0.0.4:8000@0", "http://192.0.2.7:8000@0",
            "http://203.0.113.5:80@0", "http://203.0.113.5:80@1", "http://10.0.0.1:9000"]
    got = discovery_repair(urls, observed, 8000, now, parse_networks("10.0.0.0/8,fd00::/8"))
    assert got.add == ("http://10.0.0.2:8000", "http://[fd00::7]:8000")
    assert got.remove == ("http://10.0.0.1:9000", "http://203.0.113.5:80")
    assert got.listed == tuple(urls)
    full = urls[:4] + ["http://10.0.0.2:8000@0", "http://[fd00::7]:8000@0"]
    networks = parse_networks("10.0.0.0/8,fd00::/8")
    assert discovery_repair(full, observed, 8000, now, networks) == Repair(listed=tuple(full))


def test_under_a_discovery_policy_a_router_that_still_lists_a_drained_rank_holds_the_drain(events, clock):
    spec = {"replicas": 2, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec)
    groups = sorted(kube.names("StatefulSet"))
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))  # group 1 out of routing now
    stalled = f"http://{kube.pod_ip(groups[1], 0)}:8000@2"
    c.router_workers = FakeRouters(listing={"http://10.65.0.2:8000": [stalled, "http://10.9.9.9:8000@0"]})
    clock.advance(1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert not [e for e in events if e["reason"] == "RouterWorkersUnsynced"], "inside the settle time: not reported"
    for _ in range(3):  # idle engines, past the settle time, but one router pod still routes to the group
        clock.advance(DRAIN_SETTLE_S)
        status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, groups[1]) in kube.objects
    (warned,) = [e for e in events if e["reason"] == "RouterWorkersUnsynced"]
    assert "cannot confirm the workers of router pod" in warned["message"]
    assert "still routes to 1 worker(s) of pods out of routing" in warned["message"]
    c.router_workers = FakeRouters()  # its watch caught up: confirmed before the plan, which ends the drain
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, groups[1]) not in kube.objects
    assert [(d["endedBy"], "routersBehind" in d) for d in status["lastDrains"]] == [("Idle", False)]


def test_under_a_discovery_policy_the_engine_probe_and_the_router_read_are_in_flight_together(events, clock):
    """While a group drains, its engines' requests in flight and the routers' workers are asked at once: a
    slow engine does not hold up the routers' confirmation, nor the reverse. Each fake waits (a few seconds at
    most) for the other to have been asked; one after the other, the first would give up waiting."""
    import threading

    probing, reading, saw = threading.Event(), threading.Event(), []

    class SlowEngines(FakeEngines):
        def requests_in_flight(self, host: str, port: int) -> int | None:
            probing.set()
            saw.append(("probe saw a read", reading.wait(2.5)))
            return super().requests_in_flight(host, port)

    class SlowRouters(FakeRouters):
        def workers(self, base: str) -> list[str]:
            reading.set()
            saw.append(("read saw a probe", probing.wait(2.5)))
            return super().workers(base)

    spec = {"replicas": 2, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))  # group 1 out of routing now
    c.engines, c.router_workers = SlowEngines(), SlowRouters()
    clock.advance(1)
    reconcile(c, kube, body("flash", down, status=status))
    assert c.router_workers.reads and c.engines.asked, "both were asked in this reconcile"
    assert saw and all(ok for _, ok in saw), saw


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_a_router_pod_that_refuses_the_connection_routes_nothing_and_holds_no_drain(events, clock, policy):
    """Nothing listens on its port, which is where clients reach it too. Under a discovery policy that is the
    router being down (its status says so): no Warning; where the operator keeps the workers it is reported,
    without saying drains wait."""
    spec = {"replicas": 2, "rollout": {"drainSeconds": 60}, "routing": {"policy": policy}}
    kube, c, status = _settled(clock, spec)
    groups = sorted(kube.names("StatefulSet"))
    c.router_workers = FakeRouters(refuse={"http://10.65.0.2:8000"})
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    for _ in range(3):
        clock.advance(DRAIN_SETTLE_S)
        status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, groups[1]) not in kube.objects
    assert [(d["endedBy"], "routersBehind" in d) for d in status["lastDrains"]] == [("Idle", False)]
    warned = [e["message"] for e in events if e["reason"] == "RouterWorkersUnsynced"]
    if policy == "consistent_hash":
        assert warned == []
    else:
        assert len(warned) == 1 and "connection refused" in warned[0] and "drains" not in warned[0]


def test_the_client_tells_a_refused_connection_from_a_router_that_does_not_answer():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once it is closed
    with pytest.raises(RouterUnreachable) as refused:
        RouterWorkersClient(timeout=2).workers(f"http://127.0.0.1:{closed}")
    assert refused.value.refused
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        with pytest.raises(RouterUnreachable) as hung:
            RouterWorkersClient(timeout=0.3).workers(f"http://127.0.0.1:{silent.getsockname()[1]}")
    assert not hung.value.refused


def test_what_a_discovering_router_still_routes_to_is_what_it_lists_of_pods_out_of_routing():
    observed = Observed(pods=[
        _pod("g0-0", "10.0.0.1"),
        _pod("g1-0", "10.0.0.2", routing="drain", drain_since="2026-12-06T10:00:00Z"),
        _pod("g2-0", "10.0.0.3", routing="drain"),  # no since yet: the drain labels it again
        _pod("g3-0", "10.0.0.4", routing="drain", drain_since="2026-12-06T10:00:05Z", host_network=True),
    ])  # fmt: skip
    observed = dataclasses.replace(observed, now=parse_iso("2026-12-06T10:01:00Z"))
    out = out_of_routing(observed, 8000)
    assert list(out) == ["http://10.0.0.2:8000"]
    listed = ["http://10.0.0.1:8000@0", "http://10.0.0.2:8000@3", "http://10.0.0.2:8000", "http://10.0.0.2:80001"]
    assert still_routed(listed, out) == {"http://10.0.0.2:8000@3": out["http://10.0.0.2:8000"],
                                         "http://10.0.0.2:8000": out["http://10.0.0.2:8000"]}  # fmt: skip
    assert out_of_routing(observed, 8000, parse_networks("10.1.0.0/16")) == {}


def test_switching_to_rendezvous_hash_drops_the_routers_pod_reading_role_and_back_restores_it(events, clock):
    kube = FakeKube()
    c = controller(kube)
    c.router_workers = FakeRouters()
    status = reconcile(c, kube, body("flash", {"replicas": 1}))
    rbac = {("Role", router_name("flash")), ("RoleBinding", router_name("flash"))}
    assert rbac <= {(k, n) for k, _, n in kube.objects}
    clock.advance(RECENT_WRITE_S + 1)
    status = reconcile(c, kube, body("flash", {"replicas": 1, "routing": {"policy": "rendezvous_hash"}}, status=status))
    assert not rbac & {(k, n) for k, _, n in kube.objects}
    clock.advance(RECENT_WRITE_S + 1)
    reconcile(c, kube, body("flash", {"replicas": 1}, status=status))
    assert rbac <= {(k, n) for k, _, n in kube.objects}


def test_pods_a_plan_takes_out_of_routing_or_puts_back_count_as_such_at_once():
    observed = Observed(pods=[_pod("g0-0", "10.0.0.1"), _pod("g1-0", "10.0.0.2", routing="drain")])
    assert desired_workers(observed, 80, 1, "m", leaving=frozenset({"g0-0"})) == set()
    assert desired_workers(observed, 80, 1, "m", returning=frozenset({"g1-0"})) == {
        Worker("http://10.0.0.1:80", "m"), Worker("http://10.0.0.2:80", "m")}


def test_a_scale_down_takes_the_groups_ranks_out_of_the_routers_in_the_reconcile_that_drains_it(events, clock):
    kube = FakeKube()
    kube.router_pods = True
    c = controller(kube)
    c.router_workers = routers = FakeRouters()
    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}}
    status = reconcile(c, kube, body("flash", spec))
    clock.advance(RECENT_WRITE_S + 1)
    groups = sorted(kube.names("StatefulSet"))
    reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))
    assert ("pod-routing", f"{groups[1]}-0", "drain") in kube.calls
    hosts = {w.url.split("//")[1].split(":")[0] for w in routers.calls[-1][1]}
    assert hosts == {kube.pod_ip(groups[0], 0)}, "group 1 left the routers with its drain label"


def _settled(clock, spec: dict, started_at: float | None = None) -> tuple:
    """A serving whose routers the operator keeps, reconciled once with every router answering, past the
    recent-write window: (kube, controller, status)."""
    kube = FakeKube()
    kube.router_pods = True
    kube.router_started_at = started_at
    c = controller(kube)
    c.router_workers = FakeRouters()
    status = reconcile(c, kube, body("flash", spec))
    clock.advance(RECENT_WRITE_S + 1)
    return kube, c, status


def test_a_drain_ends_idle_only_after_every_router_pod_confirmed_that_the_group_left(events, clock):
    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec)
    groups = sorted(kube.names("StatefulSet"))
    down = {**spec, "replicas": 1}
    c.router_workers = FakeRouters(fail={"http://10.65.0.2:8000"})
    for _ in range(3):  # idle engines, past the settle time, but one router still lists the group
        status = reconcile(c, kube, body("flash", down, status=status))
        clock.advance(DRAIN_SETTLE_S)
    assert ("StatefulSet", NS, groups[1]) in kube.objects
    (warned,) = [e for e in events if e["reason"] == "RouterWorkersUnsynced"]
    assert "drains of this serving wait for it" in warned["message"]
    c.router_workers = FakeRouters()
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, groups[1]) in kube.objects, "confirmed in this reconcile: the next one may end it"
    clock.advance(1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert ("StatefulSet", NS, groups[1]) not in kube.objects
    assert [(d["endedBy"], "routersBehind" in d) for d in status["lastDrains"]] == [("Idle", False)]


def test_a_drain_whose_routers_never_confirm_goes_at_drain_seconds_and_status_says_why(events, clock):
    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}, "rollout": {"drainSeconds": 30}}
    kube, c, status = _settled(clock, spec)
    c.router_workers = FakeRouters(fail={"http://10.65.0.1:8000"})
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    clock.advance(30)
    events.clear()
    status = reconcile(c, kube, body("flash", down, status=status))
    assert [(d["endedBy"], d.get("routersBehind")) for d in status["lastDrains"]] == [("Timeout", True)]
    (drained,) = [e for e in events if e["reason"] == "Drained"]
    assert drained["type"] == "Warning" and "router pod not yet told" in drained["message"]


def test_a_router_pod_whose_sync_hangs_gets_no_second_one_until_it_ends(events, clock, monkeypatch):
    import threading

    from flashserve.controller import reconciler

    monkeypatch.setattr(reconciler, "ROUTER_SYNC_WAIT_S", 0.2)
    release = threading.Event()

    class Hanging(FakeRouters):
        def sync(self, base: str, desired: set, policy: str, budget_s: float | None = None) -> Sync:
            if base == "http://10.65.0.1:8000":
                self.calls.append((base, frozenset(desired), policy))
                release.wait(10)
                return Sync()
            return super().sync(base, desired, policy)

    kube = FakeKube()
    kube.router_pods = True
    c = controller(kube)
    c.router_workers = routers = Hanging()
    spec = {"replicas": 1, "routing": {"policy": "rendezvous_hash"}}
    try:
        for _ in range(4):  # the router pods show from the second reconcile on
            reconcile(c, kube, body("flash", spec))
        asked = [base for base, _, _ in routers.calls]
        assert asked.count("http://10.65.0.1:8000") == 1 and asked.count("http://10.65.0.2:8000") == 3
        (warned,) = [e for e in events if e["reason"] == "RouterWorkersUnsynced"]
        assert "no answer in 0.2s" in warned["message"]
    finally:
        release.set()
    wait = threading.Event()
    for _ in range(50):  # the hung call returns; the next reconcile asks that pod again
        if all(r.call is None or r.call.done() for r in c._router_pods.values()):
            break
        wait.wait(0.05)
    reconcile(c, kube, body("flash", spec))
    assert [base for base, _, _ in routers.calls].count("http://10.65.0.1:8000") == 2


def test_a_router_that_just_started_is_not_reported_until_it_had_time_to_listen(events, clock):
    from flashserve.controller.reconciler import ROUTER_START_GRACE_S

    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec, started_at=clock.time())
    c.router_workers = FakeRouters(fail={"http://10.65.0.1:8000"})
    status = reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))
    clock.advance(DRAIN_SETTLE_S + 1)
    status = reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))
    assert not [e for e in events if e["reason"] == "RouterWorkersUnsynced"]
    assert len(kube.names("StatefulSet")) == 2, "unreported, the router still holds the idle group"
    clock.advance(ROUTER_START_GRACE_S)
    reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))
    assert len([e for e in events if e["reason"] == "RouterWorkersUnsynced"]) == 1


def test_a_router_pods_start_is_its_router_containers():
    from flashserve.clock import parse_iso
    from flashserve.controller.observe import pod_view

    at = "2026-12-06T10:00:00Z"
    statuses = [{"name": "router", "state": {"running": {"startedAt": at}}}]
    router = pod_view({"metadata": {"name": "r", "labels": {"app.kubernetes.io/component": "router"}},
                       "status": {"phase": "Running", "containerStatuses": statuses}})  # fmt: skip
    engine = pod_view({"metadata": {"name": "e", "labels": {"app.kubernetes.io/component": "engine"}},
                       "status": {"phase": "Running", "containerStatuses": statuses}})  # fmt: skip
    assert (router.started_at, engine.started_at) == (parse_iso(at), None)


def test_a_sync_starts_no_call_past_its_budget_and_the_next_goes_on_from_what_the_router_lists(monkeypatch):
    from flashserve.controller import router_workers

    now = [0.0]
    monkeypatch.setattr(router_workers.time, "monotonic", lambda: now[0])
    listed: dict[str, dict] = {}
    calls = []

    def call(method: str, url: str, body: dict | None = None) -> object:
        calls.append(method)
        now[0] += 1.0  # each call takes a second
        if method == "POST":
            listed[body["url"]] = {"url": body["url"], "model_id": body["model_id"], "metadata": body["labels"]}
        return {"workers": list(listed.values())} if method == "GET" else {"success": True}

    client = RouterWorkersClient()
    client._call = call
    desired = {Worker(f"http://10.0.0.{i}:8000", "m") for i in range(1, 9)}
    with pytest.raises(RouterUnreachable, match="stopped after 4.5s"):
        client.sync("http://r", desired, "rendezvous_hash", budget_s=4.5)
    assert calls == ["GET"] + ["POST"] * 4 and len(listed) == 4
    steps = client.sync("http://r", desired, "rendezvous_hash", budget_s=10)
    assert len(steps.add) == 4 and len(listed) == 8


def test_a_sync_adds_before_it_removes_except_a_worker_it_registers_again(monkeypatch):
    from flashserve.controller.router_workers import RouterWorkersClient

    listed = {"http://old:8000": {"url": "http://old:8000", "model_id": "m", "metadata": {"policy": "rendezvous_hash"}},
              "http://relabel:8000": {"url": "http://relabel:8000", "model_id": "other",
                                      "metadata": {"policy": "rendezvous_hash"}}}  # fmt: skip
    calls = []

    def call(method: str, url: str, body: dict | None = None) -> object:
        calls.append((method, body["url"] if body else url.rsplit("/", 1)[-1]))
        return {"workers": list(listed.values())} if method == "GET" else {"success": True}

    client = RouterWorkersClient()
    client._call = call
    client.sync("http://r", {Worker("http://new:8000", "m"), Worker("http://relabel:8000", "m")}, "rendezvous_hash")
    assert calls == [("GET", "workers"), ("POST", "http://new:8000"), ("DELETE", "http%3A%2F%2Fold%3A8000"),
                     ("DELETE", "http%3A%2F%2Frelabel%3A8000"), ("POST", "http://relabel:8000")]  # fmt: skip


def _lagging_view(kube: FakeKube):
    """What the operator's pod watch shows now, kept to stand for a watch that lags the operator's writes."""
    from flashserve.render.naming import legacy_serving_label_value, serving_label_value

    return kube.observed(NS, serving_label_value("flash"), legacy_serving_label_value("flash"))


def test_a_pod_just_drained_is_not_registered_again_while_the_pod_watch_lags(events, clock):
    """rendezvous_hash: the reconciles after the one that took a group out of routing may still see the pods
    in routing; the routers follow the operator's write, not that view."""
    import asyncio

    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec)
    c.router_workers = routers = FakeRouters()
    stale = _lagging_view(kube)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))
    leaving = {kube.pod_ip(g, 0) for g in kube.names("StatefulSet") if g.endswith("-g1")}
    hosts = lambda: {w.url.split("//")[1].split(":")[0] for w in routers.calls[-1][1]}  # noqa: E731
    assert leaving and not hosts() & leaving
    for _ in range(2):
        clock.advance(2)
        asyncio.run(c.reconcile(body("flash", down, status=status), stale, LOG))
        assert not hosts() & leaving, "the drained pod was registered again from a lagging view"


def test_a_discovering_router_is_not_given_back_a_pod_just_drained_nor_confirmed_from_a_lagging_view(events, clock):
    """consistent_hash: the routers' own watches dropped the drained group; the operator's view still shows it in
    routing. It must not add the group back (no pod event would take it out again), nor count the routers as
    confirmed on a view without the drain; and a router later found listing it takes back a confirmation."""
    import asyncio

    spec = {"replicas": 2, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec, started_at=clock.time() - 3600)
    kube.engine_ready_at = clock.time() - 3600
    groups = sorted(kube.names("StatefulSet"))
    g0, g1 = (f"http://{kube.pod_ip(g, 0)}:8000" for g in groups[:2])
    stale = _lagging_view(kube)
    down = {**spec, "replicas": 1}
    status = reconcile(c, kube, body("flash", down, status=status))  # group 1 out of routing
    bases = ("http://10.65.0.1:8000", "http://10.65.0.2:8000")
    c.router_workers = routers = FakeRouters(listing={b: [f"{g0}@{r}" for r in range(4)] for b in bases})
    synced = c._routers_synced.get((NS, "flash"))
    clock.advance(2)
    asyncio.run(c.reconcile(body("flash", down, status=status), stale, LOG))
    assert routers.repairs and all(g1 not in r.add for _, r in routers.repairs), "added back"
    assert c._routers_synced.get((NS, "flash")) == synced, "confirmed from a view without the drain"
    # a router that still lists the group (its watch stalled) takes back whatever was confirmed before
    c._routers_synced[(NS, "flash")] = clock.time()
    c.router_workers = FakeRouters(listing={b: [f"{u}@{r}" for u in (g0, g1) for r in range(4)] for b in bases})
    clock.advance(DRAIN_SETTLE_S + 1)
    status = reconcile(c, kube, body("flash", down, status=status))
    assert (NS, "flash") not in c._routers_synced
    assert any(g.endswith("-g1") for g in kube.names("StatefulSet")), "the drain ended on a stale confirmation"


def test_a_pod_named_after_a_group_but_not_its_statefulsets_is_neither_routed_nor_counted(events, clock):
    """Anyone who may create pods in the namespace can copy a group's labels and name a pod `<group>-7`: it is
    not the group's, so the operator neither registers it with the routers nor counts it in the group."""
    import asyncio

    spec = {"replicas": 1, "routing": {"policy": "rendezvous_hash"}}
    kube, c, status = _settled(clock, spec)
    c.router_workers = routers = FakeRouters()
    sts = sorted(kube.names("StatefulSet"))[0]
    view = _lagging_view(kube)
    real = view.pods[0]
    view.pods.append(PodView(f"{sts}-7", 0, real.template_hash, True, False, "Running", False, 0, "n", routing="serve",
                             ip="10.64.9.9", uid="foreign", owner_uid="someone-else", component="engine"))
    asyncio.run(c.reconcile(body("flash", spec, status=status), view, LOG))
    assert routers.calls and not any("10.64.9.9" in w.url for w in routers.calls[-1][1])
    assert kube.status[(NS, "flash")].get("readyReplicas") == 1


def test_a_pod_put_back_into_routing_is_registered_while_the_pod_watch_lags(events, clock):
    """rendezvous_hash: scaling back up cancels a drain; the reconciles after it may still see the pods out of
    routing, and the routers follow the write that put them back."""
    import asyncio

    spec = {"replicas": 2, "routing": {"policy": "rendezvous_hash"}, "rollout": {"drainSeconds": 60}}
    kube, c, status = _settled(clock, spec)
    c.router_workers = routers = FakeRouters()
    status = reconcile(c, kube, body("flash", {**spec, "replicas": 1}, status=status))  # group 1 out of routing
    clock.advance(2)
    drained = _lagging_view(kube)
    returning = {kube.pod_ip(g, 0) for g in kube.names("StatefulSet") if g.endswith("-g1")}
    hosts = lambda: {w.url.split("//")[1].split(":")[0] for w in routers.calls[-1][1]}  # noqa: E731
    assert returning and not hosts() & returning
    status = reconcile(c, kube, body("flash", spec, status=status))  # back up: group 1 serves again
    assert hosts() >= returning
    clock.advance(2)
    asyncio.run(c.reconcile(body("flash", spec, status=status), drained, LOG))
    assert hosts() >= returning, "the pod put back was dropped on a view that still shows it drained"
