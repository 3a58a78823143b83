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
