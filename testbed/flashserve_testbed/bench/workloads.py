"""Traffic for the benchmark: synthetic agentic sessions from a seed, and Mooncake-format trace replay.

Agentic sessions are the profile's calibrated coding-agent workload (engine/profiles/*.yaml `workload`): a
shared system prompt, a first turn, then turns that resend the whole conversation plus a new tool result, until
the context passes a per-session limit. Between turns the agent runs a tool (TOOL_GAP), so a session is in the
engine only part of the time. Sessions start by a non-homogeneous Poisson process whose rate follows the
scenario's shape (diurnal ramps, flash crowds) plus bursts (a CI fan-out starting many agents at once).

Everything a session does (prompt and output lengths, tool gaps) comes from its own random stream, seeded by
(run seed, session id): every policy sees exactly the same sessions, whatever the fleet does to their timing.

Traces are read by flashserve_testbed.traces: Mooncake traces (JSON lines `{"timestamp": ms, "input_length": n,
"output_length": n, "hash_ids": [...]}`, one hash id per 512-token block of the prompt) are replayed open loop;
aiperf multi-turn traces (turns sharing a `session_id`) closed loop, as TraceSessions.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from flashserve_testbed import traces
from flashserve_testbed.engine.profile import LogNormal, Profile
from flashserve_testbed.engine.profile import Workload as ProfileWorkload

# Time an agent spends in its tool between two turns (file reads in well under a second, test runs in tens of
# seconds): median 4 s, mean ~6.6 s, long tail.
TOOL_GAP = LogNormal(median=4.0, sigma=1.0, minimum=0.3, maximum=180.0)
MOONCAKE_BLOCK_TOKENS = 512
SESSION_ID_SHIFT = 24  # unit ids of a session's private blocks: (sid << 24) | unit index


@dataclass(frozen=True)
class SessionOverrides:
    """A scenario's changes to the session model and the engine profile (None: the profile's own)."""

    context_limit: tuple[int, int] | None = None
    system_prompt_tokens: int | None = None
    first_turn_tokens: LogNormal | None = None
    tool_result_tokens: LogNormal | None = None
    output_tokens: LogNormal | None = None
    tool_gap: LogNormal | None = None
    max_model_len: int | None = None

    def is_empty(self) -> bool:
        return all(getattr(self, f) is None for f in self.__dataclass_fields__)

    def apply(self, profile: Profile) -> Profile:
        w = profile.workload
        wl = ScenarioWorkload(
            output_tokens=self.output_tokens or w.output_tokens,
            shared_system_prompt_tokens=(w.shared_system_prompt_tokens if self.system_prompt_tokens is None
                                         else self.system_prompt_tokens),
            first_turn_tokens=self.first_turn_tokens or w.first_turn_tokens,
            tool_result_tokens=self.tool_result_tokens or w.tool_result_tokens,
            session_context_limit=self.context_limit or w.session_context_limit,
            tool_gap=self.tool_gap or getattr(w, "tool_gap", TOOL_GAP),
        )  # fmt: skip
        return replace(profile, workload=wl, max_model_len=self.max_model_len or profile.max_model_len)


@dataclass(frozen=True)
class ScenarioWorkload(ProfileWorkload):
    """The profile's workload with a scenario's tool gaps (the profile's own has none: TOOL_GAP)."""

    tool_gap: LogNormal = TOOL_GAP


@dataclass(frozen=True)
class Scenario:
    """One traffic pattern. Demand is sized in replicas: `base_replicas` is the fleet the base session rate
    needs at the SLA capacity, and the shape multiplies that rate over time."""

    name: str
    description: str
    duration_s: float
    base_replicas: float
    knots: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    """(time s, rate multiplier) points, linear in between and flat beyond the ends."""
    drift: float = 0.0
    """Relative amplitude of a slow sinusoidal wander of the rate."""
    drift_period_s: float = 5400.0
    bursts_per_hour: float = 0.0
    burst_minutes: float = 0.0
    """A burst starts as many sessions as this many minutes of base-rate arrivals..."""
    burst_spread_s: float = 60.0
    """...spread over this long."""
    warmup_s: float = 300.0
    """Traffic before t=0 on the initial fleet, with no autoscaling, so that caches, queues and metric windows
    are warm when measuring starts."""
    trace: str | None = None
    """Path of a Mooncake JSONL trace to replay instead of synthetic sessions."""
    startup_median_s: float | None = None
    """Median replica start-up; None: the engine profile's (7 min for the default profile)."""
    sessions: SessionOverrides | None = None
    """Changes to the session model and profile (scenario files' `sessions:` and `profile:`)."""

    def profile_for(self, profile: Profile) -> Profile:
        """The engine profile this scenario runs on: `profile` with the scenario's overrides."""
        return profile if self.sessions is None else self.sessions.apply(profile)

    @functools.cached_property
    def _knot_times(self) -> list[float]:
        return [t for t, _ in self.knots]

    def multiplier(self, t: float) -> float:
        k = self.knots
        if t <= k[0][0]:
            m = k[0][1]
        elif t >= k[-1][0]:
            m = k[-1][1]
        else:
            # the first knot at or after t (as the scan from the start found it), by bisection: shapes may have
            # many knots (a diurnal day sampled finely), and this is asked for every second simulated
            i = max(1, bisect.bisect_left(self._knot_times, t))
            (t0, m0), (t1, m1) = k[i - 1], k[i]
            m = m0 + (m1 - m0) * (t - t0) / (t1 - t0) if t1 > t0 else m1
        if self.drift:
            m *= 1.0 + self.drift * math.sin(2 * math.pi * t / self.drift_period_s)
        return max(0.0, m)

    def max_multiplier(self) -> float:
        return max(m for _, m in self.knots) * (1.0 + abs(self.drift))

    def scaled(self, **changes) -> Scenario:
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values.update(changes)
        return Scenario(**values)


MIN = 60.0
HOUR = 3600.0

# The built-in scenarios are data: bench/scenarios/NAME.yaml, read by the `--scenario-file` reader.
from flashserve_testbed.bench import scenario_file as _files  # noqa: E402  (it builds Scenarios of this module)

SCENARIOS: dict[str, Scenario] = {n: _files.builtin(n) for n in _files.BUILTIN_FILES}
QUICK_SCENARIO = _files.builtin(_files.QUICK_FILE)

DAY_SCENARIO = Scenario(
    name="day",
    description="24 hours of agentic traffic on a diurnal cycle: trough at 04:00 at 35% of the 16:00 peak",
    duration_s=24 * HOUR,
    base_replicas=1.0,
    knots=tuple((h * HOUR, 0.35 + 0.65 * (1 - math.cos(2 * math.pi * ((h - 4) % 24) / 24)) / 2)
                for h in range(25)),  # fmt: skip
    warmup_s=300.0,
)


# ----------------------------------------------------------------------------------------------- sessions


class Session:
    """One agentic session: its turns are drawn from its own stream, independent of timing."""

    __slots__ = ("sid", "rng", "w", "unit", "sys_units", "limit", "context", "turns", "hashes", "max_len",
                 "replica", "inflight", "done", "gaps")  # fmt: skip

    def __init__(self, sid: int, seed: int, profile: Profile, unit: int, max_model_len: int) -> None:
        self.sid = sid
        self.rng = random.Random(seed * 1_000_003 + sid)
        self.w = profile.workload
        self.unit = unit
        self.sys_units = self.w.shared_system_prompt_tokens // unit
        lo, hi = self.w.session_context_limit
        self.limit = self.rng.randint(lo, hi)
        self.context = 0
        self.turns = 0
        self.hashes: list[int] = []
        self.max_len = max_model_len
        self.replica = None  # the router's affinity
        self.inflight = False
        self.done = False
        self.gaps = getattr(self.w, "tool_gap", TOOL_GAP)

    def next_turn(self) -> tuple[int, int] | None:
        """(prompt tokens, output tokens) of the next turn, or None when the session is over."""
        if self.turns and self.context >= self.limit:
            self.done = True
            return None
        w, rng = self.w, self.rng
        if not self.turns:
            new = w.shared_system_prompt_tokens + int(w.first_turn_tokens.draw(rng))
        else:
            new = int(w.tool_result_tokens.draw(rng))
        prompt = self.context + new
        output = int(w.output_tokens.draw(rng))
        room = self.max_len - prompt
        if room < 1:
            self.done = True
            return None
        output = max(1, min(output, room))
        self.context = prompt + output
        self.turns += 1
        return prompt, output

    def gap(self, finished_at: float | None = None) -> float:
        """Seconds the agent's tool runs before its next turn."""
        return self.gaps.draw(self.rng)

    def shared_prefix_tokens(self) -> int:
        """Leading prompt tokens every session has (the engine keeps their KV blocks past the last full unit)."""
        return self.w.shared_system_prompt_tokens

    def block_hashes(self) -> list[int]:
        """Cache-unit ids covering the conversation so far (prompt and output of the last turn): the shared
        system prompt's units are the same for every session, the rest are the session's own, so a later
        turn hits on everything an earlier one computed. One more for the unit the conversation ends inside
        (the engine caches the KV blocks of it the turn computes, for the next turn, as vLLM does)."""
        units = -(-self.context // self.unit)
        h = self.hashes
        if len(h) < units:
            sys_units, base = self.sys_units, self.sid << SESSION_ID_SHIFT
            h.extend(j if j < sys_units else base | j for j in range(len(h), units))
        return h


def session_starts(scenario: Scenario, rate: float, seed: int) -> list[float]:
    """Start times in [-warmup, duration) of sessions at `rate` per second times the scenario's shape."""
    rng = random.Random(seed * 7919 + 17)
    out: list[float] = []
    lam_max = rate * scenario.max_multiplier()
    if lam_max > 0:
        t = -scenario.warmup_s
        while True:
            t += rng.expovariate(lam_max)
            if t >= scenario.duration_s:
                break
            if rng.random() * lam_max <= rate * scenario.multiplier(max(t, 0.0)):
                out.append(t)
    if scenario.bursts_per_hour > 0 and scenario.burst_minutes > 0:
        brng = random.Random(seed * 104729 + 3)
        n = max(1, round(scenario.burst_minutes * 60.0 * rate))
        t = 0.0
        while True:
            t += brng.expovariate(scenario.bursts_per_hour / HOUR)
            if t >= scenario.duration_s:
                break
            out.extend(t + brng.uniform(0.0, scenario.burst_spread_s) for _ in range(n))
    out = [x for x in out if x < scenario.duration_s]
    out.sort()
    return out


@dataclass(frozen=True)
class Nominal:
    """Service time of a turn at the SLA operating point, for sizing traffic and for the oracle's demand."""

    ttft_s: float
    tokens_per_s: float

    def turn_s(self, output_tokens: int) -> float:
        return self.ttft_s + max(0, output_tokens - 1) / self.tokens_per_s


@dataclass(frozen=True)
class SessionStats:
    """Means over the workload's sessions, per turn (the fluid model's parameters) and per session."""

    turns: float
    turn_s: float
    """Mean in-engine seconds of a turn at the nominal service."""
    gap_s: float
    prompt_tokens: float
    output_tokens: float
    session_s: float
    """Mean in-engine seconds of a session at the nominal service (`session_load`)."""

    @classmethod
    def sample(cls, profile: Profile, unit: int, nominal: Nominal, samples: int = 3000,
               seed: int = 99) -> SessionStats:  # fmt: skip
        turns = 0
        turn_s = gap = prompt = output = 0.0
        for sid in range(1, samples + 1):
            s = Session(sid, seed, profile, unit, profile.max_model_len)
            while (turn := s.next_turn()) is not None:
                turns += 1
                turn_s += nominal.turn_s(turn[1])
                prompt += turn[0]
                output += turn[1]
                gap += s.gap()
        return cls(turns / samples, turn_s / turns, gap / turns, prompt / turns, output / turns, turn_s / samples)


def session_load(profile: Profile, unit: int, nominal: Nominal, samples: int = 3000, seed: int = 99) -> float:
    """Mean in-engine seconds per session at the nominal service (concurrency per unit of session rate)."""
    return SessionStats.sample(profile, unit, nominal, samples, seed).session_s


# ----------------------------------------------------------------------------------------------- traces


@dataclass(frozen=True)
class TraceRequest:
    t: float
    """Arrival, seconds from the start of the trace."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = field(default=())


def trace_requests(trace: traces.Trace) -> list[TraceRequest]:
    """The requests of an open-loop (Mooncake) trace, sorted by time, the first at 0."""
    if trace.closed_loop:
        raise ValueError(f"{trace.source}: an aiperf multi-turn trace is replayed as sessions, not requests")
    return [TraceRequest(s.start_ms / 1000.0, t.input_length, t.output_length, t.hash_ids)
            for s in trace.sessions for t in s.turns]  # fmt: skip


def read_mooncake(path: str | Path) -> list[TraceRequest]:
    """Read a Mooncake trace (plain or gzipped; timestamps in milliseconds); requests come back sorted by time."""
    return trace_requests(traces.read(path))


class TraceSession(Session):
    """A session of an aiperf multi-turn trace, replayed closed loop: each turn's prompt is the conversation so
    far plus the turn's new tokens, the next turn comes its `delay` after the answer. A turn vLLM would refuse
    (prompt + output over max_model_len: HTTP 400) ends the session, counted in `refused`; every later turn
    would be longer still."""

    __slots__ = ("trace", "units", "pos", "refused", "start_s")

    def __init__(self, sid: int, trace: traces.Session, unit: int, max_model_len: int, start_s: float) -> None:
        self.sid = sid
        self.trace = trace
        self.unit = unit
        self.max_len = max_model_len
        self.context = 0
        self.turns = 0
        self.hashes: list[int] = []
        self.units: list = []  # cache-unit ids of the conversation, before chaining
        self.pos = 0
        self.refused = False
        self.start_s = start_s
        self.replica = None
        self.inflight = False
        self.done = False

    def shared_prefix_tokens(self) -> int:
        return 0  # a trace's sessions share what their hash ids say, in whole units

    def _extend(self, tokens: int, ids: tuple[int, ...]) -> None:
        """Append `tokens` tokens whose cache units take `ids` in order, then ids of the session's own."""
        end = self.pos + tokens
        first = -(-self.pos // self.unit)
        for k, j in enumerate(range(first, -(-end // self.unit))):
            self.units.append(("b", ids[k]) if k < len(ids) else ("s", self.sid, j))
        self.pos = end

    def next_turn(self) -> tuple[int, int] | None:
        if self.turns >= len(self.trace.turns):
            self.done = True
            return None
        turn = self.trace.turns[self.turns]
        prompt = self.context + turn.input_length
        if prompt + turn.output_length > self.max_len:
            self.refused = self.done = True
            return None
        self._extend(turn.input_length, turn.hash_ids)
        self._extend(turn.output_length, ())
        self.context = prompt + turn.output_length
        self.turns += 1
        return prompt, turn.output_length

    def gap(self, finished_at: float | None = None) -> float:
        """Seconds from the answer to the next turn: its delay, or until its timestamp."""
        if self.turns >= len(self.trace.turns):
            return 0.0
        nxt = self.trace.turns[self.turns]
        wait = nxt.delay_ms / 1000.0 if nxt.delay_ms is not None else 0.0
        if nxt.at_ms is not None and finished_at is not None:
            wait = max(wait, self.start_s + (nxt.at_ms - self.trace.start_ms) / 1000.0 - finished_at)
        return wait

    def block_hashes(self) -> list[int]:
        units = self.context // self.unit
        h = self.hashes
        if len(h) < units:
            prev = h[-1] if h else 0
            for u in self.units[len(h):units]:
                prev = hash((prev, u))
                h.append(prev)
        return h


def write_mooncake(path: str | Path, requests: Iterable[TraceRequest]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for r in requests:
            rec = {"timestamp": int(round(r.t * 1000)), "input_length": r.input_length,
                   "output_length": r.output_length, "hash_ids": list(r.hash_ids)}  # fmt: skip
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n += 1
    return n


def agentic_trace(profile: Profile, sessions_per_s: float, duration_s: float, nominal: Nominal,
                  seed: int = 0) -> Iterator[TraceRequest]:  # fmt: skip
    """Synthetic agentic sessions written down open loop, as a trace would record them: each turn arrives a
    nominal service time plus a tool gap after the previous one. Block ids follow Mooncake's convention:
    one id per 512-token block, shared blocks share ids."""
    rng = random.Random(seed)
    starts: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(sessions_per_s)
        if t >= duration_s:
            break
        starts.append(t)
    reqs: list[TraceRequest] = []
    next_id = profile.workload.shared_system_prompt_tokens // MOONCAKE_BLOCK_TOKENS
    for sid, start in enumerate(starts, 1):
        s = Session(sid, seed, profile, MOONCAKE_BLOCK_TOKENS, profile.max_model_len)
        ids: list[int] = list(range(s.sys_units))
        t = start
        while (turn := s.next_turn()) is not None:
            prompt, output = turn
            while len(ids) < prompt // MOONCAKE_BLOCK_TOKENS:
                ids.append(next_id)
                next_id += 1
            if t < duration_s:
                reqs.append(TraceRequest(t, prompt, output, tuple(ids[: prompt // MOONCAKE_BLOCK_TOKENS])))
            t += nominal.turn_s(output) + s.gap()
    reqs.sort(key=lambda r: r.t)
    return iter(reqs)


def chain_hashes(hash_ids: Iterable[int]) -> list[int]:
    """Chain block ids so that each key names its whole prefix (what the engine's prefix cache keys on)."""
    out, prev = [], 0
    for h in hash_ids:
        prev = hash((prev, h))
        out.append(prev)
    return out


def trace_groups(requests: list[TraceRequest]) -> list[int]:
    """A conversation key per request: its first block id that is not shared by many requests (the shared
    system prompt is), so that turns of one conversation fall in the same group."""
    counts: dict[int, int] = {}
    for r in requests:
        for h in set(r.hash_ids):
            counts[h] = counts.get(h, 0) + 1
    common = max(3, len(requests) // 100)
    out = []
    for i, r in enumerate(requests):
        key = next((h for h in r.hash_ids if counts[h] <= common), None)
        out.append(key if key is not None else -1 - i)
    return out
