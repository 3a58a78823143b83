"""What a load test on one replica would tell an operator before autoscaling: the engine model's steady-state
speed, throughput and memory at fixed concurrency on the benchmark's agentic workload.

From it come the concurrency per replica at the SLA (the oracle's capacity and the target the
concurrency-based baselines are given), the nominal service time used to size traffic, and the decode
profile NVIDIA Dynamo's planner interpolates (its pre-deployment profiling).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from flashserve_testbed.bench.fleet import engine_config
from flashserve_testbed.bench.prom import bucket_quantile
from flashserve_testbed.bench.workloads import Nominal, Session
from flashserve_testbed.engine.perfmodel import Engine
from flashserve_testbed.engine.profile import Profile

SEED = 4242  # calibration does not depend on the run seed: it is the operator's one-off load test


@dataclass(frozen=True)
class Point:
    concurrency: int
    """Requests kept in one engine (one GPU, one data-parallel rank)."""
    attainment: float
    """Share of output tokens from requests at or above the SLA speed."""
    speed_p50: float
    speed_p90: float
    """Per-request speed that 90% of tokens meet or beat."""
    itl_speed_p90: float
    """What the autoscaler's PromQL reads: tokens per step / ITL quantile 0.9 of the engine's histogram."""
    itl_per_token_s: float
    """Mean decode time per output token (Dynamo's ITL)."""
    output_tokens_per_s: float
    """Per engine = per GPU."""
    ttft_mean_s: float
    kv_usage: float
    waiting: float


@dataclass(frozen=True)
class Calibration:
    profile: str
    sla_tokens_per_s: float
    target_attainment: float
    points: tuple[Point, ...]
    capacity_per_rank: float
    """Concurrency per engine at which the steady-state attainment falls to `target_attainment`."""
    engines_per_replica: int
    gpus_per_replica: int
    prefill_tokens_per_s_per_gpu: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    nominal: Nominal = field(default=Nominal(0.05, 105.0))

    @property
    def capacity_per_replica(self) -> float:
        return self.capacity_per_rank * self.engines_per_replica

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        """Read back the calibration.json a benchmark run wrote (raises TypeError/KeyError when it is not one)."""
        d = {k: v for k, v in data.items() if k != "capacity_per_replica"}
        d["points"] = tuple(Point(**p) for p in d["points"])
        if "nominal" in d:
            d["nominal"] = Nominal(**d["nominal"])
        return cls(**d)

    def at(self, concurrency: float, attr: str) -> float:
        """Linear interpolation of a measured quantity in concurrency (per engine)."""
        pts = self.points
        if concurrency <= pts[0].concurrency:
            return getattr(pts[0], attr)
        for a, b in zip(pts, pts[1:]):
            if a.concurrency <= concurrency <= b.concurrency:
                f = (concurrency - a.concurrency) / (b.concurrency - a.concurrency)
                return getattr(a, attr) + f * (getattr(b, attr) - getattr(a, attr))
        return getattr(pts[-1], attr)

    def decode_profile(self) -> list[tuple[float, float]]:
        """(decode throughput per GPU, ITL per token) pairs, the table Dynamo's profiler produces."""
        return [(p.output_tokens_per_s, p.itl_per_token_s) for p in self.points]


@dataclass
class LoadTest:
    """Everything one steady-state run measured: the point, plus the engine's histograms over the measured
    window (per-bucket counts, +Inf last) and its totals, from which the fluid model synthesizes metrics."""

    point: Point
    seconds: float
    finished: int
    started: int
    running: float
    """Mean requests running (the rest of the concurrency waits in the engine)."""
    tpot: tuple[float, ...]
    tpot_sum: float
    itl: tuple[float, ...]
    itl_sum: float
    ttft: tuple[float, ...]
    ttft_sum: float
    prefix_hit_rate: float = 0.0
    """Share of prompt tokens found in the prefix cache over the measured window."""


def steady_point(profile: Profile, concurrency: int, sla: float, duration_s: float, warmup_s: float,
                 seed: int = SEED) -> Point:  # fmt: skip
    """Keep `concurrency` agentic requests in one engine (each finished turn is replaced at once)."""
    return load_test(profile, concurrency, sla, duration_s, warmup_s, seed).point


def load_test(profile: Profile, concurrency: int, sla: float, duration_s: float, warmup_s: float,
              seed: int = SEED, gaps: bool = False) -> LoadTest:  # fmt: skip
    """`concurrency` sessions on one engine. Without `gaps` each finished turn is replaced at once (the
    concurrency is exact); with `gaps` a session sends its next turn after its tool gap, as in the scenarios,
    so the engine also holds the cached prefixes of sessions between turns, and `point.concurrency` is the
    mean number of requests in the engine."""
    cfg = engine_config(profile, sla)
    eng = Engine(profile, seed=seed, config=cfg)
    rng = random.Random(seed + concurrency)
    next_sid = [0]

    def new_session() -> Session:
        next_sid[0] += 1
        return Session(next_sid[0], seed + concurrency, profile, eng.unit, cfg.max_model_len)

    sessions = [new_session() for _ in range(concurrency)]
    started = [0]
    finished = 0

    def issue(i: int, now: float) -> None:
        s = sessions[i]
        turn = s.next_turn()
        while turn is None:
            s = sessions[i] = new_session()
            turn = s.next_turn()
        eng.add_request(None, turn[0], turn[1], now, block_hashes=s.block_hashes(), hashes_cover_output=True,
                        hashes_chained=True, user=i,
                        shared_prefix_tokens=profile.workload.shared_system_prompt_tokens)  # fmt: skip
        if now >= warmup_s:
            started[0] += 1

    pending = sorted((rng.uniform(0.0, 1.0) * (8.0 if gaps else 1.0), i) for i in range(concurrency))
    later: list[tuple[float, int]] = []
    for t0, i in pending:
        if gaps:
            heapq.heappush(later, (t0, i))
        else:
            issue(i, t0)
    end = warmup_s + duration_s
    in_engine = 0 if gaps else concurrency
    area = 0.0
    last = warmup_s
    speeds: list[tuple[float, int]] = []
    decode_time = decode_tokens = ttft = 0.0
    n_ttft = 0
    kv = waiting = running = 0.0
    n_kv = 0
    base = None
    one_token0 = 0
    gen0 = None
    t = 0.0
    st = eng.stats
    while True:
        nxt = eng.next_event_time()
        if later and (nxt is None or later[0][0] < nxt):
            nxt = later[0][0]
        if nxt is None or nxt > end:
            break
        t = nxt
        if base is None and t >= warmup_s:
            base = {h: (list(getattr(st, h).counts), getattr(st, h).total) for h in ("itl", "tpot", "ttft")}
            one_token0 = st.req_generation_tokens.counts[0]
            gen0 = (eng.generation_tokens(), t)
            prefix0 = (st.prefix_queries, st.prefix_hits)
        finished_now = eng.advance(t)
        if t > warmup_s:
            area += in_engine * (t - max(last, warmup_s))
            last = t
        for req in finished_now:
            if t >= warmup_s:
                finished += 1
            if req.first_token is not None and req.first_token >= warmup_s:
                v = req.tokens_per_second()
                if v is not None:
                    speeds.append((v, req.emitted))
                    decode_time += req.finish_time - req.first_token
                    decode_tokens += req.emitted - 1
                ttft += req.first_token - req.arrival
                n_ttft += 1
            if gaps:
                in_engine -= 1
                heapq.heappush(later, (t + sessions[req.user].gap(), req.user))
            else:
                issue(req.user, t)
        while later and later[0][0] <= t:
            issue(heapq.heappop(later)[1], t)
            in_engine += 1
        if t >= warmup_s:
            snap = eng.snapshot()
            kv += snap.kv_usage
            waiting += snap.waiting
            running += snap.running
            n_kv += 1
    eng.advance(end)
    delta = {}
    for h in ("itl", "tpot", "ttft"):
        hist = getattr(st, h)
        counts0, total0 = base[h] if base else ([0] * len(hist.counts), 0.0)
        delta[h] = (tuple(float(b - a) for a, b in zip(counts0, hist.counts)), hist.total - total0)
    # The zeros vLLM records for one-token requests sit in the lowest TPOT bucket; the autoscaler's reading
    # takes them out (promql.Queries.tpot_at_percentile), so the fluid model's TPOT mixture leaves them out too.
    one_token = st.req_generation_tokens.counts[0] - one_token0
    tpot_counts = list(delta["tpot"][0])
    tpot_counts[0] -= one_token
    delta["tpot"] = (tuple(tpot_counts), delta["tpot"][1])
    cum, acc = [], 0.0
    for c in delta["itl"][0]:
        acc += c
        cum.append(acc)
    q90 = bucket_quantile(0.9, tuple(st.itl.bounds), cum)
    tps = profile.accepted_per_step(cfg.num_speculative_tokens)
    seconds = end - gen0[1] if gen0 else 0.0
    out_rate = (eng.generation_tokens() - gen0[0]) / seconds if gen0 else 0.0
    if gaps:
        area += in_engine * max(0.0, end - max(last, warmup_s))
    point = Point(
        concurrency=area / duration_s if gaps else concurrency,
        attainment=_attainment(speeds, sla),
        speed_p50=_weighted_quantile(speeds, 0.5),
        speed_p90=_weighted_quantile(speeds, 0.1),
        itl_speed_p90=tps / q90 if q90 else 0.0,
        itl_per_token_s=decode_time / decode_tokens if decode_tokens else 0.0,
        output_tokens_per_s=out_rate,
        ttft_mean_s=ttft / n_ttft if n_ttft else 0.0,
        kv_usage=kv / n_kv if n_kv else 0.0,
        waiting=waiting / n_kv if n_kv else 0.0,
    )
    return LoadTest(
        point=point, seconds=seconds, finished=finished, started=started[0],
        running=running / n_kv if n_kv else 0.0,
        tpot=delta["tpot"][0], tpot_sum=delta["tpot"][1], itl=delta["itl"][0], itl_sum=delta["itl"][1],
        ttft=delta["ttft"][0], ttft_sum=delta["ttft"][1],
        prefix_hit_rate=(st.prefix_hits - prefix0[1]) / max(1, st.prefix_queries - prefix0[0]) if gen0 else 0.0,
    )  # fmt: skip


def _attainment(speeds: list[tuple[float, int]], sla: float) -> float:
    total = sum(n for _, n in speeds)
    return sum(n for v, n in speeds if v >= sla) / total if total else 1.0


def _weighted_quantile(speeds: list[tuple[float, int]], q: float) -> float:
    """Token-weighted quantile of per-request speed (q=0.1: the speed 90% of tokens meet or beat)."""
    if not speeds:
        return 0.0
    s = sorted(speeds)
    total = sum(n for _, n in s)
    acc = 0.0
    for v, n in s:
        acc += n
        if acc >= q * total:
            return v
    return s[-1][0]


def calibrate(profile: Profile, sla: float = 100.0, target_attainment: float = 0.99, quick: bool = False,
              progress=None) -> Calibration:  # fmt: skip
    grid = (8, 24, 32, 40, 48, 64) if quick else (4, 8, 16, 24, 28, 32, 36, 40, 44, 48, 56, 64, 80)
    duration, warmup = (100.0, 20.0) if quick else (240.0, 40.0)
    points = []
    for c in grid:
        points.append(steady_point(profile, c, sla, duration, warmup))
        if progress:
            progress(f"calibration: {c} requests/GPU -> attainment {points[-1].attainment:.3f}, "
                     f"speed p50 {points[-1].speed_p50:.0f} tok/s")  # fmt: skip
    cap = _crossing(points, "attainment", target_attainment)
    speed_at_cap = _interp(points, cap, "speed_p50")
    ttft_at_cap = _interp(points, cap, "ttft_mean_s")
    # Prefill alone: t = fixed + d * P per step, so a long prompt goes through at ~1/d tokens per second
    prefill_rate = 1.0 / profile.step.per_prefill_token_s
    w = profile.workload
    return Calibration(
        profile=profile.name,
        sla_tokens_per_s=sla,
        target_attainment=target_attainment,
        points=tuple(points),
        capacity_per_rank=cap,
        engines_per_replica=profile.engines_per_replica,
        gpus_per_replica=profile.gpus_per_replica,
        prefill_tokens_per_s_per_gpu=prefill_rate,
        mean_prompt_tokens=float(w.shared_system_prompt_tokens + w.first_turn_tokens.mean),
        mean_output_tokens=float(w.output_tokens.mean),
        nominal=Nominal(ttft_s=ttft_at_cap, tokens_per_s=speed_at_cap),
    )


def _interp(points: list[Point], c: float, attr: str) -> float:
    for a, b in zip(points, points[1:]):
        if a.concurrency <= c <= b.concurrency:
            f = (c - a.concurrency) / (b.concurrency - a.concurrency)
            return getattr(a, attr) + f * (getattr(b, attr) - getattr(a, attr))
    return getattr(points[0] if c < points[0].concurrency else points[-1], attr)


def _crossing(points: list[Point], attr: str, level: float) -> float:
    """Largest concurrency (interpolated) at which `attr` is still >= level, scanning up the grid."""
    prev = None
    for p in points:
        v = getattr(p, attr)
        if v < level:
            if prev is None:
                return float(p.concurrency)
            pv = getattr(prev, attr)
            f = (pv - level) / (pv - v) if pv != v else 0.0
            return prev.concurrency + f * (p.concurrency - prev.concurrency)
        prev = p
    return float(points[-1].concurrency)
