"""Which Prometheus URLs the operator may query for a serving (spec.autoscaling.prometheusUrl).

The operator sends GET requests wherever a serving points it, from inside the cluster, so an unchecked URL
lets anyone who may create a serving probe internal services. Allowed by default: the operator's own
--prometheus-url (same scheme, host and port) and Services of the serving's own namespace
(`<service>.<namespace>.svc[.cluster.local]`). The operator's --prometheus-allow entries add to that:
a URL prefix (`https://thanos.example.com/prom`: same scheme, host and port, path under it) or a host
pattern (`prometheus.monitoring.svc`, `*.monitoring.svc.cluster.local`, optionally with `:port`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from flashserve.api.kubevalues import DNS_LABEL
from flashserve.api.v1alpha1 import PROMETHEUS_NETLOC


# What the host part may hold: a name or an IP literal, and a port. The HTTP client and urlsplit must agree on
# the host, and they part ways over characters such as `\` (the client ends the host there, urlsplit does not:
# `http://10.0.0.1\.monitoring.svc/` would pass `*.monitoring.svc` and reach 10.0.0.1), `@` and `%`.
_NETLOC = re.compile(PROMETHEUS_NETLOC)


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or not _NETLOC.fullmatch(parts.netloc):
        return None
    if "\\" in url:
        return None
    return parts.scheme, parts.hostname.lower().rstrip("."), port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True)
class PrometheusAllowList:
    operator_url: str | None = None
    """The operator's --prometheus-url."""
    entries: tuple[str, ...] = ()
    """--prometheus-allow: URL prefixes and host patterns."""
    own_namespace: bool = True
    """Allow Services of the serving's own namespace."""

    def own_service(self, url: str, namespace: str) -> str | None:
        """The Service's name when `url` is allowed only as a Service of the serving's own namespace: what such a
        Service points at is the namespace's to choose (an ExternalName alias, endpoints without a selector), so
        the operator looks at it before it sends anything (controller/autoscale.py)."""
        origin = _origin(url)
        if origin is None or self._is_operators(origin) or not self.own_namespace:
            return None
        name = _service_of(origin[1], namespace)
        return name if name and not self._listed(origin, url) else None

    def refusal(self, url: str, namespace: str) -> str | None:
        """None when `url` may be queried for a serving in `namespace`; else why not."""
        origin = _origin(url)
        if origin is None:
            return "not an http(s) URL of a host name or IP address, an optional port and a path (no user@, no \\)"
        if _dot_segments(url):
            return "a path with . or .. segments (the server may resolve them out of an allowed prefix): write it out"
        if self._is_operators(origin) or (self.own_namespace and _service_of(origin[1], namespace)):
            return None
        if self._listed(origin, url):
            return None
        return (f"the operator allows only its own --prometheus-url, Services of namespace {namespace} "
                "(<service>.<namespace>.svc) and its --prometheus-allow list")  # fmt: skip

    def _is_operators(self, origin: tuple[str, str, int]) -> bool:
        return bool(self.operator_url) and _origin(self.operator_url) == origin

    def _listed(self, origin: tuple[str, str, int], url: str) -> bool:
        """Whether a --prometheus-allow entry admits the URL."""
        _, host, port = origin
        path = urlsplit(url).path or "/"
        for entry in self.entries:
            if "://" in entry:
                if _origin(entry) == origin and _under(path, urlsplit(entry).path or "/"):
                    return True
                continue
            pattern, _, want_port = entry.lower().partition(":")
            if want_port and (not want_port.isdigit() or int(want_port) != port):
                continue
            if pattern.startswith("*.") and host.endswith(pattern[1:]) or host == pattern:
                return True
        return False


def _service_of(host: str, namespace: str) -> str | None:
    """The Service name when `host` names a Service of `namespace` (`<service>.<namespace>.svc[.cluster.local]`)."""
    m = re.fullmatch(rf"({DNS_LABEL})\.{re.escape(namespace)}\.svc(\.cluster\.local)?", host)
    return m[1] if m else None


def _dot_segments(url: str) -> bool:
    """Whether the path holds a `.` or `..` segment, written out or percent-encoded: a client or server that
    resolves them leaves the path a --prometheus-allow prefix was checked against."""
    return any(unquote(seg) in (".", "..") for seg in urlsplit(url).path.split("/"))


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or not prefix


def parse_entries(values: list[str] | None) -> tuple[str, ...]:
    """--prometheus-allow values (repeatable, each comma-separated) as one tuple of entries."""
    return tuple(e.strip() for v in values or [] for e in v.split(",") if e.strip())
