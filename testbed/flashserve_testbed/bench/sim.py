"""The discrete-event simulation of one run: one scenario, one seed, one autoscaler.

Time is virtual seconds. Events, in time order: session starts and later turns (closed loop: a turn is sent a
tool gap after the previous answer finished), trace requests (open loop), engine rounds (each engine model
reports when its batch next changes), replicas becoming ready, Prometheus scrapes, and the autoscaler's
evaluations. Traffic runs from -warmup on the initial fleet; the autoscaler acts from 0 to the end of the
scenario; then no new turns start, the requests in flight finish, and the run is scored on what arrived in
[0, end) and the GPU time of [0, end).
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
import random
import time
import zlib
from dataclasses import dataclass
from itertools import accumulate

from flashserve_testbed import traces
from flashserve_testbed.bench.calibrate import Calibration
from flashserve_testbed.bench.context import Context, Policy
from flashserve_testbed.bench.fleet import DRAINING, RECENT_STARTUPS, STARTING, Fleet, Rank
from flashserve_testbed.bench.measures import (
    GPU_HOUR_PRICE_USD,
    Recorder,
    Result,
    oracle_gpu_hours,
    summarize,
)
from flashserve_testbed.bench.prom import Prometheus, Sample
from flashserve_testbed.bench.workloads import (
    Scenario,
    Session,
    TraceRequest,
    TraceSession,
    chain_hashes,
    session_load,
    session_starts,
    trace_groups,
    trace_requests,
)
from flashserve_testbed.engine.profile import Profile
from flashserve_testbed.engine.stats import DEFAULT_TTFT_BUCKETS

_START, _TURN, _TRACE, _ENGINE, _READY, _SCRAPE, _EVAL = range(7)
DRAIN_LIMIT_S = 1800.0  # after the end, stop waiting for stragglers (they count as missed)


@dataclass(frozen=True)
class Settings:
    sla_tokens_per_s: float = 100.0
    scrape_interval_s: float = 15.0
    gpu_hour_price: float = GPU_HOUR_PRICE_USD
    startup_median_s: float | None = None
    """None: the profile's start-up distribution (median 7 min for the default profile)."""
    min_replicas: int = 1
    max_replicas: int | None = None
    """GPU budget in replicas; None: twice the oracle's peak plus two."""
    timeline: bool = False
    decisions: bool = False
    """Keep the policy's decision log (FlashServe's: reasons and readings) in the result."""
    all_ranks: bool = False
    """Simulate every data-parallel rank of a replica instead of one representative (4x the work)."""
    engine: str = "model"
    """model: every request through the engine model; fluid: the fluid model (bench/fluid.py, day-scale)."""
    routing: str = "affinity"
    """How a request picks its replica (bench/routing.py): service (random per request), affinity (session
    affinity with bounded load) or router (vllm-router's consistent_hash on X-Session-ID)."""
    sticky_ttl_s: float | None = None
    """`router-sticky`: the router's idle expiry of a session (VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S); None, an
    ended session leaves its rank's count at once (a client calling /finish_session)."""
    startup_model: str = "lognormal"
    """Where start-ups come from (bench/fleet.py STARTUP_MODELS): the profile's cold-only lognormal, or the
    phase model with no cache (cold), a node-local weights cache (cached-node) or a shared one (cached-shared)."""
    learn_startup: bool = True
    spec_startup_s: float | None = None
    """spec.autoscaling.replicaStartupSeconds given to FlashServe (and the start-up the tuned baselines are
    tuned for); None: the run's median start-up, as if the user had measured it."""
    """FlashServe learns its start-up time from the start-ups it sees complete (False: the spec value)."""


