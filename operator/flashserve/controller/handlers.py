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
from typing import Any, Callable

import kopf

from flashserve.api.v1alpha1 import GROUP, PLURAL, VERSION
from flashserve.controller.observe import CHILDREN, Observed, pod_view, serving_key, slim
from flashserve.controller.reconciler import Controller, ServingGone
from flashserve.render.startup import OWNER_LABEL
from flashserve.render.naming import (
    MANAGED_BY,
    legacy_serving_label_value,
    serving_label_value,
)

MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
_wakeups: dict[tuple[str, str], asyncio.Event] = {}
_bodies: dict[tuple[str, str], dict] = {}  # latest version of each serving, from its watch
_deleted: dict[tuple[str, str], tuple[str, ...]] = {}  # uids of the last servings deleted under each name
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


# Their watches are restricted by the API server to MANAGED objects (kopf's settings.watching.label_selectors,
# see main.py): the `labels=` filter of a handler is applied by kopf on the client, after every object of the
# kind in the watched namespaces has been sent, parsed and queued.
CHILD_RESOURCES = {(c.group, c.version, c.plural): c.kind for c in CHILDREN}
MANAGED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())
# A serving's StatefulSets and Services that are being deleted are taken as gone (made again if still
# wanted); other kinds are kept as they are until the API drops them.
_LIVE_ONLY = {"statefulsets", "services"}


# Index functions run on every watch event of a child; waking the owner there costs nothing extra.
async def _index_child(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
    key = serving_key(namespace, labels)
    _wake(key)
    return {key: slim(body)} if key else None


async def _index_pod(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> dict | None:
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


for _child in CHILDREN:
    kopf.index(_child.group, _child.version, _child.plural, labels=MANAGED, id=_child.index)(
        _index_pod if _child.plural == "pods" else _index_child)


def startup_key(key: tuple[str, str]) -> tuple[str, str, str]:
    """The index key of the start-up pods that work for the serving of `key`."""
    return (*key, OWNER_LABEL)


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


for _child in CHILDREN:
    _on_child_event(_child.group, _child.version, _child.plural, _child.kind)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def serving_event(
    type: str | None,
    namespace: str,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: logging.Logger,
    **kwargs: Any,
) -> None:
    key = (namespace, serving_label_value(name))
    legacy = (namespace, legacy_serving_label_value(name))
    deleting = type == "DELETED" or bool(body.get("metadata", {}).get("deletionTimestamp"))
    if _earlier_incarnation(_bodies.get(key), body, deleting) or (not deleting and _uid(body) in _deleted.get(key, ())):
        return
    if deleting:
        if _uid(body):
            _deleted[key] = (*_deleted.get(key, ())[-7:], _uid(body))  # its late events are ignored
            if len(_deleted) > 10_000:
                del _deleted[next(iter(_deleted))]
        _aliases.get(legacy, set()).discard(key)
        _forget(memo.controller, key, name)
        task = _workers.pop(key, None)
        if task is not None:
            task.cancel()
        return
    _bodies[key] = copy.deepcopy(dict(body))
    if key not in _workers or _workers[key].done():
        indexes = {c.field: kwargs[c.index] for c in CHILDREN}  # kopf passes every index to every handler
        # Children made by earlier versions may carry the label value those gave; the reconciler keeps only
        # the ones this serving owns.
        keys = [key, legacy]
        if legacy != key:
            _aliases.setdefault(legacy, set()).add(key)
        _workers[key] = asyncio.create_task(_worker(key, keys, memo.controller, indexes, logger),
                                            name=f"reconcile {key}")  # fmt: skip
    _wake(key)


def _uid(body: Any) -> str | None:
    return (body.get("metadata") or {}).get("uid")


def _forget(controller: Controller, key: tuple[str, str], name: str) -> None:
    _bodies.pop(key, None)
    controller.forget(key[0], name)
    if controller.autoscaler is not None:
        controller.autoscaler.forget(key[0], name)


def _earlier_incarnation(current: dict | None, event: Any, deleting: bool) -> bool:
    """Whether `event` is of a serving deleted before the one now held under its name was made. kopf handles
    each uid's events on a worker of its own, so a deleted serving's last events (its DELETED among them) may
    come after the ADDED of one re-created under the same name: acted on, they would stop the new serving's
    worker, or have it reconcile the old spec. Told apart by uid, and ordered by creation time."""
    if current is None:
        return False
    old, new = current.get("metadata") or {}, event.get("metadata") or {}
    if not old.get("uid") or not new.get("uid") or old["uid"] == new["uid"]:
        return False
    made, held = new.get("creationTimestamp") or "", old.get("creationTimestamp") or ""
    # RFC 3339 in UTC with whole seconds, as the API server writes them: compared as text. In the same second
    # the event's own uid is all there is to go by: a deletion only ends a serving with that uid.
    return made < held or (made == held and deleting)


def _observed(keys: list[tuple[str, str]], indexes: dict[str, kopf.Index]) -> Observed:
    """What the indexes hold of the serving's children, under every label value it may carry (`keys`)."""
    keys = list(dict.fromkeys(keys))

    def items(field: str, key_of: Callable = lambda k: k) -> list:
        return [item for key in keys for item in indexes[field].get(key_of(key), [])]

    def by_name(field: str) -> dict[str, dict]:
        objs = {o["metadata"]["name"]: o for o in items(field)}
        if field in _LIVE_ONLY:
            return {n: o for n, o in objs.items() if not o["metadata"]["deletionTimestamp"]}
        return objs

    named = {c.field: by_name(c.field) for c in CHILDREN if c.field != "pods"}
    return Observed(**named, pods=items("pods"), startup_pods=items("pods", startup_key))


async def _worker(key: tuple[str, str], keys: list[tuple[str, str]], controller: Controller,
                  indexes: dict[str, kopf.Index], logger: logging.Logger) -> None:
    wake = _wakeups.setdefault(key, asyncio.Event())
    failures = 0
    try:
        while key in _bodies:
            wake.clear()
            body = _bodies[key]
            try:
                await controller.reconcile(body, _observed(keys, indexes), logger)
                failures = 0
            except asyncio.CancelledError:
                raise
            except ServingGone:
                now_held = _bodies.get(key)
                if now_held is not None and _uid(now_held) != _uid(body):
                    continue  # re-created under the name meanwhile: this worker serves the new one
                logger.info("%s/%s is gone (its status cannot be written): stopping its worker", key[0],
                            body["metadata"]["name"])  # fmt: skip
                _forget(controller, key, body["metadata"]["name"])
                return
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
