"""Child names and label values: valid for any serving name the API server accepts, and never shared by two
servings of one namespace (else one serving's plan would rewrite, select or delete the other's children)."""

from __future__ import annotations

import re

import pytest
from flashserve.api.validation import SpecError, parse_serving
from flashserve.render.naming import (
    GROUP_LABEL,
    SERVING_LABEL,
    compute_domain_name,
    group_name,
    inference_pool_name,
    legacy_group_name,
    legacy_serving_label_value,
    network_policy_name,
    pdb_name,
    router_name,
    service_name,
    serving_label_value,
)
from flashserve.render.renderer import render_serving
from hypothesis import assume, given, settings
from hypothesis import strategies as st

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Serving names: DNS-1123 subdomains (dot-separated labels) of up to 253 characters.
_labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?\Z", fullmatch=True)
names = st.lists(_labels, min_size=1, max_size=5).map(".".join).filter(lambda n: len(n) <= 253)
# Names that differ only where the old naming lost information: dots and dashes, a leading digit, the tail
# of a long name, a `-g<i>` suffix.
near = st.sampled_from(["a.b", "a-b", "1abc", "s1abc", "flash", "flash-g0", "flash-g0-cd", "flash-pdb", "x" * 70,
                        "x" * 69 + "y", "a--b", "a-b.c", "a.b-c"])  # fmt: skip


@given(names, st.integers(0, 999))
def test_child_names_are_valid(name, index):
    g = group_name(name, index)
    assert len(g) <= 52 and DNS_1035.match(g), g
    assert len(service_name(name)) <= 63 and DNS_1035.match(service_name(name))
    assert len(compute_domain_name(name, index)) <= 63 and DNS_1035.match(compute_domain_name(name, index))
    assert len(f"{g}-71") <= 63, "pod names are hostnames"
    assert pdb_name(name) == network_policy_name(name) == inference_pool_name(name) == name  # any subdomain fits
    r = router_name(name)
    assert len(r) <= 63 and DNS_1035.match(r) and r.endswith("-router") and "--" in r, r
    v = serving_label_value(name)
    assert len(v) <= 63 and LABEL_VALUE.match(v)


def _objects(name: str, replicas: int) -> list[dict]:
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
          "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
          "spec": {"replicas": replicas, "parallelism": {"nodesPerReplica": 2},
                   "placement": {"computeDomain": {"enabled": True}},
                   "routing": {"inferencePool": {"enabled": True}}}}  # fmt: skip
    return render_serving(parse_serving(cr))


def _selectors(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    out = []
    if obj["kind"] == "Service":
        out.append(spec["selector"])
    elif obj["kind"] in ("StatefulSet", "PodDisruptionBudget", "Deployment", "InferencePool"):
        out.append(spec["selector"]["matchLabels"])
    elif obj["kind"] == "NetworkPolicy":
        out.append(spec["podSelector"]["matchLabels"])
    if obj["kind"] == "StatefulSet":
        aff = spec["template"]["spec"]["affinity"]
        for kind in ("podAffinity", "podAntiAffinity"):
            out += [t["labelSelector"]["matchLabels"] for t in aff.get(kind, {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])]
    return out


def _pod_labels(objs: list[dict]) -> list[dict]:
    return [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] in ("StatefulSet", "Deployment")]


def _claims(objs: list[dict]) -> set[str]:
    return {c["resourceClaimTemplateName"] for o in objs if o["kind"] == "StatefulSet"
            for c in o["spec"]["template"]["spec"].get("resourceClaims", [])}  # fmt: skip