class OracleView:
    """The oracle's need as a step function of scenario time (`oracle_steps`), shared by both models."""

    scenario: Scenario
    oracle_steps: list[tuple[float, int]]
    oracle_gpu_hours: float

    def oracle_at(self, utilization: float) -> tuple[float, list[tuple[float, int]]]:
        """The oracle's GPU-hours and need steps had it sized each replica at `utilization` x the SLA
        capacity (1: `oracle_gpu_hours`, `oracle_steps`)."""
        raise NotImplementedError

    def at_utilization(self, utilization: float) -> OracleView:
        """This workload as seen by a clairvoyant that holds headroom: the same arrivals, the oracle's need
        at `utilization` x the SLA capacity (the frontier of what knowing the future buys, `--frontier`)."""
        view = copy.copy(self)
        view.oracle_gpu_hours, view.oracle_steps = self.oracle_at(utilization)
        return view

    def oracle_need(self, t: float) -> int:
        from flashserve_testbed.bench.measures import need_at

        return need_at(self.oracle_steps, t)

    def peak_need(self) -> int:
        return max((n for t, n in self.oracle_steps if 0.0 <= t < self.scenario.duration_s), default=1)


class Workload(OracleView):
    """The arrivals of one (scenario, seed), shared by every policy's run, plus the oracle's view of them:
    each request served at the nominal SLA operating point."""

    def __init__(self, scenario: Scenario, seed: int, profile: Profile, calib: Calibration,
                 unit: int, max_model_len: int, all_ranks: bool = False) -> None:  # fmt: skip
        self.scenario = scenario
        self.all_ranks = all_ranks
        # the traffic of the simulated engines: one representative rank per replica, or every rank
        ranks = profile.engines_per_replica if all_ranks else 1
        self.seed = seed
        self.profile = profile
        self.calib = calib
        self.unit = unit
        self.max_model_len = max_model_len
        nominal = calib.nominal
        self.starts: list[float] = []
        self.trace: list[TraceRequest] = []
        self.trace_keys: list[list[int]] = []
        self.sessions: list[traces.Session] = []  # an aiperf trace's sessions, parallel to `starts`
        keep_p = ranks / profile.engines_per_replica
        salt = seed * 2654435761
        trace = traces.read(scenario.trace) if scenario.trace else None
        if trace is not None and trace.closed_loop:
            # one representative rank per replica: keep a session with probability 1/ranks
            span = scenario.duration_s + scenario.warmup_s
            self.sessions = [t for t in trace.sessions if t.start_ms / 1000.0 < span
                             and random.Random(salt ^ zlib.crc32(t.id.encode())).random() < keep_p]  # fmt: skip
            self.starts = [t.start_ms / 1000.0 - scenario.warmup_s for t in self.sessions]
            occ = []
            for sid, (t, start) in enumerate(zip(self.sessions, self.starts), 1):
                s = TraceSession(sid, t, unit, max_model_len, start)
                while (turn := s.next_turn()) is not None:
                    end = start + nominal.turn_s(turn[1])
                    occ.append((start, end))
                    start = end + s.gap(end)
                    if start >= scenario.duration_s:
                        break
        elif trace is not None:
            reqs = trace_requests(trace)
            groups = trace_groups(reqs)
            # one representative rank per replica: keep a conversation with probability 1/ranks, whole
            kept = [r for r, g in zip(reqs, groups) if random.Random(salt ^ g).random() < keep_p]
            span = scenario.duration_s
            self.trace = [TraceRequest(r.t - scenario.warmup_s, r.input_length, r.output_length, r.hash_ids)
                          for r in kept if r.t < span + scenario.warmup_s]  # fmt: skip
            self.trace_keys = [chain_hashes(r.hash_ids) for r in self.trace]
            occ = [(r.t, r.t + nominal.ttft_s + max(0, r.output_length - 1) / nominal.tokens_per_s)
                   for r in self.trace if r.input_length + r.output_length <= max_model_len]  # fmt: skip
        else:
            per_session = session_load(profile, unit, nominal)
            self.rate = scenario.base_replicas * calib.capacity_per_rank * ranks / per_session
            self.starts = session_starts(scenario, self.rate, seed)
            occ = []
            for sid, t in enumerate(self.starts, 1):
                s = Session(sid, seed, profile, unit, max_model_len)
                while (turn := s.next_turn()) is not None:
                    end = t + nominal.turn_s(turn[1])
                    occ.append((t, end))
                    t = end + s.gap()
                    if t >= scenario.duration_s:
                        break
        self.occ_starts = [a for a, _ in occ]
        self.occ_ends = [b for _, b in occ]
        self.oracle_capacity = calib.capacity_per_rank * ranks
        self.oracle_gpu_hours, self.oracle_steps = self.oracle_at(1.0)

    def oracle_at(self, utilization: float) -> tuple[float, list[tuple[float, int]]]:
        return oracle_gpu_hours(self.occ_starts, self.occ_ends, self.oracle_capacity * utilization,
                                self.profile.gpus_per_replica, 0.0, self.scenario.duration_s)  # fmt: skip

    def new_session(self, sid: int, unit: int, max_model_len: int, now: float) -> Session:
        """The sid-th session to start (1-based): the trace's, or a synthetic one from the run's seed."""
        if self.sessions:
            return TraceSession(sid, self.sessions[sid - 1], unit, max_model_len, now)
        return Session(sid, self.seed, self.profile, unit, max_model_len)


