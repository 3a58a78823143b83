"""Leader election judges expiry on the standby's own clock: it takes a lease only after seeing its record
unchanged for a whole lease duration, whatever the holder's clock says."""

from __future__ import annotations

import copy
import datetime as dt

from flashserve.controller.leader import LeaseElector
from kubernetes import client

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class FakeCoordination:
    def __init__(self, lease: client.V1Lease):
        self.lease = lease
        self.replaced = 0

    def read_namespaced_lease(self, name, namespace, **_):
        return copy.deepcopy(self.lease)

    def replace_namespaced_lease(self, name, namespace, body, **_):
        self.replaced += 1
        self.lease = copy.deepcopy(body)

    def renew(self, when: dt.datetime) -> None:
        """The holder renews, stamping the time its own clock shows."""
        self.lease.spec.renew_time = when


def lease(holder: str, renewed: dt.datetime) -> client.V1Lease:
    return client.V1Lease(metadata=client.V1ObjectMeta(name="op", namespace="ns"),
                          spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15,
                                                  acquire_time=renewed, renew_time=renewed, lease_transitions=0))  # fmt: skip


def standby(coord: FakeCoordination, clock: list[float]) -> LeaseElector:
    e = LeaseElector(client.ApiClient(), "ns", "op", identity="standby", clock=lambda: clock[0])
    e.coord = coord  # type: ignore[assignment]
    return e


def test_a_live_holder_with_a_clock_far_behind_keeps_the_lease():
    coord = FakeCoordination(lease("leader", T0 - dt.timedelta(hours=1)))  # its clock is an hour slow
    clock = [100.0]
    e = standby(coord, clock)
    for step in range(20):
        clock[0] += 2.0
        coord.renew(T0 - dt.timedelta(hours=1) + dt.timedelta(seconds=2 * step))  # renewing, on its own clock
        assert e._try_acquire_or_renew() is False
    assert coord.lease.spec.holder_identity == "leader"


def test_a_dead_holder_with_a_clock_far_ahead_is_replaced_after_one_lease_duration():
    coord = FakeCoordination(lease("leader", T0 + dt.timedelta(hours=1)))  # its clock is an hour fast, then it dies
    clock = [100.0]
    e = standby(coord, clock)
    assert e._try_acquire_or_renew() is False  # first sight of the record starts the count
    clock[0] += 14.0
    assert e._try_acquire_or_renew() is False, "not before a whole lease duration without change"
    clock[0] += 2.0
    assert e._try_acquire_or_renew() is True
    assert coord.lease.spec.holder_identity == "standby" and coord.lease.spec.lease_transitions == 1


def test_a_released_lease_is_taken_at_once():
    coord = FakeCoordination(lease("", T0))
    coord.lease.spec.holder_identity = None
    assert standby(coord, [0.0])._try_acquire_or_renew() is True


def test_leading_holds_only_while_renewals_are_younger_than_the_renew_deadline():
    coord = FakeCoordination(lease("", T0))
    coord.lease.spec.holder_identity = None
    clock = [0.0]
    e = standby(coord, clock)
    assert not e.leading(), "a standby never writes"
    assert e._try_acquire_or_renew() is True and e.leading()
    clock[0] += e.renew_deadline - 0.1
    assert e.leading()
    clock[0] += 0.2
    assert not e.leading(), "a leader that could not renew stops writing on its own clock, before a standby may act"
    assert e._try_acquire_or_renew() is True and e.leading()
    e.release()
    assert not e.leading(), "released: its writes stop before the standby takes the lease"
    assert coord.lease.spec.holder_identity is None
    assert e._try_acquire_or_renew() is False, "an attempt still running after the release takes nothing back"
    assert coord.lease.spec.holder_identity is None and not e.leading()


def test_a_renewal_that_finds_another_holder_ends_the_leadership_at_once():
    import asyncio

    coord = FakeCoordination(lease("", T0))
    coord.lease.spec.holder_identity = None
    clock = [0.0]
    e = standby(coord, clock)
    e.retry_period = 0.01
    assert e._try_acquire_or_renew() is True
    # while this replica was stalled, the lease expired for the other one, which took it
    coord.lease.spec.holder_identity = "other"
    coord.renew(T0 + dt.timedelta(seconds=20))
    asyncio.run(asyncio.wait_for(e.hold(), 2.0))  # returns, long before renew_deadline on this clock
    assert not e.leading() and clock[0] == 0.0


def test_no_write_leaves_a_replica_that_does_not_lead():
    from flashserve.controller.kube import Kube, NotLeading, WriteGate

    class Api:
        calls = 0

        def param_serialize(self, **kw):
            return kw["method"], kw["resource_path"], {}, None, None

        def call_api(self, *a, **kw):
            Api.calls += 1

            class Resp:
                status, reason = 200, "OK"

                def read(self):
                    return b"{}"

            return Resp()

    leading = [False]
    kube = Kube(Api(), WriteGate(lambda: leading[0]))
    try:
        kube.patch_status("ns", "flash", {"observedGeneration": 1})
        raise AssertionError("written without the lease")
    except NotLeading as exc:
        assert "no longer leads" in str(exc)
    assert Api.calls == 0
    assert kube.get("ns", "Service", "flash") == {}, "reads go on"
    leading[0] = True
    kube.patch_status("ns", "flash", {"observedGeneration": 1})
    assert Api.calls == 2
