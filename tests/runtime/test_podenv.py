"""Environment and command line of an engine container, resolved as the kubelet would."""

from __future__ import annotations

import pytest
from flashserve.render.vllm_args import START_RANK_SCRIPT
from flashserve_testbed.runtime.podenv import (
    PLACEHOLDER,
    EnvError,
    command_line,
    expand,
    quantity,
    resolve_env,
)

POD = {
    "metadata": {"name": "flash-g0-1", "namespace": "demo", "uid": "u-1",
                 "labels": {"apps.kubernetes.io/pod-index": "1", "flashserve.io/serving": "flash"},
                 "annotations": {"note": "x"}},
    "spec": {"nodeName": "gb200-r0-n03"},
    "status": {"podIP": "10.64.3.7", "hostIP": "172.16.0.5", "podIPs": [{"ip": "10.64.3.7"}]},
}


@pytest.mark.parametrize("text, want", [
    ("$(A)-$(B)", "1-two"),
    ("$$(A)", "$(A)"),             # escaped
    ("$(MISSING)", "$(MISSING)"),  # unknown names stay as written
    ("$(A", "$(A"),                # unclosed
    ("cost $5", "cost $5"),
    ("$", "$"),
    ("a$$b", "a$b"),
])
def test_expand_follows_kubernetes_rules(text, want):
    assert expand(text, {"A": "1", "B": "two"}) == want


def test_field_refs_literals_and_order():
    container = {"env": [
        {"name": "FLASHSERVE_POD_INDEX",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
        {"name": "WHO", "value": "$(POD).$(NS) $(LATER)"},
        {"name": "LATER", "value": "late"},
        {"name": "EMPTY"},
    ]}
    env = resolve_env(POD, container).env
    assert env["FLASHSERVE_POD_INDEX"] == "1"
    assert (env["POD"], env["NS"], env["IP"], env["NODE"], env["NOTE"]) == \
        ("flash-g0-1", "demo", "10.64.3.7", "gb200-r0-n03", "x")
    assert env["WHO"] == "flash-g0-1.demo $(LATER)"  # only variables defined before
    assert env["EMPTY"] == ""


def test_secrets_and_config_maps_are_never_read():
    container = {
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
        "envFrom": [{"secretRef": {"name": "all"}}],
    }
    out = resolve_env(POD, container)
    assert out.env == {"HF_TOKEN": PLACEHOLDER, "CFG": PLACEHOLDER}
    assert len(out.notes) == 3 and any("hf/token" in n for n in out.notes)


def test_resource_field_refs_round_up_by_divisor():
    container = {"resources": {"limits": {"memory": "256Gi", "cpu": "1500m"}, "requests": {"cpu": "500m"}},
                 "env": [
                     {"name": "MEM",
                      "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Gi"}}},
                     {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                     {"name": "REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                     {"name": "RMEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
                 ]}
    env = resolve_env(POD, container).env
    assert env == {"MEM": "256", "CPU": "2", "REQ": "500", "RMEM": str(256 * 2**30)}


def test_quantities():
    assert quantity("64Gi") == 64 * 2**30
    assert quantity("500m") * 1000 == 500
    assert quantity("1e3") == 1000
    assert quantity("2k") == 2000
    with pytest.raises(EnvError):
        quantity("lots")


def test_unsupported_field_ref_is_an_error():
    with pytest.raises(EnvError):
        resolve_env(POD, {"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.whatever"}}}]})


def test_command_line_keeps_the_wrapper_script_and_expands_references():
    container = {"command": ["/bin/sh", "-c", START_RANK_SCRIPT, "vllm"],
                 "args": ["/models/x", "--port", "8000", "--data-parallel-address", "$(POD).svc"]}
    argv = command_line(container, {"POD": "flash-g0-0"}, ["vllm", "serve"])
    assert argv[:4] == ["/bin/sh", "-c", START_RANK_SCRIPT, "vllm"]  # the script is passed verbatim
    assert argv[-1] == "flash-g0-0.svc"
    assert command_line({"args": ["m"]}, {}, ["vllm", "serve"]) == ["vllm", "serve", "m"]
