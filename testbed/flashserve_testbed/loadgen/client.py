"""One streamed OpenAI chat completion, timed token by token (aiohttp: lighter than the openai client when a
single process drives hundreds of sessions)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from flashserve_testbed.loadgen.report import RequestRecord

ENDPOINT_HEADER = "X-FlashServe-Endpoint"


def chat_body(model: str, messages: list[dict], max_tokens: int, session: str | None = None) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        # vLLM's extension: generate exactly max_tokens, so the output length is the workload's draw
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if session:
        body["user"] = session
    return body


async def stream_chat(http: aiohttp.ClientSession, url: str, body: dict, record: RequestRecord, t0: float,
                      headers: dict | None = None, timeout: float = 600.0) -> str:
    """Send `body`, fill `record` (times relative to t0) and return the answer text."""
    parts: list[str] = []
    chunks = 0
    done = False
    finish: str | None = None
    try:
        async with http.post(url, json=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=10)) as resp:
            record.status = resp.status
            record.endpoint = resp.headers.get(ENDPOINT_HEADER)
            if resp.status != 200:
                record.error = (await resp.text())[:300] or f"HTTP {resp.status}"
                record.end = time.monotonic() - t0
                return ""
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                doc = json.loads(data)
                usage = doc.get("usage")
                if usage:
                    record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    record.completion_tokens = int(usage.get("completion_tokens") or 0)
                    record.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                for choice in doc.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        now = time.monotonic() - t0
                        if record.first is None:
                            record.first = now
                        record.end = now
                        parts.append(text)
                        chunks += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        record.error = f"{type(e).__name__}: {e}"[:300]
    if record.end is None:
        record.end = time.monotonic() - t0
    if not record.error and not done:
        # A proxy or engine that goes away mid-answer can end the body cleanly: the stream then simply stops.
        record.error = f"stream cut: ended after {chunks} chunks without [DONE]"
    elif not record.error and finish not in (None, "stop", "length"):
        record.error = f"stream ended with finish_reason {finish!r}"
    elif (not record.error and body.get("ignore_eos") and record.completion_tokens
          and record.completion_tokens < int(body.get("max_tokens") or 0)):
        record.error = f"truncated: {record.completion_tokens} of {body['max_tokens']} tokens"
    if not record.completion_tokens and not record.error:
        record.completion_tokens = chunks  # a server without usage: one token per chunk
    if not record.error and record.first is None:
        record.error = "no output tokens"
    return "".join(parts)
