"""The local cluster's loopback address plan and the guard discovering components start behind."""

from __future__ import annotations

import ipaddress

import pytest
from flashserve_testbed.localcluster import loopback, pools
from flashserve_testbed.localcluster.loopback import NotLoopback, require_loopback, violations


def pod(name, ip=None, host_ip=None, host_network=False, ips=None, ns="demo"):
    status = {}
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": i} for i in (ips or [ip])]
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"hostNetwork": host_network}, "status": status}


def node(name, *addresses):
    return {"metadata": {"name": name},
            "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


def test_loopback_pods_and_nodes_pass():
    pods = [pod("a", "127.4.1.1", "127.4.0.1"), pod("b", "127.4.1.2", "127.4.0.1"), pod("pending")]
    nodes = [node("n0", ("InternalIP", "127.4.0.1"), ("Hostname", "gb200-r0-n00"))]
    assert violations(pods, nodes) == []
    require_loopback(pods, nodes)


def test_a_hostnetwork_pod_on_a_172_16_node_is_refused_by_name_and_ip():
    pods = [pod("ok", "127.4.1.1", "127.4.0.1"),
            pod("exporter", "172.16.0.2", "172.16.0.2", host_network=True, ns="monitoring")]
    nodes = [node("cpu-0", ("InternalIP", "172.16.0.2"), ("Hostname", "cpu-0"))]
    found = violations(pods, nodes)
    assert [(v.kind, v.name, v.address) for v in found] == [
        ("pod", "monitoring/exporter", "172.16.0.2"), ("pod", "monitoring/exporter", "172.16.0.2"),
        ("node", "cpu-0", "172.16.0.2")]
    assert "hostNetwork" in found[0].field
    with pytest.raises(NotLoopback) as e:
        require_loopback(pods, nodes, "router pod demo/r-0")
    msg = str(e.value)
    assert "refusing to start router pod demo/r-0" in msg
    assert "monitoring/exporter" in msg and "172.16.0.2" in msg and "cpu-0" in msg


@pytest.mark.parametrize("field, value", [("podIP", "10.64.3.7"), ("hostIP", "192.168.1.4")])
def test_any_non_loopback_pod_address_is_refused(field, value):
    p = pod("x", "127.4.1.1", "127.4.0.1")
    p["status"][field] = value
    assert [v.address for v in violations([p], [])] == [value]


def test_a_second_pod_ip_outside_loopback_is_refused():
    found = violations([pod("dual", "127.4.1.1", ips=["127.4.1.1", "fd00::5"])], [])
    assert [(v.field, v.address) for v in found] == [("status.podIPs[1].ip", "fd00::5")]


def test_node_external_ip_counts_and_names_do_not():
    nodes = [node("n", ("InternalIP", "127.4.0.1"), ("ExternalIP", "203.0.113.9"), ("InternalDNS", "n.example"))]
    assert [v.address for v in violations([], nodes)] == ["203.0.113.9"]


def test_plan_is_loopback_distinct_per_node_and_per_slot():
    specs, reserved = pools.resolve()
    seen_cidrs, seen_ips = set(), set()
    for slot in (0, 7, loopback.SLOTS - 1):
        nodes = pools.build_nodes(specs, reserved, slot)
        for n in nodes:
            cidr = ipaddress.ip_network(n["spec"]["podCIDR"])
            ip = ipaddress.ip_address(n["status"]["addresses"][0]["address"])
            assert cidr.subnet_of(loopback.LOOPBACK) and ip.is_loopback
            assert ip not in cidr and ipaddress.ip_address("127.0.0.1") not in cidr
            assert cidr not in seen_cidrs and ip not in seen_ips
            seen_cidrs.add(cidr)
            seen_ips.add(ip)
        assert violations([], nodes) == []
    # every node's pod range is apart from every node IP and from kwok's default range of every slot
    defaults = {ipaddress.ip_network(loopback.default_cidr(s)) for s in (0, 7, loopback.SLOTS - 1)}
    assert not any(c.overlaps(d) for c in seen_cidrs for d in defaults)
    assert not any(ip in c for ip in seen_ips for c in seen_cidrs)


def test_plan_refuses_what_it_cannot_address():
    with pytest.raises(loopback.AddressPlanError, match="slot"):
        loopback.check_slot(loopback.SLOTS)
    with pytest.raises(loopback.AddressPlanError, match="pool 'gb200'.*254"):
        loopback.pod_cidr(0, 0, 254, "gb200")
    with pytest.raises(loopback.AddressPlanError, match="4 node pools"):
        loopback.node_ip(0, 4, 0)


def test_default_slot_is_stable_and_differs_between_directories():
    a, b = loopback.default_slot("/home/u/.cache/flashserve/cluster"), loopback.default_slot("/tmp/other/cluster")
    assert a == loopback.default_slot("/home/u/.cache/flashserve/cluster") and a != b
    assert 0 <= a < loopback.SLOTS
