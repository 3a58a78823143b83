"""Waiting on the runtime's asynchronous work in its tests: a condition polled until it holds, and a pod's
readiness as the runtime reports it."""

from __future__ import annotations

import asyncio


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def until(check, timeout: float = 30.0):
    """The first true value of `check()`, polled every 50 ms; AssertionError after `timeout` seconds."""
    for _ in range(int(timeout / 0.05)):
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")
