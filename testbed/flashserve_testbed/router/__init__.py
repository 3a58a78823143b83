"""An OpenAI-compatible router in front of each serving's ready engines, with session and prefix-cache
affinity and a least-loaded fallback, as an inference gateway does (docs/mock-runtime.md)."""

from flashserve_testbed.router.affinity import Policy
from flashserve_testbed.router.server import Router

__all__ = ["Policy", "Router"]
