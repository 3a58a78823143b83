"""The fluid model of the fleet, for day-scale runs: sessions and requests as flows instead of one by one.

The engine model (`sim.Simulation`) simulates every request through the engine's scheduler and prefix cache,
about 150 us per request: a simulated day of a two-replica fleet takes five minutes. This model keeps everything
an autoscaler sees and acts on (groups with their start-up times, session affinity with bounded load, the
same scrapes and PromQL, every policy unchanged: it reuses `Simulation`'s event loop for scrapes,
evaluations and readiness) and replaces the engines by what the load test measured of one engine:

* each serving group (one representative rank, as in the engine model) holds `inflight` requests in its
  engine (running + waiting) and `gap` sessions in their tool gap; every tick (1 s) turns leave the gap at
  the mean tool gap's rate, and the engine finishes turns at the rate the load test measured at that
  concurrency; a finished turn ends its session with probability 1 / mean turns per session;
* output tokens meet the SLA in the share the load test measured at that concurrency; the load test is one
  engine serving a fixed number of agentic sessions with their tool gaps (`build_curve`), so the
  fluctuation of the load and the cache pressure of idle sessions are in its figures;
* the histograms Prometheus scrapes (TPOT, ITL, TTFT) are mixtures of the load test's, weighted by the
  concurrency each observation was made at; gauges (running, waiting, KV) are the load test's means.

Session arrivals are the engine model's, to the second (same seeds). What it loses is in
docs/autoscaling-benchmark.md ("Fluid model"), with its validation against the engine model.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass

from flashserve_testbed.bench.calibrate import Calibration, LoadTest, load_test
from flashserve_testbed.bench.context import Policy
from flashserve_testbed.bench.fleet import AFFINITY_BOUND, DRAINING, GONE, Group
from flashserve_testbed.bench.measures import (
    ORACLE_WINDOW_S,
    Result,
    oracle_from_area,
    weighted_quantile,
)
from flashserve_testbed.bench.prom import Sample
from flashserve_testbed.bench.sim import (
    _EVAL,
    _SCRAPE,
    DRAIN_LIMIT_S,
    OracleView,
    Settings,
    Simulation,
)
from flashserve_testbed.bench.workloads import Scenario, SessionStats, session_starts
from flashserve_testbed.engine.profile import Profile

TICK_S = 1.0
CURVE_SESSIONS = (4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 384,
                  512, 768, 1024, 1536, 2048, 3072, 4096)  # fmt: skip
CURVE_SECONDS, CURVE_WARMUP_S = 200.0, 60.0


# --------------------------------------------------------------------------------------------- the curve


@dataclass(frozen=True)
class CurvePoint:
    """One engine held at `concurrency` requests (running + waiting): rates per second, shares per bucket."""

    concurrency: float
    running: float
    completions: float
    tokens: float
    attainment: float
    speed_p50: float
    speed_p90: float
    kv: float
    ttft_mean: float
    itl_per_token: float
    """ITL observations per output token (one per request per step, a step emits several tokens)."""
    tpot: tuple[float, ...]
    """Share of TPOT observations per bucket of the ITL bounds, +Inf last (same for `itl`, `ttft`)."""
    tpot_mean: float
    itl: tuple[float, ...]
    itl_mean: float
    ttft: tuple[float, ...]
    prefix_hit_rate: float = 0.0

    @classmethod
    def from_load_test(cls, lt: LoadTest) -> CurvePoint:
        p, s = lt.point, lt.seconds or 1.0

        def shares(counts: tuple[float, ...]) -> tuple[float, ...]:
            n = sum(counts)
            return tuple(c / n for c in counts) if n else tuple(0.0 for _ in counts)

        n_tpot, n_itl, n_ttft = sum(lt.tpot), sum(lt.itl), sum(lt.ttft)
        gen = p.output_tokens_per_s * s
        return cls(
            concurrency=float(p.concurrency), running=lt.running, completions=lt.finished / s,
            tokens=p.output_tokens_per_s, attainment=p.attainment, speed_p50=p.speed_p50, speed_p90=p.speed_p90,
            kv=p.kv_usage, ttft_mean=lt.ttft_sum / n_ttft if n_ttft else p.ttft_mean_s,
            itl_per_token=n_itl / gen if gen else 0.0, tpot=shares(lt.tpot),
            tpot_mean=lt.tpot_sum / n_tpot if n_tpot else 0.0, itl=shares(lt.itl),
            itl_mean=lt.itl_sum / n_itl if n_itl else 0.0, ttft=shares(lt.ttft),
            prefix_hit_rate=lt.prefix_hit_rate,
        )  # fmt: skip


class Curve:
    """The load test over a grid of concurrencies, interpolated linearly in between (flat beyond the last
    point; below the first, rates scale with the concurrency)."""

    def __init__(self, points: list[CurvePoint]) -> None:
        self.points = points
        self.conc = [p.concurrency for p in points]
        self.col = {f: [getattr(p, f) for p in points]
                    for f in ("running", "completions", "tokens", "attainment", "speed_p50", "speed_p90", "kv",
                              "ttft_mean", "itl_per_token", "prefix_hit_rate")}  # fmt: skip

    def locate(self, a: float) -> tuple[int, float]:
        conc = self.conc
        if a <= conc[0]:
            return 0, 0.0
        if a >= conc[-1]:
            return len(conc) - 1, 0.0
        i = bisect.bisect_right(conc, a) - 1
        return i, (a - conc[i]) / (conc[i + 1] - conc[i])

    def at(self, field: str, i: int, f: float) -> float:
        col = self.col[field]
        return col[i] + f * (col[i + 1] - col[i]) if f else col[i]


def build_curve(profile: Profile, sla: float, progress=None, sessions: tuple[int, ...] = CURVE_SESSIONS,
                seconds: float = CURVE_SECONDS) -> Curve:  # fmt: skip
    """The load test behind the fluid model: one engine with each number of agentic sessions of CURVE_SESSIONS,
    tool gaps included, indexed by the mean number of requests it held (~20 s of CPU). With the gaps, the
    engine also keeps the prefixes of sessions between turns, and its load fluctuates as sessions come and go:
    at the same mean concurrency it is slower than under the calibration's back-to-back load (99% of tokens
    on time at ~33 requests against ~41), as the engine model is in the scenarios."""
    points: list[CurvePoint] = []
    for n in sessions:
        p = CurvePoint.from_load_test(load_test(profile, n, sla, seconds, CURVE_WARMUP_S, gaps=True))
        if not points or p.concurrency > points[-1].concurrency:
            points.append(p)
    if progress:
        progress(f"fluid model: load test with {sessions[0]} to {sessions[-1]} sessions per engine "
                 f"({points[0].concurrency:.0f} to {points[-1].concurrency:.0f} requests in the engine)")
    return Curve(points)


# --------------------------------------------------------------------------------------------- traffic


class FluidWorkload(OracleView):
    """The engine model's session arrivals (same rate, same seeds), and the oracle's need from the nominal
    fluid: every turn served at the SLA operating point, no capacity limit."""

    def __init__(self, scenario: Scenario, seed: int, profile: Profile, calib: Calibration, unit: int) -> None:
        if scenario.trace:
            raise ValueError(f"{scenario.name}: the fluid model replays synthetic sessions only, not traces; "
                             "run traces with the engine model (--engine model)")  # fmt: skip
        self.scenario = scenario
        self.seed = seed
        self.profile = profile
        self.calib = calib
        self.unit = unit
        self.stats = st = SessionStats.sample(profile, unit, calib.nominal)
        self.rate = scenario.base_replicas * calib.capacity_per_rank / st.session_s
        self.starts = session_starts(scenario, self.rate, seed)
        # nominal fluid, sampled on the oracle's 5-s grid as the cumulative area under concurrency
        half, step = ORACLE_WINDOW_S / 2.0, 5.0
        lo, hi = -half, scenario.duration_s + half
        grid = [lo + i * step for i in range(int(math.ceil((hi - lo) / step)) + 1)]
        area = [0.0] * len(grid)
        serve, back, keep = TICK_S / st.turn_s, TICK_S / st.gap_s, 1.0 - 1.0 / st.turns
        inflight = gap = acc = 0.0
        t = -scenario.warmup_s
        j = k = 0
        starts = self.starts
        while k < len(grid):
            # as the fleet's fluid: rates on the state at the tick's start, arrivals served from the next
            turns = gap * back
            done = inflight * serve
            gap += done * keep - turns
            inflight += turns - done
            while j < len(starts) and starts[j] < t + TICK_S:
                inflight += 1.0
                j += 1
            t += TICK_S
            if t > lo:
                acc += inflight * (t - max(lo, t - TICK_S))
            while k < len(grid) and grid[k] <= t + 1e-9:
                area[k] = acc
                k += 1
        self.area_grid, self.area = grid, area
        self.oracle_gpu_hours, self.oracle_steps = self.oracle_at(1.0)

    def oracle_at(self, utilization: float) -> tuple[float, list[tuple[float, int]]]:
        return oracle_from_area(self.area_grid, self.area, self.calib.capacity_per_rank * utilization,
                                self.profile.gpus_per_replica, 0.0, self.scenario.duration_s)  # fmt: skip


# --------------------------------------------------------------------------------------------- the fleet


class _State:
    """One serving group's flows (one representative rank) and its metric counters."""

    __slots__ = ("inflight", "gap", "where", "gen", "done", "started", "hits", "w_tpot", "w_itl", "w_ttft", "tpot",
                 "itl", "ttft", "sums")  # fmt: skip

    def __init__(self, n_itl: int, n_ttft: int) -> None:
        self.inflight = 0.0
        self.gap = 0.0
        self.where = (0, 0.0)  # the curve's (index, fraction) at the current concurrency
        self.gen = self.done = self.started = self.hits = 0.0
        # observations since the last scrape, per curve point; cumulative per-bucket counts and sums
        self.w_tpot: dict[int, float] = {}
        self.w_itl: dict[int, float] = {}
        self.w_ttft: dict[int, float] = {}
        self.tpot = [0.0] * n_itl
        self.itl = [0.0] * n_itl
        self.ttft = [0.0] * n_ttft
        self.sums = [0.0, 0.0, 0.0]  # tpot, itl, ttft

    @property
    def sessions(self) -> float:
        return self.inflight + self.gap


