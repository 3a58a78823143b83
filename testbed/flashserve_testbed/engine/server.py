"""The mock `vllm serve` HTTP layer: vLLM's OpenAI-compatible API, /health and /metrics in front of a
MockReplica (replica.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web
from flashserve.facts import router as router_facts

from flashserve_testbed.engine import metrics as prom
from flashserve_testbed.engine import render
from flashserve_testbed.engine import tokenizer as tok
from flashserve_testbed.engine.args import ServeArgs, check_host
from flashserve_testbed.engine.perfmodel import Request
from flashserve_testbed.engine.replica import (
    ENV_BIND_ANY,
    MockReplica,
    MockSettings,
    RequestError,
)

VLLM_VERSION = "0.33.0"


# ---------------------------------------------------------------------- HTTP layer
def _data_parallel_rank(request: web.Request) -> int | None:
    """The rank a router pinned the request to (`X-data-parallel-rank`), read as vLLM 0.33 reads it: a value
    that is not an integer is ignored, not refused."""
    value = request.headers.get(router_facts.DP_RANK_HEADER)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def _not_ready() -> web.Response:
    return _error(503, "The engine is still loading the model.", "ServiceUnavailableError")


class API:
    def __init__(self, mock: MockReplica) -> None:
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
        # what vllm-router asks a worker to turn a prompt into token ids (docs/vllm-router.md)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/v1/chat/completions/render", self.render_chat)
        r.add_post("/v1/completions/render", self.render_completion)
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
        text = prom.render(self.m.engines, self.m.args.model_name, self.m.cache_info())
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
            raise RequestError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        if body.get("n", 1) != 1:
            raise RequestError(400, "the mock engine supports n=1 only", param="n")
        return body

    async def _handle(self, request: web.Request, answer, scale_out: bool = False) -> web.StreamResponse:
        """The steps every API route shares: readiness, (for the render routes) vLLM's scale-out switch, the
        JSON body and the model name, then `answer(body, model)`; a RequestError becomes vLLM's error body."""
        if not self.m.ready or not self.m.engines:
            return _not_ready()
        if scale_out and not self.m.args.enable_scale_out:
            return _error(403, render.SCALE_OUT_DISABLED, "PermissionDeniedError")
        try:
            body = await self._body(request)
            return await answer(body, self.m.check_model(body.get("model")))
        except RequestError as e:
            return _error(e.status, e.message, e.kind, e.param)

    @staticmethod
    def _chat_text(body: dict) -> str:
        try:
            return tok.render_chat(body.get("messages"), body.get("tools"))
        except ValueError as e:
            raise RequestError(400, str(e), param="messages") from None

    @staticmethod
    def _one_prompt(body: dict) -> tuple[str | None, list[int] | None]:
        """A completion's prompt as (text, None) or (None, token ids): one prompt, as the mock serves."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return prompt, None
        if isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
            return None, list(prompt)
        raise RequestError(400, "prompt must be a non-empty string or token id list (one prompt)", param="prompt")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        async def answer(body, model):
            return await self._serve(request, body, model, self._chat_text(body), None, chat=True)

        return await self._handle(request, answer)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        async def answer(body, model):
            text, ids = self._one_prompt(body)
            return await self._serve(request, body, model, text, ids, chat=False)

        return await self._handle(request, answer)

    async def tokenize(self, request: web.Request) -> web.Response:
        async def answer(body, model):
            return web.json_response(render.tokenize(body, model, self.m.cfg.max_model_len))

        return await self._handle(request, answer)

    async def render_chat(self, request: web.Request) -> web.Response:
        async def answer(body, model):
            max_tokens = self._max_tokens(body, tok.count_tokens(render.chat_text(body)), None)
            return web.json_response(render.render_chat(body, model, max_tokens))

        return await self._handle(request, answer, scale_out=True)

    async def render_completion(self, request: web.Request) -> web.Response:
        async def answer(body, model):
            text, ids = self._one_prompt(body)
            ids = tok.prompt_token_ids(text) if text is not None else ids
            return web.json_response(render.render_completion(body, model, self._max_tokens(body, len(ids), 16), ids))

        return await self._handle(request, answer, scale_out=True)

    def _max_tokens(self, body: dict, prompt_tokens: int, default_max: int | None) -> int:
        """get_max_tokens: the request's limit (checked against the context as a completion is), else the room
        left in the context."""
        _, max_tokens, _ = self.m.output_length({**body, "ignore_eos": True}, prompt_tokens, default_max)
        return max_tokens if max_tokens is not None else self.m.cfg.max_model_len - prompt_tokens

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
        req = m.submit(prompt_tokens, out_len, hashes, prompt_tokens // bs, max_tokens, reason,
                       rank=_data_parallel_rank(request))
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
                if role:
                    delta = {"role": "assistant", "content": ""}
                else:
                    delta = {"content": delta_text} if delta_text else {}
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
    mock = MockReplica(args, settings)
    # In a container (bind_any) without --host, listen on every interface like `vllm serve` does, so the
    # kubelet's probes and the Service reach the pod IP; elsewhere loopback only.
    requested = "0.0.0.0" if settings.bind_any and not args.host_given else args.host
    host = check_host(requested, settings.bind_any)
    if host != requested:
        print(f"WARNING mock engine: binding {host} instead of {args.host} (set {ENV_BIND_ANY}=1 in a container "
              "to listen on other addresses)", file=sys.stderr)
    for w in args.warnings:
        print(f"WARNING {w}", file=sys.stderr)
    if args.ignored:
        print(f"INFO mock engine: ignoring flags it does not model {' '.join(args.ignored)}", file=sys.stderr)
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
    phases = asyncio.ensure_future(announce_phases(mock)) if mock.phases else None
    if ready_file is not None:
        ready_file(port)
    try:
        await asyncio.Event().wait()
    finally:
        if phases is not None:
            phases.cancel()
        await runner.cleanup()


async def announce_phases(mock: MockReplica, out=None) -> None:
    """The start-up the runtime modelled, as the log of a real start-up would show it: the plan (one JSON line
    a reader can parse), then a line as each phase ends, in engine seconds since the process started."""
    out = out or sys.stderr
    plan = {"cacheState": mock.settings.cache_state, "phases": mock.phases, "seconds": round(mock.startup_s, 3)}
    print(f"INFO mock engine: start-up plan {json.dumps(plan, separators=(',', ':'))}", file=out, flush=True)
    end = 0.0
    for name, seconds in mock.phases.items():
        if seconds <= 0:
            print(f"INFO mock engine: start-up phase {name} skipped ({mock.settings.cache_state})", file=out,
                  flush=True)
            continue
        end += seconds
        await asyncio.sleep(max(0.0, (end - mock.vnow()) / mock.scale))
        print(f"INFO mock engine: start-up phase {name} done, {seconds:.1f} engine-s (at {end:.1f})", file=out,
              flush=True)
