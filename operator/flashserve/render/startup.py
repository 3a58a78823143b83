"""The children and pod pieces of spec.startup: the weights and kernel cache volumes of the engine pods, the
prefetch that fills the weights cache (a Job for a shared claim, a DaemonSet for a node-local one) and the
image pre-pull DaemonSet. Pure, like the rest of the renderer.

The prefetch and pre-pull pods carry no serving label: the client Service, the PodDisruptionBudget and the
NetworkPolicy select engine pods by it, and must never count or route to these. Their objects do carry it, so
the operator finds them among the serving's children.
"""

from __future__ import annotations

import hashlib
import json

from flashserve.api.v1alpha1 import DeepSeekServing, DeepSeekServingSpec

# _hashed: the start-up children's names follow naming.py's scheme (readable prefix, name hash, suffix), so they
# are injective in the serving's name like every other child's.
from flashserve.render.naming import (
    COMPONENT_LABEL,
    DNS_LABEL_MAX,
    MANAGED_BY,
    SERVING_LABEL,
    _hashed,
    serving_label_value,
)
from flashserve.render.placement import node_affinity, node_selector, tolerations
from flashserve.render.vllm_args import HF_HOME, KERNEL_CACHE_MOUNT

PREFETCH_COMPONENT = "weights-prefetch"
PREPULL_COMPONENT = "image-prepull"
OWNER_LABEL = "flashserve.io/startup-of"  # the serving a prefetch or pre-pull pod works for
WEIGHTS_VOLUME = "hf-cache"  # the engines' Hugging Face cache volume, whatever backs it
KERNEL_VOLUME = "kernel-cache"

# A download is network- and disk-bound: a little CPU, and memory for the Hub client's buffers.
PREFETCH_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
# Pull-only and pause containers do nothing; the kubelet pulls the image whatever the container asks for.
IDLE_RESOURCES = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}}
PREFETCH_BACKOFF_LIMIT = 6
# Pod Security `restricted` whatever the engines need (spec.engine.ipcLock adds a capability to them only).
POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def prefetch_daemonset_name(serving: str) -> str:
    return _hashed(serving, "-prefetch", DNS_LABEL_MAX)


def prefetch_job_name(serving: str, spec: DeepSeekServingSpec) -> str:
    """A Job's pod template cannot change, so the name carries a digest of what the Job downloads where: a new
    model, revision, image or claim is a new Job, and the old one is the operator's to delete."""
    wc = spec.startup.weights_cache if spec.startup else None
    what = [spec.model.name, spec.model.revision, spec.engine.image, wc.claim_name if wc else None]
    digest = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:6]
    return _hashed(serving, f"-prefetch-{digest}", DNS_LABEL_MAX)


def prepull_daemonset_name(serving: str) -> str:
    return _hashed(serving, "-prepull", DNS_LABEL_MAX)


def weights_cache_claim(spec: DeepSeekServingSpec) -> str | None:
    wc = spec.startup.weights_cache if spec.startup else None
    return wc.claim_name if wc else None


def kernel_cache_volume(spec: DeepSeekServingSpec) -> tuple[dict, dict] | None:
    """(volume, mount) of the kernel cache in an engine pod, or None without one."""
    kc = spec.startup.kernel_cache if spec.startup else None
    if kc is None:
        return None
    return (
        {"name": KERNEL_VOLUME, "persistentVolumeClaim": {"claimName": kc.claim_name}},
        {"name": KERNEL_VOLUME, "mountPath": KERNEL_CACHE_MOUNT},
    )


def _labels(serving: str, component: str) -> tuple[dict, dict, dict]:
    """(object labels, pod labels, pod selector) of a start-up child."""
    value = serving_label_value(serving)
    selector = {OWNER_LABEL: value, COMPONENT_LABEL: component}
    pod = {
        "app.kubernetes.io/name": "deepseek-serving",
        "app.kubernetes.io/instance": value,
        "app.kubernetes.io/part-of": "flashserve",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector,
    }
    return {**pod, SERVING_LABEL: value}, pod, selector


def _download_container(spec: DeepSeekServingSpec, security_context: dict) -> dict:
    """`hf download` of the model into the cache, as the engine would lay it out under HF_HOME. The model and
    revision are separate arguments, never shell text; the token comes only from the Secret."""
    args = [spec.model.name]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    env = [{"name": "HF_HOME", "value": HF_HOME}, {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret_ref is not None:
        ref = hf.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return {
        "name": "download",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["hf", "download"],
        "args": args,
        "env": env,
        "resources": PREFETCH_RESOURCES,
        "securityContext": security_context,
        "volumeMounts": [{"name": WEIGHTS_VOLUME, "mountPath": HF_HOME}],
    }


def _pause_container(image: str, security_context: dict) -> dict:
    return {"name": "pause", "image": image, "imagePullPolicy": "IfNotPresent", "resources": IDLE_RESOURCES,
            "securityContext": security_context}  # fmt: skip


def startup_objects(obj: DeepSeekServing, ctx: dict) -> list[tuple[str, dict]]:
    """(template, context) of each start-up child; `ctx` holds the serving's namespace and owner reference."""
    spec, name = obj.spec, obj.metadata["name"]
    st = spec.startup
    if st is None:
        return []
    sc = CONTAINER_SECURITY_CONTEXT
    ctx = {**ctx, "pod_security_context": POD_SECURITY_CONTEXT}
    pool = {"affinity": {"nodeAffinity": node_affinity(spec)}, "node_selector": node_selector(spec),
            "tolerations": tolerations(spec)}  # fmt: skip
    out: list[tuple[str, dict]] = []
    wc = st.weights_cache
    if wc is not None and wc.prefetch:
        labels, pod_labels, pod_selector = _labels(name, PREFETCH_COMPONENT)
        volumes = [{"name": WEIGHTS_VOLUME, "persistentVolumeClaim": {"claimName": wc.claim_name}}]
        common = {**ctx, "labels": labels, "pod_labels": pod_labels, "volumes": volumes}
        download = _download_container(spec, sc)
        if wc.scope == "NodeLocal":
            # The download runs first; the pause container then keeps the pod Ready, which says "this node's
            # copy is complete" (the per-node cache signal).
            out.append(("daemonset.yaml.j2", {**common, **pool, "name": prefetch_daemonset_name(name),
                                               "selector": pod_selector, "init_containers": [download],
                                               "containers": [_pause_container(st.image_prepull.pause_image, sc)]}))  # fmt: skip
        else:
            out.append(("job.yaml.j2", {**common, "name": prefetch_job_name(name, spec), "containers": [download],
                                         "backoff_limit": PREFETCH_BACKOFF_LIMIT}))  # fmt: skip
    if st.image_prepull.enabled:
        labels, pod_labels, pod_selector = _labels(name, PREPULL_COMPONENT)
        pull = {"name": "pull", "image": spec.engine.image, "imagePullPolicy": spec.engine.image_pull_policy,
                "command": ["true"], "resources": IDLE_RESOURCES, "securityContext": sc}  # fmt: skip
        out.append(("daemonset.yaml.j2", {**ctx, **pool, "name": prepull_daemonset_name(name), "labels": labels,
                                           "pod_labels": pod_labels, "selector": pod_selector,
                                           "init_containers": [pull], "volumes": [],
                                           "containers": [_pause_container(st.image_prepull.pause_image, sc)]}))  # fmt: skip
    return out
