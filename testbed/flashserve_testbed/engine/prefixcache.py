"""Prefix cache of one engine: KV blocks keyed by the hash of their whole token prefix, with LRU eviction.

Mirrors vLLM's block pool: a block referenced by a running request cannot be evicted; when the last reference
goes, the block stays cached in a free queue and is only reclaimed (oldest first) when a new allocation needs
room. Keys are chain hashes, so a key identifies its block *and* everything before it; a request's hit is the
longest run of leading keys present.

The unit of caching may span several KV blocks (`weight` blocks per key) so that a fleet simulator can trade
precision for speed (Mooncake traces hash 512-token blocks). A coarse unit would lose every request's partial
last unit, which vLLM caches block by block; `tails` keeps it: the KV blocks a request computed past its last
full unit, keyed by that unit, with the key of the unit they begin (engine/perfmodel.py reads them at
admission); `shared` likewise for a prefix every request with those keys shares (a system prompt).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_MISSING = object()


class PrefixCache:
    __slots__ = ("weight", "refs", "free", "held_blocks", "free_blocks", "evictions", "tails", "shared", "_trim_at")

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.refs: dict[int, int] = {}  # key -> reference count (> 0)
        self.free: OrderedDict[int, None] = OrderedDict()  # evictable, oldest first
        self.held_blocks = 0.0  # blocks of referenced keys, each counted once
        self.free_blocks = 0.0  # blocks of cached but unreferenced keys
        self.evictions = 0
        # last full key -> (key of the unit the tail begins, KV blocks of it computed); gone with its key
        self.tails: dict[int, tuple[int, int]] = {}
        # last full key of a prefix every request with those keys shares (a system prompt) -> its KV blocks
        # past that key: whichever unit a request continues with, it begins with them
        self.shared: dict[int, int] = {}
        self._trim_at = 64

    def __len__(self) -> int:
        return len(self.refs) + len(self.free)

    def match(self, keys: Sequence[int], limit: int) -> int:
        """Number of leading keys (at most `limit`) that are cached.

        The cached keys of one chain always form a prefix of it: every request holding key j+1 also holds
        key j and releases it later (tail first), so j+1 never outlives j in the LRU. That makes the longest
        cached prefix a binary search instead of a walk over a 100k-token prompt's blocks.
        """
        refs, free = self.refs, self.free
        lo, hi = 0, min(limit, len(keys))  # keys[:lo] cached; keys[hi:] not known cached
        if hi and (keys[hi - 1] in refs or keys[hi - 1] in free):
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            key = keys[mid - 1]
            if key in refs or key in free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def acquire(self, keys: Sequence[int]) -> None:
        """Reference keys known to be cached (from `match`) or insert them as newly computed."""
        refs, pop, get = self.refs, self.free.pop, self.refs.get
        new = revived = 0
        for key in keys:
            count = get(key)
            if count is None:
                refs[key] = 1
                new += 1
                if pop(key, _MISSING) is not _MISSING:
                    revived += 1
            else:
                refs[key] = count + 1
        self.held_blocks += new * self.weight
        self.free_blocks -= revived * self.weight

    def release(self, keys: Sequence[int], cache: bool = True) -> None:
        """Drop one reference per key. Tail keys are queued first so they are evicted first, as vLLM does: a
        later turn of the same session still finds the head of its prefix."""
        refs, free = self.refs, self.free
        dropped = 0
        for key in reversed(keys):
            count = refs[key]
            if count > 1:
                refs[key] = count - 1
            else:
                del refs[key]
                dropped += 1
                if cache:
                    free[key] = None
        self.held_blocks -= dropped * self.weight
        if cache:
            self.free_blocks += dropped * self.weight

    def evict(self, blocks: float) -> float:
        """Reclaim at least `blocks` from the free queue (LRU first); returns what was reclaimed."""
        freed = 0.0
        free, w = self.free, self.weight
        while freed < blocks and free:
            free.popitem(last=False)
            freed += w
            self.evictions += 1
        self.free_blocks -= freed
        return freed

    def note_tail(self, key: int, unit_key: int, blocks: int) -> None:
        """After `key`, the first `blocks` KV blocks of the unit keyed `unit_key` are cached."""
        self.tails[key] = (unit_key, blocks)
        if len(self.tails) > self._trim_at:
            self._trim()

    def note_shared(self, key: int, blocks: int) -> None:
        """After `key`, `blocks` KV blocks every request with the keys up to it shares are cached."""
        self.shared[key] = blocks
        if len(self.shared) > self._trim_at:
            self._trim()

    def _trim(self) -> None:
        # Entries whose key was evicted are dropped in bulk once the entries have doubled since the last
        # trim, not one by one in evict() (its loop is the hot path). Until then one can outlive its key; a
        # lookup reads it only after matching that key, i.e. once the key is cached again.
        refs, free = self.refs, self.free
        self.tails = {k: v for k, v in self.tails.items() if k in refs or k in free}
        self.shared = {k: v for k, v in self.shared.items() if k in refs or k in free}
        self._trim_at = 2 * max(len(self.tails), len(self.shared)) + 64

    def clear(self) -> None:
        self.free.clear()
        self.free_blocks = 0.0
