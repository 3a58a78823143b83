"""The mock `vllm serve`: vLLM's OpenAI-compatible API and /metrics in front of the engine model.

One asyncio task (the driver) advances every engine of this API server to the scaled wall clock and wakes the
handlers waiting for tokens. Engine time is virtual: with FLASHSERVE_MOCK_TIME_SCALE=10 a step the profile
says takes 12 ms passes in 1.2 ms, and every latency the metrics report is in engine seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from flashserve.engine import metrics as prom
from flashserve.engine import tokenizer as tok
from flashserve.engine.args import ServeArgs, check_host
from flashserve.engine.perfmodel import Engine, EngineConfig, Request
from flashserve.engine.profile import Profile
from flashserve.engine.profile import load as load_profile

VLLM_VERSION = "0.33.0"
ENV_PROFILE = "FLASHSERVE_MOCK_PROFILE"
ENV_STARTUP = "FLASHSERVE_MOCK_STARTUP_SECONDS"
ENV_SCALE = "FLASHSERVE_MOCK_TIME_SCALE"
ENV_SEED = "FLASHSERVE_MOCK_SEED"
ENV_ROUTING = "FLASHSERVE_MOCK_DP_ROUTING"
ENV_BIND_ANY = "FLASHSERVE_MOCK_BIND_ANY"
ENV_TICK_MS = "FLASHSERVE_MOCK_TICK_MS"


@dataclass
class MockSettings:
    """Mock-only knobs, from FLASHSERVE_MOCK_* environment variables."""

    profile: str | None = None
    startup_seconds: float | None = None  # engine seconds; None: drawn from the profile
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


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class MockEngine:
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
        if settings.startup_seconds is not None:
            self.startup_s = max(0.0, settings.startup_seconds)
        else:
            self.startup_s = p.draw_startup_seconds(random.Random(seed + 7919))
        self.scale = settings.time_scale
        self.names = list(args.served_model_names)
        self.created = int(time.time())
        self._rr = 0
        self._wake: asyncio.Future | None = None
        self._tick = None
        self._driver: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.streams = 0

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
            raise HTTPError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return str(model)

    def output_length(self, body: dict, prompt_tokens: int, default_max: int | None) -> tuple[int, int | None, str]:
        """(tokens to generate, the max_tokens parameter, finish reason), like vLLM's sampling defaults."""
        room = self.cfg.max_model_len - prompt_tokens
        if room < 1:
            raise HTTPError(
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
                raise HTTPError(400, "max_tokens must be at least 1", param="max_tokens")
            if max_tokens > room:
                raise HTTPError(
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

    def choose_engine(self, keys: list[int]) -> Engine:
        engines = self.engines
        n = len(engines)
        start = self._rr
        self._rr = (self._rr + 1) % n
        order = [engines[(start + i) % n][1] for i in range(n)]
        best = min(order, key=lambda e: e.load_score())
        if n == 1 or self.settings.dp_routing != "prefix" or not keys:
            return best
        floor = best.load_score()
        slack = max(4, floor // 4)
        hits = [(e.cached_prefix_units(keys), -e.load_score(), e) for e in order if e.load_score() <= floor + slack]
        top = max(hits, key=lambda h: (h[0], h[1]))
        return top[2] if top[0] > 0 else best

    def submit(self, prompt_tokens: int, out_len: int, hashes: list[int], prompt_units: int,
               max_tokens: int | None, reason: str) -> Request:
        eng = self.choose_engine(hashes[:prompt_units])
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


# ---------------------------------------------------------------------- HTTP layer
def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def _not_ready() -> web.Response:
    return _error(503, "The engine is still loading the model.", "ServiceUnavailableError")


class API:
    def __init__(self, mock: MockEngine) -> None:
        self.m = mock

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app) -> None:
        await self.m.start()

    async def _on_cleanup(self, app) -> None:
        await self.m.stop()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200) if self.m.ready else web.Response(status=503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.m.ready:
            return _not_ready()
        self.m.sync()
        text = prom.render(self.m.engines, self.m.args.model_name)
        return web.Response(body=text.encode(), headers={"Content-Type": prom.CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        if not self.m.ready or not self.m.engines:
            return _not_ready()
        data = [
            {
                "id": name, "object": "model", "created": self.m.created, "owned_by": "vllm",
                "root": self.m.args.model, "parent": None, "max_model_len": self.m.cfg.max_model_len,
            }
            for name in self.m.names
        ]
        return web.json_response({"object": "list", "data": data})

    async def _body(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise HTTPError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "request body must be a JSON object")
        if body.get("n", 1) != 1:
            raise HTTPError(400, "the mock engine supports n=1 only", param="n")
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if not self.m.ready or not self.m.engines:
            return _not_ready()
        try:
            body = await self._body(request)
            model = self.m.check_model(body.get("model"))
            try:
                text = tok.render_chat(body.get("messages"), body.get("tools"))
            except ValueError as e:
                raise HTTPError(400, str(e), param="messages") from None
            return await self._serve(request, body, model, text, None, chat=True)
        except HTTPError as e:
            return _error(e.status, e.message, e.kind, e.param)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if not self.m.ready or not self.m.engines:
            return _not_ready()
        try:
            body = await self._body(request)
            model = self.m.check_model(body.get("model"))
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str) and prompt:
                return await self._serve(request, body, model, prompt, None, chat=False)
            if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
                return await self._serve(request, body, model, None, prompt, chat=False)
            raise HTTPError(400, "prompt must be a non-empty string or list of token ids (one prompt)", param="prompt")
        except HTTPError as e:
            return _error(e.status, e.message, e.kind, e.param)

    async def _serve(self, request, body, model, text, ids, chat: bool) -> web.StreamResponse:
        m = self.m
        bs = m.cfg.block_size
        if text is not None:
            prompt_tokens = tok.count_tokens(text)
            offset = tok.output_offset(text)
        else:
            prompt_tokens = len(ids)
            offset = tok.output_offset(ids)
        out_len, max_tokens, reason = m.output_length(body, prompt_tokens, None if chat else 16)
        if text is not None:
            hashes = tok.text_block_hashes(text + tok.output_text(offset, 0, out_len), bs)
        else:
            hashes = tok.id_block_hashes(list(ids) + tok.output_token_ids(offset, out_len), bs)
        req = m.submit(prompt_tokens, out_len, hashes, prompt_tokens // bs, max_tokens, reason)
        rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        created = int(time.time())
        stream = bool(body.get("stream"))
        try:
            if stream:
                opts = body.get("stream_options") or {}
                return await self._stream(request, req, rid, created, model, offset, chat,
                                          bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats")))
            await _until_done(request, req)
            if not req.finished:
                return web.Response(status=499)  # client went away; the finally clause aborts the request
            content = tok.output_text(offset, 0, req.emitted)
            choice = {"index": 0, "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": [],
                                     "reasoning_content": None}
            else:
                choice["text"] = content
            return web.json_response({
                "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model, "choices": [choice], "usage": _usage(req),
            })
        finally:
            if not req.finished:
                req.user.engine.abort(req, m.vnow())

    async def _stream(self, request, req: Request, rid, created, model, offset, chat, include_usage,
                      continuous) -> web.StreamResponse:
        m = self.m
        eng = req.user.engine
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, role: bool = False) -> bytes:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": delta_text} if delta_text else {})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}
            doc = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
            if include_usage and continuous:
                doc["usage"] = _usage(req, eng.emitted(req))
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        m.streams += 1
        try:
            if chat:
                await resp.write(chunk(None, None, role=True))
            st: _Stream = req.user
            while True:
                done = st.done.done()
                n = eng.emitted(req)
                if n > st.sent:
                    text = tok.output_text(offset, st.sent, n)
                    st.sent = n
                    last = done and n >= req.emitted
                    await resp.write(chunk(text, req.finish_reason if last else None))
                    if last:
                        break
                elif done:
                    await resp.write(chunk(None, req.finish_reason))
                    break
                await m.next_tick()
            if include_usage:
                doc = {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                       "usage": _usage(req)}
                await resp.write(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            eng.abort(req, m.vnow())
            raise
        finally:
            m.streams -= 1
        return resp


async def _until_done(request: web.Request, req: Request) -> None:
    """Wait for a non-streamed request, giving up (so it can be aborted, as vLLM does) if the client leaves."""
    done = req.user.done
    while not done.done():
        await asyncio.wait([done], timeout=0.5)
        transport = request.transport
        if not done.done() and (transport is None or transport.is_closing()):
            return


def _usage(req: Request, completion: int | None = None) -> dict:
    done = req.emitted if completion is None else completion
    return {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + done,
        "completion_tokens": done,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


async def serve(args: ServeArgs, settings: MockSettings, ready_file=None) -> None:
    """Run until cancelled."""
    mock = MockEngine(args, settings)
    host = check_host(args.host, settings.bind_any)
    if host != args.host:
        print(f"WARNING mock engine: binding {host} instead of {args.host} (set {ENV_BIND_ANY}=1 in a container "
              "to listen on other addresses)", file=sys.stderr)
    for w in args.warnings:
        print(f"WARNING {w}", file=sys.stderr)
    if args.ignored:
        print(f"INFO mock engine: ignoring GPU-only flags {' '.join(args.ignored)}", file=sys.stderr)
    runner = web.AppRunner(API(mock).app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, args.port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else args.port
    ranks = ",".join(str(r) for r, _ in mock.engines) or "none (headless)"
    print(
        f"INFO mock vLLM {VLLM_VERSION} serving {', '.join(mock.names)} on http://{host}:{port} "
        f"(profile {mock.profile.name}, engines {ranks}, {mock.cfg.num_blocks} KV blocks/engine, "
        f"ready in {mock.startup_s:.0f} engine-s, time scale {mock.scale:g})",
        file=sys.stderr, flush=True,
    )
    if ready_file is not None:
        ready_file(port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
