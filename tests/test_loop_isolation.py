"""What runs on the operator's event loop is kept short: a reconcile plans (renders) on a thread of its own,
and the Lease is renewed on threads of its own, so neither a large render nor a queue of API writes in the
default executor delays a renewal or the liveness endpoint."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

from flashserve.controller import reconciler as reconciler_mod
from flashserve.controller.leader import LeaseElector
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.builders import body
from tests.fakes import FakeKube, controller


def test_reconcile_plans_on_a_thread_that_is_not_the_event_loop(monkeypatch):
    monkeypatch.setattr(reconciler_mod.kopf, "event", lambda *a, **k: None)
    planned_on: list[threading.Thread] = []
    real_plan = reconciler_mod.plan

    def recording_plan(*args, **kwargs):
        planned_on.append(threading.current_thread())
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(reconciler_mod, "plan", recording_plan)
    kube = FakeKube()
    c = controller(kube)
    loop_thread: list[threading.Thread] = []

    async def main():
        loop_thread.append(threading.current_thread())
        await c.reconcile(body("flash"), kube.observed("team-a", "flash"), logging.getLogger("test"))

    asyncio.run(main())
    assert planned_on and planned_on[0] is not loop_thread[0]
    assert kube.names("StatefulSet"), "the plan was carried out"


class NoLease:
    """A coordination API without the Lease yet: the first attempt creates it."""

    def __init__(self):
        self.created = 0

    def read_namespaced_lease(self, name, namespace, **_):
        raise ApiException(status=404)

    def create_namespaced_lease(self, namespace, body, **_):
        self.created += 1


def test_lease_attempts_do_not_wait_for_a_busy_default_executor():
    coord = NoLease()
    elector = LeaseElector(client.ApiClient(), "ns", "op", identity="me")
    elector.coord = coord  # type: ignore[assignment]
    release = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        busy = loop.run_in_executor(None, release.wait)  # e.g. an API write hanging until its timeout
        try:
            await asyncio.wait_for(elector.acquire(), timeout=5)
        finally:
            release.set()
            await busy

    asyncio.run(main())
    assert coord.created == 1
