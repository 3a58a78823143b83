"""What the renderer promises about the objects it produces."""

from __future__ import annotations

import jinja2
import pytest
from flashserve.api.validation import parse_serving
from flashserve.render.naming import group_name
from flashserve.render.renderer import _env, render, render_serving, template_hash

from tests.builders import by_kind, cr, pod


def test_templates_refuse_values_without_tojson():
    with pytest.raises(jinja2.TemplateError, match="tojson"):
        _env().from_string("name: {{ x }}").render(x="a")
    with pytest.raises(jinja2.UndefinedError):
        _env().from_string("name: {{ missing | tojson }}").render()


def test_yaml_breaking_values_arrive_intact():
    nasty = 'a: b\n- c: "d" # e\n---\n{{ x }}'
    objs = render(cr({"engine": {"extraArgs": ["--tool-call-parser", nasty],
                                 "env": [{"name": "NOTE", "value": nasty}]}}))  # fmt: skip
    c = pod(objs)["containers"][0]
    assert c["args"][-1] == nasty
    assert {"name": "NOTE", "value": nasty} in c["env"]


def test_characters_beyond_the_basic_plane_arrive_intact():
    """JSON escapes them as surrogate pairs, which libyaml's fast parser refuses."""
    astral = "\U00010000 \U0001F680 \\ud83d\\ude80 \\\U0001F680"  # and text that only looks like an escape
    objs = render(cr({"engine": {"extraArgs": ["--response-role", astral], "env": [{"name": "NOTE", "value": astral}]}}))
    c = pod(objs)["containers"][0]
    assert c["args"][-1] == astral
    assert {"name": "NOTE", "value": astral} in c["env"]


def test_pod_essentials():
    objs = render(cr({}))
    p = pod(objs)
    c = p["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert p["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    term = p["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0] == {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-GB200"]}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in p["volumes"]
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800, "tens of minutes"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert p["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert p["terminationGracePeriodSeconds"] >= 60 and p["automountServiceAccountToken"] is False
    labels = by_kind(objs, "StatefulSet")[0]["spec"]["template"]["metadata"]["labels"]
    assert labels["flashserve.io/serving"] == "flash" and labels["flashserve.io/group"] == "0"
    assert labels["app.kubernetes.io/managed-by"] == "flashserve-operator"


def test_multi_node_group_stays_in_one_clique_and_has_a_leader_service():
    objs = render(cr({"parallelism": {"nodesPerReplica": 2}, "replicas": 2}))
    sts = by_kind(objs, "StatefulSet")[1]
    assert sts["spec"]["podManagementPolicy"] == "Parallel" and sts["spec"]["replicas"] == 2
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    aff = sts["spec"]["template"]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    g1 = group_name("flash", 1)
    assert aff == [{"labelSelector": {"matchLabels": {"flashserve.io/serving": "flash", "flashserve.io/group": "1",
                                                      "flashserve.io/group-name": g1}},
                    "topologyKey": "nvidia.com/gpu.clique"}]  # fmt: skip
    headless = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == g1][0]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--data-parallel-address") + 1] == f"{g1}-0.{g1}.ns.svc"
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FLASHSERVE_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert env["NCCL_MNNVL_ENABLE"]["value"] == "1"


def test_hf_token_only_by_secret_reference():
    objs = render(cr({"model": {"source": {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}}}}}))
    env = {e["name"]: e for e in pod(objs)["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


def test_pvc_weights_are_mounted_read_only_and_offline():
    objs = render(cr({"model": {"source": {"pvc": {"claimName": "weights", "path": "flash"}}}}))
    p = pod(objs)
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in p["volumes"]
    env = {e["name"]: e.get("value") for e in p["containers"][0]["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env


def test_compute_domain_claim():
    objs = render(cr({"parallelism": {"nodesPerReplica": 2}, "placement": {"computeDomain": {"enabled": True}}}))
    cd = by_kind(objs, "ComputeDomain")[0]
    assert cd["spec"]["numNodes"] == 2
    claim = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    p = pod(objs)
    assert p["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": claim}]
    assert p["containers"][0]["resources"]["claims"] == [{"name": "imex-channel"}]


def test_owner_reference_when_the_object_exists():
    objs = render(cr({}, uid="1234"))
    for o in objs:
        ref = o["metadata"]["ownerReferences"][0]
        assert ref["uid"] == "1234" and ref["controller"] is True and ref["kind"] == "DeepSeekServing"
    assert all("ownerReferences" not in o["metadata"] for o in render(cr({})))


def test_template_hash_ignores_replicas_and_autoscaling_bounds_but_not_the_image():
    base = parse_serving(cr({})).spec
    same = parse_serving(cr({"replicas": 5, "autoscaling": {"maxReplicas": 9}, "rollout": {"maxUnavailable": 2}})).spec
    other = parse_serving(cr({"engine": {"image": "vllm/vllm-openai:v0.33.1"}})).spec
    assert template_hash(base) == template_hash(same) != template_hash(other)


def test_render_is_deterministic():
    obj = parse_serving(cr({"replicas": 3}))
    assert render_serving(obj) == render_serving(obj)


def test_client_service_and_pdb():
    objs = render(cr({"parallelism": {"nodesPerReplica": 2}}))
    svc = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == "flash"][0]
    assert svc["spec"]["selector"] == {"flashserve.io/serving": "flash", "app.kubernetes.io/component": "router"}
    assert svc["spec"]["ports"][0]["port"] == 8000 and svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = by_kind(objs, "PodDisruptionBudget")[0]
    assert pdb["spec"]["maxUnavailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"] == {"flashserve.io/serving": "flash",
                                                      "app.kubernetes.io/component": "engine"}  # fmt: skip


def test_network_policy_is_on_by_default_can_be_turned_off_and_never_restarts_engines():
    off = render(cr({"networkPolicy": {"enabled": False}}))
    assert not by_kind(off, "NetworkPolicy")
    objs = render(cr({"networkPolicy": {"allowedNamespaces": ["gateway"]}}))
    pol = by_kind(objs, "NetworkPolicy")[0]
    assert pol["spec"]["podSelector"] == {"matchLabels": {"flashserve.io/serving": "flash",
                                                          "app.kubernetes.io/component": "engine"}}  # fmt: skip
    api_rule = pol["spec"]["ingress"][1]
    assert api_rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}} in api_rule["from"]
    h = lambda objs: by_kind(objs, "StatefulSet")[0]["metadata"]["annotations"]["flashserve.io/template-hash"]  # noqa: E731
    assert h(off) == h(objs)
    from tests.k8s_schema import validate

    validate(pol)
