"""The pod-overhead bench's pure parts: the serving it applies and how it names the pods on the wire."""

from __future__ import annotations

from flashserve.render.renderer import render
from flashserve_testbed.router.bench_pod_overhead import _endpoint, serving


def _router_resources(dedicated: bool) -> dict:
    cr = serving("overhead", dedicated=dedicated)
    cr["metadata"]["namespace"] = "bench"
    dep = next(o for o in render(cr) if o["kind"] == "Deployment")
    (router,) = dep["spec"]["template"]["spec"]["containers"]
    return router["resources"]


def test_the_bench_serving_gives_a_guaranteed_router_pod_with_a_whole_core_only_when_dedicated():
    # Guaranteed QoS with a whole-core request is what the static CPU manager (and the mock runtime) pins
    pinned = _router_resources(dedicated=True)
    assert pinned["requests"] == pinned["limits"] and pinned["requests"]["cpu"] == "1"
    shared = _router_resources(dedicated=False)
    assert "cpu" not in shared.get("limits", {})


def test_pods_on_the_wire_are_named_by_address_and_port():
    assert _endpoint("http://127.114.2.1:8000/v1") == ("127.114.2.1", 8000)


def test_a_pods_url_is_its_containers_named_port_at_the_pod_ip():
    from flashserve_testbed.runtime.routerpods import pod_url

    ports = [{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 29000}]
    pod = {"status": {"podIP": "127.114.2.1"}, "spec": {"containers": [{"name": "router", "ports": ports}]}}
    assert pod_url(pod, "router", "metrics") == "http://127.114.2.1:29000"
    assert pod_url(pod, "router", "admin") is None and pod_url(pod, "router", "admin", 8000).endswith(":8000")
    assert pod_url({"spec": pod["spec"], "status": {}}, "router", "http") is None
