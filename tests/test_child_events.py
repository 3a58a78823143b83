"""A child's DELETED watch event wakes its serving's worker at once (kopf drops a deleted object from the
indexes before any handler runs, so only an on.event handler sees the deletion), for every kind the operator
makes; and the API server, not kopf, restricts those watches to the operator's own children."""

from __future__ import annotations

import argparse
import asyncio

import kopf
import pytest
from flashserve.controller import handlers
from flashserve.controller.main import _configure_kopf
from flashserve.render.naming import (
    SERVING_LABEL,
    legacy_serving_label_value,
    serving_label_value,
)
from kopf._cogs.structs import references

from tests.builders import NS
from tests.fakes import FakeKube, controller


def _handler_for(group: str, version: str, plural: str):
    """The on.event handler kopf would call for an event of this resource."""
    resource = references.Resource(group, version, plural)
    found = [h for h in kopf.get_default_registry()._watching.get_all_handlers()
             if h.selector is not None and h.selector.check(resource)]  # fmt: skip
    assert len(found) == 1, f"one on.event handler for {plural}, found {[h.id for h in found]}"
    return found[0]


@pytest.fixture
def wakeups():
    """Wake-up events for two servings' workers, removed afterwards."""
    keys = [(NS, serving_label_value("flash")), (NS, serving_label_value("other"))]
    for k in keys:
        handlers._wakeups[k] = asyncio.Event()
    yield {k: handlers._wakeups[k] for k in keys}
    for k in keys:
        handlers._wakeups.pop(k, None)


@pytest.mark.parametrize("resource", list(handlers.CHILD_RESOURCES), ids=lambda r: r[2])
def test_a_deleted_child_of_each_kind_wakes_its_own_servings_worker_only(resource, wakeups):
    c = controller(FakeKube())
    kind = handlers.CHILD_RESOURCES[resource]
    c._recent[(kind, NS, "flash-x")] = ("digest", 0.0)
    h = _handler_for(*resource)
    labels = {**handlers.MANAGED, SERVING_LABEL: serving_label_value("flash")}
    assert h.labels == handlers.MANAGED, "the handler sees managed children only"

    async def call(type_: str | None) -> None:
        await h.fn(type=type_, namespace=NS, name="flash-x", labels=labels, memo=kopf.Memo(controller=c))

    for type_ in (None, "ADDED", "MODIFIED"):
        asyncio.run(call(type_))
    assert not any(e.is_set() for e in wakeups.values()), "only deletions wake from here (the index wakes the rest)"
    assert (kind, NS, "flash-x") in c._recent

    asyncio.run(call("DELETED"))
    flash, other = wakeups.values()
    assert flash.is_set() and not other.is_set()
    assert (kind, NS, "flash-x") not in c._recent, "the write record would take the absence for a lagging watch"


def test_a_child_under_an_earlier_label_value_wakes_the_worker_that_reads_it():
    key = (NS, serving_label_value("a.b"))
    legacy = (NS, legacy_serving_label_value("a.b"))
    assert legacy != key
    handlers._wakeups[key] = asyncio.Event()
    handlers._aliases.setdefault(legacy, set()).add(key)
    try:
        woke = handlers.child_deleted(controller(FakeKube()), "StatefulSet", NS, "flash-g0",
                                      {SERVING_LABEL: legacy[1]})  # fmt: skip
        assert woke and handlers._wakeups[key].is_set()
    finally:
        handlers._aliases[legacy].discard(key)
        handlers._wakeups.pop(key, None)


def test_a_deleted_object_that_names_no_serving_wakes_nothing(wakeups):
    assert not handlers.child_deleted(controller(FakeKube()), "Service", NS, "flash", {"app": "x"})
    assert not any(e.is_set() for e in wakeups.values())


def test_child_watches_are_restricted_by_the_api_server_to_managed_objects():
    settings = kopf.OperatorSettings()
    _configure_kopf(settings, argparse.Namespace(watch_timeout=60, watch_client_timeout=None))
    managed = ",".join(f"{k}={v}" for k, v in handlers.MANAGED.items())
    for group, version, plural in handlers.CHILD_RESOURCES:
        got = settings.watching.label_selectors.collect(references.Resource(group, version, plural))
        assert got == [managed], plural
    # The servings themselves carry no such label; nor is any other kind of the same plural restricted.
    for other in (references.Resource("flashserve.io", "v1alpha1", "deepseekservings"),
                  references.Resource("serving.knative.dev", "v1", "services"),
                  references.Resource("", "v1", "configmaps")):  # fmt: skip
        assert settings.watching.label_selectors.collect(other) == [], other


