"""What the API admits, the children admit: for every object of the admission corpus (tests/differential_corpus.py)
that the operator accepts, each child it renders (StatefulSets, Services, budgets, policies, the router) goes to the
real API server with server-side dry-run, and the API server must admit every one. A child it refused would stop
a reconcile half way through; `kubernetes-validate` alone does not check apimachinery's name, quantity and
toleration rules, so this asks the API server itself. Prints the count per kind."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from flashserve.api.validation import SpecError, parse_serving
from flashserve.render.renderer import render_serving
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.differential_corpus import corpus

# Custom resources of other projects (the NVIDIA DRA driver's ComputeDomain, the inference gateway's
# InferencePool: e2e/test_inferencepool.py installs the project's copy of its CRD) are not installed here.
NOT_INSTALLED = {"ComputeDomain", "InferencePool"}
API_SERVER = (("10.96.0.1/32", 443), ("192.0.2.2/32", 6443), ("fd00::1/128", 6443))


def _dry_run(kube, namespace: str, obj: dict) -> str | None:
    """None when the API server admits the object, else its message."""
    kind = obj["kind"]
    name, body = obj["metadata"]["name"], {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    apps, core, policy, net, rbac = (client.AppsV1Api(kube), client.CoreV1Api(kube), client.PolicyV1Api(kube),
                                     client.NetworkingV1Api(kube), client.RbacAuthorizationV1Api(kube))  # fmt: skip
    create = {
        "StatefulSet": apps.create_namespaced_stateful_set,
        "Service": core.create_namespaced_service,
        "PodDisruptionBudget": policy.create_namespaced_pod_disruption_budget,
        "NetworkPolicy": net.create_namespaced_network_policy,
        "Deployment": apps.create_namespaced_deployment,
        "ServiceAccount": core.create_namespaced_service_account,
        "Role": rbac.create_namespaced_role,
        "RoleBinding": rbac.create_namespaced_role_binding,
        "DaemonSet": apps.create_namespaced_daemon_set,
        "Job": client.BatchV1Api(kube).create_namespaced_job,
    }[kind]
    try:
        create(namespace, body, dry_run="All", field_validation="Strict")
        return None
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise
        return f"{kind}/{name}: " + (json.loads(exc.body or "{}").get("message") or str(exc))[:400]


def test_every_child_of_an_admitted_serving_is_admitted(kube, crd_installed, namespace):
    servings = []
    for case in corpus():
        try:
            servings.append((case.klass, parse_serving(case.obj)))
        except SpecError:
            continue
    # With the API server's addresses known, so the routers' egress rules (IPv4 and IPv6 blocks) go too.
    children = [(klass, child) for klass, s in servings
                for child in render_serving(s, replicas=min(1, s.spec.replicas) or 1, api_server=API_SERVER)
                if child["kind"] not in NOT_INSTALLED]  # fmt: skip
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda kc: (kc[0], kc[1]["kind"], _dry_run(kube, namespace, kc[1])), children))
    kinds = Counter(kind for _, kind, _ in verdicts)
    refused = [(klass, why) for klass, _, why in verdicts if why]
    print(f"\n{len(servings)} admitted servings, {len(children)} children dry-run in {time.monotonic() - started:.1f}s: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))  # fmt: skip
    assert len(servings) >= 100 and kinds["StatefulSet"] >= 100
    assert refused == [], json.dumps(refused[:10], indent=1)


@pytest.mark.parametrize("placement, field", [
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "tolerations"),
    ({"nodeSelector": {"pool": "has space"}}, "nodeSelector"),
])
def test_a_child_the_api_server_would_refuse_is_refused_at_the_serving(kube, crd_installed, namespace, placement,
                                                                       field):  # fmt: skip
    """The other half: before the API grew these grammars such a serving was admitted and its StatefulSet
    refused; now the serving itself is refused, and the same child built by hand is refused too."""
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "x"},
          "spec": {"placement": {"accelerator": "GB200", **placement}}}  # fmt: skip
    with pytest.raises(SpecError, match=field):
        parse_serving(cr)
    ok = parse_serving({**cr, "spec": {"placement": {"accelerator": "GB200"}}})
    sts = next(o for o in render_serving(ok, replicas=1) if o["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    if field == "tolerations":
        pod["tolerations"] = placement["tolerations"]
    else:
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **placement["nodeSelector"]}
    assert _dry_run(kube, namespace, sts) is not None
