"""kopf registrations: indexes that mirror each serving's children, and one daemon per serving that runs
the reconcile loop. Everything that decides lives in plan.py, status.py and the autoscaling package.

One daemon per DeepSeekServing is the single writer for that serving: it reconciles when woken (the serving
or one of its children changed) and at least every resync period, so a missed or silent watch cannot leave
drift in place for longer than that.
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
from flashserve.naming import MANAGED_BY, serving_label_value

MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
_wakeups: dict[tuple[str, str], asyncio.Event] = {}
log = logging.getLogger(__name__)


def _wake(key: tuple[str, str] | None) -> None:
    event = _wakeups.get(key) if key else None
    if event is not None:
        event.set()


# Index functions run on every watch event of a child; waking the owner there costs nothing extra.
@kopf.index("apps", "v1", "statefulsets", labels=MANAGED)
def fs_statefulsets(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "services", labels=MANAGED)
def fs_services(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
def fs_pdbs(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "pods", labels=MANAGED)
def fs_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: pod_view(body)} if key else None


# Deletions do not reach index functions; these wake the owner so a child deleted by hand returns at once.
@kopf.on.event("apps", "v1", "statefulsets", labels=MANAGED)
@kopf.on.event("", "v1", "services", labels=MANAGED)
@kopf.on.event("", "v1", "pods", labels=MANAGED)
def child_event(type: str, namespace: str, labels: dict, **_: Any) -> None:
    if type == "DELETED":
        _wake(serving_key(namespace, labels))


@kopf.on.event(GROUP, VERSION, PLURAL)
def serving_event(namespace: str, name: str, **_: Any) -> None:
    _wake((namespace, serving_label_value(name)))


def _observed(key: tuple[str, str], sts: kopf.Index, svcs: kopf.Index, pdbs: kopf.Index, pods: kopf.Index) -> Observed:
    def items(index: kopf.Index) -> list:
        return list(index.get(key, []))

    return Observed(
        statefulsets={s["metadata"]["name"]: s for s in items(sts) if not s["metadata"]["deletionTimestamp"]},
        services={s["metadata"]["name"]: s for s in items(svcs) if not s["metadata"]["deletionTimestamp"]},
        pdbs={s["metadata"]["name"]: s for s in items(pdbs)},
        pods=items(pods),
    )


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=10.0)
async def serving_daemon(
    name: str,
    namespace: str,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger,
    memo: kopf.Memo,
    fs_statefulsets: kopf.Index,
    fs_services: kopf.Index,
    fs_pdbs: kopf.Index,
    fs_pods: kopf.Index,
    **_: Any,
) -> None:
    controller: Controller = memo.controller
    key = (namespace, serving_label_value(name))
    wake = _wakeups.setdefault(key, asyncio.Event())
    failures = 0
    try:
        while not stopped:
            wake.clear()
            snapshot = copy.deepcopy(dict(body))  # the live body changes under us; decide on one version
            try:
                observed = _observed(key, fs_statefulsets, fs_services, fs_pdbs, fs_pods)
                await controller.reconcile(snapshot, observed, logger)
                failures = 0
            except Exception as exc:  # keep the loop alive; back off so a broken API is not hammered
                failures += 1
                logger.error("reconcile failed (attempt %d): %s", failures, exc, exc_info=failures == 1)
            delay = controller.resync_seconds if not failures else min(60.0, 2.0**failures)
            delay = min(delay, controller.next_evaluation_in(snapshot))
            waiter = asyncio.ensure_future(wake.wait())
            stopper = asyncio.ensure_future(stopped.wait())
            try:
                await asyncio.wait({waiter, stopper}, timeout=max(0.5, delay), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
            if wake.is_set() and not stopped:
                await asyncio.sleep(controller.debounce_seconds)  # let a burst of child events settle
    finally:
        if _wakeups.get(key) is wake:
            del _wakeups[key]
