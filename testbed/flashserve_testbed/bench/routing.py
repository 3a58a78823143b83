"""How the simulated fleet picks a replica for each request: the `--routing` setting of `bench autoscale`.

* `service`: a random ready replica per request, what a plain Kubernetes Service (kube-proxy) gives.
* `affinity`: session affinity with bounded load (`fleet.Fleet.route_session`), the benchmark's original router.
* `router`: vllm-router 0.1.17's `consistent_hash` policy on the client's `X-Session-ID`, the operator's
  default. `HashRing` is its ring, bit for bit: 160 virtual nodes per worker at `fbi_hash("<url>:<i>")`,
  a key goes to the first virtual node at or after `fbi_hash(key)` (wrapping), where `fbi_hash` is mcrouter's
  furc hash (23 bits) expanded by MurmurHash64A. `tests/router/test_ring_calibration.py` checks it against the
  real binary. The ring holds no state beyond the worker set: it is rebuilt whenever the set changes (a pod
  joins when ready, leaves when its `flashserve.io/routing` label turns `drain` or it is deleted), and every
  router replica with the same set sends a key to the same worker. On a change only the keys whose nearest
  virtual node changed move (about 1/n of them when an n-th worker joins; those of a removed worker spread over
  the rest); a moved session's next turn is a full prefill on a cold engine. No load bound: the ring's own
  imbalance is what the engines get. Inside the chosen pod, vLLM picks the rank: the model takes the mock
  engine's balancer (engine/dprank.py), which prefers the rank holding the prompt's prefix.
* `router-rank`: the same policy with DP-aware routing (`spec.routing.dataParallelAware`, the operator's
  default): the ring's workers are each pod's ranks, `<pod>@<rank>`, and a request goes to its rank.
* `router-pod-vllm`: `router` with vLLM 0.33's own balancer inside the pod (by load only, no prefix
  preference): what a pod-level router gets from real engines, i.e. `dataParallelAware: false`.
* `router-sticky`: vllm-router's `sticky_least_loaded` over each pod's ranks (docs/vllm-router.md): a new
  session goes to the rank with the fewest sessions (ties to the first in worker order) and stays there until
  its rank leaves routing or it has been idle for the expiry; nothing moves it for load. Modelled as one router
  process, or several that a client-IP affinity keeps each session on. By default a session leaves its rank's
  count when it ends (a client posting `/finish_session`); with `--sticky-ttl` (the operator's
  `stickyLeastLoaded.sessionIdleSeconds`) it counts until idle that long and a sweep, at most once a minute,
  finds it, as the binary does when nobody tells it a conversation ended. Not the operator's default policy.
* `router-rendezvous`: `rendezvous_hash`, a policy compiled into vllm-router 0.1.17's library that nothing selects
  (docs/vllm-router.md, "Where a load bound would come from"), over each pod's ranks like `router-rank`: a key goes
  to the worker with the highest `fbi_hash("<key>:<url>")` (the last of equal scores, as Rust's `max_by_key`
  picks), so each session lands on a worker drawn uniformly, with no ring shares to skew it, and a changed worker
  set moves only the sessions of a removed worker or those a new one outscores. No load bound either: the
  sessions' own draw is what the engines get. Modelled to tell how much of the ring's cost offering it would take
  away; the operator does not offer it (only IGW mode's worker API selects it).
"""

from __future__ import annotations

import bisect
from typing import Literal

ROUTINGS = ("service", "affinity", "router", "router-rank", "router-pod-vllm", "router-sticky", "router-rendezvous")
Routing = Literal["service", "affinity", "router", "router-rank", "router-pod-vllm", "router-sticky",
                  "router-rendezvous"]
RING_ROUTINGS = frozenset({"router", "router-rank", "router-pod-vllm"})
# the routings whose router lists each pod's ranks as its workers, `<pod>@<rank>` (DP-aware)
RANK_WORKER_ROUTINGS = frozenset({"router-rank", "router-rendezvous"})

VIRTUAL_NODES = 160
_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
_SEED = 4193360111
_FURC_SHIFT = 23
_FURC_MAX_TRIES = 32
_FURC_MODULUS = (1 << 23) - 1


