"""Builders shared by the tests: DeepSeekServing objects as the renderer and the watches see them, the
children and pods the API server would hold for them, and the spellings of JSON-valued vLLM flags.

Test modules import from here (or tests/fakes.py, or take fixtures from conftest.py), never from one
another: a test module can then be renamed, split or deleted without breaking an unrelated one."""

from __future__ import annotations

from pathlib import Path

import yaml
from flashserve.controller.observe import Observed, PodView, slim
from flashserve.render.naming import ROUTING_SERVE
from flashserve.render.renderer import render, render_serving, template_hash

ROOT = Path(__file__).resolve().parents[1]
NS = "team-a"  # the namespace of the servings the controller tests reconcile


def cr(spec: dict, name: str = "flash", **meta) -> dict:
    """A DeepSeekServing as `kubectl apply` would send it (no uid, no generation): input to the renderer."""
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
            "metadata": {"name": name, "namespace": "ns", **meta}, "spec": spec}  # fmt: skip


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def pod(objs: list[dict], i: int = 0) -> dict:
    """The pod spec of the i-th StatefulSet among rendered objects."""
    return by_kind(objs, "StatefulSet")[i]["spec"]["template"]["spec"]


def body(name: str, spec: dict | None = None, uid: str | None = None, status: dict | None = None,
         generation: int = 1) -> dict:  # fmt: skip
    """A DeepSeekServing as its watch delivers it to the controller: with a uid, a generation and maybe a status."""
    out = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
           "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "generation": generation},
           "spec": spec if spec is not None else {"replicas": 1}}  # fmt: skip
    if status is not None:
        out["status"] = status
    return out


def observe(obj, *, ready: bool = True, hash_override: dict[int, str] | None = None,
            pod_hash: dict[str, str] | None = None) -> Observed:  # fmt: skip
    """The children as the API server would hold them after applying `obj` (a parsed serving), with pods per group."""
    hash_override = hash_override or {}
    pod_hash = pod_hash or {}
    out = Observed()
    nodes = obj.spec.parallelism.nodes_per_replica
    for o in render_serving(obj):
        live = slim(o)
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "StatefulSet":
            idx = int(o["metadata"]["labels"]["flashserve.io/group"])
            h = hash_override.get(idx, template_hash(obj.spec))
            live["metadata"]["annotations"]["flashserve.io/template-hash"] = h
            live["metadata"]["uid"] = f"uid-{name}"
            out.statefulsets[name] = live
            for k in range(nodes):
                pname = f"{name}-{k}"
                out.pods.append(PodView(pname, idx, pod_hash.get(pname, h), ready, False, "Running", False, 0, "n",
                                        routing=ROUTING_SERVE, ip=f"10.64.{idx}.{k + 1}", uid=f"uid-{pname}",
                                        owner_uid=f"uid-{name}"))  # fmt: skip
        elif kind in out.by_kind():
            if kind == "Deployment":  # its pods up, as the Deployment controller reports them
                live["status"] = {"replicas": o["spec"]["replicas"], "availableReplicas": o["spec"]["replicas"]}
            out.by_kind()[kind][name] = live
    return out


def body_for(url: str, mode: str = "Active", replicas: int = 2) -> dict:
    """A serving with the autoscaler on, reading Prometheus at `url`."""
    return {
        "apiVersion": "flashserve.io/v1alpha1",
        "kind": "DeepSeekServing",
        "metadata": {"name": "flash", "namespace": "team-a", "uid": "u", "resourceVersion": "42", "generation": 1},
        "spec": {"replicas": replicas, "autoscaling": {"enabled": True, "mode": mode, "minReplicas": 1, "maxReplicas": 8,
                                                       "prometheusUrl": url, "gpuHourlyCost": 6.0}},  # fmt: skip
    }


def ready_observed(groups: int) -> Observed:
    """`groups` replica groups of one ready pod each, without template hashes (readiness is what the
    autoscaler counts)."""
    obs = Observed()
    for i in range(groups):
        name = f"flash-g{i}"
        obs.statefulsets[name] = slim({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
            "name": name, "labels": {"flashserve.io/group": str(i)}, "annotations": {}}, "spec": {"replicas": 1}})  # fmt: skip
        obs.pods.append(PodView(f"{name}-0", i, "", True, False, "Running", False, 0, "n"))
    return obs


def pod_from_sample(sample: str, index: int = 0, ip: str = "127.4.3.7") -> dict:
    """Pod `index` of the first StatefulSet of a sample serving, as the API server would hold it running."""
    cr = yaml.safe_load((ROOT / "manifests" / "samples" / sample).read_text())
    cr["metadata"]["namespace"] = "demo"
    sts = next(o for o in render(cr) if o["kind"] == "StatefulSet")
    tpl = sts["spec"]["template"]
    labels = {**tpl["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(index)}
    return {"metadata": {"name": f"{sts['metadata']['name']}-{index}", "namespace": "demo", "uid": f"uid-{index}",
                         "labels": labels, "annotations": dict(tpl["metadata"].get("annotations") or {})},
            "spec": {**tpl["spec"], "nodeName": "gb200-r0-n03"},
            "status": {"phase": "Running", "podIP": ip}}


def node(product: str) -> dict:
    """A (KWOK) node with the GPU product label the runtime reads."""
    return {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": product},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}}}


# Sub-keys of the JSON-valued managed settings, for their `--flag.key=value` spellings.
SUB_KEYS = {
    "compilation_config": "cudagraph_mode=NONE",
    "speculative_config": "num_speculative_tokens=2",
    "eplb_config": "window_size=10",
    "attention_config": "backend=FLASHMLA",
    "custom_histogram_buckets": "inter_token_latency=[0.1]",
}


def bench_context(calib, sla: float, groups: list | None = None):
    """The benchmark's policy context for a fleet of `groups` (bench.fleet.Group), as the simulator builds it."""
    from flashserve_testbed.bench.context import Context
    from flashserve_testbed.bench.fleet import READY, FleetCounts

    groups = groups or []
    ready = sum(g.state == READY for g in groups)
    return Context(now=0.0, counts=FleetCounts(len(groups), ready, len(groups) - ready, 0), groups=groups, prom=None,
                   calib=calib, sla_tokens_per_s=sla, min_replicas=1, max_replicas=8, scrape_interval_s=5.0)  # type: ignore[arg-type]  # fmt: skip

