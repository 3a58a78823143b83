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
