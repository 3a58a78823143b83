"""A mock vLLM replica as one API server sees it: its DP engines, the scaled clock that drives them, the
routing of requests over the engines, and the sampling defaults that decide output lengths.

One asyncio task (the driver) advances every engine to the scaled wall clock and wakes the handlers waiting
for tokens. Engine time is virtual: with FLASHSERVE_MOCK_TIME_SCALE=10 a step the profile says takes 12 ms
passes in 1.2 ms of wall time, and every latency the metrics report is in engine seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass

from flashserve_testbed.engine import dprank
from flashserve_testbed.engine import metrics as prom
from flashserve_testbed.engine.args import ServeArgs
from flashserve_testbed.engine.perfmodel import Engine, EngineConfig, Request
from flashserve_testbed.engine.profile import Profile
from flashserve_testbed.engine.profile import load as load_profile

ENV_PROFILE = "FLASHSERVE_MOCK_PROFILE"
ENV_STARTUP = "FLASHSERVE_MOCK_STARTUP_SECONDS"
ENV_SCALE = "FLASHSERVE_MOCK_TIME_SCALE"
ENV_SEED = "FLASHSERVE_MOCK_SEED"
ENV_ROUTING = "FLASHSERVE_MOCK_DP_ROUTING"
ENV_BIND_ANY = "FLASHSERVE_MOCK_BIND_ANY"
ENV_TICK_MS = "FLASHSERVE_MOCK_TICK_MS"
# The start-up by phase the mock runtime chose from the caches the pod finds (runtime/startup.py):
# {"cacheState": "cold", "phases": {"pull": s, "download": s, "load": s, "compile": s, "warmup": s}}, engine seconds.
ENV_PHASES = "FLASHSERVE_MOCK_STARTUP_PHASES"
PHASE_NAMES = ("pull", "download", "load", "compile", "warmup")  # startup_model.PHASES


def parse_phases(text: str) -> tuple[str, dict[str, float]]:
    """(cache state, seconds per phase) of ENV_PHASES, or an error naming the variable and its form."""
    try:
        doc = json.loads(text)
        phases = {str(k): float(v) for k, v in (doc.get("phases") or {}).items()}
        state = str(doc.get("cacheState") or "")
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{ENV_PHASES} must be JSON {{\"cacheState\": ..., \"phases\": {{\"pull\": seconds, ...}}}}, "
                         f"got {text[:80]!r}") from None
    unknown = sorted(set(phases) - set(PHASE_NAMES))
    if unknown or any(v < 0 for v in phases.values()):
        raise ValueError(f"{ENV_PHASES}: phases are {', '.join(PHASE_NAMES)} with seconds >= 0, got {phases}")
    return state, {p: phases[p] for p in PHASE_NAMES if p in phases}


@dataclass
class MockSettings:
    """Mock-only knobs, from FLASHSERVE_MOCK_* environment variables."""

    profile: str | None = None
    startup_seconds: float | None = None  # engine seconds; None: the phases below, else drawn from the profile
    startup_phases: dict[str, float] | None = None  # engine seconds per phase, from the runtime's cache model
    cache_state: str = ""
    time_scale: float = 1.0
    seed: int | None = None
    dp_routing: str = "prefix"  # prefix: longest cached prefix among lightly loaded ranks; load: vLLM's score
    bind_any: bool = False
    tick_ms: float = 5.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "MockSettings":
        env = dict(os.environ if env is None else env)

        def num(key: str, kind=float):
            raw = env.get(key, "").strip()
            if not raw:
                return None
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} is not a number") from None

        s = cls(profile=env.get(ENV_PROFILE) or None)
        s.startup_seconds = num(ENV_STARTUP)
        if env.get(ENV_PHASES, "").strip():
            s.cache_state, s.startup_phases = parse_phases(env[ENV_PHASES])
        scale = num(ENV_SCALE)
        if scale is not None:
            if scale <= 0:
                raise ValueError(f"{ENV_SCALE} must be positive")
            s.time_scale = scale
        s.seed = num(ENV_SEED, int)
        routing = env.get(ENV_ROUTING, "prefix").strip() or "prefix"
        if routing not in ("prefix", "load"):
            raise ValueError(f"{ENV_ROUTING} must be 'prefix' or 'load'")
        s.dp_routing = routing
        s.bind_any = env.get(ENV_BIND_ANY, "") in ("1", "true", "yes")
        tick = num(ENV_TICK_MS)
        if tick is not None and tick > 0:
            s.tick_ms = tick
        return s


class _Stream:
    """Per-request state the handler and the driver share."""

    __slots__ = ("done", "sent", "engine")

    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self.done = loop.create_future()
        self.sent = 0
        self.engine = engine


class RequestError(Exception):
    """A request vLLM would refuse, with the HTTP status and OpenAI error type it answers with."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class MockReplica:
    def __init__(self, args: ServeArgs, settings: MockSettings, profile: Profile | None = None) -> None:
        self.args = args
        self.settings = settings
        self.profile = profile or load_profile(settings.profile)
        seed = settings.seed if settings.seed is not None else (args.seed or 0)
        self.seed = seed
        self.rng = random.Random(seed)
        p = self.profile
        overrides = dict(
            max_num_seqs=args.max_num_seqs or p.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens or p.max_num_batched_tokens,
            max_model_len=args.max_model_len or p.max_model_len,
            enable_prefix_caching=args.enable_prefix_caching,
            enable_chunked_prefill=args.enable_chunked_prefill,
            num_speculative_tokens=args.num_speculative_tokens,
            buckets=dict(args.custom_buckets),
        )
        self.cfg = EngineConfig.from_profile(
            p, block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization, **overrides
        )
        self.engines: list[tuple[int, Engine]] = []
        if not args.headless:
            for i, rank in enumerate(args.engine_ranks):
                cfg = EngineConfig(**{**self.cfg.__dict__})
                self.engines.append((rank, Engine(p, seed=seed * 1000 + i, config=cfg)))
        self.phases: dict[str, float] = {}  # the start-up by phase, when the runtime gave one
        if settings.startup_seconds is not None:
            self.startup_s = max(0.0, settings.startup_seconds)
        elif settings.startup_phases is not None:
            self.phases = dict(settings.startup_phases)
            self.startup_s = sum(self.phases.values())
        else:
            # pods sharing a seed still load at different speeds: the draw also depends on who this pod is
            who = f"{seed}|{socket.gethostname()}|{args.host}|{args.port}|{args.engine_ranks}"
            self.startup_s = p.draw_startup_seconds(random.Random(who))
        self.scale = settings.time_scale
        self.names = list(args.served_model_names)
        self.created = int(time.time())
        self._rr = 0
        self._dp_slack = dprank.slack(self.profile)
        self._wake: asyncio.Future | None = None
        self._tick = None
        self._driver: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.streams = 0

    def cache_info(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info`, from this replica's command line and engine config."""
        util = self.args.gpu_memory_utilization
        return prom.cache_config_info(
            self.engines,
            kv_cache_dtype=str(self.args.raw.get("--kv-cache-dtype", "auto")),
            gpu_memory_utilization=self.profile.gpu_memory_utilization if util is None else util,
            block_size_given=self.args.block_size is not None,
        )

    # ------------------------------------------------------------------ clock and driver
    def vnow(self) -> float:
        return (self.loop.time() - self.t0) * self.scale

    @property
    def ready(self) -> bool:
        return self.loop is not None and self.vnow() >= self.startup_s

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self._tick = asyncio.Event()
        self._driver = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        if self._driver:
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass

    def kick(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def sync(self) -> None:
        """Bring every engine to now and hand finished requests to their handlers."""
        now = self.vnow()
        for _, eng in self.engines:
            for req in eng.advance(now):
                st: _Stream = req.user
                if st is not None and not st.done.done():
                    st.done.set_result(None)

    async def _drive(self) -> None:
        tick_wall = self.settings.tick_ms / 1000.0
        while True:
            self.sync()
            old, self._tick = self._tick, asyncio.Event()
            old.set()
            now = self.vnow()
            nxt = None
            for _, eng in self.engines:
                t = eng.next_event_time()
                if t is not None and (nxt is None or t < nxt):
                    nxt = t
            wait = 1.0 if nxt is None else max(0.0, (nxt - now) / self.scale)
            if self.streams:
                wait = min(wait, tick_wall)
            wait = max(wait, 0.0005)
            fut = self.loop.create_future()
            self._wake = fut
            handle = self.loop.call_later(wait, _resolve, fut)
            try:
                await fut
            finally:
                handle.cancel()
                self._wake = None

    async def next_tick(self) -> None:
        await self._tick.wait()

    # ------------------------------------------------------------------ requests
    def check_model(self, model: object) -> str:
        if model is None:
            return self.names[0]
        if model not in self.names:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return str(model)

    def output_length(self, body: dict, prompt_tokens: int, default_max: int | None) -> tuple[int, int | None, str]:
        """(tokens to generate, the max_tokens parameter, finish reason), like vLLM's sampling defaults."""
        room = self.cfg.max_model_len - prompt_tokens
        if room < 1:
            raise RequestError(
                400,
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, your request "
                f"has {prompt_tokens} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens", default_max)
        if max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise RequestError(400, "max_tokens must be at least 1", param="max_tokens")
            if max_tokens > room:
                raise RequestError(
                    400,
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                    f"context length is {self.cfg.max_model_len} tokens and your request has {prompt_tokens} "
                    f"input tokens ({max_tokens} > {self.cfg.max_model_len} - {prompt_tokens}).",
                    param="max_tokens",
                )
        limit = max_tokens if max_tokens is not None else room
        if body.get("ignore_eos"):
            return limit, max_tokens, "length"
        seed = body.get("seed")
        rng = random.Random(seed) if isinstance(seed, int) and not isinstance(seed, bool) else self.rng
        natural = int(self.profile.workload.output_tokens.draw(rng))
        min_tokens = body.get("min_tokens") or 0
        if isinstance(min_tokens, int) and min_tokens > natural:
            natural = min_tokens
        if natural >= limit:
            return limit, max_tokens, "length"
        return max(1, natural), max_tokens, "stop"

    def choose_engine(self, keys: list[int], rank: int | None = None) -> Engine:
        """The engine that takes a request: the one `rank` names (vLLM's `X-data-parallel-rank` header, which
        vllm-router sends with --intra-node-data-parallel-size; an index into this pod's local engines, as
        under --data-parallel-hybrid-lb), else the balancer's choice (dprank.py)."""
        engines = [e for _, e in self.engines]
        if rank is not None:
            if not 0 <= rank < len(engines):
                raise RequestError(400, f"data_parallel_rank {rank} is out of range [0, {len(engines)}).")
            return engines[rank]
        start = self._rr
        self._rr = (self._rr + 1) % len(engines)
        i = dprank.choose(engines, keys, start, self._dp_slack, prefix=self.settings.dp_routing == "prefix")
        return engines[i]

    def submit(self, prompt_tokens: int, out_len: int, hashes: list[int], prompt_units: int,
               max_tokens: int | None, reason: str, rank: int | None = None) -> Request:
        eng = self.choose_engine(hashes[:prompt_units], rank)
        req = eng.add_request(
            uuid.uuid4().hex, prompt_tokens, out_len, self.vnow(), block_hashes=hashes,
            hashes_cover_output=True, hashes_chained=True, max_tokens=max_tokens, finish_reason=reason,
            user=_Stream(self.loop, eng),
        )
        self.kick()
        return req


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
