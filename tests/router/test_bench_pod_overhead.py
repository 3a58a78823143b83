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