class Simulation:
    engines = True
    """Groups run the engine model (the fluid model's subclass keeps flows instead)."""

    def __init__(self, workload: Workload, policy: Policy, settings: Settings, oracle_lookahead_s: float | None = None):
        self.w = workload
        self.sc = workload.scenario
        self.policy = policy
        self.s = settings
        self.profile = workload.profile
        self.calib = workload.calib
        startup = settings.startup_median_s if settings.startup_median_s is not None else self.sc.startup_median_s
        self.startup_median_s = startup if startup is not None else self.profile.startup.median
        self.max_replicas = settings.max_replicas or 2 * workload.peak_need() + 2
        self.fleet = Fleet(self.profile, settings.sla_tokens_per_s, workload.seed, startup, settings.all_ranks,
                           engines=self.engines, routing=settings.routing, startup_model=settings.startup_model,
                           nodes=self.max_replicas, sticky_ttl_s=settings.sticky_ttl_s)  # fmt: skip
        itl_bounds = self.fleet.cfg.buckets["inter_token_latency"]
        self.prom = Prometheus(tuple(itl_bounds), tuple(DEFAULT_TTFT_BUCKETS))
        self.heap: list = []
        self.seq = 0
        self.rec = Recorder()
        self.scale_actions = 0
        self.router_queue: list = []
        # requests (turns) arrived at the router, as its vllm_router_requests_total counts them: on receipt,
        # whether a replica is ready or not, and not again when a queued one is routed
        self.arrivals = 0.0
        # engine clocks start at 0: internal time runs from the start of the warm-up
        self.off = self.sc.warmup_s
        self.end = self.off + self.sc.duration_s
        self.oracle_lookahead_s = oracle_lookahead_s
        self.timeline: dict[str, list] = {"t": [], "desired": [], "ready": [], "demand": [], "oracle": []}
        # step-level view (what the policy's ITL quantile measures): ITL observations at or under the SLA's
        # step latency, counted from the start of the measured window
        tps = self.profile.accepted_per_step(self.fleet.cfg.num_speculative_tokens)
        self.step_bound = bisect.bisect_left(itl_bounds, round(tps / settings.sla_tokens_per_s, 6) - 1e-12)
        self.step_base: dict[int, tuple[float, float]] | None = None
        self.prefix_base: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------ plumbing
    def push(self, t: float, kind: int, a=None, b=None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def wake(self, r: Rank) -> None:
        r.version += 1
        nt = r.engine.next_event_time()
        if nt is not None:
            self.push(nt, _ENGINE, r, r.version)

    def submit(self, r: Rank, now: float, prompt: int, output: int, user, keys: list[int], cover: bool,
               arrival: float | None = None) -> None:  # fmt: skip
        # a session's prompt begins with the system prompt every session shares (a trace's requests: nothing)
        shared = user.shared_prefix_tokens() if isinstance(user, Session) else 0
        r.engine.add_request(None, prompt, output, now, block_hashes=keys, hashes_cover_output=cover,
                             hashes_chained=True, user=user, shared_prefix_tokens=shared)  # fmt: skip
        if arrival is not None:
            # it waited in the router since `arrival` (no replica was ready): that counts against its TTFT
            r.engine.waiting[-1].arrival = arrival
        r.inflight += 1
        r.group.inflight += 1
        self.collect(r, r.engine.advance(now), now)
        self.wake(r)

    def collect(self, r: Rank, finished, now: float) -> None:
        g = r.group
        for req in finished:
            r.inflight -= 1
            g.inflight -= 1
            if req.arrival >= self.off:
                ttft = req.first_token - req.arrival if req.first_token is not None else None
                self.rec.add(req.prompt_len, req.emitted, req.tokens_per_second(), ttft)
            user = req.user
            if isinstance(user, Session):
                user.inflight = False
                t_next = req.finish_time + user.gap(req.finish_time)
                if t_next < self.end:
                    self.push(t_next, _TURN, user)
                else:
                    self.fleet.end_session(user)
        if g.state == DRAINING and g.inflight == 0:
            self.fleet.finish_drain(g, now)
            self.prom.target_gone(g.pod, now)

    # ------------------------------------------------------------------ events
    def on_turn(self, s: Session, now: float) -> None:
        turn = s.next_turn()
        if turn is None:
            if getattr(s, "refused", False) and now >= self.off:
                self.rec.refuse()
            self.fleet.end_session(s)
            return
        self.arrivals += 1
        r = self.fleet.route_session(s, now)
        if r is None:
            self.router_queue.append((now, s, turn))
            return
        s.inflight = True
        self.submit(r, now, turn[0], turn[1], s, s.block_hashes(), True)

    def on_trace(self, i: int, now: float, arrival: float | None = None) -> None:
        req = self.w.trace[i]
        if arrival is None:  # a new request, not one the router held until a replica was ready
            self.arrivals += 1
        if req.input_length + req.output_length > self.fleet.cfg.max_model_len:
            if (now if arrival is None else arrival) >= self.off:
                self.rec.refuse()  # vLLM answers 400: the prompt and its max_tokens do not fit the context
            return
        keys = self.w.trace_keys[i]
        r = self.fleet.route_prefix(keys)
        if r is None:
            self.router_queue.append((now if arrival is None else arrival, i, None))
            return
        out = max(1, min(req.output_length, self.fleet.cfg.max_model_len - req.input_length))
        self.submit(r, now, max(1, req.input_length), out, i, keys, False, arrival)

    def flush_router(self, now: float) -> None:
        queued, self.router_queue = self.router_queue, []
        for t0, who, turn in queued:
            if isinstance(who, Session):
                r = self.fleet.route_session(who, now)
                if r is None:
                    self.router_queue.append((t0, who, turn))
                    continue
                who.inflight = True
                self.submit(r, now, turn[0], turn[1], who, who.block_hashes(), True, t0)
            else:
                self.on_trace(who, now, t0)

    def on_scrape(self, now: float) -> None:
        running = waiting = 0
        for r in self.ranks():
            g, eng = r.group, r.engine
            self.collect(r, eng.advance(now), now)
            self.wake(r)
            st = eng.stats
            snap = eng.snapshot()
            running += snap.running * g.weight
            waiting += snap.waiting * g.weight
            itl, ttft, tpot = st.itl, st.ttft, st.tpot
            self.prom.ingest(r.key, g.pod, g.index, g.weight, Sample(
                t=now, running=snap.running, waiting=snap.waiting, kv=snap.kv_usage,
                gen_tokens=eng.generation_tokens(), itl_count=itl.n, itl_sum=itl.total,
                itl_buckets=tuple(accumulate(itl.counts[:-1])), ttft_count=ttft.n, ttft_sum=ttft.total,
                ttft_buckets=tuple(accumulate(ttft.counts[:-1])), prompt_tokens=st.req_prompt_tokens.total,
                prompt_count=st.req_prompt_tokens.n, output_tokens_done=st.req_generation_tokens.total,
                output_count=st.req_generation_tokens.n, prefix_queries=st.prefix_queries,
                prefix_hits=st.prefix_hits, tpot_count=tpot.n, tpot_buckets=tuple(accumulate(tpot.counts[:-1])),
                one_token_requests=st.req_generation_tokens.counts[0],
            ))  # fmt: skip
        self.scrape_router(now)
        self.prom.forget_old(now)
        if self.step_base is None and now >= self.off:
            self.step_base = {r.key: self.step_counts(r) for r in self.ranks()}
            self.prefix_base = {r.key: (r.engine.stats.prefix_queries, r.engine.stats.prefix_hits)
                                for r in self.ranks()}  # fmt: skip
        if self.s.timeline:
            self.record_timeline(now, running + waiting)

    def scrape_router(self, now: float) -> None:
        """The router pod's metrics, scraped with the engines'. A plain Service (routing `service`) has no
        router, so no arrival counter: the policy then sizes on the engines' readings alone."""
        if self.s.routing != "service":
            # one simulated rank per replica stands for rank_weight of them, as its engine series do
            self.prom.ingest_router(now, self.arrivals * self.fleet.rank_weight)

    def record_timeline(self, now: float, in_engines: float) -> None:
        """One point of the timeline figure: replicas wanted and ready, demand and the oracle's need."""
        c = self.fleet.counts(now)
        tl = self.timeline
        tl["t"].append(now - self.off)
        tl["desired"].append(c.desired)
        tl["ready"].append(c.ready)
        tl["demand"].append(in_engines / self.calib.capacity_per_replica)
        tl["oracle"].append(self.w.oracle_need(now - self.off))

    def on_eval(self, now: float) -> None:
        ctx = Context(
            now=now, counts=self.fleet.counts(now), groups=list(self.fleet.active), prom=self.prom,
            calib=self.calib, sla_tokens_per_s=self.s.sla_tokens_per_s, min_replicas=self.s.min_replicas,
            max_replicas=self.max_replicas, scrape_interval_s=self.s.scrape_interval_s,
            startups=tuple(self.fleet.completed[-RECENT_STARTUPS:]),
        )  # fmt: skip
        want = self.policy.decide(ctx)
        if want is not None:
            self.scale_to(want, now)

    def start_fleet(self, now: float) -> None:
        """The initial fleet, ready: what the oracle needs at the start (or a static policy's fixed size)."""
        initial = max(self.s.min_replicas, self.w.oracle_need(0.0))
        fixed = getattr(self.policy, "fixed_replicas", None)
        if fixed is not None:
            initial = fixed(self.w)
        for _ in range(min(initial, self.max_replicas)):
            self.fleet.order(now, ready=True)

    def on_fleet_event(self, kind: int, a, now: float, oracle: bool) -> None:
        """A scrape, a group becoming ready, or an evaluation (the oracle's sizing when `oracle`)."""
        if kind == _SCRAPE:
            self.on_scrape(now)
            if now < self.end:
                self.push(now + self.s.scrape_interval_s, _SCRAPE)
        elif kind == _READY:
            if a.state == STARTING and a in self.fleet.active:
                self.fleet.make_ready(a, now)
                self.flush_router(now)
        elif kind == _EVAL and now < self.end:
            if oracle:
                self.scale_to(self.oracle_target(now), now, startup=0.0)
                self.flush_router(now)
                self.push(now + self.s.scrape_interval_s, _EVAL)
            else:
                self.on_eval(now)
                self.push(now + self.policy.interval_s, _EVAL)

    def scale_to(self, want: int, now: float, startup: float | None = None) -> None:
        n = min(self.max_replicas, max(self.s.min_replicas, int(want)))
        if n == len(self.fleet.active):
            return
        self.scale_actions += 1
        while len(self.fleet.active) < n:
            g = self.fleet.order(now, ready=startup == 0.0)
            if g.state == STARTING:
                self.push(g.ready_at, _READY, g)
        while len(self.fleet.active) > n:
            g = self.fleet.remove_last(now)
            if g.ended is not None:  # cancelled while starting (no series) or drained at once
                self.prom.target_gone(g.pod, now)

    # ------------------------------------------------------------------ run
    def run(self) -> Result:
        cpu0 = time.process_time()
        sc = self.sc
        t0 = 0.0
        self.start_fleet(t0)
        scrape = self.s.scrape_interval_s
        k = math.ceil(t0 / scrape)
        self.push(k * scrape, _SCRAPE)
        oracle = self.oracle_lookahead_s is not None
        if not oracle:
            self.push(self.off + self.policy.offset_s, _EVAL)
        else:
            self.push(self.off, _EVAL)
        starts = self.w.starts
        trace = self.w.trace
        i_start = i_trace = 0
        sid = 0
        hard_end = self.end + DRAIN_LIMIT_S
        heap = self.heap
        while True:
            t_heap = heap[0][0] if heap else math.inf
            t_s = starts[i_start] + self.off if i_start < len(starts) else math.inf
            t_r = trace[i_trace].t + self.off if i_trace < len(trace) else math.inf
            if t_s == math.inf and t_r == math.inf and not heap:
                break
            if t_s <= t_heap and t_s <= t_r:
                now = t_s
                i_start += 1
                sid += 1
                s = self.w.new_session(sid, self.fleet.cfg.cache_unit_tokens, self.fleet.cfg.max_model_len, now)
                self.on_turn(s, now)
                continue
            if t_r < t_heap:
                now = t_r
                self.on_trace(i_trace, now)
                i_trace += 1
                continue
            if not heap:
                break
            now, _, kind, a, b = heapq.heappop(heap)
            if now > hard_end:
                break
            if kind == _ENGINE:
                if a.version == b:
                    self.collect(a, a.engine.advance(now), now)
                    self.wake(a)
            elif kind == _TURN:
                if now < self.end:
                    self.on_turn(a, now)
                else:
                    self.fleet.end_session(a)
            else:
                self.on_fleet_event(kind, a, now, oracle)
        # stragglers: whatever never finished counts as missed
        for r in (r for g in self.fleet.all for r in g.ranks):
            for req in list(r.engine.running) + list(r.engine.waiting):
                if req.arrival >= self.off and not req.finished:
                    self.rec.unfinished(req.prompt_len, req.output_len)
        for t0_, who, turn in self.router_queue:
            if t0_ >= self.off and turn is not None:
                self.rec.unfinished(turn[0], turn[1])
        gpu_hours = self.fleet.gpu_hours(self.off, self.end)
        summary = summarize(self.rec, self.s.sla_tokens_per_s, gpu_hours, self.s.gpu_hour_price,
                            self.fleet.rank_weight)  # fmt: skip
        reps = self.replica_series()
        return Result(
            policy=self.policy.name,
            scenario=sc.name,
            seed=self.w.seed,
            gpu_hours=gpu_hours,
            scale_actions=self.scale_actions,
            replicas_mean=reps[0],
            replicas_max=reps[1],
            sim_seconds=self.end,
            cpu_seconds=time.process_time() - cpu0,
            knob=self.policy.knob,
            knob_value=self.policy.knob_value,
            startup_median_s=self.startup_median_s,
            step_attainment=self.step_attainment(),
            routing=self.routing_label(),
            prefix_hit_rate=self.prefix_hit_rate(),
            timeline=self.timeline if self.s.timeline else None,
            decisions=self._decisions() if self.s.decisions else None,
            **self.startup_fields(),
            **summary,
        )

    def routing_label(self) -> str:
        """The routing model as results name it: router-sticky with an idle expiry carries it (-ttl600)."""
        if self.s.routing == "router-sticky" and self.s.sticky_ttl_s is not None:
            return f"router-sticky-ttl{self.s.sticky_ttl_s:g}"
        return self.s.routing

    def startup_fields(self) -> dict:
        done = self.fleet.completed
        learned = getattr(self.policy, "startup_s_now", None)
        return {
            "startup_model": self.s.startup_model,
            "startup_learning": "on" if self.s.learn_startup else "off",
            "cached_startups": sum(s.cache_state != "cold" for s in done) / len(done) if done else None,
            "learned_startup_s": learned() if learned else None,
        }

    def _decisions(self) -> list | None:
        log = getattr(self.policy, "decisions", None)
        if log is None:
            return None
        # scenario time (the warm-up is before 0)
        return [{**d, "t": round(d["t"] - self.off, 3)} for d in log]

    def ranks(self) -> list[Rank]:
        return [r for g in self.fleet.serving() for r in g.ranks]

    def step_counts(self, r: Rank) -> tuple[float, float]:
        counts = r.engine.stats.itl.counts
        return float(sum(counts[: self.step_bound + 1])), float(sum(counts))

    def step_attainment(self) -> float | None:
        base = self.step_base or {}
        ok = total = 0.0
        for r in (r for g in self.fleet.all for r in g.ranks):
            le, n = self.step_counts(r)
            b = base.get(r.key, (0.0, 0.0))
            ok += le - b[0]
            total += n - b[1]
        return ok / total if total > 0 else None

    def prefix_hit_rate(self) -> float | None:
        """vllm:prefix_cache_hits / queries (tokens) over the measured window, summed over every engine."""
        queries = hits = 0.0
        for r in (r for g in self.fleet.all for r in g.ranks):
            q0, h0 = self.prefix_base.get(r.key, (0.0, 0.0))
            queries += r.engine.stats.prefix_queries - q0
            hits += r.engine.stats.prefix_hits - h0
        return hits / queries if queries > 0 else None

    def oracle_target(self, now: float) -> int:
        """Perfect foresight, no start-up: the most the ideal demand needs over the next scrape interval plus
        the lookahead (so a replica is there before its users)."""
        from flashserve_testbed.bench.measures import need_at

        steps = self.w.oracle_steps
        hi = now + self.s.scrape_interval_s + (self.oracle_lookahead_s or 0.0)
        now -= self.off
        hi -= self.off
        best = need_at(steps, now)
        for t, n in steps:
            if now < t <= hi and n > best:
                best = n
        return best

    def replica_series(self) -> tuple[float, int]:
        """Mean and peak over the measured window of the groups holding GPUs (starting, ready or draining)."""
        events = []
        for g in self.fleet.all:
            events.append((g.ordered, 1))
            events.append((g.ended if g.ended is not None else math.inf, -1))
        events.sort()
        n = peak = 0
        area = 0.0
        last = self.off
        for t, d in events:
            if t > last:
                hi = min(t, self.end)
                if hi > last:
                    area += n * (hi - last)
                    last = hi
            n += d
            if t < self.end:
                peak = max(peak, n)
        if last < self.end:
            area += n * (self.end - last)
        return area / (self.end - self.off), peak


def run(workload: Workload, policy: Policy, settings: Settings) -> Result:
    return Simulation(workload, policy, settings).run()


def run_oracle(workload: Workload, settings: Settings, lookahead_s: float = 60.0) -> Result:
    """The oracle's fleet (ideal demand, perfect foresight, instant start-up) simulated for its attainment;
    its GPU-hours are reported as the analytic integral (the lower bound)."""
    from flashserve_testbed.bench.baselines.oracle import Oracle

    sim = Simulation(workload, Oracle(), settings, oracle_lookahead_s=lookahead_s)
    res = sim.run()
    res.gpu_hours = workload.oracle_gpu_hours
    cost = res.gpu_hours * settings.gpu_hour_price
    w = sim.fleet.rank_weight
    res.tokens_per_dollar = w * (sim.rec.prompt_tokens + res.output_tokens) / cost if cost else 0.0
    res.output_tokens_per_dollar = w * res.output_tokens / cost if cost else 0.0
    return res
