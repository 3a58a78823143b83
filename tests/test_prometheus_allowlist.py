"""spec.autoscaling.prometheusUrl cannot make the operator probe arbitrary endpoints: only allowed URLs are
queried, redirects are not followed, and nothing an endpoint answers comes back through the status."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
from flashserve.autoscaling.allowlist import PrometheusAllowList, parse_entries
from flashserve.controller.main import _parser

from tests.builders import body_for, ready_observed
from tests.fakes import RecordingKube, evaluate, loopback_scaler


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://prometheus.team-a.svc:9090", True),
        ("http://prometheus.team-a.svc.cluster.local:9090/prom", True),
        ("http://prometheus.team-b.svc:9090", False),  # another tenant's namespace
        ("http://a.b.team-a.svc:9090", False),  # not a Service name
        ("http://169.254.169.254/latest/meta-data", False),
        ("http://kubernetes.default.svc", False),
        ("http://prometheus.team-a.svc@evil.example.com/", False),  # userinfo trick: the host is evil
        ("http://op-prom.monitoring.svc:9090", True),  # the operator's own --prometheus-url
        ("http://op-prom.monitoring.svc:9091", False),  # same host, another port
        ("ftp://prometheus.team-a.svc", False),
    ],
)
def test_default_allow_list(url, allowed):
    allow = PrometheusAllowList(operator_url="http://op-prom.monitoring.svc:9090")
    assert (allow.refusal(url, "team-a") is None) == allowed


def test_allow_entries_add_prefixes_and_host_patterns():
    allow = PrometheusAllowList(entries=parse_entries(["https://thanos.example.com/prom,*.monitoring.svc", "vm:8428"]))
    assert allow.refusal("https://thanos.example.com/prom/api", "ns") is None
    assert allow.refusal("https://thanos.example.com/other", "ns") is not None
    assert allow.refusal("http://thanos.example.com/prom", "ns") is not None, "scheme is part of the prefix"
    assert allow.refusal("http://p.monitoring.svc:9090", "ns") is None
    assert allow.refusal("http://vm:8428", "ns") is None and allow.refusal("http://vm:8429", "ns") is not None
    assert PrometheusAllowList(own_namespace=False).refusal("http://p.ns.svc", "ns") is not None


@pytest.mark.parametrize("path", ["/prom/team-a/../team-b", "/prom/team-a/%2e%2E/team-b", "/prom/team-a/./x",
                                  "/prom/team-a/%2E"])  # fmt: skip
def test_a_path_with_dot_segments_cannot_leave_an_allowed_prefix(path):
    allow = PrometheusAllowList(entries=("https://mimir.example.com/prom/team-a",))
    assert allow.refusal("https://mimir.example.com/prom/team-a/api", "ns") is None
    why = allow.refusal(f"https://mimir.example.com{path}", "ns")
    assert why is not None and ". or .. segments" in why
    assert allow.refusal("https://mimir.example.com/prom/team-a/..x/.y", "ns") is None, "only whole segments"


@pytest.mark.parametrize("url", [
    "http://169.254.169.254\\.monitoring.svc/",  # requests ends the host at the backslash: it would reach 169.254...
    "http://10.0.0.1\\@p.monitoring.svc/",
    "http://p.monitoring.svc%2f@10.0.0.1/",
    "http://p.monitoring.svc/a\\b",
])  # fmt: skip
def test_urls_whose_host_the_http_client_reads_differently_are_refused(url):
    """The allow-list and the client must judge the same host: a host part with anything but a name, an IP and a
    port is refused, by the operator and by the CRD's pattern (the API server refuses it at admission)."""
    import re

    from flashserve.api.v1alpha1 import PROMETHEUS_URL

    allow = PrometheusAllowList(entries=("*.monitoring.svc",))
    assert allow.refusal(url, "team-a") is not None
    assert re.fullmatch(PROMETHEUS_URL, url) is None
    assert allow.refusal("http://p.monitoring.svc:9090/prom", "team-a") is None
    assert re.fullmatch(PROMETHEUS_URL, "http://p.monitoring.svc:9090/prom")


def test_flags_and_environment(monkeypatch):
    args = _parser().parse_args(["--prometheus-allow", "a.example,b.example", "--prometheus-allow", "c.example",
                                 "--no-prometheus-allow-own-namespace"])  # fmt: skip
    assert parse_entries(args.prometheus_allow) == ("a.example", "b.example", "c.example")
    assert args.prometheus_allow_own_namespace is False
    monkeypatch.setenv("FLASHSERVE_PROMETHEUS_ALLOW", "x.example")
    args = _parser().parse_args([])
    assert parse_entries(args.prometheus_allow) == ("x.example",) and args.prometheus_allow_own_namespace is True


