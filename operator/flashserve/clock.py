"""The wall clock as Kubernetes writes times (RFC 3339, UTC, whole seconds): condition transition times,
scaling events, the mock runtime's container states."""

from __future__ import annotations

import datetime as dt


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ago(seconds: float) -> str:
    """now_iso() of `seconds` ago."""
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
    return then.strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_at(seconds: float) -> str:
    """Seconds since the epoch as Kubernetes writes times."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    """An RFC 3339 time (as an annotation holds it) in seconds since the epoch; None when it is not one. A time
    without a zone is taken as UTC, the only zone this operator writes."""
    if not text or not isinstance(text, str) or len(text) > 64:
        return None
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()
