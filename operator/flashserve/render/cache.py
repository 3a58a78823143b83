"""Rendered objects of each serving, kept between reconciles so that a resync of an unchanged serving renders
nothing.

What render_group and render_shared produce depends only on the serving's name, namespace and uid, its spec
apart from `replicas`, and the group index. Entries are therefore keyed by the serving (namespace, name, uid)
and a digest of its spec without `replicas`: scaling keeps every rendered group, any other spec change (or a
new serving of the same name) drops the serving's entry and renders afresh. Keying by the full spec rather
than by template_hash costs a re-render after an edit that leaves pods alone (a rollout setting), which is
rare, and cannot serve a stale object when a field that shapes a Service or a budget changes.

Entries are held as JSON text, and every hit returns fresh objects parsed from it (about 0.1 ms a group). A
caller may then modify what it gets, the cache takes a sixth of the memory the objects would, and the
garbage collector has nothing to scan in it: hundreds of thousands of long-lived dicts would make each full
collection, which stops every thread and so the event loop, take a tenth of a second.
The cache is shared by the threads that plan, hence the lock; rendering itself happens outside it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.render.renderer import OPERATOR_NAMESPACE, ApiServer, render_group, render_shared

# Bound on the groups held over all servings. A group takes about 6 KB of JSON, so this is about 50 MB, within
# the chart's 512 MiB limit: 32 servings at the group ceiling, or 8192 small ones. A fleet with more groups
# than this re-renders what was evicted at each resync (as it did before the cache, off the event loop).
MAX_CACHED_GROUPS = 8192

_SHARED = "shared"  # the entry of the objects shared by all groups is (_SHARED, operator namespace)


def spec_digest(obj: DeepSeekServing) -> str:
    spec = obj.spec.dump()
    spec.pop("replicas", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


class RenderCache:
    def __init__(self, max_groups: int = MAX_CACHED_GROUPS):
        self.max_groups = max_groups
        self.renders = 0  # render_group / render_shared calls made (misses)
        self._lock = threading.Lock()
        # (namespace, name, uid) -> (spec digest, {group index or the shared key: objects as JSON}), least recently
        # used first
        self._entries: OrderedDict[tuple, tuple[str, dict[int | tuple, str]]] = OrderedDict()
        self._held = 0

    def group(self, obj: DeepSeekServing, index: int, digest: str | None = None) -> list[dict]:
        """render_group(obj, index), rendered at most once per spec."""
        return self._get(obj, index, digest or spec_digest(obj))

    def shared(self, obj: DeepSeekServing, digest: str | None = None, operator_namespace: str = OPERATOR_NAMESPACE,
               api_server: ApiServer = ()) -> list[dict]:  # fmt: skip
        """render_shared(obj, operator_namespace, api_server), rendered at most once per spec and inputs."""
        return self._get(obj, (_SHARED, operator_namespace, api_server), digest or spec_digest(obj))

    def forget(self, namespace: str, name: str) -> None:
        """A serving is gone: drop what was rendered for it (any uid)."""
        with self._lock:
            for key in [k for k in self._entries if k[:2] == (namespace, name)]:
                self._held -= len(self._entries.pop(key)[1])

    def __len__(self) -> int:
        return self._held

    def _get(self, obj: DeepSeekServing, index: int | tuple, digest: str) -> list[dict]:
        meta = obj.metadata
        key = (meta.get("namespace", "default"), meta["name"], meta.get("uid"))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == digest and index in entry[1]:
                self._entries.move_to_end(key)
                return json.loads(entry[1][index])
        objs = render_shared(obj, index[1], index[2]) if isinstance(index, tuple) else render_group(obj, index)
        text = json.dumps(objs, separators=(",", ":"))
        with self._lock:
            self.renders += 1
            entry = self._entries.get(key)
            if entry is None or entry[0] != digest:
                if entry is not None:
                    self._held -= len(entry[1])
                entry = (digest, {})
                self._entries[key] = entry
            if index not in entry[1]:
                self._held += 1
            entry[1][index] = text
            self._entries.move_to_end(key)
            self._evict(keep=key)
        return objs

    def _evict(self, keep: tuple) -> None:
        """Drop least recently used servings until the bound holds; the serving being planned stays whole
        (its groups are all needed by this plan), so one serving at the ceiling never thrashes."""
        while self._held > self.max_groups:
            oldest = next(iter(self._entries))
            if oldest == keep:
                break
            self._held -= len(self._entries.pop(oldest)[1])


CACHE = RenderCache()