@settings(deadline=None, max_examples=80)  # each example renders two whole servings
@given(st.one_of(names, near), st.one_of(names, near))
def test_two_servings_never_share_a_child_or_a_pod_selector(a, b):
    assume(a != b)
    oa, ob = _objects(a, 3), _objects(b, 3)
    keys_a = {(o["kind"], o["metadata"]["name"]) for o in oa}
    keys_b = {(o["kind"], o["metadata"]["name"]) for o in ob}
    assert not keys_a & keys_b, f"{a!r} and {b!r} both write {keys_a & keys_b}"
    assert not _claims(oa) & _claims(ob)
    for sel in (s for o in oa for s in _selectors(o)):
        assert not any(sel.items() <= labels.items() for labels in _pod_labels(ob)), f"{a!r} selects pods of {b!r}"
    for sel in (s for o in ob for s in _selectors(o)):
        assert not any(sel.items() <= labels.items() for labels in _pod_labels(oa)), f"{b!r} selects pods of {a!r}"
    assert serving_label_value(a) != serving_label_value(b), "the operator's worker key"


def test_a_serving_named_like_another_servings_router_is_refused():
    """The one name shape that would meet another serving's children (naming.py says so): a serving named exactly
    like another's router would take that name for its engines' budget and policy. The API refuses that shape
    (when a serving is made), and it is the shape of every router name; names the router naming cannot make (a
    dot or a double dash before the hash, over 63 characters) are admitted."""
    from flashserve.api.v1alpha1 import OPERATOR_ROUTER_NAME, ROUTER_NAME_MAX

    for serving in ("flash", "a" * 253, "x.y-z", "1abc", "a--b", "flash-g0"):
        r = router_name(serving)
        assert re.fullmatch(OPERATOR_ROUTER_NAME, r) and len(r) <= ROUTER_NAME_MAX
        with pytest.raises(SpecError, match=r"metadata.name: .* has the shape of the names the operator gives"):
            _objects(r, 1)
    for own in ("flash-router", "flash--router", "my-router", "a--b-router", "my.app--backends-router",
                "a--b--gatewayz-router", "x" * 47 + "--abcdefgh-router"):
        assert {o["kind"] for o in _objects(own, 1)} >= {"PodDisruptionBudget", "NetworkPolicy"}
    assert router_name("flash") != router_name("flash-router") != router_name("flash--router")


def test_names_that_met_before_are_apart_now():
    assert legacy_group_name("a.b", 1) == legacy_group_name("a-b", 1)  # what went wrong
    assert legacy_serving_label_value("a.b") == legacy_serving_label_value("a-b")
    assert group_name("a.b", 1) != group_name("a-b", 1)
    assert serving_label_value("a.b") != serving_label_value("a-b")
    assert service_name("1abc") != service_name("s1abc")
    assert group_name("flash", 0) != service_name("flash-g0")


def test_common_names_keep_their_endpoint_and_label():
    assert service_name("flash") == "flash" and serving_label_value("flash") == "flash"
    assert group_name("flash", 3).startswith("flash--") and group_name("flash", 3).endswith("-g3")
    a, b = "a" * 200 + "x", "a" * 200 + "y"
    assert group_name(a, 0) != group_name(b, 0)
    assert serving_label_value(a) != serving_label_value(b)
    objs = _objects("flash", 1)
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    assert sts["metadata"]["labels"][SERVING_LABEL] == "flash" and sts["metadata"]["labels"][GROUP_LABEL] == "0"


def test_the_channel_templates_the_operator_names_are_the_ones_a_serving_may_not_claim():
    """api.v1alpha1.OPERATOR_CHANNEL_TEMPLATE must match every template name the renderer makes (the claim of
    another serving's channel is refused by it), and no name a user's own template would plausibly have."""
    from flashserve.api.v1alpha1 import OPERATOR_CHANNEL_TEMPLATE

    for serving in ("flash", "a" * 253, "x.y-z", "team-a"):
        for index in (0, 7, 123):
            assert re.search(OPERATOR_CHANNEL_TEMPLATE, f"{compute_domain_name(serving, index)}-channel")
    for own in ("imex-channel", "my-cd-channel"):
        assert not re.search(OPERATOR_CHANNEL_TEMPLATE, own)