def _index_for(plural: str):
    found = [h for h in kopf.get_default_registry()._indexing.get_all_handlers()
             if h.selector is not None and h.selector.check(references.Resource(*_child(plural)))]  # fmt: skip
    assert len(found) == 1, f"one index for {plural}, found {[h.id for h in found]}"
    return found[0]


def _child(plural: str) -> tuple[str, str, str]:
    return next((c.group, c.version, c.plural) for c in handlers.CHILDREN if c.plural == plural)


def _obj(name: str, labels: dict) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "labels": labels, "uid": f"uid-{name}"}, "spec": {},
            "status": {}}  # fmt: skip


@pytest.mark.parametrize("child", handlers.CHILDREN, ids=lambda c: c.plural)
def test_each_kind_has_one_index_that_files_a_managed_object_under_its_serving(child, wakeups):
    h = _index_for(child.plural)
    assert h.id == child.index and h.labels == handlers.MANAGED
    labels = {**handlers.MANAGED, SERVING_LABEL: serving_label_value("flash")}
    got = asyncio.run(h.fn(namespace=NS, labels=labels, body=_obj("flash-x", labels)))
    key = (NS, serving_label_value("flash"))
    assert list(got) == [key]
    assert wakeups[key].is_set() and not wakeups[(NS, serving_label_value("other"))].is_set()
    unowned = asyncio.run(h.fn(namespace=NS, labels=dict(handlers.MANAGED), body=_obj("x", handlers.MANAGED)))
    assert unowned is None, "an object that names no serving is not indexed"


def test_observed_takes_each_kind_from_its_own_index_under_every_label_value():
    key, legacy = (NS, "flash"), (NS, "flash-legacy")
    indexes: dict = {c.field: {} for c in handlers.CHILDREN}
    for c in handlers.CHILDREN:
        if c.field != "pods":
            indexes[c.field] = {key: [{"metadata": {"name": f"{c.plural}-a", "deletionTimestamp": None}}],
                                legacy: [{"metadata": {"name": f"{c.plural}-b", "deletionTimestamp": None}}]}
    indexes["statefulsets"][key].append({"metadata": {"name": "going", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    indexes["pods"] = {key: ["pod-a"], legacy: ["pod-b"], handlers.startup_key(key): ["prefetch-a"]}
    got = handlers._observed([key, legacy, key], indexes)
    for c in handlers.CHILDREN:
        if c.field != "pods":
            assert sorted(getattr(got, c.field)) == [f"{c.plural}-a", f"{c.plural}-b"], c.field
    assert got.pods == ["pod-a", "pod-b"] and got.startup_pods == ["prefetch-a"]
    assert sorted(got.by_kind()) == sorted(c.kind for c in handlers.CHILDREN if c.field != "pods")


def test_a_deleted_servings_late_events_leave_the_one_re_created_under_its_name_alone():
    """kopf runs each uid's events apart: the old serving's MODIFIED and DELETED may come after the new one's
    ADDED. Neither may stop the new serving's worker nor have it reconcile the old spec."""
    h = _handler_for("flashserve.io", "v1alpha1", "deepseekservings")
    key = (NS, serving_label_value("flash"))
    c = controller(FakeKube())

    def body(uid: str, made: str, replicas: int, deleted: bool = False) -> kopf.Body:
        meta = {"name": "flash", "namespace": NS, "uid": uid, "creationTimestamp": made}
        if deleted:
            meta["deletionTimestamp"] = "2026-12-07T10:05:00Z"
        return kopf.Body({"metadata": meta, "spec": {"replicas": replicas}})

    indexes = {c_.index: {} for c_ in handlers.CHILDREN}

    async def events() -> None:
        async def send(type_: str, b: kopf.Body) -> None:
            await h.fn(type=type_, namespace=NS, name="flash", body=b, memo=kopf.Memo(controller=c),
                       logger=handlers.logging.getLogger("test"), **indexes)  # fmt: skip

        await send("ADDED", body("new", "2026-12-07T10:04:59Z", 3))
        await send("MODIFIED", body("old", "2026-12-07T09:00:00Z", 1))
        await send("DELETED", body("old", "2026-12-07T09:00:00Z", 1, deleted=True))
        assert key in handlers._workers and handlers._bodies[key]["metadata"]["uid"] == "new"
        assert handlers._bodies[key]["spec"]["replicas"] == 3
        await send("DELETED", body("new", "2026-12-07T10:04:59Z", 3, deleted=True))
        assert key not in handlers._bodies and key not in handlers._workers

    try:
        asyncio.run(events())
    finally:
        handlers._bodies.pop(key, None)
        task = handlers._workers.pop(key, None)
        if task is not None:
            task.cancel()
