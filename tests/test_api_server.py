"""Where the operator lets the router pods reach the API server: read from the `kubernetes` Service's
EndpointSlice and the in-cluster environment (controller/api_server.py), and carried into the router's
NetworkPolicy by the reconcile."""

from __future__ import annotations

import logging

import pytest
from flashserve.controller.api_server import ApiServerAddresses, api_server_addresses
from flashserve.render.naming import router_name

from tests.fakes import NS, FakeKube, body, controller, reconcile

SLICE = {
    "addressType": "IPv4",
    "endpoints": [
        {"addresses": ["192.0.2.2"], "conditions": {"ready": True}},
        {"addresses": ["192.0.2.3"]},  # no conditions: ready unless said otherwise
        {"addresses": ["192.0.2.4"], "conditions": {"ready": False}},
    ],
    "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
}


def test_ready_addresses_on_the_slices_port_and_the_cluster_ip():
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert api_server_addresses(SLICE, env) == (("10.96.0.1/32", 443), ("192.0.2.2/32", 6443), ("192.0.2.3/32", 6443))


def test_ipv6_addresses_are_single_address_blocks():
    v6 = {"endpoints": [{"addresses": ["fd00::1"]}], "ports": [{"port": 6443}]}
    assert api_server_addresses(v6, {"KUBERNETES_SERVICE_HOST": "fd00:10::1", "KUBERNETES_SERVICE_PORT": "443"}) == (
        ("fd00:10::1/128", 443), ("fd00::1/128", 6443))


@pytest.mark.parametrize("slice_, env", [
    (None, {}),
    ({"endpoints": [{"addresses": ["192.0.2.2"]}], "ports": []}, {}),
    ({"endpoints": [{"addresses": ["api.example"]}], "ports": [{"port": 6443}]}, {}),
    ({"endpoints": [{"addresses": ["192.0.2.2"]}], "ports": [{"port": 0}, {"port": "https"}, {"port": True}]}, {}),
    (None, {"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc", "KUBERNETES_SERVICE_PORT": "443"}),
    (None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"}),
    (None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}),
])  # fmt: skip
def test_nothing_usable_gives_no_address(slice_, env):
    """The ClusterIP alone is not enough: most implementations match the address it is translated to."""
    assert api_server_addresses(slice_, env) == ()


def test_a_failed_read_keeps_the_last_answer_and_none_yet_is_logged_once(caplog):
    answers: list = [RuntimeError("403 Forbidden"), None, SLICE, RuntimeError("timeout"), None]

    def read():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    addresses = ApiServerAddresses(read, {})
    with caplog.at_level(logging.WARNING, logger="flashserve.controller.api_server"):
        addresses.refresh()
        addresses.refresh()
    assert addresses.value == ()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "egress is left open" in warnings[0] and "403 Forbidden" in warnings[0]
    addresses.refresh()
    assert addresses.value == (("192.0.2.2/32", 6443), ("192.0.2.3/32", 6443))
    addresses.refresh()
    addresses.refresh()
    assert addresses.value == (("192.0.2.2/32", 6443), ("192.0.2.3/32", 6443)), "failures keep what was read"


def test_the_reconcile_renders_the_addresses_into_the_routers_policy(events, clock):
    kube = FakeKube()
    c = controller(kube)
    reconcile(c, kube, body("flash", {"replicas": 1}))
    assert "egress" not in kube.objects[("NetworkPolicy", NS, router_name("flash"))]["spec"]
    c.api_server = ApiServerAddresses(lambda: SLICE, {})
    c.api_server.refresh()
    reconcile(c, kube, body("flash", {"replicas": 1}))
    spec = kube.objects[("NetworkPolicy", NS, router_name("flash"))]["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"][1] == {"to": [{"ipBlock": {"cidr": "192.0.2.2/32"}}, {"ipBlock": {"cidr": "192.0.2.3/32"}}],
                                 "ports": [{"port": 6443, "protocol": "TCP"}]}  # fmt: skip
