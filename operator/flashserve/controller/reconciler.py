"""One reconcile of one serving: validate, plan, write what differs, report status and events.

Writes happen only when the plan or the status differs from what is observed, so a serving in steady state
costs no API requests at all (children are observed through watches).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.clock import iso_ago, now_iso
from flashserve.controller.api_server import ApiServerAddresses, read_slice
from flashserve.controller.router_workers import (
    Repair,
    RouterUnreachable,
    RouterWorkersClient,
    Sync,
    TIMEOUT_S as ROUTER_CALL_TIMEOUT_S,
    desired_workers,
    discovery_repair,
    out_of_routing,
    router_targets,
    still_routed,
)
from flashserve.api.validation import SpecError, parse_spec
from flashserve.controller.drain import DRAIN_SETTLE_S, RENAME, SCALE_DOWN, drain_targets, engine_address
from flashserve.controller.engine_metrics import EngineMetrics
from flashserve.controller.kube import Kube
from flashserve.controller.observe import (
    Observed,
    controller_uid,
    owned,
    pods_missing,
    statefulset_of,
)
from flashserve.controller.plan import Plan, plan
from flashserve.controller.startup_phases import StartupTracker
from flashserve.controller.router_status import (
    grace_left,
    router_status,
    router_status_fields,
    unavailable_since,
    with_router,
)
from flashserve.controller.autoscale import CONDITIONS as AUTOSCALER_CONDITIONS
from flashserve.controller.autoscale import STATUS_FIELDS as AUTOSCALER_STATUS_FIELDS
from flashserve.controller.status import (
    Cond,
    group_conditions,
    group_counts,
    invalid_spec_conditions,
    join_capped,
    merge_conditions,
    previous_conditions,
    surge_unschedulable_condition,
    transitions,
)
from flashserve.render.cache import CACHE
from flashserve.render.naming import (
    GROUP_LABEL,
    MANAGED_BY,
    ROUTING_DRAIN,
    ROUTING_SERVE,
    SERVING_LABEL,
    router_name,
    serving_label_value,
)
from flashserve.render.renderer import OPERATOR_NAMESPACE, ApiServer, endpoint, router_ranks, selector_string

API_MESSAGE_MAX = 1024  # of an API server's answer quoted in status

# Watch events for our own writes arrive after a moment (seconds on a busy API server). Within this window an
# identical write is not repeated just because the mirror of the cluster has not caught up; a real outside
# change is still restored once the window has passed (well within one resync).
RECENT_WRITE_S = 10.0

# A StatefulSet makes its pods within a second or two (podManagementPolicy Parallel). One that has had fewer
# pods than it asks for since PODS_GRACE_S is looked into: the StatefulSet controller records why the API
# server refused a pod (Pod Security admission, a ResourceQuota, a LimitRange, a webhook) only as an Event on
# the StatefulSet, so that Event is read then, and only then (never in steady state), at most once per
# PODS_GRACE_S while the shortage lasts, or every REFUSAL_RECHECK_S while it has no such Event.
PODS_GRACE_S = 5.0
REFUSAL_RECHECK_S = 10.0
# Events live about an hour, so a FailedCreate of an earlier shortage can still be listed during a later one
# with another cause. Only Events seen since the shortage began count, less the longest a controller's retry
# backoff waits (client-go's default rate limiter: 1000 s): a refusal that goes on is recorded again within
# it, also when the operator (re)started in the middle of a shortage.
EVENT_BACKOFF_MAX_S = 1000.0


# Planning renders templates: seconds of CPU for a serving at the group ceiling when its spec changes. It runs
# on threads of its own, never on the event loop (which renews the Lease and answers the liveness probe) and
# never in the default executor (which the API writes use), so a large render delays neither. Two threads: a
# large serving's render leaves the other one to the many small plans that a resync brings.
PLAN_THREADS = 2
_planner = concurrent.futures.ThreadPoolExecutor(max_workers=PLAN_THREADS, thread_name_prefix="flashserve-plan")

# While a group drains, nothing the watches show tells when its last request ends: the serving is reconciled
# (and its draining engines asked) every DRAIN_POLL_S instead of at the next resync.
DRAIN_POLL_S = 2.0
# Draining engines are asked on threads of their own, a bounded number at once, and a reconcile waits for the
# answers at most PROBE_WAIT_S: an engine that has not answered by then counts as not known to be idle (its
# drain then ends by idleness at a later poll, or by rollout.drainSeconds).
PROBE_THREADS = 16
PROBE_WAIT_S = 3.0
# Each router pod's sync is a listing and a few small writes (router_workers.TIMEOUT_S each); a pod slower
# than this is left to the next reconcile, and the sync itself stops writing once this has passed (2,048
# workers take 1.3 s from empty: docs/routing.md). The syncs run on a pool of their own, so routers that
# answer slowly never hold up the drain probes of any serving.
ROUTER_SYNC_WAIT_S = 10.0
ROUTER_SYNC_THREADS = 8
# A router container that started moments ago may not listen yet: its failures are not reported (drains still
# wait for it) until it has had this long, which covers vllm-router's start on the local cluster (~1.5 s) many
# times over.
ROUTER_START_GRACE_S = 30.0
_probes = concurrent.futures.ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="flashserve-probe")
_router_syncs = concurrent.futures.ThreadPoolExecutor(max_workers=ROUTER_SYNC_THREADS,
                                                      thread_name_prefix="flashserve-router-sync")  # fmt: skip

log = logging.getLogger(__name__)


@dataclass
class RouterPodCalls:
    """The operator's calls to one router pod's worker routes."""

    call: concurrent.futures.Future | None = None  # the last one made, running or done
    behind: bool = False  # it failed, or the router still listed a pod out of routing
    warned: bool = False  # this streak of being behind has been reported


def _planned(obj: DeepSeekServing, mine: Observed, operator_namespace: str = OPERATOR_NAMESPACE,
             api_server: ApiServer = ()) -> tuple[Plan, list[str]]:  # fmt: skip
    """The plan and the digest of each object it applies (hashing thousands of objects is work too)."""
    p = plan(obj, mine, operator_namespace=operator_namespace, api_server=api_server)
    return p, [_digest(o) for o in p.apply]


def _digest(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@dataclass
class Outcome:
    """What executing a plan came to: writes made, objects refused (another object owns them), writes the
    API server turned down."""

    writes: int = 0
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) not written: retry next time
    gone: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) to delete that were already gone


def _api_message(exc: Exception) -> str:
    """The API server's own message (a Status object's `message`), else the exception's class and text."""
    if isinstance(exc, ApiException):
        text = ""
        try:
            text = json.loads(exc.body or b"{}").get("message") or ""
        except (ValueError, AttributeError):
            text = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
        text = text or str(exc.reason or "")
        return f"{exc.status}: {text}"[:API_MESSAGE_MAX]
    return f"{type(exc).__name__}: {exc}"[:API_MESSAGE_MAX]