class _Endpoint(BaseHTTPRequestHandler):
    hits: list[str] = []
    status = 403
    location = ""

    def do_GET(self) -> None:  # noqa: N802
        type(self).hits.append(self.path)
        body = b"internal-only: db password hunter2"
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint(serve_http):
    def start(status: int = 403, location: str = "") -> tuple[str, type]:
        handler = type("H", (_Endpoint,), {"hits": [], "status": status, "location": location})
        return serve_http(handler)[0], handler

    return start


def _metrics_condition(scaler, url):
    conds, scaled = evaluate(scaler, body_for(url), ready_observed(2), RecordingKube())
    assert scaled is None
    return {c.type: c for c in conds}["MetricsAvailable"]


def test_a_url_not_allowed_is_never_requested(endpoint, events):  # noqa: F811
    from flashserve.controller.autoscale import Autoscaler

    url, handler = endpoint()
    cond = _metrics_condition(Autoscaler(), url)  # default allow-list: 127.0.0.1 is not on it
    assert cond.status == "False" and "NotAllowed" in cond.message
    assert handler.hits == [], "the operator must not send the request"


def test_an_error_body_is_not_quoted(endpoint, events):  # noqa: F811
    url, handler = endpoint(403)
    cond = _metrics_condition(loopback_scaler(), url)
    assert handler.hits, "allowed: queried"
    assert "HTTPError 403" in cond.message
    assert "internal-only" not in cond.message and "hunter2" not in cond.message


def test_redirects_are_not_followed(endpoint, events):  # noqa: F811
    target, target_handler = endpoint(200)
    url, _ = endpoint(302, location=target + "/api/v1/query")
    cond = _metrics_condition(loopback_scaler(), url)
    assert "HTTPError 302" in cond.message
    assert target_handler.hits == [], "a redirect must not lead the operator elsewhere"


def test_a_non_prometheus_answer_is_a_bad_response(endpoint, events):  # noqa: F811
    url, _ = endpoint(200)
    cond = _metrics_condition(loopback_scaler(), url)
    assert "BadResponse" in cond.message and "internal-only" not in cond.message


@pytest.mark.parametrize(("spec", "words"), [
    ({"type": "ExternalName", "externalName": "metadata.internal"}, "is an ExternalName alias of another host"),
    ({"type": "ClusterIP", "ports": [{"port": 9090}]}, "has no selector"),
    (None, "no Service prom in namespace team-a"),
])  # fmt: skip
def test_an_own_namespace_service_that_could_point_anywhere_is_not_queried(spec, words, events):
    """A Service of the serving's namespace is the tenant's to define: as an ExternalName alias, or with endpoints
    written by hand, it would send the operator's request wherever the tenant chose. The operator reads it first
    and sends nothing (the refusal comes before any connection, so no name is resolved)."""
    from flashserve.controller.autoscale import Autoscaler

    objects = {} if spec is None else {("Service", "team-a", "prom"): {"spec": spec}}
    kube = RecordingKube(objects)
    conds, _ = evaluate(Autoscaler(), body_for("http://prom.team-a.svc:9090"), ready_observed(2), kube)
    cond = {c.type: c for c in conds}["MetricsAvailable"]
    assert cond.status == "False" and "NotAllowed" in cond.message and words in cond.message, cond.message
    assert ("get", "Service", "team-a", "prom") in kube.calls


def test_only_urls_allowed_as_own_namespace_services_are_checked_as_services():
    allow = PrometheusAllowList(operator_url="http://op.monitoring.svc:9090", entries=("*.team-a.svc",))
    assert PrometheusAllowList().own_service("http://prom.team-a.svc.cluster.local:9090/x", "team-a") == "prom"
    assert allow.own_service("http://prom.team-a.svc:9090", "team-a") is None  # listed by the operator's admin
    assert allow.own_service("http://op.monitoring.svc:9090", "team-a") is None
    assert PrometheusAllowList(own_namespace=False).own_service("http://prom.team-a.svc", "team-a") is None
    assert PrometheusAllowList().own_service("http://prom.team-b.svc", "team-a") is None


def test_a_service_that_selects_pods_is_queried():
    from flashserve.controller.autoscale import service_refusal

    kube = RecordingKube({("Service", "team-a", "prom"): {"spec": {"selector": {"app": "prometheus"}}}})
    assert service_refusal(kube, "team-a", "prom") is None
