"""kopf registrations: indexes that mirror each serving's children, and one worker task per serving that
runs the reconcile loop. Everything that decides lives in plan.py, status.py and the autoscaling package.

One worker per DeepSeekServing is the single writer for that serving: it reconciles when woken (the serving
or one of its children changed) and at least every resync period, so a missed or silent watch cannot leave
drift in place for longer than that.

The workers are plain asyncio tasks started from the serving's watch events rather than kopf daemons: a kopf
daemon puts a finalizer on every object, which would leave servings (and their namespaces) stuck in deletion
whenever the operator is not running. Children are removed by the garbage collector through ownerReferences,
so no finalizer is needed. Handlers are async so they run on the event loop (kopf runs sync ones in threads).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import kopf

from flashserve.api.v1alpha1 import GROUP, PLURAL, VERSION
from flashserve.controller.observe import Observed, pod_view, serving_key, slim
from flashserve.controller.reconciler import Controller
from flashserve.render.startup import OWNER_LABEL
from flashserve.render.naming import (
    MANAGED_BY,
    legacy_serving_label_value,
    serving_label_value,
)

MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
_wakeups: dict[tuple[str, str], asyncio.Event] = {}
_bodies: dict[tuple[str, str], dict] = {}  # latest version of each serving, from its watch
_workers: dict[tuple[str, str], asyncio.Task] = {}
log = logging.getLogger(__name__)


_aliases: dict[tuple[str, str], set[tuple[str, str]]] = {}  # earlier label value -> workers that read it


def _wake(key: tuple[str, str] | None) -> None:
    if not key:
        return
    for k in {key, *_aliases.get(key, ())}:
        event = _wakeups.get(k)
        if event is not None:
            event.set()


# Index functions run on every watch event of a child; waking the owner there costs nothing extra.
@kopf.index("apps", "v1", "statefulsets", labels=MANAGED)
async def fs_statefulsets(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "services", labels=MANAGED)
async def fs_services(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
async def fs_pdbs(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED)
async def fs_netpols(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
async def fs_deployments(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "serviceaccounts", labels=MANAGED)
async def fs_serviceaccounts(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("rbac.authorization.k8s.io", "v1", "roles", labels=MANAGED)
async def fs_roles(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("rbac.authorization.k8s.io", "v1", "rolebindings", labels=MANAGED)
async def fs_rolebindings(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


# The InferencePool CRD comes with an inference gateway and may be missing: kopf then serves no watch for it
# (it logs that the resource is unresolved) and starts one when the CRD appears.
@kopf.index("inference.networking.k8s.io", "v1", "inferencepools", labels=MANAGED)
async def fs_inferencepools(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("apps", "v1", "daemonsets", labels=MANAGED)
async def fs_daemonsets(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("batch", "v1", "jobs", labels=MANAGED)
async def fs_jobs(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "pods", labels=MANAGED)
async def fs_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    if key is None:
        # A prefetch or pre-pull pod carries no serving label (no selector of the engines may match it), only
        # the serving it works for: kept apart, under a key of its own, for the start-up's cache signal.
        owner = (labels or {}).get(OWNER_LABEL)
        if not owner:
            return None
        _wake((namespace, owner))
        return {startup_key((namespace, owner)): pod_view(body)}
    _wake(key)
    return {key: pod_view(body)}


def startup_key(key: tuple[str, str]) -> tuple[str, str, str]:
    """The index key of the start-up pods that work for the serving of `key`."""
    return (*key, OWNER_LABEL)


# The resources whose objects the operator makes (and so watches), with their kinds. Their watches are
# restricted by the API server to MANAGED objects (kopf's settings.watching.label_selectors, see
# main.py): the `labels=` filter of a handler is applied by kopf on the client, after every object of the
# kind in the watched namespaces has been sent, parsed and queued.
CHILD_RESOURCES = {
    ("apps", "v1", "statefulsets"): "StatefulSet",
    ("", "v1", "services"): "Service",
    ("policy", "v1", "poddisruptionbudgets"): "PodDisruptionBudget",
    ("networking.k8s.io", "v1", "networkpolicies"): "NetworkPolicy",
    ("", "v1", "pods"): "Pod",
    ("apps", "v1", "deployments"): "Deployment",
    ("", "v1", "serviceaccounts"): "ServiceAccount",
    ("rbac.authorization.k8s.io", "v1", "roles"): "Role",
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): "RoleBinding",
    ("inference.networking.k8s.io", "v1", "inferencepools"): "InferencePool",
    ("apps", "v1", "daemonsets"): "DaemonSet",
    ("batch", "v1", "jobs"): "Job",
}
MANAGED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())


def child_deleted(controller: Controller, kind: str, namespace: str, name: str, labels: dict) -> bool:
    """A managed child is gone: the write record that would take its absence for a watch that lags is
    dropped, and its serving's worker is woken to make it again. False when no serving is named."""
    controller.deleted(kind, namespace, name)
    key = serving_key(namespace, labels)
    _wake(key)
    return key is not None


