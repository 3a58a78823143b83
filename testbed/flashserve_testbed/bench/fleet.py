"""The serving fleet: replica groups with a start-up lifecycle, a router (the `--routing` setting), and billing.

A group is what `spec.replicas` counts (one vLLM replica of `engines_per_replica` data-parallel ranks). It is
ordered at some time, holds its GPUs from then on, spends its start-up time Pending (node provisioning, image
pull) and then Running but not ready (weight load, compile, CUDA graphs), serves when ready, and when removed
stops taking requests, finishes those in flight (drains) and gives its GPUs back. Groups are removed highest
index first (as the operator does), so a scale-down cancels groups still starting before it drains ready ones.

A group's start-up comes from the start-up model (`startup_model`, STARTUP_MODELS): `lognormal`, the profile's
cold-only lognormal (the published tables), or the shared phase model (flashserve_testbed/startup_model.py)
with the caches of one of three setups: `cold` (no cache: every start-up downloads the weights and compiles),
`cached-node` (spec.startup.weightsCache NodeLocal with its default prefetch, and kernelCache: the prefetch has
filled every node of the pool before the run and the initial fleet has filled the kernel cache, so a group
starts warm, unless it lands on a node new to the pool, which starts it cold) and
`cached-shared` (weightsCache Shared and kernelCache: every start-up after the first loads from the claim).
The phase figures are scaled so that the cold start-up is the run's median start-up; each group is placed on
a random free node of a pool of the run's GPU budget (the scheduler does not know the caches), on a new node
when the pool is full (draining groups still hold theirs).

One engine model instance is one data-parallel rank. By default the simulator runs one representative rank
per group, with the group's share of sessions for one rank, and weighs its metrics by the rank count
(docs/autoscaling-benchmark.md: what this keeps and what it loses); `all_ranks` simulates every rank.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

from flashserve.autoscaling.startup import StartupSample
from flashserve.facts import router as router_facts

from flashserve.render.vllm_args import itl_buckets

from flashserve_testbed.bench.routing import (
    RANK_WORKER_ROUTINGS,
    RING_ROUTINGS,
    ROUTINGS,
    HashRing,
    Routing,
    fbi_hash,
    rendezvous_pick,
    session_key,
)
from flashserve_testbed.engine import dprank
from flashserve_testbed.engine.perfmodel import Engine, EngineConfig
from flashserve_testbed.engine.profile import Profile
from flashserve_testbed.startup_model import (
    COLD,
    REFERENCE,
    WEIGHTS_HUB,
    WEIGHTS_NODE,
    WEIGHTS_SHARED,
    Caches,
    phase_seconds,
)

CACHE_UNIT_TOKENS = 512  # the engine model's coarse prefix-cache unit (docs/engine-model.md): ~4x faster
PENDING_SHARE = 0.3  # share of the start-up spent Pending (scheduling, node, image pull) before containers run
AFFINITY_BOUND = 1.25  # bounded-load affinity: a replica above this x the mean session count sheds sessions

STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"

STARTUP_MODELS = ("lognormal", "cold", "cached-node", "cached-shared")
_CACHES = {"cold": (WEIGHTS_HUB, False), "cached-node": (WEIGHTS_NODE, True), "cached-shared": (WEIGHTS_SHARED, True)}
KERNEL_KEY = "engine"  # one engine image and layout per run: the kernel cache holds it after the first start-up
RECENT_STARTUPS = 8  # completed start-ups a policy is shown (the operator's status.startup.recent is as short)


def engine_config(profile: Profile, sla: float) -> EngineConfig:
    cfg = EngineConfig.from_profile(profile, cache_unit_tokens=CACHE_UNIT_TOKENS)
    # the ITL buckets the operator renders around the SLA (vllm_args.itl_buckets), so quantiles resolve there
    cfg.buckets = {"inter_token_latency": tuple(itl_buckets(sla, profile.accepted_per_step(cfg.num_speculative_tokens)))}
    return cfg


class Rank:
    """One data-parallel engine of a group."""

    __slots__ = ("group", "index", "engine", "version", "inflight", "key")

    def __init__(self, group: Group, index: int, engine: Engine) -> None:
        self.group = group
        self.index = index
        self.engine = engine
        self.version = 0  # bumps whenever the engine's next event may have changed
        self.inflight = 0
        self.key = f"{group.pod}/{index}"


class Group:
    __slots__ = ("index", "serial", "pod", "ordered", "startup", "ready_at", "ended", "state", "ranks",
                 "weight", "sessions", "inflight", "node", "cache_state", "dp_next")  # fmt: skip

    def __init__(self, index: int, serial: int, ordered: float, startup: float) -> None:
        self.index = index
        self.serial = serial
        self.pod = f"g{index}-{serial}"
        self.ordered = ordered
        self.startup = startup
        self.ready_at = ordered + startup
        self.ended: float | None = None  # GPUs released
        self.state = STARTING
        self.ranks: list[Rank] = []
        self.weight = 1.0  # data-parallel ranks each simulated engine stands for
        self.sessions = 0  # sessions whose affinity is this group
        self.inflight = 0  # requests submitted and not finished
        self.node = ""  # the node it runs on (phase start-up models)
        self.cache_state = COLD  # what its start-up found: cold, weights-cached or warm
        self.dp_next = 0  # where its data-parallel balancer's next scan starts (it rotates per request)

    def phase(self, now: float) -> str:
        """Pod phase as Kubernetes reports it while starting: Pending, then Running (not ready)."""
        if self.state != STARTING:
            return self.state
        return "pending" if now < self.ordered + PENDING_SHARE * self.startup else "running"

    def gpu_seconds(self, gpus: int, start: float, end: float) -> float:
        lo = max(start, self.ordered)
        hi = min(end, self.ended if self.ended is not None else end)
        return max(0.0, hi - lo) * gpus


@dataclass
class FleetCounts:
    desired: int
    ready: int
    starting: int
    pending_phase: int
    """Starting groups still in the Pending pod phase (not yet Running): HPA ignores these."""


class Fleet:
    def __init__(self, profile: Profile, sla: float, seed: int, startup_median_s: float | None = None,
                 all_ranks: bool = False, engines: bool = True, routing: Routing = "affinity",
                 startup_model: str = "lognormal", nodes: int = 0,
                 sticky_ttl_s: float | None = None) -> None:  # fmt: skip
        if routing not in ROUTINGS:
            raise ValueError(f"routing: {routing!r} is not a routing model: choose {', '.join(ROUTINGS)}")
        self.profile = profile
        self.routing = routing
        self.route_rng = random.Random(seed * 7919 + 3)  # `service`: kube-proxy's random endpoint per request
        self.ring = HashRing()  # the router models: vllm-router's consistent-hash ring over the ready pods' workers
        self.by_worker: dict[str, tuple[Group, int]] = {}  # ring worker -> its group and rank (-1: vLLM picks)
        self.key_hash: dict[int, int] = {}  # session id -> its X-Session-ID's ring position
        self.sticky_home: dict[int, tuple[Group, int]] = {}  # `router-sticky`: session id -> its (pod, rank)
        self.sticky_count: dict[tuple[Group, int], int] = {}  # `router-sticky`: sessions per (pod, rank)
        self.sticky_seen: dict[int, float] = {}  # `router-sticky` with a TTL: session id -> its last request
        self.sticky_ttl_s = sticky_ttl_s
        """`router-sticky`: None, an ended session leaves its rank's count at once (a client calling
        /finish_session); seconds, the binary's idle expiry (VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S): a session
        counts until it has been idle that long, found by a sweep at most once a minute."""
        self.sticky_swept = 0.0
        self.hrw_scores: dict[int, dict[str, int]] = {}  # `router-rendezvous`: session id -> its score per worker
        self.hrw_home: dict[int, str] = {}  # `router-rendezvous`: session id -> its worker, until the set changes
        self.engines = engines
        """False: groups get no engine model (the fluid model keeps their state itself)."""
        self.n_ranks = profile.engines_per_replica if all_ranks else 1
        self.rank_weight = profile.engines_per_replica / self.n_ranks
        self.cfg = engine_config(profile, sla)
        self.dp_slack = dprank.slack(profile)
        self.seed = seed
        self.active: list[Group] = []  # index order; len == spec.replicas
        self.draining: list[Group] = []
        self.all: list[Group] = []
        self.serial = 0
        self.startup_rng = random.Random(seed * 31 + 7)
        st = profile.startup
        if startup_median_s is not None:
            scale = startup_median_s / st.median
            self.startup_dist = type(st)(startup_median_s, st.sigma, st.minimum * scale, st.maximum * scale)
        else:
            self.startup_dist = st
        self.ready_list: list[Group] = []
        if startup_model not in STARTUP_MODELS:
            raise ValueError(f"startup_model: {startup_model!r} is not a start-up model: choose from "
                             f"{', '.join(STARTUP_MODELS)}")  # fmt: skip
        self.startup_model = startup_model
        median = st.median if startup_median_s is None else startup_median_s
        self.figures = REFERENCE.scaled(median / REFERENCE.cold_total())
        self.phase_sigma = st.sigma
        weights, kernels = _CACHES.get(startup_model, (WEIGHTS_HUB, False))
        self.caches = Caches(weights=weights, kernel_cache=kernels)
        self.nodes = [f"n{i}" for i in range(max(0, nodes))]
        if startup_model == "cached-node":
            for n in self.nodes:
                self.caches.prefetched(n)
        self.extra_nodes = 0
        self.completed: list[StartupSample] = []
        """Start-ups of groups that became ready during the run, oldest first (what the operator records)."""

    # ------------------------------------------------------------------ start-up
    def _draw_startup(self, g: Group) -> float:
        if self.startup_model == "lognormal":
            return self.startup_dist.draw(self.startup_rng)
        self._place(g)
        state = self.caches.state([g.node], KERNEL_KEY)
        g.cache_state = state.label
        return sum(phase_seconds(state, self.figures, self.startup_rng, self.phase_sigma).values())

    def _place(self, g: Group) -> None:
        held = {x.node for x in self.all if x.ended is None and x is not g}
        free = [n for n in self.nodes if n not in held]
        if free:
            g.node = free[self.startup_rng.randrange(len(free))]
        else:
            self.extra_nodes += 1
            g.node = f"x{self.extra_nodes}"

    def peek_startups(self, k: int) -> list[float]:
        """The start-up times of the next k orders, were they made now, without drawing them (the bound's
        foresight)."""
        saved = (self.startup_rng.getstate(), copy.deepcopy(self.caches), self.extra_nodes)
        probes: list[Group] = []
        out = []
        for _ in range(k):
            g = Group(-1, -1, 0.0, 0.0)
            out.append(self._draw_startup(g))
            probes.append(g)
            self.all.append(g)
        del self.all[len(self.all) - len(probes):]
        self.startup_rng.setstate(saved[0])
        self.caches, self.extra_nodes = saved[1], saved[2]
        return out

    # ------------------------------------------------------------------ lifecycle
    def order(self, now: float, ready: bool = False) -> Group:
        """Create the next group; `ready` builds it already serving (the initial fleet)."""
        self.serial += 1
        g = Group(len(self.active), self.serial, now, 0.0)
        if ready:
            if self.startup_model != "lognormal":
                self._place(g)  # it started before the run: make_ready leaves its caches behind
        else:
            g.startup = self._draw_startup(g)
            g.ready_at = now + g.startup
        self.active.append(g)
        self.all.append(g)
        if ready:
            self.make_ready(g, now)
        return g

    def make_ready(self, g: Group, now: float) -> None:
        if g.node:
            self.caches.started([g.node], KERNEL_KEY)
        if g.state == STARTING and g.startup > 0:
            self.completed.append(StartupSample(g.pod, g.startup, g.cache_state))
        g.state = READY
        g.ready_at = now
        g.weight = self.rank_weight
        for i in range(self.n_ranks if self.engines else 0):
            cfg = EngineConfig(**{**self.cfg.__dict__})
            eng = Engine(self.profile, seed=(self.seed * 1000 + g.serial) * 16 + i, config=cfg)
            g.ranks.append(Rank(g, i, eng))
        self._set_ready()

    def _set_ready(self) -> None:
        """The groups that take new requests; for `router`, also the ring's worker set: the router's pod
        discovery adds a pod when it is ready and drops it when its routing label turns `drain` (or it goes)."""
        self.ready_list = [x for x in self.active if x.state == READY]
        if self.routing in RING_ROUTINGS:
            self.by_worker = dict(self._ring_workers())
            self.ring.update(list(self.by_worker))
        elif self.routing == "router-rendezvous":
            workers = dict(self._ring_workers())
            if workers.keys() != self.by_worker.keys():
                self.hrw_home.clear()  # every session is scored again over the new set (most keep their worker)
            self.by_worker = workers

    def _ring_workers(self):
        """The router's workers: each ready pod, or with DP-aware routing (RANK_WORKER_ROUTINGS) each of its ranks as
        `<pod>@<rank>` (vllm-router's worker URL form). With one representative rank simulated per replica,
        a pod's ranks all lead to it: the pod's share is then the sum of its ranks' shares of the ring."""
        for g in self.ready_list:
            if self.routing in RANK_WORKER_ROUTINGS:
                for i in range(self.profile.engines_per_replica):
                    yield f"{g.pod}@{i}", (g, i if self.n_ranks > 1 else 0)
            else:
                yield g.pod, (g, -1)

    def remove_last(self, now: float) -> Group:
        g = self.active.pop()
        if g.state == STARTING:
            g.state = GONE
            g.ended = now
        else:
            g.state = DRAINING
            self.draining.append(g)
            if g.inflight == 0:
                self.finish_drain(g, now)
        self._set_ready()
        return g

    def finish_drain(self, g: Group, now: float) -> None:
        g.state = GONE
        g.ended = now
        if g in self.draining:
            self.draining.remove(g)

    def counts(self, now: float) -> FleetCounts:
        ready = sum(1 for g in self.active if g.state == READY)
        starting = len(self.active) - ready
        pend = sum(1 for g in self.active if g.state == STARTING and g.phase(now) == "pending")
        return FleetCounts(len(self.active), ready, starting, pend)

    def serving(self) -> list[Group]:
        """Groups whose engines exist and may hold requests (ready or draining)."""
        return self.ready_list + self.draining

    def gpu_hours(self, start: float, end: float) -> float:
        gpus = self.profile.gpus_per_replica
        return sum(g.gpu_seconds(gpus, start, end) for g in self.all) / 3600.0

    # ------------------------------------------------------------------ routing
    def route_session(self, s, now: float) -> Rank | None:
        """The rank that serves a session's next turn, by the fleet's routing model (bench/routing.py)."""
        if self.routing == "service":
            return self._route_random(s.block_hashes())
        if self.routing in RING_ROUTINGS:
            return self._route_ring(s)
        if self.routing == "router-sticky":
            return self._route_sticky(s, now)
        if self.routing == "router-rendezvous":
            return self._route_rendezvous(s)
        return self._route_affinity(s)

    def _route_random(self, keys: list[int]) -> Rank | None:
        ready = self.ready_list
        if not ready:
            return None
        g = ready[self.route_rng.randrange(len(ready))]
        return self._pick_rank(g, keys)

    def _pick_rank(self, g: Group, keys: list[int]) -> Rank:
        """vLLM's choice of rank inside a replica: the mock engine's (prefix-preferring) balancer, or under
        `router-pod-vllm` vLLM 0.33's own, by load only."""
        return pick_rank(g, keys, self.dp_slack, prefix=self.routing != "router-pod-vllm")

    def _ring_rank(self, worker: str, keys: list[int]) -> Rank:
        g, rank = self.by_worker[worker]
        return self._pick_rank(g, keys) if rank < 0 else g.ranks[rank]

    def _route_ring(self, s) -> Rank | None:
        """vllm-router's consistent_hash on `X-Session-ID: s<sid>` (what the load generator sends): the ring's
        owner of the key among the ready pods."""
        if not self.ready_list:
            return None
        h = self.key_hash.get(s.sid)
        if h is None:
            h = self.key_hash[s.sid] = fbi_hash(session_key(f"s{s.sid}"))
        worker = self.ring.lookup_hash(h)
        self._follow(s, self.by_worker[worker][0])
        return self._ring_rank(worker, s.block_hashes())

    def _route_rendezvous(self, s) -> Rank | None:
        """vllm-router's rendezvous_hash (in 0.1.17, not selectable by --policy) on `X-Session-ID: s<sid>` over
        the ready pods' ranks."""
        if not self.ready_list:
            return None
        worker = self.hrw_home.get(s.sid)
        if worker is None:
            scores = self.hrw_scores.setdefault(s.sid, {})
            worker = self.hrw_home[s.sid] = rendezvous_pick(session_key(f"s{s.sid}"), self.by_worker, scores)
        self._follow(s, self.by_worker[worker][0])
        return self._ring_rank(worker, s.block_hashes())

    def _route_sticky(self, s, now: float) -> Rank | None:
        """vllm-router's sticky_least_loaded over the ready pods' ranks: a session keeps its (pod, rank) while
        that pod is ready and the session has not been idle for the TTL; a new one, or one whose pod left
        routing or whose entry expired, goes to the rank with the fewest sessions counted."""
        if not self.ready_list:
            return None
        self._sweep_sticky(now)
        home = self.sticky_home.get(s.sid)
        expired = self.sticky_ttl_s is not None and now - self.sticky_seen.get(s.sid, now) >= self.sticky_ttl_s
        if home is None or home[0].state != READY or expired:
            if home is not None:
                self.sticky_count[home] -= 1
            workers = [(g, i) for g in self.ready_list for i in range(self.profile.engines_per_replica)]
            home = min(workers, key=lambda w: self.sticky_count.get(w, 0))
            self.sticky_count[home] = self.sticky_count.get(home, 0) + 1
            self.sticky_home[s.sid] = home
        self.sticky_seen[s.sid] = now
        g, rank = home
        self._follow(s, g)
        return g.ranks[rank if self.n_ranks > 1 else 0]

    def _sweep_sticky(self, now: float) -> None:
        """The binary's expiry sweep: at most once a minute, on a request, every entry idle for the TTL goes
        (ended sessions included: the router is not told that a conversation ended)."""
        if self.sticky_ttl_s is None or now - self.sticky_swept < router_facts.SLL_SWEEP_SECS:
            return
        self.sticky_swept = now
        for sid in [sid for sid, t in self.sticky_seen.items() if now - t >= self.sticky_ttl_s]:
            del self.sticky_seen[sid]
            self.sticky_count[self.sticky_home.pop(sid)] -= 1

    @staticmethod
    def _follow(s, g: Group) -> None:
        """`s.replica` follows the router's choice, so that the replicas' session counts stay right."""
        if s.replica is not g:
            if s.replica is not None:
                s.replica.sessions -= 1
            g.sessions += 1
            s.replica = g

    def _route_affinity(self, s) -> Rank | None:
        """Session affinity with bounded load (consistent hashing with bounded loads): a session stays on its
        replica, where its prefix is cached, unless that replica is draining or carries more than
        AFFINITY_BOUND x the mean number of sessions; new and moved sessions go to the replica with the
        fewest sessions (cold cache there: the whole conversation is prefilled again)."""
        ready = self.ready_list
        if not ready:
            return None
        g = s.replica
        if g is None or g.state != READY or g.sessions > AFFINITY_BOUND * sum(x.sessions for x in ready) / len(ready) + 1:
            target = min(ready, key=lambda x: (x.sessions, x.index))
            if g is not None:
                g.sessions -= 1
            target.sessions += 1
            s.replica = g = target
        return self._pick_rank(g, s.block_hashes())

    def end_session(self, s) -> None:
        if s.replica is not None:
            s.replica.sessions -= 1
            s.replica = None
        self.key_hash.pop(s.sid, None)
        self.hrw_scores.pop(s.sid, None)
        self.hrw_home.pop(s.sid, None)
        if self.sticky_ttl_s is None:
            home = self.sticky_home.pop(s.sid, None)
            if home is not None:
                self.sticky_count[home] -= 1

    def route_prefix(self, keys: list[int]) -> Rank | None:
        """For trace replay (no session ids): the engine with the longest cached prefix among those within
        a small margin of the least loaded, as prefix-aware routers (and vLLM's DP balancer) do."""
        if self.routing == "service":
            return self._route_random(keys)
        if self.routing in RING_ROUTINGS:
            # no session id in a Mooncake trace: the router hashes each request on its own (its prompt-text
            # fallback), which places requests on the ring independently of each other
            if not self.ready_list:
                return None
            return self._ring_rank(self.ring.lookup_hash(self.route_rng.getrandbits(64)), keys)
        if self.routing == "router-rendezvous":  # the same fallback: each request's own text picks its worker
            if not self.ready_list:
                return None
            return self._ring_rank(self.route_rng.choice(list(self.by_worker)), keys)
        ranks = [r for g in self.ready_list for r in g.ranks]
        if not ranks:
            return None
        floor = min(r.inflight for r in ranks)
        slack = max(4, floor // 4)
        best, best_hit = None, 0
        for r in ranks:
            if r.inflight <= floor + slack:
                hit = r.engine.cached_prefix_units(keys)
                if hit > best_hit or (hit == best_hit and best is not None and r.inflight < best.inflight):
                    best, best_hit = r, hit
        if best is None or best_hit == 0:
            best = min(ranks, key=lambda r: (r.inflight, r.group.index, r.index))
        return best


def pick_rank(g: Group, keys: list[int], slack: int, prefix: bool = True) -> Rank:
    """Within a replica, per request: the mock engine's choice of data-parallel rank (engine/dprank.py), the
    rank holding the longest cached prefix among the lightly loaded ones, else vLLM's balancer's (fewest
    4 x waiting + running, ties to the first in a scan order that rotates per request)."""
    ranks = g.ranks
    if len(ranks) == 1:
        return ranks[0]
    start = g.dp_next
    g.dp_next = (start + 1) % len(ranks)
    return ranks[dprank.choose([r.engine for r in ranks], keys, start, slack, prefix=prefix)]
