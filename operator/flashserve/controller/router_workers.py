"""The router's workers: kept by the operator where the policy is one vllm-router takes only through its worker
API (`routing.policy: rendezvous_hash`, facts/router.py WORKER_LABEL_POLICIES), and read back under every other
policy, whose routers discover the engine pods themselves, to confirm that a drained group has left them.

Under `rendezvous_hash` the router runs in IGW mode without pod discovery. At each reconcile of the serving the
operator lists each router pod's workers (GET /workers) and makes them the engines that take traffic: every Ready
engine pod with the routing label `serve`, one worker per data-parallel rank (`http://<pod IP>:<port>@<rank>`), with
the served model's name and the policy label (POST /workers); everything else goes (DELETE /workers/<url>): engines
taken out of routing for a drain, pods that are gone, and any worker a client of the router's port added (the worker
routes take no credentials: docs/routing.md, "Who can steer the router"). The router adds a worker without asking it
first, so only Ready engines are registered.

Under the discovery policies the router's pod watch owns its workers. At each reconcile the operator lists
each router pod's workers (GET /workers). A drain counts the group as gone from the routers only once none
lists a rank of a pod out of routing (still_routed): a router whose watch has stalled would otherwise keep
sending the idle group requests until its pods go. The operator leaves the pods out of routing to the watch
(removing one itself could race the watch re-adding a pod that returns to routing), and repairs what the watch
never undoes (discovery_repair): the worker routes take no credentials, so a client can take an engine pod out
of the router's list (POST /remove_worker), which no pod event brings back, or add a server of its own. A Ready
engine pod in routing that a router pod has not listed for REPAIR_GRACE_S is added back (POST /add_worker
with the pod's URL: the router lists its ranks again), and a listed worker that is no engine pod of the serving
is removed (POST /remove_worker with its URL, which takes all its ranks).

The addresses are pod IPs from the API server, never a field of the serving, and a router pod is asked only
when it is the serving's own (owned(): named after its Deployment) and its IP passes the same check as a
draining engine's (drain.reachable_host, --engine-networks). No proxy from the environment, no redirect.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable

from flashserve.controller.drain import IPNetwork, engine_address, out_since, reachable_host
from flashserve.controller.engine_metrics import connection_refused, direct_opener
from flashserve.controller.kube import WriteGate
from flashserve.controller.observe import Observed
from flashserve.facts import router as router_facts
from flashserve.render.naming import ROUTING_SERVE

# The router answers its worker routes from memory; a router that takes longer is starting or stuck, and the
# next reconcile (30 s at most) asks again. Short, so one router pod cannot hold its serving's reconcile.
TIMEOUT_S = 2.0
MAX_LISTING_BYTES = 16 * 1024 * 1024  # 256 groups x 8 ranks of workers is well under 1 MiB


# A Ready engine pod that a discovering router pod has not listed this long after it turned Ready was taken out
# of its list, or its watch has stalled. Watch delivery takes well under a second; the margin covers an
# observation that is a reconcile old.
REPAIR_GRACE_S = 10.0


@dataclass(frozen=True)
class Worker:
    url: str
    model: str


@dataclass(frozen=True)
class Sync:
    """What one router pod needs: workers to add, URLs to remove."""

    add: tuple[Worker, ...] = ()
    remove: tuple[str, ...] = ()


def desired_workers(observed: Observed, port: int, ranks: int, model: str, networks: tuple[IPNetwork, ...] = (),
                    leaving: frozenset[str] = frozenset(),
                    returning: frozenset[str] = frozenset()) -> set[Worker]:  # fmt: skip
    """One worker per rank of each Ready engine pod that takes traffic (ranks 1: the pod's URL alone).
    `leaving` and `returning` name pods whose routing label this reconcile turns to drain or back to serve:
    the routers follow at once, so a drain's settle time (drain.DRAIN_SETTLE_S) is not spent waiting for the
    next reconcile."""
    out = set()
    for p in observed.pods:
        serving = (p.routing == ROUTING_SERVE or p.name in returning) and p.name not in leaving
        if not serving or not p.ready or p.terminating:
            continue
        host = reachable_host(p, networks)
        if host is None:
            continue
        url = f"http://{host}:{port}"
        if ranks > 1:
            out.update(Worker(f"{url}@{r}", model) for r in range(ranks))
        else:
            out.add(Worker(url, model))
    return out


def router_targets(observed: Observed, port: int, networks: tuple[IPNetwork, ...] = ()) -> list[tuple[str, str]]:
    """(pod name, base URL) of each router pod of the serving the operator keeps: running, not terminating,
    with an address it may connect to. Ready or not: a router in IGW mode is Ready only once it has workers."""
    out = []
    for p in observed.router_pods:
        if p.terminating or p.phase != "Running":
            continue
        host = reachable_host(p, networks)
        if host is not None:
            out.append((p.name, f"http://{host}:{port}"))
    return sorted(out)


def out_of_routing(observed: Observed, port: int, networks: tuple[IPNetwork, ...] = ()) -> dict[str, float]:
    """Base URL (`http://<pod IP>:<port>`) -> since when, of each engine pod a drain has taken out of routing:
    what a router that discovers the pods must no longer list."""
    out = {}
    for p in observed.pods:
        host, since = reachable_host(p, networks), out_since(p, observed.now)
        if host is not None and since is not None:
            out[f"http://{host}:{port}"] = since
    return out


def still_routed(urls: list[str], out: dict[str, float]) -> dict[str, float]:
    """The listed worker URLs (a rank's `<base>@<rank>`, or a pod's `<base>`) of pods out of routing -> since
    when that pod has been out."""
    return {u: out[base] for u in urls if (base := u.split("@", 1)[0]) in out}


def listed_workers(body: object, policy: str) -> dict[str, Worker | None]:
    """URL -> the worker as GET /workers lists it; None where its model or policy label is not what the
    operator registers (it is then removed and added again)."""
    out: dict[str, Worker | None] = {}
    workers = body.get("workers") if isinstance(body, dict) else None
    for w in workers if isinstance(workers, list) else []:
        if not isinstance(w, dict) or not isinstance(w.get("url"), str):
            continue
        labels = w.get("metadata") if isinstance(w.get("metadata"), dict) else {}
        model = w.get("model_id")
        ok = isinstance(model, str) and labels.get(router_facts.POLICY_LABEL) == policy
        out[w["url"]] = Worker(w["url"], model) if ok else None
    return out


def sync_steps(listed: dict[str, Worker | None], desired: set[Worker]) -> Sync:
    """Remove what is listed and not desired as listed; add what is desired and not listed as desired."""
    remove = sorted(url for url, w in listed.items() if w is None or w not in desired)
    kept = {w for w in listed.values() if w is not None and w in desired}
    add = sorted(desired - kept, key=lambda w: w.url)
    return Sync(add=tuple(add), remove=tuple(remove))


@dataclass(frozen=True)
class Repair:
    """What one discovering router pod listed, and the pod URLs the operator added back and removed."""

    listed: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # the calls that failed, with what happened


def discovery_repair(urls: list[str], observed: Observed, port: int, now: float, networks: tuple[IPNetwork, ...] = (),
                     leaving: frozenset[str] = frozenset()) -> Repair:  # fmt: skip
    """For a discovering router pod that lists `urls` (`<pod URL>` or `<pod URL>@<rank>`): the URLs of the
    Ready engine pods in routing, Ready for REPAIR_GRACE_S, of which it lists no rank (to add), and its listed
    pod URLs that are no engine pod of the serving (to remove). Pods out of routing are the watch's to drop, and
    so are the pods in `leaving`, which the operator has just taken out of routing where `observed` does not
    show it yet: the router's watch dropped them on the write, and none of its events would drop them again."""
    listed = {u.split("@", 1)[0] for u in urls}
    ours = {f"http://{host}:{port}" for p in observed.pods if p.ip and (host := engine_address(p.ip))}
    add = set()
    for p in observed.pods:
        if p.routing != ROUTING_SERVE or not p.ready or p.terminating or p.name in leaving:
            continue
        if p.ready_at is None or now - p.ready_at < REPAIR_GRACE_S:
            continue
        if (host := reachable_host(p, networks)) is not None and f"http://{host}:{port}" not in listed:
            add.add(f"http://{host}:{port}")
    return Repair(listed=tuple(urls), add=tuple(sorted(add)), remove=tuple(sorted(listed - ours)))


class RouterUnreachable(Exception):
    def __init__(self, message: str, status: int | None = None, refused: bool = False):
        super().__init__(message)
        self.status = status  # the HTTP status the router answered, if it answered
        # The connection was refused: nothing listens on the router's port (its process has exited or not yet
        # started), and that port is also where clients reach it, so the pod routes nothing.
        self.refused = refused


class RouterWorkersClient:
    """HTTP to one router pod's worker routes. Every failure raises RouterUnreachable with what happened."""

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        self._opener = direct_opener()
        self.gate = WriteGate()  # as kube.Kube's (the same one): no change of a router's list unless leading

    def _call(self, method: str, url: str, body: dict | None = None, text_answer: bool = False) -> object:
        """The JSON answer (`text_answer`: the text, as the routes that answer plain text do)."""
        if method != "GET":
            with self.gate.write(f"{method} {url}"):
                return self._send(method, url, body, text_answer)
        return self._send(method, url, body, text_answer)

    def _send(self, method: str, url: str, body: dict | None, text_answer: bool) -> object:
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(url, data, {"content-type": "application/json"} if data else {}, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                text = resp.read(MAX_LISTING_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise RouterUnreachable(f"{method} {url}: HTTP {exc.code}", exc.code) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise RouterUnreachable(f"{method} {url}: {exc}", refused=connection_refused(exc)) from None
        if len(text) > MAX_LISTING_BYTES:
            raise RouterUnreachable(f"{method} {url}: answer over {MAX_LISTING_BYTES} bytes")
        if text_answer:
            return text.decode(errors="replace")
        try:
            return json.loads(text or b"null")
        except ValueError:
            raise RouterUnreachable(f"{method} {url}: not JSON") from None

    def workers(self, base: str) -> list[str]:
        """The URLs of the workers the router at `base` lists."""
        return list(listed_workers(self._call("GET", base + router_facts.WORKERS_PATH), ""))

    def repair(self, base: str, steps: Callable[[list[str]], Repair], budget_s: float) -> Repair:
        """List the workers of the discovering router at `base` and apply `steps(listed URLs)`: add back and
        remove pods by URL (the router's own routes, which add or remove all of a pod's ranks). No call starts
        once `budget_s` has passed, so none lands after the caller has stopped waiting and moved on (a pod
        added back after the plan took it out of routing would hold its drain)."""
        deadline = time.monotonic() + budget_s
        repair = steps(self.workers(base))
        failed = []
        routes = ((router_facts.ADD_WORKER_PATH, repair.add), (router_facts.REMOVE_WORKER_PATH, repair.remove))
        for path, urls in routes:
            for url in urls:
                if time.monotonic() > deadline:
                    failed.append(f"POST {base}{path} {url}: not sent, {budget_s:g}s passed")
                    continue
                try:
                    self._call("POST", f"{base}{path}?url={urllib.parse.quote(url, safe='')}", text_answer=True)
                except RouterUnreachable as exc:  # the listing stands: a failed repair is reported, retried later
                    failed.append(str(exc))
        return dataclasses.replace(repair, failed=tuple(failed))

    def _post(self, base: str, w: Worker, policy: str) -> None:
        self._call("POST", base + router_facts.WORKERS_PATH,
                   {"url": w.url, "model_id": w.model, "labels": {router_facts.POLICY_LABEL: policy}})  # fmt: skip

    def sync(self, base: str, desired: set[Worker], policy: str, budget_s: float | None = None) -> Sync:
        """Make the router at `base` hold exactly `desired`; what it did. With `budget_s`, no call starts once
        that many seconds have passed (RouterUnreachable; the next sync goes on from what the router lists)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s

        def in_time() -> None:
            if deadline is not None and time.monotonic() > deadline:
                raise RouterUnreachable(f"{base}: sync stopped after {budget_s:g}s, to go on at the next reconcile")

        steps = sync_steps(listed_workers(self._call("GET", base + router_facts.WORKERS_PATH), policy), desired)
        # New workers first, so that a router whose only workers are replaced (a one-group rollout) never lists
        # none; a URL listed with another model or label is removed before it is added again (a second POST of
        # a listed URL changes nothing).
        removed = set(steps.remove)
        relisted = {w for w in steps.add if w.url in removed}
        for w in (w for w in steps.add if w not in relisted):
            in_time()
            self._post(base, w, policy)
        for url in steps.remove:
            in_time()
            try:
                self._call("DELETE", f"{base}{router_facts.WORKERS_PATH}/{urllib.parse.quote(url, safe='')}")
            except RouterUnreachable as exc:
                if exc.status != 400:  # WORKER_NOT_FOUND: gone already
                    raise
        for w in sorted(relisted, key=lambda w: w.url):
            in_time()
            self._post(base, w, policy)
        return steps
