"""Authenticated scrapes of the operator's metrics, as Kubernetes components do it: a bearer token checked with
a TokenReview, then a SubjectAccessReview for `get` on the non-resource URL `/metrics`.

A Prometheus in another namespace scrapes with its ServiceAccount token and needs a ClusterRole granting
`get` on `nonResourceURLs: ["/metrics"]` (the chart's `<fullname>-operator-metrics-reader`). Answers are cached for a
short while so a scrape every few seconds does not cost two API requests each time; a revoked grant stops
working within that time.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

METRICS_PATH = "/metrics"
CACHE_SECONDS = 60.0
CACHE_MAX = 1024  # distinct tokens remembered; beyond that the oldest answers are dropped


@dataclass(frozen=True)
class Decision:
    status: int  # 200, 401 (no or invalid token) or 403 (authenticated, not allowed)
    user: str = ""


class Reviewer(Protocol):
    def authenticate(self, token: str) -> tuple[str, list[str]] | None:
        """The token's user name and groups, or None when the API server does not accept it."""

    def allowed(self, user: str, groups: list[str], path: str) -> bool:
        """Whether that user may `get` the non-resource URL `path`."""


# A review the API server has not answered in this long fails (the scrape is refused, and not cached): a scraper
# must not hold a thread of the endpoint on a slow API server.
REVIEW_TIMEOUT_S = 10.0


class KubeReviewer:
    """TokenReview and SubjectAccessReview through the Kubernetes API (the operator's own credentials need
    `create` on both)."""

    def __init__(self, api_client: object):
        from kubernetes import client

        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)

    def authenticate(self, token: str) -> tuple[str, list[str]] | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        review = self.authn.create_token_review(body, _request_timeout=REVIEW_TIMEOUT_S)
        status = review.status
        if not status or not status.authenticated or not status.user:
            return None
        return status.user.username or "", list(status.user.groups or [])

    def allowed(self, user: str, groups: list[str], path: str) -> bool:
        review = self.authz.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "nonResourceAttributes": {"path": path, "verb": "get"}},
        }, _request_timeout=REVIEW_TIMEOUT_S)  # fmt: skip
        return bool(review.status and review.status.allowed)


class Gate:
    """Token -> Decision, cached per token digest (the token itself is never kept)."""

    def __init__(self, reviewer: Reviewer, clock: Callable[[], float] = time.monotonic,
                 cache_seconds: float = CACHE_SECONDS):
        self.reviewer = reviewer
        self.clock = clock
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Decision]] = {}
        self._lock = threading.Lock()

    def decide(self, authorization: str | None) -> Decision:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Decision(401)
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit and now - hit[0] < self.cache_seconds:
                return hit[1]
        try:
            who = self.reviewer.authenticate(token)
            if who is None:
                decision = Decision(401)
            else:
                decision = Decision(200 if self.reviewer.allowed(who[0], who[1], METRICS_PATH) else 403, who[0])
        except Exception:  # noqa: BLE001 - the API server unreachable: refuse this scrape, cache nothing
            return Decision(503)
        with self._lock:
            if len(self._cache) >= CACHE_MAX:
                for old in sorted(self._cache, key=lambda k: self._cache[k][0])[: CACHE_MAX // 4]:
                    del self._cache[old]
            self._cache[key] = (now, decision)
        return decision


_REASONS = {401: "401 Unauthorized", 403: "403 Forbidden", 404: "404 Not Found", 503: "503 Service Unavailable"}


def guarded_app(registry: CollectorRegistry, gate: Gate | None):
    """The metrics WSGI app; with a gate, every request must pass it first."""
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO", "/") not in (METRICS_PATH, METRICS_PATH + "/"):
            start_response(_REASONS[404], [("Content-Type", "text/plain")])
            return [b"not found\n"]
        if gate is not None:
            decision = gate.decide(environ.get("HTTP_AUTHORIZATION"))
            if decision.status != 200:
                headers = [("Content-Type", "text/plain")]
                if decision.status == 401:
                    headers.append(("WWW-Authenticate", 'Bearer realm="flashserve-operator"'))
                start_response(_REASONS[decision.status], headers)
                return [_REASONS[decision.status].encode() + b"\n"]
        return metrics(environ, start_response)

    return app


# How long a client may take over its TLS handshake, and may then leave its connection silent, before it is
# dropped; and how many connections are served at once (each has a thread): one more is closed at once, so a
# client that opens many cannot take the operator's threads.
HANDSHAKE_TIMEOUT_S = 10.0
CONNECTION_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None
    _slots: threading.BoundedSemaphore | None = None

    def process_request(self, request, client_address):
        if self._slots is None:  # serve_forever's one thread calls this: no race
            self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request, client_address):
        # A client dropped for its silence, or one that went away, is not the operator's error: no traceback.
        if not isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request, client_address):
        if self.tls is None:
            return super().finish_request(request, client_address)
        # The handshake runs here, in the connection's own thread: on a wrapped listening socket it would run
        # in accept(), and one client that connects and never speaks would hold up every scrape.
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


class _Server6(_Server):
    """An IPv6 address; `::` takes IPv4 too (one socket for both families), so the kubelet and Prometheus
    reach it over whichever family the pod's address has."""

    address_family = socket.AF_INET6

    def server_bind(self):
        if self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _QuietHandler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT_S  # a client that stops sending is dropped, not waited for

    def log_message(self, format, *args):
        pass


def serve(host: str, port: int, registry: CollectorRegistry, gate: Gate | None = None,
          certfile: str | None = None, keyfile: str | None = None) -> WSGIServer:
    """Serve /metrics on host:port in a daemon thread; TLS when a certificate is given. Returns the server
    (its `server_address` has the bound port when `port` is 0)."""
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, guarded_app(registry, gate), server_class=server_class,
                         handler_class=_QuietHandler)  # fmt: skip
    if certfile:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certfile, keyfile)
        server.tls = context
    threading.Thread(target=server.serve_forever, name="flashserve-metrics", daemon=True).start()
    return server
