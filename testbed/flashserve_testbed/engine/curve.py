"""Speed-versus-concurrency curve of one engine under the profile's agentic workload (virtual time).

A fixed number of closed-loop clients each run coding-agent sessions against one engine: every turn resends
the whole conversation (shared system prompt + earlier turns + the new tool result), so most of each prompt
is a prefix-cache hit, and the next turn starts as soon as the previous answer ends. This is the setting of
the public figures the profiles are fitted to; the tests and docs/engine-speed-vs-concurrency.png use it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from flashserve_testbed.engine.perfmodel import Engine, EngineConfig
from flashserve_testbed.engine.profile import Profile


@dataclass
class CurvePoint:
    concurrency: int
    per_user_tokens_per_s: float  # median over requests of (output - 1) / decode time
    per_user_p10_tokens_per_s: float
    throughput_per_gpu: float  # (prompt incl. cached + output) tokens per second per engine (= per GPU)
    output_tokens_per_s: float
    ttft_median_s: float
    prompt_per_output: float
    cached_fraction: float
    kv_usage_mean: float
    preemptions: int
    requests: int


class _Session:
    __slots__ = ("sid", "context", "limit")

    def __init__(self, sid: int, limit: int) -> None:
        self.sid = sid
        self.context = 0
        self.limit = limit


class AgenticClients:
    """Closed-loop clients producing multi-turn agentic requests with block hashes."""

    def __init__(self, profile: Profile, engine: Engine, concurrency: int, seed: int) -> None:
        self.w = profile.workload
        self.engine = engine
        self.unit = engine.unit
        self.rng = random.Random(seed)
        self.sys_units = self.w.shared_system_prompt_tokens // self.unit
        self.next_sid = 0
        self.sessions = [self._new_session() for _ in range(concurrency)]

    def _new_session(self) -> _Session:
        self.next_sid += 1
        lo, hi = self.w.session_context_limit
        return _Session(self.next_sid, self.rng.randint(lo, hi))

    def issue(self, client: int, now: float):
        s = self.sessions[client]
        if s.context and s.context >= s.limit:
            s = self.sessions[client] = self._new_session()
        if not s.context:
            new = self.w.shared_system_prompt_tokens + int(self.w.first_turn_tokens.draw(self.rng))
        else:
            new = int(self.w.tool_result_tokens.draw(self.rng))
        prompt = s.context + new
        output = int(self.w.output_tokens.draw(self.rng))
        room = self.engine.cfg.max_model_len - prompt
        if room < 1:
            self.sessions[client] = self._new_session()
            return self.issue(client, now)
        output = max(1, min(output, room))
        units = (prompt + output) // self.unit
        sid, sys_units = s.sid, self.sys_units
        # a unit's id depends only on what precedes it, so later turns of the session share the earlier ones
        hashes = [j if j < sys_units else (sid << 24) | j for j in range(units)]
        s.context = prompt + output
        return self.engine.add_request(
            (client, s.sid, prompt), prompt, output, now,
            block_hashes=hashes, hashes_cover_output=True, hashes_chained=True, user=client,
        )


def simulate(
    profile: Profile,
    concurrency: int,
    *,
    duration_s: float = 120.0,
    warmup_s: float = 30.0,
    seed: int = 1,
    config: EngineConfig | None = None,
) -> CurvePoint:
    engine = Engine(profile, seed=seed, config=config)
    clients = AgenticClients(profile, engine, concurrency, seed + 1)
    rng = random.Random(seed + 2)
    # stagger the first requests so the clients do not move in lock-step
    starts = sorted((rng.uniform(0, 1.0), c) for c in range(concurrency))
    pending = list(starts)
    speeds: list[float] = []
    ttfts: list[float] = []
    kv_samples: list[float] = []
    end = warmup_s + duration_s
    base = None  # counters when measurement starts
    t = 0.0
    while t < end:
        nxt = engine.next_event_time()
        if pending and (nxt is None or pending[0][0] <= nxt):
            t, client = pending.pop(0)
            finished = engine.advance(t)
            clients.issue(client, t)
        else:
            if nxt is None:
                break
            t = nxt
            finished = engine.advance(t)
        if base is None and t >= warmup_s:
            base = _counters(engine)
        for req in finished:
            if req.finish_time >= warmup_s and req.first_token is not None and req.first_token >= warmup_s:
                v = req.tokens_per_second()
                if v is not None:
                    speeds.append(v)
                ttfts.append(req.first_token - req.arrival)
            if t < end:
                clients.issue(req.user, t)
        if t >= warmup_s and len(kv_samples) < 100000:
            kv_samples.append(engine.snapshot().kv_usage)
    engine.advance(end)
    speeds.sort()
    last = _counters(engine)
    prompt, cached, output, preemptions = (b - a for a, b in zip(base or (0, 0, 0, 0), last))
    return CurvePoint(
        concurrency=concurrency,
        per_user_tokens_per_s=statistics.median(speeds) if speeds else 0.0,
        per_user_p10_tokens_per_s=speeds[len(speeds) // 10] if speeds else 0.0,
        throughput_per_gpu=(prompt + output) / duration_s,
        output_tokens_per_s=output / duration_s,
        ttft_median_s=statistics.median(ttfts) if ttfts else 0.0,
        prompt_per_output=prompt / output if output else 0.0,
        cached_fraction=cached / prompt if prompt else 0.0,
        kv_usage_mean=statistics.fmean(kv_samples) if kv_samples else 0.0,
        preemptions=preemptions,
        requests=len(ttfts),
    )


def _counters(engine: Engine) -> tuple[int, int, int, int]:
    s = engine.stats
    return s.prompt_tokens, s.prompt_tokens_cached, engine.generation_tokens(), s.preemptions


def curve(profile: Profile, concurrencies, **kw) -> list[CurvePoint]:
    return [simulate(profile, c, **kw) for c in concurrencies]


def concurrency_at_speed(points: list[CurvePoint], tokens_per_s: float) -> float | None:
    """Interpolated concurrency at which the median per-user speed falls to `tokens_per_s`."""
    for a, b in zip(points, points[1:]):
        if a.per_user_tokens_per_s >= tokens_per_s >= b.per_user_tokens_per_s:
            span = a.per_user_tokens_per_s - b.per_user_tokens_per_s
            f = 0.0 if span == 0 else (a.per_user_tokens_per_s - tokens_per_s) / span
            return a.concurrency + f * (b.concurrency - a.concurrency)
    return None