def _spread(w: dict[int, float], where: tuple[int, float], x: float) -> None:
    i, f = where
    if f:
        w[i] = w.get(i, 0.0) + x * (1.0 - f)
        w[i + 1] = w.get(i + 1, 0.0) + x * f
    else:
        w[i] = w.get(i, 0.0) + x


class FluidSimulation(Simulation):
    engines = False

    def __init__(self, workload: FluidWorkload, policy: Policy, settings: Settings, curve: Curve,
                 oracle_lookahead_s: float | None = None) -> None:  # fmt: skip
        super().__init__(workload, policy, settings, oracle_lookahead_s)  # type: ignore[arg-type]
        if settings.all_ranks:
            raise ValueError("the fluid model simulates one representative rank per replica (no --all-ranks)")
        self.curve = curve
        st = workload.stats
        self.keep = 1.0 - 1.0 / st.turns
        self.st = st
        # A scenario with its own session model (a scenario file's `sessions:`): the load test's turns are the
        # default workload's, so its turn completions would be too; finish turns at the tokens emitted over
        # this workload's mean output instead (first order: the token rate at a concurrency stays the load
        # test's, whatever the contexts). The built-in scenarios keep the load test's completions exactly.
        self.per_turn = st.output_tokens if workload.scenario.sessions is not None else 0.0
        self.state: dict[int, _State] = {}  # by group serial
        self.router = 0.0  # turns waiting for any ready group
        # output tokens and finished turns of the measured window, spread over the curve's points
        self.w_tokens: dict[int, float] = {}
        self.w_done: dict[int, float] = {}
        self.n_itl = len(self.fleet.cfg.buckets["inter_token_latency"]) + 1
        self.n_ttft = len(curve.points[0].ttft)

    # ------------------------------------------------------------------ routing
    def _st(self, g: Group) -> _State:
        s = self.state.get(g.serial)
        if s is None:
            s = self.state[g.serial] = _State(self.n_itl, self.n_ttft)
        return s

    def _least(self, exclude: Group | None = None) -> _State | None:
        best, best_key = None, None
        for g in self.fleet.ready_list:
            if g is not exclude:
                s = self._st(g)
                key = (s.sessions, g.index)
                if best_key is None or key < best_key:
                    best, best_key = s, key
        return best

    def _start_turns(self, s: _State, x: float) -> None:
        s.inflight += x
        s.started += x
        s.hits += x * self.curve.at("prefix_hit_rate", *s.where)
        _spread(s.w_ttft, s.where, x)

    def _route_new(self, n: int) -> None:
        """`n` new sessions, one after the other, each to the replica with the fewest sessions (as `_route`)."""
        self.arrivals += n
        heap = [(self._st(g).sessions, g.index, self._st(g)) for g in self.fleet.ready_list]
        if not heap:
            self.router += n
            return
        heapq.heapify(heap)
        for _ in range(n):
            sessions, index, s = heap[0]
            self._start_turns(s, 1.0)
            heapq.heapreplace(heap, (s.sessions, index, s))

    def _route(self, x: float, exclude: Group | None = None) -> None:
        """`x` turns of sessions without a (usable) replica: to the one with the fewest sessions."""
        target = self._least(exclude)
        if target is None:
            self.router += x
        else:
            self._start_turns(target, x)

    # ------------------------------------------------------------------ time
    def _tick(self, t: float, dt: float, measured: bool, open_: bool) -> None:
        """Advance the flows by dt to t. Rates are taken at the state the tick starts from (so a gauge read
        between ticks is the concurrency the engine served at); turns that arrive during it are served from
        the next tick on. After the end (`open_` false) no new turn starts."""
        ready = self.fleet.ready_list
        states = [(g, self._st(g)) for g in self.fleet.serving()]
        curve = self.curve
        conc, comp, tok, ipt = curve.conc, curve.col["completions"], curve.col["tokens"], curve.col["itl_per_token"]
        c0, top = conc[0], conc[-1]
        per_turn = self.per_turn
        finished = []
        for g, s in states:
            a = s.inflight
            if a <= 1e-9:
                s.where = (0, 0.0)
                finished.append(0.0)
                continue
            if a <= c0 or a >= top:
                i, f = (0, 0.0) if a <= c0 else (len(conc) - 1, 0.0)
                scale = a / c0 if a < c0 else 1.0
                done = min(a, comp[i] * scale * dt)
                tokens = tok[i] * scale * dt
                itl = tokens * ipt[i]
            else:  # curve.locate and curve.at, inlined: this loop is most of the model's time
                i = bisect.bisect_right(conc, a) - 1
                f = (a - conc[i]) / (conc[i + 1] - conc[i])
                done = min(a, (comp[i] + f * (comp[i + 1] - comp[i])) * dt)
                tokens = (tok[i] + f * (tok[i + 1] - tok[i])) * dt
                itl = tokens * (ipt[i] + f * (ipt[i + 1] - ipt[i]))
            if per_turn:
                done = min(a, tokens / per_turn)
            s.where = where = (i, f)
            s.inflight = a - done
            s.gen += tokens
            s.done += done
            finished.append(done)
            _spread(s.w_tpot, where, done)
            _spread(s.w_itl, where, itl)
            if measured:
                # scored at the end from the load test's figures per point (linear in the weights)
                _spread(self.w_tokens, where, tokens)
                _spread(self.w_done, where, done)
        bound = AFFINITY_BOUND * sum(self._st(g).sessions for g in ready) / len(ready) + 1 if ready else 0.0
        back = dt / self.st.gap_s
        for (g, s), done in zip(states, finished):
            turns = s.gap * back if open_ else s.gap
            s.gap += done * self.keep - turns
            if not open_:
                s.gap = 0.0
                continue
            self.arrivals += turns  # next turns back from their tool gap, at the router before a replica
            if g.state == DRAINING:
                self._route(turns, g)
                continue
            over = s.sessions + turns - bound
            if over > 0 and len(ready) > 1:
                moved = min(turns, over)
                turns -= moved
                self._route(moved, g)
            self._start_turns(s, turns)
        for g, s in states:
            g.inflight = math.ceil(s.inflight - 0.5) if s.inflight > 0.5 else 0
            if g.state == DRAINING and s.inflight <= 0.5:
                self._finish_drain(g, s, t)

    def _finish_drain(self, g: Group, s: _State, now: float) -> None:
        s.inflight = 0.0
        g.inflight = 0
        self._finish_drain_sessions(g, s)
        self.fleet.finish_drain(g, now)
        self.prom.target_gone(g.pod, now)

    def _finish_drain_sessions(self, g: Group, s: _State) -> None:
        """A group is gone: its sessions in their tool gap take the replica with the fewest sessions."""
        gap, s.gap = s.gap, 0.0
        target = self._least(g)
        if target is not None:
            target.gap += gap
        else:
            self.router += gap  # no replica ready: their next turns will wait in the router

    def flush_router(self, now: float) -> None:
        x, self.router = self.router, 0.0
        if x > 0:
            self._route(x)

    # ------------------------------------------------------------------ events
    def on_scrape(self, now: float) -> None:
        curve = self.curve
        running = waiting = 0.0
        for g in self.fleet.serving():
            s = self._st(g)
            for w, hist, k, attr, mean in ((s.w_tpot, s.tpot, 0, "tpot", "tpot_mean"),
                                           (s.w_itl, s.itl, 1, "itl", "itl_mean"),
                                           (s.w_ttft, s.ttft, 2, "ttft", "ttft_mean")):  # fmt: skip
                for idx, x in w.items():
                    p = curve.points[idx]
                    for b, share in enumerate(getattr(p, attr)):
                        hist[b] += x * share
                    s.sums[k] += x * getattr(p, mean)
                w.clear()
            i, f = s.where
            run = min(s.inflight, curve.at("running", i, f))
            wait = s.inflight - run
            running += run * g.weight
            waiting += wait * g.weight
            self.prom.ingest(g.pod, g.pod, g.index, g.weight, Sample(
                t=now, running=run, waiting=wait, kv=curve.at("kv", i, f) if s.inflight > 0 else 0.0,
                gen_tokens=s.gen, itl_count=sum(s.itl), itl_sum=s.sums[1], itl_buckets=_cum(s.itl),
                ttft_count=sum(s.ttft), ttft_sum=s.sums[2], ttft_buckets=_cum(s.ttft),
                prompt_tokens=s.started * self.st.prompt_tokens, prompt_count=s.started,
                output_tokens_done=s.done * self.st.output_tokens, output_count=s.done,
                prefix_queries=s.started * self.st.prompt_tokens, prefix_hits=s.hits * self.st.prompt_tokens,
                tpot_count=sum(s.tpot), tpot_buckets=_cum(s.tpot),
            ))  # fmt: skip
        self.scrape_router(now)
        self.prom.forget_old(now)
        if self.s.timeline:
            self.record_timeline(now, running + waiting)

    def scale_to(self, want: int, now: float, startup: float | None = None) -> None:
        before = list(self.fleet.active)
        super().scale_to(want, now, startup)
        for g in before:
            if g.state == GONE and g.serial in self.state:  # drained at once: its idle sessions move
                s = self.state[g.serial]
                if s.gap > 0:
                    self._finish_drain_sessions(g, s)
            elif g.state == DRAINING:
                s = self._st(g)
                if s.inflight <= 0.5:
                    self._finish_drain(g, s, now)

    def run(self) -> Result:
        cpu0 = time.process_time()
        self.start_fleet(0.0)
        oracle = self.oracle_lookahead_s is not None
        self.push(0.0, _SCRAPE)
        self.push(self.off + (0.0 if oracle else self.policy.offset_s), _EVAL)
        starts = self.w.starts
        j = 0
        t = 0.0
        heap = self.heap
        hard_end = self.end + DRAIN_LIMIT_S
        while True:
            # the flows up to the next event, a tick at a time; a new session starts its first turn at once
            target = min(heap[0][0] if heap else math.inf, hard_end)
            while t < target - 1e-9:
                if t >= self.end and self.router <= 0.5 and self._idle():
                    target = t
                    break
                dt = min(TICK_S, target - t)
                self._tick(t + dt, dt, self.off <= t, t < self.end)
                k = j
                while j < len(starts) and starts[j] + self.off < min(t + dt, self.end):
                    j += 1
                if j > k:
                    self._route_new(j - k)
                t += dt
            if not heap or t >= hard_end or (t >= self.end and heap[0][0] > t + 1e-9):
                break
            now, _, kind, a, _b = heapq.heappop(heap)
            self.on_fleet_event(kind, a, now, oracle)
        # what is left past the drain limit is missed; below half a request per group, the flows are drained
        unfinished = sum(s.inflight for g, s in self._serving_states()) + self.router if t >= hard_end else 0.0
        gpu_hours = self.fleet.gpu_hours(self.off, self.end)
        cost = gpu_hours * self.s.gpu_hour_price
        w = self.fleet.rank_weight
        pts = self.curve.points
        met = sum(x * pts[k].attainment for k, x in self.w_tokens.items())
        self.requests = sum(self.w_done.values())
        self.prompt_tokens = self.requests * self.st.prompt_tokens
        total = sum(self.w_tokens.values()) + unfinished * self.st.output_tokens
        # per point, three atoms of speed: the slow fifth at its p90, the bulk at its p50, the fast fifth mirrored
        speeds = sorted((v, share * x) for k, x in self.w_tokens.items()
                        for v, share in ((pts[k].speed_p90, 0.2), (pts[k].speed_p50, 0.6),
                                         (2 * pts[k].speed_p50 - pts[k].speed_p90, 0.2)))  # fmt: skip
        ttfts = sorted((pts[k].ttft_mean, x) for k, x in self.w_done.items())
        reps = self.replica_series()
        return Result(
            policy=self.policy.name, scenario=self.sc.name, seed=self.w.seed,
            attainment=met / total if total else 1.0,
            speed_p90=weighted_quantile(speeds, 0.10), speed_p50=weighted_quantile(speeds, 0.50),
            ttft_p90_s=weighted_quantile(ttfts, 0.90), gpu_hours=gpu_hours,
            tokens_per_dollar=w * (self.prompt_tokens + total) / cost if cost else 0.0,
            output_tokens_per_dollar=w * total / cost if cost else 0.0,
            scale_actions=self.scale_actions, replicas_mean=reps[0], replicas_max=reps[1],
            requests=round(self.requests), unfinished=round(unfinished), output_tokens=round(total),
            sim_seconds=self.end, cpu_seconds=time.process_time() - cpu0, knob=self.policy.knob,
            knob_value=self.policy.knob_value, startup_median_s=self.startup_median_s, step_attainment=None,
            timeline=self.timeline if self.s.timeline else None,
            decisions=self._decisions() if self.s.decisions else None, **self.startup_fields(),
        )  # fmt: skip

    def _serving_states(self):
        return [(g, self._st(g)) for g in self.fleet.serving()]

    def _idle(self) -> bool:
        return all(s.inflight <= 0.5 for _, s in self._serving_states())


def _cum(counts: list[float]) -> tuple[float, ...]:
    out, acc = [], 0.0
    for c in counts[:-1]:
        acc += c
        out.append(acc)
    return tuple(out)


def run(workload: FluidWorkload, policy: Policy, settings: Settings, curve: Curve) -> Result:
    return FluidSimulation(workload, policy, settings, curve).run()


def run_oracle(workload: FluidWorkload, settings: Settings, curve: Curve, lookahead_s: float = 60.0) -> Result:
    from flashserve_testbed.bench.baselines.oracle import Oracle

    sim = FluidSimulation(workload, Oracle(), settings, curve, oracle_lookahead_s=lookahead_s)
    res = sim.run()
    res.gpu_hours = workload.oracle_gpu_hours
    cost = res.gpu_hours * settings.gpu_hour_price
    w = sim.fleet.rank_weight
    res.tokens_per_dollar = w * (sim.prompt_tokens + res.output_tokens) / cost if cost else 0.0
    res.output_tokens_per_dollar = w * res.output_tokens / cost if cost else 0.0
    return res