def _describe_owner(child: dict) -> str:
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return f"{ref.get('kind', '?')}/{ref.get('name', '?')} (uid {ref.get('uid', '?')})"
    return "no controller (made outside this serving)"


@dataclass
class Stats:
    reconciles: int = 0
    writes: int = 0
    status_writes: int = 0


@dataclass
class Controller:
    api: client.ApiClient
    resync_seconds: float = 30.0
    debounce_seconds: float = 0.2
    prometheus_url: str | None = None
    stats: Stats = field(default_factory=Stats)
    autoscaler: object | None = None  # flashserve.controller.autoscale.Autoscaler, when enabled
    operator_namespace: str = OPERATOR_NAMESPACE  # where the operator runs: its pods may reach the engines
    engines: object | None = None  # reads an engine's requests in flight: requests_in_flight(host, port)
    engine_networks: tuple = ()  # pod IPs the operator may ask (drain.parse_networks); empty: any pod IP
    # Where the router pods may reach the API server (api_server.py), refreshed by main.py off the reconcile path.
    api_server: ApiServerAddresses = field(init=False)

    def __post_init__(self) -> None:
        self.kube = Kube(self.api)
        self.router_workers = RouterWorkersClient()
        self._router_pods: dict[tuple[str, str, str], RouterPodCalls] = {}  # (namespace, serving, router pod)
        self._routers_synced: dict[tuple[str, str], float] = {}  # serving -> Observed.routers_synced_at
        self.api_server = ApiServerAddresses(lambda: read_slice(self.kube), os.environ)
        if self.engines is None:
            self.engines = EngineMetrics()
        self._draining: set[tuple[str, str]] = set()  # servings with a drain in progress
        # The drains in progress per serving as the last reconcile saw them, for the in-flight gauge (metrics.py)
        self.drains: dict[tuple[str, str], list] = {}
        self._recent: dict[tuple[str, str, str], tuple[str, float]] = {}  # (kind, ns, name) -> (what, when)
        self._status: dict[tuple[str, str], dict] = {}  # the status this operator last wrote, per serving
        self._uncreated: dict[tuple[str, str], set[str]] = {}  # "Kind/name" the API server refused to create
        self._short: dict[tuple[str, str], dict[str, float]] = {}  # StatefulSet -> since when it lacks pods
        # StatefulSet -> (the FailedCreate message, or None when it had none; when that was read)
        self._refusals: dict[tuple[str, str], dict[str, tuple[str | None, float]]] = {}
        self.startups = StartupTracker()  # each group's start-up, recorded once (status, metric, StartupSlow)

    def forget(self, namespace: str, name: str) -> None:
        """A serving is gone: a new one of the same name starts from its own (empty) status."""
        self._status.pop((namespace, name), None)
        self._uncreated.pop((namespace, name), None)
        self._short.pop((namespace, name), None)
        self._refusals.pop((namespace, name), None)
        self._draining.discard((namespace, name))
        self.startups.forget(namespace, name)
        self.drains.pop((namespace, name), None)
        self._routers_synced.pop((namespace, name), None)
        self._router_pods = {k: v for k, v in self._router_pods.items() if k[:2] != (namespace, name)}
        CACHE.forget(namespace, name)

    def _first(self, key: tuple[str, str, str], what: str, now: float) -> bool:
        """False for a write identical to one made in the last RECENT_WRITE_S; otherwise record it."""
        prev = self._recent.get(key)
        if prev is not None and prev[0] == what and now - prev[1] < RECENT_WRITE_S:
            return False
        self._recent[key] = (what, now)
        return True

    def deleted(self, kind: str, namespace: str, name: str) -> None:
        """The watch showed this object deleted: a later absence is a deletion, not a watch that has not yet
        shown the operator's own write, so the next plan's write of it is not skipped as a repeat."""
        self._recent.pop((kind, namespace, name), None)

    def _retry(self, namespace: str, skipped: set[tuple[str, str]]) -> None:
        """Writes that did not happen are not "recent": the next reconcile tries them (and reports) again."""
        for kind, name in skipped:
            self._recent.pop((kind, namespace, name), None)

    def _routing_writes(self, namespace: str, mine: Observed) -> tuple[frozenset[str], frozenset[str]]:
        """(leaving, returning): pods of the serving whose routing label the operator set to drain or to serve in
        the last RECENT_WRITE_S and that the view does not show so yet. The pod watch can lag the operator's own
        writes by seconds; the routers follow the write, not the lagging view, so a drained pod is never put
        back into a router and a confirmation is never taken from a view without it."""
        now = time.monotonic()
        leaving, returning = set(), set()
        for pod in mine.pods:
            rec = self._recent.get(("Pod", namespace, pod.name))
            if rec is None or now - rec[1] >= RECENT_WRITE_S:
                continue
            if rec[0] == ROUTING_DRAIN and pod.routing != ROUTING_DRAIN:
                leaving.add(pod.name)
            elif rec[0] == ROUTING_SERVE and pod.routing != ROUTING_SERVE:
                returning.add(pod.name)
        return frozenset(leaving), frozenset(returning)

    def _skip_repeats(self, namespace: str, p: Plan, digests: list[str] | None = None,
                      mine: Observed | None = None) -> None:
        """Drop writes identical to ones made moments ago (the watch has not shown them yet)."""
        now = time.monotonic()
        digests = digests if digests is not None else [_digest(o) for o in p.apply]
        p.apply = [o for o, d in zip(p.apply, digests, strict=True)
                   if self._first((o["kind"], namespace, o["metadata"]["name"]), d, now)]  # fmt: skip
        applied_groups = {o["metadata"]["labels"].get(GROUP_LABEL) for o in p.apply if o["kind"] == "StatefulSet"}
        p.created_groups = [g for g in p.created_groups if str(g) in applied_groups]
        p.rolling = [g for g in p.rolling if str(g) in applied_groups]
        applied = {f"{o['kind']}/{o['metadata']['name']}" for o in p.apply}
        p.restored = [r for r in p.restored if r in applied]
        p.delete_pods = [n for n in p.delete_pods if self._first(("Pod", namespace, n), "delete", now)]
        p.delete = [(k, n) for k, n in p.delete if self._first((k, namespace, n), "delete", now)]
        if mine is not None:
            # A group whose StatefulSet was deleted moments ago, still in a watch that lags, is not deleted (nor
            # announced) again.
            going = {((mine.statefulsets.get(n) or {}).get("metadata") or {}).get("labels", {}).get(GROUP_LABEL)
                     for k, n in p.delete if k == "StatefulSet"}  # fmt: skip
            p.deleted_groups = [g for g in p.deleted_groups if str(g) in going]
        p.delete_first = [(k, n) for k, n in p.delete_first if self._first((k, namespace, n), "delete", now)]
        p.migrating = [g for g in p.migrating if str(g) in applied_groups]
        p.drain_pods = [d for d in p.drain_pods if self._first(("Pod", namespace, d[0]), ROUTING_DRAIN, now)]
        p.undrain_pods = [d for d in p.undrain_pods if self._first(("Pod", namespace, d[0]), ROUTING_SERVE, now)]
        if len(self._recent) > 10000:  # forget old entries so memory stays flat
            self._recent = {k: v for k, v in self._recent.items() if now - v[1] < RECENT_WRITE_S}

    def next_evaluation_in(self, body: dict) -> float:
        base = self.resync_seconds if self.autoscaler is None else self.autoscaler.next_evaluation_in(body)
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        check = self._next_refusal_check(key)
        last = self._status.get(key) or body.get("status") or {}
        left = grace_left(last.get("router"), time.time())
        if left is not None and left > 0:  # look again when the grace ends, to report the router down on time
            check = left + 0.1 if check is None else min(check, left + 0.1)
        if key in self._draining:
            check = DRAIN_POLL_S if check is None else min(check, DRAIN_POLL_S)
        return base if check is None else min(base, check)

    async def _probe(self, mine: Observed, port: int) -> dict[str, int | None]:
        """Requests in flight of each draining engine of the serving, asked concurrently off the event loop."""
        targets = drain_targets(mine, self.engine_networks)
        if not targets:
            return {}
        loop = asyncio.get_running_loop()
        futures = {p.name: loop.run_in_executor(_probes, self.engines.requests_in_flight, engine_address(p.ip), port)
                   for p in targets}  # fmt: skip
        done, pending = await asyncio.wait(futures.values(), timeout=PROBE_WAIT_S)
        for f in pending:
            f.cancel()
        out: dict[str, int | None] = {}
        for pod, f in futures.items():
            value = None
            if f in done and not f.cancelled() and f.exception() is None:
                value = f.result()
            out[pod] = value if isinstance(value, int) and value >= 0 else None
        return out

    async def _sync_router_workers(self, body: dict, namespace: str, name: str, spec, mine: Observed,
                                   p: Plan | None) -> None:  # fmt: skip
        """Confirm, router pod by router pod and off the event loop, that the routers route to the engines that
        take traffic only (router_workers.py). Where the operator keeps the workers it makes each pod's list the
        engines that take traffic, with the pods plan `p` takes out of routing or puts back (so it runs after
        the plan); under a discovery policy it reads each pod's list before the plan (`p` None), so that a
        drain may end in the reconcile that confirms it, and repairs what the pods' watch never undoes
        (router_workers.discovery_repair). A router that does not answer (or still lists a pod out of routing
        past the settle time) is asked again at the next reconcile;
        the first failure of a streak is logged and goes out as a Warning event. Once every router pod has
        confirmed, drains may count the group as gone from the routers (drain.routers_behind)."""
        key0 = (namespace, name)
        registers = p is not None
        out: dict[str, float] = {}
        # Seconds each router pod's container has run (None: its start is not in the status yet).
        ran = {r.name: None if r.started_at is None else mine.now - r.started_at for r in mine.router_pods}
        # Label writes the view does not show yet: earlier reconciles', and with a plan (`p`) this one's too, which
        # _skip_repeats has recorded; under a discovery policy this runs before the plan, on earlier writes only.
        leaving, returning = self._routing_writes(namespace, mine)
        if p is not None:
            desired = desired_workers(mine, spec.engine.port, router_ranks(spec), spec.model.served_model_names[0],
                                      self.engine_networks, leaving=leaving, returning=returning)  # fmt: skip

            def job(base: str, pod: str) -> Sync:
                return self.router_workers.sync(base, desired, spec.routing.policy, ROUTER_SYNC_WAIT_S)
        else:
            out = out_of_routing(mine, spec.engine.port, self.engine_networks)
            port, now, networks = spec.engine.port, mine.now, self.engine_networks
            # A router pod that has just started is still listing the pods through its watch: read, not repaired.
            young = {pod for pod, age in ran.items() if age is None or age < ROUTER_START_GRACE_S}

            def job(base: str, pod: str) -> Repair:
                if pod in young:
                    return Repair(listed=tuple(self.router_workers.workers(base)))
                # Calls end before the reconcile stops waiting (TIMEOUT_S each), so before the plan it informs.
                return self.router_workers.repair(base, lambda urls: discovery_repair(urls, mine, port, now, networks,
                                                                                      leaving),
                                                  ROUTER_SYNC_WAIT_S - 2 * ROUTER_CALL_TIMEOUT_S)  # fmt: skip
        targets = router_targets(mine, spec.routing.port, self.engine_networks)
        # One call per router pod at a time: a thread cannot be stopped once its call hangs, and a router that
        # answers slowly must not take the pool one more thread at each reconcile. So a router pod no longer
        # asked (gone, or nothing to confirm) keeps its record, as not behind, until its last call ends.
        current = {(namespace, name, pod) for pod, _ in targets}
        for key in [k for k in self._router_pods if k[:2] == key0 and k not in current]:
            rec = self._router_pods[key]
            if rec.call is None or rec.call.done():
                del self._router_pods[key]
            else:
                rec.behind = rec.warned = False
        futures: dict[str, concurrent.futures.Future] = {}
        for pod, base in targets:
            rec = self._router_pods.setdefault((namespace, name, pod), RouterPodCalls())
            if rec.call is None or rec.call.done():
                futures[pod] = rec.call = _router_syncs.submit(job, base, pod)
        done: set = set()
        if futures:
            waiting = [asyncio.wrap_future(f) for f in futures.values()]
            await asyncio.wait(waiting, timeout=ROUTER_SYNC_WAIT_S)
            for w in waiting:  # a late outcome is dropped (the next reconcile asks again): read, not logged as lost
                w.add_done_callback(lambda w: w.cancelled() or w.exception())
            done = {f for f in futures.values() if f.done()}
        for pod, _ in targets:
            rec = self._router_pods[(namespace, name, pod)]
            f = futures.get(pod)
            settling = False  # behind, but not for long enough to report
            refused = False  # nothing listens on its port: it routes nothing, so it holds no drain
            if f is None:
                error = "its previous call has not finished"
            elif f not in done:
                error = f"no answer in {ROUTER_SYNC_WAIT_S:g}s"
            elif (exc := f.exception()) is not None:
                error = str(exc)
                refused = isinstance(exc, RouterUnreachable) and exc.refused
            elif registers:
                error = None
                steps = f.result()
                if steps.add or steps.remove:
                    log.info("%s/%s: router pod %s: registered %s, removed %s", namespace, name, pod,
                             [w.url for w in steps.add], list(steps.remove))  # fmt: skip
            else:
                repair = f.result()
                self._report_repair(body, namespace, name, pod, repair)
                stale = still_routed(list(repair.listed), out)
                error = None
                if stale:
                    age = mine.now - min(stale.values())
                    settling = age < DRAIN_SETTLE_S
                    error = (f"it still routes to {len(stale)} worker(s) of pods out of routing for {age:.0f}s "
                             "(its pod watch is behind)")
            rec.behind = error is not None and not refused
            if error is None:
                rec.warned = False
                continue
            starting = (age := ran[pod]) is not None and age < ROUTER_START_GRACE_S
            # A discovering router that refuses is down, which the router's status reports; one whose workers
            # the operator keeps will serve nothing until it can.
            quiet = starting or settling or (refused and not registers)
            if not rec.warned and not quiet:
                rec.warned = True
                what = "keep" if registers else "confirm"
                waits = ("" if refused else f"; drains of this serving wait for it, at most rollout.drainSeconds "
                                            f"({spec.rollout.drain_seconds} s)")
                message = f"cannot {what} the workers of router pod {pod}: {error}{waits}"
                log.warning("%s/%s: %s", namespace, name, message)
                kopf.event(body, type="Warning", reason="RouterWorkersUnsynced", message=message)
        # With no router pod to ask, none routes: one the operator cannot reach was never given a worker (under
        # a discovery policy it is trusted to its pod watch: docs/drain.md, "What a real cluster needs"). A
        # router found behind takes back an earlier confirmation (a drain must not end on it), and a view that
        # does not show the operator's own label writes yet confirms nothing about them.
        if any(self._router_pods[k].behind for k in current):
            self._routers_synced.pop(key0, None)
        elif registers or not (leaving or returning):
            self._routers_synced[key0] = mine.now

    @staticmethod
    def _report_repair(body: dict, namespace: str, name: str, pod: str, repair: Repair) -> None:
        """A Warning event for each repair of a discovering router pod's workers: no event of the cluster takes
        an engine out of its list or adds a foreign server, so someone used its worker routes."""
        if not (repair.add or repair.remove or repair.failed):
            return
        def some(items: tuple[str, ...], sep: str = ", ") -> str:  # the removed URLs are a client's: bounded
            return sep.join(i[:200] for i in items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")

        parts = []
        if repair.add:
            parts.append(f"added back {some(repair.add)} (engine pods in routing it did not list)")
        if repair.remove:
            parts.append(f"removed {some(repair.remove)} (no engine pod of this serving)")
        if repair.failed:
            parts.append(f"could not: {some(repair.failed, '; ')}")
        message = (f"router pod {pod}: {'; '.join(parts)}. Its worker routes take no credentials: narrow who "
                   "reaches its port (docs/routing.md, \"Who can steer the router\")")
        log.warning("%s/%s: %s", namespace, name, message)
        kopf.event(body, type="Warning", reason="RouterWorkersRepaired", message=message)

    def _next_refusal_check(self, key: tuple[str, str]) -> float | None:
        """Seconds until a StatefulSet short of pods is due to be looked into (again), if one is."""
        now = time.monotonic()
        read = self._refusals.get(key, {})
        due = []
        for sts, since in self._short.get(key, {}).items():
            if sts not in read:
                due.append(since + PODS_GRACE_S - now)
            elif read[sts][0] is None:
                due.append(read[sts][1] + REFUSAL_RECHECK_S - now)
        return max(0.0, min(due)) if due else None

    async def _pods_refused(self, namespace: str, name: str, mine: Observed) -> list[tuple[int, str, str]]:
        """(group, StatefulSet, the API server's message) for each StatefulSet that has lacked pods for longer
        than PODS_GRACE_S and whose latest FailedCreate Event says why. Reads Events only for those."""
        key, now = (namespace, name), time.monotonic()
        missing = pods_missing(mine)
        previous = self._short.get(key, {})
        since = {sts: previous.get(sts, now) for sts in missing}
        read = {sts: r for sts, r in self._refusals.get(key, {}).items() if sts in missing}
        if since:
            self._short[key] = since
        else:
            self._short.pop(key, None)
        out = []
        for sts, t in sorted(since.items()):
            if now - t < PODS_GRACE_S:
                continue
            last = read.get(sts)
            if last is None or now - last[1] >= (REFUSAL_RECHECK_S if last[0] is None else PODS_GRACE_S):
                uid = (mine.statefulsets[sts].get("metadata") or {}).get("uid")
                not_before = iso_ago(now - t + EVENT_BACKOFF_MAX_S)
                try:
                    message = await asyncio.to_thread(self.kube.failed_create_message, namespace, sts, uid,
                                                      not_before)  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - not knowing why is no reason to fail the reconcile
                    log.warning("%s/%s: reading the events of StatefulSet/%s failed: %s", namespace, name, sts,
                                _api_message(exc))  # fmt: skip
                    message = last[0] if last else None
                read[sts] = last = (message, now)
            if last[0]:
                labels = (mine.statefulsets[sts].get("metadata") or {}).get("labels") or {}
                try:
                    group = int(labels.get(GROUP_LABEL, "-1"))
                except ValueError:
                    group = -1
                out.append((group, sts, last[0][:API_MESSAGE_MAX]))
        if read:
            self._refusals[key] = read
        else:
            self._refusals.pop(key, None)
        return out

    async def reconcile(self, body: dict, observed: Observed, logger: logging.Logger) -> None:
        self.stats.reconciles += 1
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        # This operator is the only writer of its conditions: what it last wrote is newer than a body whose
        # watch event has not arrived yet, so conditions keep their transition times and an unchanged status
        # is not rewritten. Other tools' conditions are taken from the body.
        status = self._status.get((namespace, name)) or body.get("status") or {}
        previous = previous_conditions(status.get("conditions"), (body.get("status") or {}).get("conditions"))
        generation = meta.get("generation")
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError as exc:
            new_status = {"observedGeneration": generation}
            conds = merge_conditions(previous, invalid_spec_conditions([str(e) for e in exc.errors]), now_iso(),
                                     generation)  # fmt: skip
            await self._write_status(body, status, {**new_status, "conditions": conds}, logger)
            return
        obj = DeepSeekServing(metadata=dict(meta), spec=spec)

        # Decide over this serving's own children only; `observed` (everything carrying its labels) is kept
        # to check, before each write, that no other object owns the name.
        mine = owned(observed, meta.get("uid"), serving_label_value(name))
        extra_conds: list[Cond] = []
        if self.autoscaler is not None and spec.autoscaling.enabled:
            extra_conds, scaled = await self.autoscaler.evaluate(body, obj, mine, self.kube, logger)
            if scaled is not None:
                obj.spec.replicas = scaled  # act on the new count now; the watch brings the same value back
        elif self.autoscaler is not None:
            await self.autoscaler.paused(body, self.kube)

        mine.now = time.time()
        probe = self._probe(mine, spec.engine.port)
        if spec.routing.enabled and not spec.routing.registers_workers():
            # both only read, and a slow engine must not hold up the routers' confirmation (or the reverse)
            mine.in_flight, _ = await asyncio.gather(probe, self._sync_router_workers(body, namespace, name, spec,
                                                                                       mine, None))  # fmt: skip
        else:
            mine.in_flight = await probe
        mine.routers_synced_at = self._routers_synced.get((namespace, name))
        loop = asyncio.get_running_loop()
        p, digests = await loop.run_in_executor(_planner, _planned, obj, mine, self.operator_namespace,
                                                self.api_server.value)  # fmt: skip
        if p.draining:
            self._draining.add((namespace, name))
            self.drains[(namespace, name)] = list(p.draining)
        else:
            self._draining.discard((namespace, name))
            self.drains.pop((namespace, name), None)
        self._skip_repeats(namespace, p, digests, mine)
        if not p.writes:  # nothing left to do (or only what was done moments ago): nothing happened now
            _drop_unmade_drains(p, set(), mine)
        outcome = Outcome()
        if p.writes:
            log.info("%s/%s: apply %s; patch %s; delete %s; delete pods %s", namespace, name,
                     [f"{o['kind']}/{o['metadata']['name']}" for o in p.apply], p.patch_replicas,
                     p.delete_first + p.delete, p.delete_pods)  # fmt: skip
            outcome = await asyncio.to_thread(self._execute, namespace, meta.get("uid"), name, p, observed)
            self._retry(namespace, outcome.skipped)
            # A StatefulSet whose creation was refused is missing beside its headless Service at the next
            # reconcile, which the plan takes for one deleted by hand: made then, it is created, not restored.
            retried = self._uncreated.pop((namespace, name), set())
            unmade = {f"{k}/{n}" for k, n in outcome.skipped}
            if new := {r for r in unmade if r not in p.restored or r in retried}:
                self._uncreated[(namespace, name)] = new
            _count_as_created(p, retried - unmade)
            _drop_unwritten(p, outcome.skipped, mine, outcome.gone)
            self.stats.writes += outcome.writes
            self._report(body, p, logger, spec.rollout.drain_seconds)

        if spec.routing.registers_workers():
            await self._sync_router_workers(body, namespace, name, spec, mine, p)

        counts = group_counts(p.groups)
        extra_groups = len(p.deleted_groups) + sum(d.reason == SCALE_DOWN for d in p.draining)
        refused = await self._pods_refused(namespace, name, mine)
        conds = group_conditions(p.groups, spec.replicas, extra_groups, refused)
        router = mine.deployments.get(router_name(name))
        wall = time.time()
        since = unavailable_since(status.get("router"), spec.routing.enabled and counts["readyReplicas"] > 0
                                  and router_status(router)["availableReplicas"] == 0, wall)  # fmt: skip
        if spec.routing.enabled:
            conds = with_router(conds, router, counts["readyReplicas"], 0.0 if since is None else wall - since)
        conds += extra_conds
        if p.surge_unschedulable and not any(c.type == "Degraded" and c.status == "True" for c in conds):
            conds = [c for c in conds if c.type != "Degraded"] + [surge_unschedulable_condition(p.surge)]
        if outcome.failed or outcome.refused:
            conds = [c for c in conds if c.type != "Degraded"] + [_write_problems(outcome)]
        new_status = {
            "observedGeneration": generation,
            **counts,
            "desiredReplicas": spec.replicas,
            "selector": selector_string(name),
            "endpoint": endpoint(name, namespace, spec),
            "conditions": merge_conditions(previous, conds, now_iso(), generation,
                                           frozenset() if spec.autoscaling.enabled else AUTOSCALER_CONDITIONS),
        }
        # Written while groups drain, and cleared once (only then: a steady serving's status does not change).
        if p.draining or status.get("drainingGroups"):
            new_status["drainingGroups"] = [d.status() for d in p.draining] or None
        if spec.routing.enabled or status.get("router"):
            new_status["router"] = router_status_fields(router, since, status.get("router")) if spec.routing.enabled else None
        if p.drained:
            new_status["lastDrains"] = [d.ended() for d in p.drained]
        if self.autoscaler is not None and spec.autoscaling.enabled:
            new_status.update(self.autoscaler.status_fields(body))
        else:  # what the autoscaler last said no longer holds: cleared once, then absent
            new_status.update({k: None for k in AUTOSCALER_STATUS_FIELDS if status.get(k) is not None})
        # Written when a start-up completes, only then.
        started = self.startups.step(namespace, name, spec, mine, status.get("startup"), time.time())
        if started.status is not None:
            new_status["startup"] = started.status
        await self._write_status(body, status, new_status, logger)
        self.startups.commit(namespace, name, started,
                             {u for s in mine.statefulsets.values() if (u := (s.get("metadata") or {}).get("uid"))})
        for slow in started.slow:
            kopf.event(body, type="Warning", reason="StartupSlow", message=slow.message())
            # the module logger: a warning on kopf's per-object logger would be posted as a second Event
            log.warning("%s/%s: StartupSlow: %s", namespace, name, slow.message())

    def _owner_conflict(self, namespace: str, uid: str | None, label: str, obj: dict, observed: Observed) -> str | None:
        """Why `obj` must not be written (an object of its name belongs to someone else), else None."""
        if not uid:
            return None
        kind, name = obj["kind"], obj["metadata"]["name"]
        live = observed.by_kind().get(kind, {}).get(name)
        if live is None:
            live = self.kube.get(namespace, kind, name)  # not among ours: is the name taken by another object?
        if live is None:
            return None
        owner = controller_uid(live)
        if owner == uid:
            return None
        labels = (live.get("metadata") or {}).get("labels") or {}
        if owner is None and labels.get(SERVING_LABEL) == label and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY:
            return None  # an orphan of this serving (e.g. deleted with --cascade=orphan, then re-created): adopt it
        return f"{kind}/{name} belongs to {_describe_owner(live)}"

    def _execute(self, namespace: str, uid: str | None, serving: str, p: Plan, observed: Observed) -> Outcome:
        """Make the plan's writes. An object another owns is not written; a write the API server refuses is
        recorded; either way the rest goes on, except what depends on it (a group's pods are not replaced
        when its StatefulSet was not written)."""
        out = Outcome()
        label = serving_label_value(serving)
        blocked: set[str] = set()  # StatefulSets not written

        def attempt(kind: str, name: str, call) -> bool:
            try:
                call()
                out.writes += 1
                return True
            except Exception as exc:  # noqa: BLE001 - reported in status, retried at the next reconcile
                out.failed.append(f"{kind}/{name}: {_api_message(exc)}")
                out.skipped.add((kind, name))
                log.warning("%s/%s: writing %s/%s failed: %s", namespace, serving, kind, name, _api_message(exc))
                return False

        for kind, name in p.delete_first:
            attempt(kind, name, lambda k=kind, n=name: self._delete_unobserved(namespace, uid, k, n))
        for obj in p.apply:
            kind, name = obj["kind"], obj["metadata"]["name"]
            try:
                conflict = self._owner_conflict(namespace, uid, label, obj, observed)
            except Exception as exc:  # noqa: BLE001 - the check could not be made: do not write blind
                out.failed.append(f"{kind}/{name}: {_api_message(exc)}")
                conflict, written = None, False
            else:
                if conflict:
                    out.refused.append(conflict)
                written = not conflict and attempt(kind, name, lambda o=obj: self.kube.apply(o))
            if not written:
                out.skipped.add((kind, name))
                if kind == "StatefulSet":
                    blocked.add(name)
        for sts, replicas in p.patch_replicas:
            attempt("StatefulSet", sts, lambda s=sts, r=replicas: self.kube.patch_replicas(namespace, s, r))
        # Out of routing before anything is deleted; back into routing as soon as a drain is called off.
        for pod, pod_uid, since in p.drain_pods:
            attempt("Pod", pod, lambda n=pod, u=pod_uid, t=since:
                    self.kube.patch_pod_routing(namespace, n, u, ROUTING_DRAIN, t))  # fmt: skip
        for pod, pod_uid in p.undrain_pods:
            attempt("Pod", pod, lambda n=pod, u=pod_uid:
                    self.kube.patch_pod_routing(namespace, n, u, ROUTING_SERVE, None))  # fmt: skip
        for pod in p.delete_pods:
            if statefulset_of(pod) in blocked:
                out.skipped.add(("Pod", pod))
                continue
            attempt("Pod", pod, lambda n=pod: self.kube.delete(namespace, "Pod", n))
        for kind, name in p.delete:
            if kind == "ComputeDomain":  # not watched: check it is ours first
                attempt(kind, name, lambda k=kind, n=name: self._delete_unobserved(namespace, uid, k, n))
            else:
                def delete(k=kind, n=name) -> None:
                    if not self.kube.delete(namespace, k, n):
                        out.gone.add((k, n))  # deleted earlier, and the watch has not shown it yet

                attempt(kind, name, delete)
        return out

    def _delete_unobserved(self, namespace: str, uid: str | None, kind: str, name: str) -> None:
        """Delete an object the controller does not watch, only if this serving controls it."""
        if not uid:
            self.kube.delete(namespace, kind, name)
            return
        live = self.kube.get(namespace, kind, name)
        if live is None or controller_uid(live) != uid:
            return  # gone, or another's: not ours to delete
        self.kube.delete(namespace, kind, name, uid=(live.get("metadata") or {}).get("uid"))

    def _report(self, body: dict, p: Plan, logger: logging.Logger, drain_seconds: int) -> None:
        if p.migrating:
            kopf.event(body, type="Normal", reason="GroupsRenaming",
                       message=f"creating replica groups {p.migrating} under their current names beside the old "
                       "ones, which serve until the new ones are ready")  # fmt: skip
        if p.migrated:
            kopf.event(body, type="Normal", reason="GroupsRenamed",
                       message=f"replica groups {p.migrated} serve under their current names: old copies deleted")  # fmt: skip
        created = [g for g in p.created_groups if g != p.surge]
        if p.surge is not None and p.surge in p.created_groups:
            kopf.event(body, type="Normal", reason="SurgeCreated",
                       message=f"created surge group {p.surge} on the new template: group 0 serves until it is "
                       "ready, then is drained and replaced")  # fmt: skip
        if created:
            kopf.event(body, type="Normal", reason="GroupsCreated", message=f"created replica groups {created}")
        for g in p.drain_started:
            d = next((d for d in p.draining + p.drained if d.group == g), None)
            why = {SCALE_DOWN: "beyond the desired count", RENAME: "an old-named copy: the copy under its current "
                   "name serves"}.get(d.reason if d is not None else "", "its pods are replaced next")  # fmt: skip
            kopf.event(body, type="Normal", reason="DrainStarted",
                       message=f"group {g} taken out of routing ({why}): it goes once its engines are idle, at "
                       f"most {drain_seconds} s after it started")  # fmt: skip
        for d in p.drained:
            left = "" if d.in_flight in (0, None) else f", {d.in_flight} requests still in flight"
            if d.routers_behind:
                left += ", a router pod not yet told that it left routing"
            kopf.event(body, type="Normal" if d.ended_by == "Idle" else "Warning", reason="Drained",
                       message=f"group {d.group} drained ({d.ended_by.lower()}) after "
                       f"{max(0.0, d.ended_at - d.since):.0f} s{left}")  # fmt: skip
        if p.drain_cancelled:
            kopf.event(body, type="Normal", reason="DrainCancelled",
                       message=f"groups {p.drain_cancelled} put back into routing: they no longer have to go")  # fmt: skip
        if p.deleted_groups:
            kopf.event(body, type="Normal", reason="GroupsDeleted", message=f"deleted replica groups {p.deleted_groups}")
        for g in p.rolling:
            kopf.event(body, type="Normal", reason="GroupUpdating",
                       message=f"replacing all pods of group {g} with the new template")  # fmt: skip
        if p.restored:
            msg = "restored to the operator's intent after an outside change: " + ", ".join(sorted(set(p.restored)))
            kopf.event(body, type="Warning", reason="DriftCorrected", message=msg)
            log.warning("%s/%s: DriftCorrected: %s", body["metadata"]["namespace"], body["metadata"]["name"], msg)

    async def _write_status(self, body: dict, old: dict, new: dict, logger: logging.Logger) -> None:
        merged = {**old, **{k: v for k, v in new.items()}}
        if merged == old:
            return
        meta = body["metadata"]
        changed = sorted(k for k in new if old.get(k) != new[k])
        log.info("%s/%s: status %s", meta["namespace"], meta["name"], changed)
        try:
            await asyncio.to_thread(self.kube.patch_status, meta["namespace"], meta["name"], new)
        except ApiException as exc:
            if exc.status == 404:
                raise ServingGone(meta["namespace"], meta["name"]) from None
            raise
        self._status[(meta["namespace"], meta["name"])] = merged
        self.stats.status_writes += 1
        for kind, reason, message in transitions(old.get("conditions"), new.get("conditions", [])):
            kopf.event(body, type=kind, reason=reason, message=message)
            if kind == "Warning":
                log.warning("%s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)


class ServingGone(Exception):
    """The serving's status could not be written because the serving is no longer there. kopf reports no
    deletion that happened while its watch was down (after a 410 it lists again, and an object gone from the
    list gets no DELETED event), so without this the worker would go on making children for an owner that does
    not exist, which the garbage collector removes and the worker makes again."""


def _write_problems(outcome: Outcome) -> Cond:
    if outcome.failed:
        parts = [f"the API server refused {f}" for f in outcome.failed] + [f"not written: {r}" for r in outcome.refused]
        return Cond("Degraded", "True", "ApplyFailed", join_capped(parts))
    parts = [f"not written: {r}; rename this serving or remove that object" for r in outcome.refused]
    return Cond("Degraded", "True", "OwnershipConflict", join_capped(parts))


def _count_as_created(p: Plan, made: set[str]) -> None:
    for o in p.apply:
        ref = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "StatefulSet" and ref in made and ref in p.restored:
            p.restored.remove(ref)
            p.created_groups = sorted({*p.created_groups, int(o["metadata"]["labels"][GROUP_LABEL])})


def _drop_unwritten(p: Plan, skipped: set[tuple[str, str]], mine: Observed,
                    gone: set[tuple[str, str]] = frozenset()) -> None:  # fmt: skip
    """Events tell of what was done: groups whose StatefulSet was not written (or not deleted) are not announced."""
    groups = {o["metadata"]["labels"].get(GROUP_LABEL) for o in p.apply
              if o["kind"] == "StatefulSet" and ("StatefulSet", o["metadata"]["name"]) in skipped}  # fmt: skip
    p.created_groups = [g for g in p.created_groups if str(g) not in groups]
    p.rolling = [g for g in p.rolling if str(g) not in groups]
    p.migrating = [g for g in p.migrating if str(g) not in groups]
    p.restored = [r for r in p.restored if tuple(r.split("/", 1)) not in skipped]
    # A group is deleted (or its old-named copy is) only when every StatefulSet of it that the plan deletes went.
    kept = {((mine.statefulsets.get(n) or {}).get("metadata") or {}).get("labels", {}).get(GROUP_LABEL)
            for kind, n in p.delete if kind == "StatefulSet" and (kind, n) in skipped}  # fmt: skip
    # Already gone (a watch that lags past the repeat window): deleted and announced when it went.
    earlier = {((mine.statefulsets.get(n) or {}).get("metadata") or {}).get("labels", {}).get(GROUP_LABEL)
               for kind, n in p.delete if kind == "StatefulSet" and (kind, n) in gone}  # fmt: skip
    p.deleted_groups = [g for g in p.deleted_groups if str(g) not in earlier]
    p.deleted_groups = [g for g in p.deleted_groups if str(g) not in kept]
    p.migrated = [g for g in p.migrated if str(g) not in kept]
    _drop_unmade_drains(p, skipped, mine)


def _drop_unmade_drains(p: Plan, skipped: set[tuple[str, str]], mine: Observed) -> None:
    """Drain events tell of what was done: a drain started or called off when a pod's label was written, ended
    when its group went (its StatefulSet deleted, or its pods deleted for replacement)."""
    group_of = {v.name: v.group for v in mine.pods}
    sts_group = {n: ((s.get("metadata") or {}).get("labels") or {}).get(GROUP_LABEL) for n, s in mine.statefulsets.items()}
    gone = {int(g) for kind, n in p.delete if kind == "StatefulSet" and ("StatefulSet", n) not in skipped
            for g in [sts_group.get(n)] if g is not None and g.lstrip("-").isdigit()}  # fmt: skip
    gone |= {group_of[n] for n in p.delete_pods if ("Pod", n) not in skipped and n in group_of}
    p.drained = [d for d in p.drained if d.group in gone]
    labelled = {group_of.get(n) for n, _, _ in p.drain_pods if ("Pod", n) not in skipped}
    p.drain_started = [g for g in p.drain_started if g in labelled]
    back = {group_of.get(n) for n, _ in p.undrain_pods if ("Pod", n) not in skipped}
    p.drain_cancelled = [g for g in p.drain_cancelled if g in back]