# Deletions do not reach index functions (kopf discards the object from the indexes before any handler
# runs); these wake the owner so a child deleted by hand returns at once, not at the next resync.
def _on_child_event(group: str, version: str, plural: str, kind: str) -> None:
    @kopf.on.event(group, version, plural, labels=MANAGED, id=f"child_event/{plural}")
    async def child_event(type: str | None, namespace: str, name: str, labels: dict, memo: kopf.Memo,
                          **_: Any) -> None:  # fmt: skip
        if type == "DELETED":
            child_deleted(memo.controller, kind, namespace, name, labels)


for (_group, _version, _plural), _kind in CHILD_RESOURCES.items():
    _on_child_event(_group, _version, _plural, _kind)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def serving_event(
    type: str | None,
    namespace: str,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: logging.Logger,
    fs_statefulsets: kopf.Index,
    fs_services: kopf.Index,
    fs_pdbs: kopf.Index,
    fs_pods: kopf.Index,
    fs_netpols: kopf.Index,
    fs_deployments: kopf.Index,
    fs_serviceaccounts: kopf.Index,
    fs_roles: kopf.Index,
    fs_rolebindings: kopf.Index,
    fs_inferencepools: kopf.Index,
    fs_daemonsets: kopf.Index,
    fs_jobs: kopf.Index,
    **_: Any,
) -> None:
    key = (namespace, serving_label_value(name))
    legacy = (namespace, legacy_serving_label_value(name))
    if type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        _aliases.get(legacy, set()).discard(key)
        _bodies.pop(key, None)
        memo.controller.forget(namespace, name)
        if memo.controller.autoscaler is not None:
            memo.controller.autoscaler.forget(namespace, name)
        task = _workers.pop(key, None)
        if task is not None:
            task.cancel()
        return
    _bodies[key] = copy.deepcopy(dict(body))
    if key not in _workers or _workers[key].done():
        indexes = (fs_statefulsets, fs_services, fs_pdbs, fs_pods, fs_netpols, fs_deployments, fs_serviceaccounts,
                   fs_roles, fs_rolebindings, fs_inferencepools, fs_daemonsets, fs_jobs)  # fmt: skip
        # Children made by earlier versions may carry the label value those gave; the reconciler keeps only
        # the ones this serving owns.
        keys = [key, legacy]
        if legacy != key:
            _aliases.setdefault(legacy, set()).add(key)
        _workers[key] = asyncio.create_task(_worker(key, keys, memo.controller, indexes, logger),
                                            name=f"reconcile {key}")  # fmt: skip
    _wake(key)


def _observed(keys: list[tuple[str, str]], sts: kopf.Index, svcs: kopf.Index, pdbs: kopf.Index, pods: kopf.Index,
              netpols: kopf.Index, deployments: kopf.Index, serviceaccounts: kopf.Index, roles: kopf.Index,
              rolebindings: kopf.Index, inferencepools: kopf.Index, daemonsets: kopf.Index,
              jobs: kopf.Index) -> Observed:  # fmt: skip
    def items(index: kopf.Index) -> list:
        return [item for key in dict.fromkeys(keys) for item in index.get(key, [])]

    def by_name(index: kopf.Index) -> dict[str, dict]:
        return {s["metadata"]["name"]: s for s in items(index)}

    return Observed(
        statefulsets={s["metadata"]["name"]: s for s in items(sts) if not s["metadata"]["deletionTimestamp"]},
        services={s["metadata"]["name"]: s for s in items(svcs) if not s["metadata"]["deletionTimestamp"]},
        pdbs=by_name(pdbs),
        netpols=by_name(netpols),
        pods=[p for key in dict.fromkeys(keys) for p in pods.get(key, [])],
        startup_pods=[p for key in dict.fromkeys(keys) for p in pods.get(startup_key(key), [])],
        deployments=by_name(deployments),
        serviceaccounts=by_name(serviceaccounts),
        roles=by_name(roles),
        rolebindings=by_name(rolebindings),
        inferencepools=by_name(inferencepools),
        daemonsets=by_name(daemonsets),
        jobs=by_name(jobs),
    )


async def _worker(key: tuple[str, str], keys: list[tuple[str, str]], controller: Controller, indexes: tuple,
                  logger: logging.Logger) -> None:
    wake = _wakeups.setdefault(key, asyncio.Event())
    failures = 0
    try:
        while key in _bodies:
            wake.clear()
            body = _bodies[key]
            try:
                await controller.reconcile(body, _observed(keys, *indexes), logger)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the loop alive; back off so a broken API is not hammered
                failures += 1
                logger.error("reconcile of %s/%s failed (attempt %d): %s", key[0], body["metadata"]["name"],
                             failures, exc, exc_info=failures == 1)  # fmt: skip
            delay = controller.resync_seconds if not failures else min(60.0, 2.0**failures)
            delay = min(delay, controller.next_evaluation_in(body))
            try:
                await asyncio.wait_for(wake.wait(), timeout=max(0.5, delay))
                await asyncio.sleep(controller.debounce_seconds)  # let a burst of child events settle
            except asyncio.TimeoutError:
                pass
    finally:
        if _wakeups.get(key) is wake:
            del _wakeups[key]


@kopf.on.cleanup()
async def stop_workers(**_: Any) -> None:
    for task in list(_workers.values()):
        task.cancel()
    await asyncio.gather(*_workers.values(), return_exceptions=True)
    _workers.clear()
