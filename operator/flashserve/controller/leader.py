"""Leader election on a coordination.k8s.io Lease, so that of several operator replicas exactly one acts.

kopf's own peering freezes every operator when two share a priority, and lets two act for a moment while a
new higher-priority peer is noticed. A Lease gives the usual Kubernetes guarantee instead: the holder renews
it; if it cannot renew within `renew_deadline` it stops acting (the process exits and is restarted), and a
standby can take the lease only after `lease_duration` has passed since the last renewal.

Expiry is judged on this replica's own monotonic clock, never by comparing the lease's renewTime (written by
another machine's clock) with ours: a standby notes when it last saw the lease record change (holder or
renewTime) and takes the lease only once it has not changed for a whole lease duration. Clock skew between
replicas then cannot make a standby take a live lease (holder's clock behind) or wait on a dead one for hours
(holder's clock ahead). This is what client-go's leader election does.

Every Lease request has its own short timeout and the elector its own connection pool: a request stuck on a
half-open connection (a frozen proxy, a dropped NAT entry) then fails in seconds, takes its connection with
it, and the next attempt opens a fresh one well within `renew_deadline`. With one request allowed to hang for
the whole deadline, a single dead connection would cost the leadership.

Its requests also run on threads of its own rather than the event loop's default executor, which the
reconciler's API writes share: a queue of slow writes never delays a renewal.

`leading()` is what every write of the operator asks first (kube.Kube.may_write): true only while the last
renewal is younger than `renew_deadline`, so a leader that stalled, lost the lease or released it stops
writing on its own clock, well before a standby may take over (`lease_duration` after the last renewal it
saw). A renewal that finds another holder ends the leadership at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class LeaseElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str = "flashserve-operator",
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name
        self.identity = identity or f"{socket.gethostname()}_{os.getpid()}"
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        # An attempt is a read and a write: two stuck ones still leave time for a third inside the deadline.
        self.request_timeout = renew_deadline / 4
        self.clock = clock
        self._observed: tuple | None = None  # the lease record as last read
        self._observed_at = 0.0  # local monotonic time at which it last changed
        # Two: a request stuck until its timeout leaves a thread for the next attempt.
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="flashserve-lease")
        self._renewed_at: float | None = None  # local monotonic time of the last acquire or renewal; None: not leading
        self.holder_seen: str | None = None  # the holder the last read showed
        # Set once this replica steps down: no attempt still running on a thread may take the lease again. The
        # lock makes an attempt and the release one after the other.
        self._stepped_down = False
        self._lock = threading.Lock()

    def leading(self) -> bool:
        """Whether this replica may act now: it holds the lease and renewed it within renew_deadline."""
        at = self._renewed_at
        return at is not None and not self._stepped_down and self.clock() - at < self.renew_deadline

    def step_down(self) -> None:
        """Stop acting now (leading() is false from here on) and never take the lease again; release() then
        gives it up once the writes in flight have landed."""
        self._stepped_down = True
        self._renewed_at = None

    def _stamp(self, started: float) -> bool:
        # The renewal counts from when it was sent: the API server may have stamped it any time after that.
        self._renewed_at = started
        return True

    def _try_acquire_or_renew(self) -> bool:
        with self._lock:
            return False if self._stepped_down else self._acquire_or_renew()

    async def _attempt(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._try_acquire_or_renew)

    def _acquire_or_renew(self) -> bool:
        now, started = _now(), self.clock()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=int(self.lease_duration),
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                self.coord.create_namespaced_lease(self.namespace, body, _request_timeout=self.request_timeout)
                self.holder_seen = self.identity
                return self._stamp(started)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False  # another replica created it first
                raise
        spec = lease.spec
        holder = spec.holder_identity
        self.holder_seen = holder
        record = (holder, str(spec.renew_time), str(spec.acquire_time), spec.lease_transitions)
        local = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, local
        duration = spec.lease_duration_seconds or int(self.lease_duration)
        expired = local - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(self.lease_duration)
        try:
            # resourceVersion in `lease` makes this a compare-and-swap: a racing replica gets 409.
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.request_timeout)
            return self._stamp(started)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def acquire(self) -> None:
        """Wait until this replica holds the lease."""
        announced = False
        while True:
            try:
                if await self._attempt():
                    log.info("leader election: %s acquired lease %s/%s", self.identity, self.namespace, self.name)
                    return
            except Exception as exc:  # API server unreachable: keep trying, never act without the lease
                log.warning("leader election: cannot reach the lease (%s)", exc)
            if not announced:
                log.info("leader election: standing by; lease %s/%s is held by another replica", self.namespace, self.name)
                announced = True
            await asyncio.sleep(self.retry_period)

    async def hold(self) -> None:
        """Renew the lease until renewal fails for longer than renew_deadline, or another replica holds it; then
        return (leadership lost). Start it as soon as acquire() returns: the deadline counts from the acquire."""
        ok = True
        while True:
            # After a failure, try again soon (on a fresh connection) rather than a whole retry period later.
            await asyncio.sleep(self.retry_period if ok else min(self.retry_period, 0.5))
            try:
                ok = await asyncio.wait_for(self._attempt(), self.renew_deadline)
            except Exception as exc:
                log.warning("leader election: renewal failed (%s)", exc)
                ok = False
            if not ok and self.holder_seen not in (None, self.identity):
                self._renewed_at = None
                log.error("leader election: lease lost (%s holds it now)", self.holder_seen)
                return
            if not self.leading():
                since = self.clock() - self._renewed_at if self._renewed_at is not None else float("inf")
                self._renewed_at = None
                log.error("leader election: lease lost (not renewed for %.0fs)", since)
                return

    def release(self) -> None:
        """Give the lease up on a clean shutdown so a standby takes over without waiting for expiry. Call it once
        the operator's writes have drained: a write still in flight would land beside the new leader's."""
        self.step_down()
        with self._lock:
            self._release()

    def _release(self) -> None:
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.coord.replace_namespaced_lease(self.name, self.namespace, lease,
                                                    _request_timeout=self.request_timeout)  # fmt: skip
        except Exception as exc:  # best effort: expiry releases it anyway
            log.warning("leader election: release failed (%s)", exc)
