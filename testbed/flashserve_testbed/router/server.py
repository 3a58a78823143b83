"""The router's HTTP side: `/{namespace}/{serving}/v1/...` proxied to a chosen engine, bodies streamed through
as they arrive (SSE included), and /metrics for the autoscaler and dashboards."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from flashserve_testbed.router.affinity import (
    Choice,
    Policy,
    PrefixIndex,
    SessionTable,
    block_hashes,
    choose,
    prompt_text,
    session_key,
)

log = logging.getLogger("flashserve_testbed.router")

ENDPOINT_HEADER = "X-FlashServe-Endpoint"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
AFFINITY_PATHS = ("v1/chat/completions", "v1/completions")


@dataclass
class Endpoint:
    pod: str
    address: str
    port: int
    group: str
    ready: bool
    inflight: int = 0
    suspect_until: float = 0.0  # refused a connection: skipped briefly, until the runtime's probe decides

    @property
    def base(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class Serving:
    namespace: str
    name: str
    policy: Policy
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    inflight: int = 0
    queued: int = 0
    turn: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.sessions = SessionTable(self.policy.sessions)
        self.prefix = PrefixIndex(self.policy.index_blocks, self.policy.engines_per_block)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def available(self, now: float, exclude: set[str]) -> dict[str, int]:
        cap = self.policy.max_inflight
        return {p: e.inflight for p, e in self.endpoints.items()
                if e.ready and p not in exclude and e.suspect_until <= now and (cap <= 0 or e.inflight < cap)}


class _Gauges:
    def __init__(self, router: "Router") -> None:
        self.router = router

    def collect(self):
        labels = ["namespace", "serving"]
        inflight = GaugeMetricFamily("flashserve_router_requests_in_flight", "Requests being served", labels=labels)
        queued = GaugeMetricFamily("flashserve_router_requests_queued",
                                   "Requests waiting in the router for an engine", labels=labels)
        ready = GaugeMetricFamily("flashserve_router_ready_endpoints", "Engines taking requests", labels=labels)
        per = GaugeMetricFamily("flashserve_router_endpoint_requests_in_flight", "Requests being served by an engine",
                                labels=[*labels, "pod"])
        for s in self.router.servings.values():
            key = [s.namespace, s.name]
            inflight.add_metric(key, s.inflight)
            queued.add_metric(key, s.queued)
            ready.add_metric(key, sum(e.ready for e in s.endpoints.values()))
            for e in s.endpoints.values():
                per.add_metric([*key, e.pod], e.inflight)
        yield from (inflight, queued, ready, per)


class Router:
    def __init__(self, policy: Policy | None = None, queue_timeout: float = 30.0,
                 registry: CollectorRegistry | None = None) -> None:
        self.policy = policy or Policy()
        self.queue_timeout = queue_timeout
        self.servings: dict[tuple[str, str], Serving] = {}
        self.registry = registry or CollectorRegistry()
        self.registry.register(_Gauges(self))
        labels = ["namespace", "serving"]
        self.requests = Counter("flashserve_router_requests", "Requests answered, by HTTP status",
                                [*labels, "code"], registry=self.registry)
        self.decisions = Counter("flashserve_router_decisions", "Routing decisions by reason",
                                 [*labels, "reason"], registry=self.registry)
        self.queue_time = Histogram("flashserve_router_queue_seconds", "Time a request waited for an engine",
                                    labels, registry=self.registry,
                                    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.app = web.Application(client_max_size=512 * 1024 * 1024)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/-/endpoints", self._endpoints)
        self.app.router.add_route("*", "/{namespace}/{serving}/{tail:.*}", self._proxy)
        self.app.on_cleanup.append(self._close)
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------ endpoints, from the runtime
    def _serving(self, namespace: str, serving: str) -> Serving:
        key = (namespace, serving)
        if key not in self.servings:
            self.servings[key] = Serving(namespace, serving, self.policy)
        return self.servings[key]

    def set_endpoint(self, namespace: str, serving: str, pod: str, address: str, port: int, group: str,
                     ready: bool) -> None:
        s = self._serving(namespace, serving)
        e = s.endpoints.get(pod)
        if e is None or (e.address, e.port) != (address, port):
            s.endpoints[pod] = Endpoint(pod, address, port, group, ready, inflight=e.inflight if e else 0)
        else:
            e.ready = ready
            if ready:
                e.suspect_until = 0.0
        s.notify()

    def remove_endpoint(self, namespace: str, serving: str, pod: str) -> None:
        s = self.servings.get((namespace, serving))
        if s is not None and s.endpoints.pop(pod, None) is not None:
            s.notify()

    # ------------------------------------------------------------------ server
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            # No pool limit: the engines' own queues are what a request should wait in, not the router's sockets.
            self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                                                 auto_decompress=False, read_bufsize=2**18)
        return self._client

    async def _close(self, app) -> None:
        if self._client is not None:
            await self._client.close()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _endpoints(self, request: web.Request) -> web.Response:
        doc = [{"namespace": s.namespace, "serving": s.name, "inflight": s.inflight, "queued": s.queued,
                "endpoints": [{"pod": e.pod, "url": e.base, "group": e.group, "ready": e.ready, "inflight": e.inflight}
                              for e in s.endpoints.values()]}
               for s in self.servings.values()]
        extra = self.app.get("extra_state")
        if extra is not None:
            return web.json_response({"servings": doc, **extra()})
        return web.json_response({"servings": doc})

    # ------------------------------------------------------------------ proxy
    async def _acquire(self, s: Serving, sid: str | None, hashes: list[int], exclude: set[str]) -> Choice | None:
        deadline = time.monotonic() + self.queue_timeout
        started = time.monotonic()
        queued = False
        try:
            while True:
                loads = s.available(time.monotonic(), exclude)
                if loads:
                    known = s.sessions.get(sid) if sid else None
                    new = bool(sid) and known is None
                    scores = s.prefix.match(hashes, loads) if hashes and not sid else {}
                    active = s.sessions.active(time.monotonic() - self.policy.session_idle_seconds) if new else None
                    choice = choose(loads, scores, known, self.policy, s.turn, new_session=new, sessions=active)
                    s.turn += 1
                    return choice
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if not queued:
                    queued = True
                    s.queued += 1
                try:
                    await asyncio.wait_for(s.changed.wait(), min(remaining, 1.0))
                except asyncio.TimeoutError:
                    pass  # suspects expire with time, not with events
        finally:
            if queued:
                s.queued -= 1
            self.queue_time.labels(s.namespace, s.name).observe(time.monotonic() - started)

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        ns, name, tail = request.match_info["namespace"], request.match_info["serving"], request.match_info["tail"]
        s = self.servings.get((ns, name))
        if s is None:
            return _error(404, f"the router knows no serving {ns}/{name} (no pod of it has run yet)")
        body = await request.read()
        sid, hashes = None, []
        if request.method == "POST" and tail.rstrip("/") in AFFINITY_PATHS and body:
            try:
                doc = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                doc = None
            if isinstance(doc, dict):
                sid = session_key(doc, request.headers)
                hashes = block_hashes(prompt_text(doc), self.policy.block_chars, self.policy.max_blocks)
        exclude: set[str] = set()
        for _ in range(3):
            choice = await self._acquire(s, sid, hashes, exclude)
            if choice is None:
                self.requests.labels(ns, name, "503").inc()
                return _error(503, f"no ready engine for {ns}/{name} within {self.queue_timeout:g}s",
                              "ServiceUnavailableError")
            e = s.endpoints[choice.pod]
            self.decisions.labels(ns, name, choice.reason).inc()
            if sid:
                s.sessions.put(sid, e.pod, time.monotonic())
            if hashes:
                s.prefix.record(hashes, e.pod)
            e.inflight += 1
            s.inflight += 1
            try:
                return await self._forward(request, s, e, tail, body)
            except _Unreachable:
                e.suspect_until = time.monotonic() + 2.0
                exclude.add(e.pod)
            finally:
                e.inflight -= 1
                s.inflight -= 1
                s.notify()
        self.requests.labels(ns, name, "502").inc()
        return _error(502, f"no engine of {ns}/{name} accepted the connection", "BadGatewayError")

    async def _forward(self, request: web.Request, s: Serving, e: Endpoint, tail: str,
                       body: bytes) -> web.StreamResponse:
        url = f"{e.base}/{tail}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None)
        try:
            upstream_cm = self.client.request(request.method, url, params=request.query, data=body or None,
                                              headers=headers, timeout=timeout, allow_redirects=False)
            upstream = await upstream_cm.__aenter__()
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, asyncio.TimeoutError) as exc:
            log.info("%s/%s: %s unreachable (%s), trying another engine", s.namespace, s.name, e.pod, exc)
            raise _Unreachable() from None
        try:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    resp.headers.add(k, v)
            resp.headers[ENDPOINT_HEADER] = e.pod
            if upstream.content_length is not None:
                resp.content_length = upstream.content_length
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)  # each chunk goes out as it came in: SSE stays unbuffered
            await resp.write_eof()
            self.requests.labels(s.namespace, s.name, str(upstream.status)).inc()
            return resp
        except (ConnectionResetError, aiohttp.ClientError) as exc:
            # The client left (its engine request is closed with ours) or the engine died mid-answer.
            log.debug("%s/%s: stream via %s ended early: %r", s.namespace, s.name, e.pod, exc)
            self.requests.labels(s.namespace, s.name, "499").inc()
            return resp
        finally:
            await upstream_cm.__aexit__(None, None, None)


class _Unreachable(Exception):
    pass


def _error(status: int, message: str, kind: str = "NotFoundError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)