def murmur64a(key: bytes, seed: int) -> int:
    """MurmurHash64A (mcrouter's lib/fbi/hash.c), as vllm-router's consistent_hash.rs computes it."""
    h = (seed ^ (len(key) * _M)) & _MASK
    n8 = len(key) // 8 * 8
    for i in range(0, n8, 8):
        k = int.from_bytes(key[i:i + 8], "little")
        k = (k * _M) & _MASK
        k ^= k >> 47
        k = (k * _M) & _MASK
        h ^= k
        h = (h * _M) & _MASK
    rest = key[n8:]
    if rest:
        h ^= int.from_bytes(rest, "little")
        h = (h * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    h ^= h >> 47
    return h


def _rehash64a(k: int) -> int:
    h = (_SEED ^ (8 * _M)) & _MASK
    k = (k * _M) & _MASK
    k ^= k >> 47
    k = (k * _M) & _MASK
    h ^= k
    h = (h * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    h ^= h >> 47
    return h


def furc_hash(key: bytes, m: int) -> int:
    """mcrouter's furc_hash: a consistent hash of `key` into [0, m)."""
    if m <= 1:
        return 0
    cache: list[int] = []

    def bit(idx: int) -> int:
        ord_ = idx >> 6
        while len(cache) <= ord_:
            cache.append(murmur64a(key, _SEED) if not cache else _rehash64a(cache[-1]))
        return (cache[ord_] >> (idx & 0x3F)) & 1

    d = 0
    while m > (1 << d):
        d += 1
    a = d
    for _ in range(_FURC_MAX_TRIES):
        while not bit(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += _FURC_SHIFT
        num = 1
        for _ in range(max(0, d - 1)):
            num = (num << 1) | bit(a)
            a += _FURC_SHIFT
        if num < m:
            return num
    return 0


def fbi_hash(key: str) -> int:
    """The ring position of a key or a virtual node."""
    return murmur64a(furc_hash(key.encode(), _FURC_MODULUS).to_bytes(4, "little"), _SEED)


def session_key(session_id: str) -> str:
    """The hash key vllm-router extracts from an `X-Session-ID: <id>` header (it wins over the body's fields)."""
    return f"header:x-session-id:{session_id}"


def rendezvous_pick(key: str, workers, scores: dict[str, int]) -> str | None:
    """vllm-router's `rendezvous_hash` choice of worker for a hash key: the highest `fbi_hash("<key>:<url>")`,
    the last of equal ones. `scores` keeps the key's score per worker across calls (a worker's never changes)."""
    best, best_score = None, -1
    for w in workers:
        score = scores.get(w)
        if score is None:
            score = scores[w] = fbi_hash(f"{key}:{w}")
        if score >= best_score:
            best, best_score = w, score
    return best


class HashRing:
    """vllm-router's consistent-hash ring over a list of worker ids (its worker URLs)."""

    def __init__(self, workers: list[str] | tuple[str, ...] = ()) -> None:
        self.workers: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []
        self._vnodes: dict[str, list[int]] = {}
        self.update(workers)

    def update(self, workers: list[str] | tuple[str, ...]) -> bool:
        """Rebuild for a new worker set; False (and nothing done) when it is the same list."""
        workers = tuple(workers)
        if workers == self.workers:
            return False
        ring: dict[int, str] = {}
        for w in workers:  # a later worker's colliding virtual node replaces an earlier one, as in a BTreeMap
            pts = self._vnodes.get(w)
            if pts is None:
                pts = self._vnodes[w] = [fbi_hash(f"{w}:{i}") for i in range(VIRTUAL_NODES)]
            for p in pts:
                ring[p] = w
        self._points = sorted(ring)
        self._owners = [ring[p] for p in self._points]
        self.workers = workers
        return True

    def lookup_hash(self, h: int) -> str | None:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, h)
        return self._owners[i if i < len(self._points) else 0]

    def lookup(self, key: str) -> str | None:
        return self.lookup_hash(fbi_hash(key))
