"""The operator's metrics endpoint with authenticated scrapes (metrics_auth): who gets 200, 401, 403 and 503."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from flashserve.controller.metrics_auth import Gate, serve
from prometheus_client import CollectorRegistry, Counter


class FakeReviewer:
    def __init__(self, tokens: dict[str, str], readers: set[str], fail: bool = False):
        self.tokens, self.readers, self.fail = tokens, readers, fail
        self.calls = 0

    def authenticate(self, token):
        self.calls += 1
        if self.fail:
            raise ConnectionError("API server unreachable")
        user = self.tokens.get(token)
        return (user, ["system:serviceaccounts"]) if user else None

    def allowed(self, user, groups, path):
        assert path == "/metrics"
        return user in self.readers


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    Counter("flashserve_test_total", "a counter", registry=reg).inc(3)
    return reg


def test_scrapes_need_a_token_that_may_read_metrics(registry):
    reviewer = FakeReviewer({"good": "system:serviceaccount:monitoring:prometheus", "other": "system:serviceaccount:x:y"},
                            readers={"system:serviceaccount:monitoring:prometheus"})
    server = serve("127.0.0.1", 0, registry, gate=Gate(reviewer))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        assert _get(url)[0] == 401
        assert _get(url, "forged")[0] == 401
        assert _get(url, "other")[0] == 403
        status, body = _get(url, "good")
        assert status == 200 and "flashserve_test_total 3.0" in body
        assert _get(url.replace("/metrics", "/debug"), "good")[0] == 404
    finally:
        server.shutdown()


def test_answers_are_cached_per_token_and_expire(registry):
    now = [0.0]
    reviewer = FakeReviewer({"good": "u"}, readers={"u"})
    gate = Gate(reviewer, clock=lambda: now[0], cache_seconds=60)
    assert gate.decide("Bearer good").status == 200
    assert gate.decide("Bearer good").status == 200
    assert reviewer.calls == 1  # the second scrape cost no review
    reviewer.readers.clear()  # the grant is revoked
    now[0] = 61
    assert gate.decide("Bearer good").status == 403
    assert reviewer.calls == 2


def test_an_unreachable_api_server_refuses_and_is_not_cached():
    reviewer = FakeReviewer({"good": "u"}, readers={"u"}, fail=True)
    gate = Gate(reviewer)
    assert gate.decide("Bearer good").status == 503
    reviewer.fail = False
    assert gate.decide("Bearer good").status == 200


def test_without_a_gate_metrics_are_open(registry):
    server = serve("127.0.0.1", 0, registry)
    try:
        assert _get(f"http://127.0.0.1:{server.server_address[1]}/metrics")[0] == 200
    finally:
        server.shutdown()


def test_an_ipv6_address_is_served(registry):
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server = serve("::1", 0, registry)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert server.socket.family == socket.AF_INET6
        assert _get(f"http://[::1]:{server.server_address[1]}/metrics")[0] == 200
    finally:
        server.shutdown()


def test_tls_scrapes_are_served_and_a_silent_client_holds_up_no_other(registry, tmp_path):
    """With a certificate the endpoint speaks only TLS, and each connection's handshake runs in its own thread:
    a client that connects and never speaks (a port scan, a stalled scraper) must not keep Prometheus out."""
    import socket
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    server = serve("127.0.0.1", 0, registry, certfile=str(certfile), keyfile=str(keyfile))
    url = f"127.0.0.1:{server.server_address[1]}/metrics"
    context = ssl.create_default_context()
    ca.configure_trust(context)
    silent = socket.create_connection(server.server_address[:2])
    try:
        with urllib.request.urlopen("https://" + url, context=context, timeout=5) as resp:
            assert resp.status == 200 and "flashserve_test_total 3.0" in resp.read().decode()
        with pytest.raises((ConnectionError, urllib.error.URLError)):
            urllib.request.urlopen("http://" + url, timeout=5)  # no plain-text answer on the TLS port
    finally:
        silent.close()
        server.shutdown()


def test_silent_clients_are_dropped_and_connections_beyond_the_cap_closed_at_once(registry, monkeypatch, capfd):
    """Each connection has a thread: one that never speaks is dropped after the connection timeout, and once
    MAX_CONNECTIONS are open the next is closed at once instead of taking another thread."""
    import socket
    import time

    from flashserve.controller import metrics_auth

    monkeypatch.setattr(metrics_auth, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(metrics_auth._QuietHandler, "timeout", 0.5)
    server = serve("127.0.0.1", 0, registry)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    silent = [socket.create_connection(server.server_address[:2]) for _ in range(2)]
    try:
        time.sleep(0.1)
        extra = socket.create_connection(server.server_address[:2])
        extra.settimeout(2)
        assert extra.recv(1) == b"", "a connection beyond the cap is closed at once"
        extra.close()
        for s in silent:
            s.settimeout(3)
            assert s.recv(1) == b"", "a silent client is dropped after the timeout"
        assert _get(url)[0] == 200
        assert "Traceback" not in capfd.readouterr().err, "a dropped client is no error of the operator's"
    finally:
        for s in silent:
            s.close()
        server.shutdown()
