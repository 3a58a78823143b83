"""Driving the load: closed-loop agentic sessions following a schedule, or a trace replay (Mooncake open loop,
aiperf multi-turn sessions closed loop).

Bounded by construction: a run ends at the schedule's end (or `duration`, or `max_requests`), then gives
requests still in flight `drain_seconds` to finish and cancels the rest.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Callable

import aiohttp

from flashserve_testbed import traces
from flashserve_testbed.loadgen import mooncake
from flashserve_testbed.loadgen import schedule as schedule_mod
from flashserve_testbed.loadgen.client import chat_body, stream_chat
from flashserve_testbed.loadgen.report import LoadReport, RequestRecord, percentile
from flashserve_testbed.loadgen.workload import Session, Words, Workload

Progress = Callable[[str], None]


def _progress_sink(progress: bool | Progress | None) -> Progress | None:
    if progress is True:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return progress or None


async def first_model(http: aiohttp.ClientSession, base_url: str, headers: dict | None) -> str:
    async with http.get(f"{base_url}/models", headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
        resp.raise_for_status()
        data = (await resp.json()).get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/models lists no model")
    return data[0]["id"]


class _Run:
    """State shared by the sessions of one run, and the live progress line."""

    def __init__(self, base_url: str, time_scale: float, sla: float | None, max_requests: int | None,
                 progress: Progress | None, interval: float, headers: dict | None, timeout: float,
                 session_prefix: str = "s") -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.scale = time_scale
        self.sla = sla
        self.max_requests = max_requests
        self.progress = progress
        self.interval = interval
        self.headers = headers
        self.timeout = timeout
        self.session_prefix = session_prefix
        self.records: list[RequestRecord] = []
        self.samples: list[dict] = []
        self.issued = 0
        self.inflight = 0
        self.t0 = time.monotonic()
        self._last_print = 0.0
        self._printed = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def exhausted(self) -> bool:
        return bool(self.max_requests) and self.issued >= self.max_requests  # type: ignore[operator]

    async def request(self, http: aiohttp.ClientSession, model: str, messages: list[dict], max_tokens: int,
                      session: int, turn: int) -> tuple[RequestRecord, str]:
        rec = RequestRecord(session=session, turn=turn, start=self.now(), max_tokens=max_tokens)
        self.issued += 1
        self.inflight += 1
        key = f"{self.session_prefix}{session}"
        headers = {**(self.headers or {}), "X-Session-ID": key}
        try:
            text = await stream_chat(http, self.url, chat_body(model, messages, max_tokens, key), rec,
                                     self.t0, headers, self.timeout)
        finally:
            self.inflight -= 1
        self.records.append(rec)
        return rec, text

    def sample(self, target: int, active: int) -> None:
        now = self.now()
        self.samples.append({"t": round(now, 3), "target": target, "active": active, "inflight": self.inflight})
        if self.progress and now - self._last_print >= self.interval:
            self._print(now, target, active)

    def _print(self, now: float, target: int, active: int) -> None:
        window = self.records[self._printed:]
        span = max(1e-9, (now - self._last_print) * self.scale)
        self._last_print, self._printed = now, len(self.records)
        ok = [r for r in window if not r.error]
        speeds = sorted(v for r in ok if (v := r.speed(self.scale)) is not None)
        ttfts = sorted(v for r in ok if (v := r.ttft(self.scale)) is not None)

        def f(v, spec=".0f"):
            return "-" if v is None else format(v, spec)

        out = sum(r.completion_tokens for r in ok) / span
        line = (f"[{now * self.scale:7.1f}s] sessions {active:>4}/{target:<4} in-flight {self.inflight:>4}  "
                f"done {len(ok):>5} (+{len(window) - len(ok)} err)  out {out:7.0f} tok/s  "
                f"user p50 {f(percentile(speeds, 50))} p10 {f(percentile(speeds, 10))} tok/s  "
                f"ttft p50 {f(percentile(ttfts, 50), '.3f')}s")
        if self.sla and ok:
            met = sum(r.completion_tokens for r in ok if (r.speed(self.scale) or 0) >= self.sla)
            tot = sum(r.completion_tokens for r in ok if r.speed(self.scale) is not None)
            line += f"  sla {f(100 * met / tot if tot else None)}%"
        self.progress(line)  # type: ignore[misc]


def _raise_failures(tasks: list[asyncio.Task]) -> None:
    """A session task that raised (a bug of the generator, not an answer the endpoint gave, which is a recorded
    error) would otherwise vanish with its requests from the counts: the run fails instead, saying why."""
    failed = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(tasks)} sessions failed in the load generator, the first with "
                           f"{type(failed[0]).__name__}: {failed[0]}") from failed[0]


async def _drain(tasks: set[asyncio.Task], seconds: float) -> None:
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=seconds)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)


def _session_factory(workload: Workload, seed: int):
    words = Words(seed)
    system_text = words.text(random.Random(seed), workload.system_tokens)  # one system prompt, shared by all
    return lambda sid: Session(sid, workload, words, system_text, seed * 1_000_003 + sid)


async def run_load(
    base_url: str,
    model: str | None = None,
    schedule: str | schedule_mod.Schedule = "hold 4 60s",
    *,
    workload: Workload | None = None,
    duration: float | None = None,
    max_requests: int | None = None,
    sla: float | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    progress: bool | Progress | None = False,
    progress_interval: float = 5.0,
    headers: dict | None = None,
    drain_seconds: float = 30.0,
    request_timeout: float = 600.0,
    tick: float = 0.1,
    session_prefix: str = "s",
) -> LoadReport:
    """Closed-loop agentic sessions against `base_url` (an OpenAI base such as http://host/v1). `schedule` and
    `duration` are in engine seconds; wall time is that over `time_scale`. Session n is keyed
    `f"{session_prefix}{n}"` (X-Session-ID and `user`): runs that must not share keys (a router hashes them onto
    engines) take different prefixes."""
    sched = schedule_mod.load(schedule)
    wl = workload or Workload.from_profile()
    end = min(sched.duration, duration) if duration else sched.duration
    run = _Run(base_url, time_scale, sla, max_requests, _progress_sink(progress), progress_interval, headers,
               request_timeout, session_prefix)
    new_session = _session_factory(wl, seed)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**18) as http:
        model = model or await first_model(http, base_url.rstrip("/"), headers)
        stop = asyncio.Event()
        live: dict[int, tuple[Session, asyncio.Event, asyncio.Task]] = {}
        started: list[asyncio.Task] = []
        next_sid = 0

        async def converse(s: Session, leave: asyncio.Event) -> None:
            try:
                while not (leave.is_set() or stop.is_set() or run.exhausted()):
                    messages, max_tokens = s.next_turn()
                    rec, text = await run.request(http, model, messages, max_tokens, s.sid, s.turns - 1)
                    if rec.error:
                        # a replacement starts at the next tick: pause so a down server is not hammered
                        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=1.0)
                        break
                    if s.finished:
                        break
                    s.answer(text)
                    gap = s.gap() / time_scale
                    waits = [asyncio.ensure_future(leave.wait()), asyncio.ensure_future(stop.wait())]
                    await asyncio.wait(waits, timeout=gap, return_when=asyncio.FIRST_COMPLETED)
                    for w in waits:
                        w.cancel()
            finally:
                live.pop(s.sid, None)

        run.t0 = time.monotonic()
        while True:
            t = run.now() * time_scale
            if t >= end or run.exhausted():
                break
            target = sched.users(t)
            staying = [sid for sid, (_, leave, _) in live.items() if not leave.is_set()]
            for _ in range(target - len(staying)):
                s = new_session(next_sid)
                next_sid += 1
                leave = asyncio.Event()
                live[s.sid] = (s, leave, asyncio.ensure_future(converse(s, leave)))
                started.append(live[s.sid][2])
            for sid in sorted(staying, reverse=True)[: max(0, len(staying) - target)]:
                live[sid][1].set()  # a step down: the newest sessions leave after their current turn
            run.sample(target, len(live))
            await asyncio.sleep(tick)
        stop.set()
        await _drain({task for _, _, task in live.values()}, drain_seconds)
        wall = run.now()
        _raise_failures(started)
    config = {"mode": "sessions", "base_url": base_url, "model": model, "schedule": str(sched), "duration": end,
              "max_requests": max_requests, "time_scale": time_scale, "seed": seed, "session_prefix": session_prefix,
              "workload": _describe(wl)}
    return LoadReport(run.records, wall, time_scale, sla, config, run.samples)


async def replay_trace(
    base_url: str,
    trace: str | Path | traces.Trace,
    model: str | None = None,
    *,
    speedup: float = 1.0,
    time_scale: float = 1.0,
    duration: float | None = None,
    max_requests: int | None = None,
    max_inflight: int = 512,
    sla: float | None = None,
    seed: int = 0,
    progress: bool | Progress | None = False,
    progress_interval: float = 5.0,
    headers: dict | None = None,
    drain_seconds: float = 60.0,
    request_timeout: float = 600.0,
) -> LoadReport:
    """Replays a Mooncake or aiperf multi-turn trace (flashserve_testbed.traces). Each session starts at its
    time (over `speedup`, in engine seconds); a Mooncake request is a one-turn session, so Mooncake stays open
    loop. An aiperf session is closed loop: each turn is sent its `delay` after the previous answer, with the
    conversation so far (earlier prompts and the answers the endpoint gave) and the turn's new tokens, whose
    blocks follow its hash_ids. A refused turn (e.g. HTTP 400 for a prompt over the model's context) is
    recorded and ends its session: every later turn would be longer still."""
    tr = trace if isinstance(trace, traces.Trace) else traces.read(trace, limit=max_requests)
    builder = mooncake.PromptBuilder(seed)
    run = _Run(base_url, time_scale, sla, max_requests, _progress_sink(progress), progress_interval, headers,
               request_timeout)
    slots = asyncio.Semaphore(max_inflight)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**18) as http:
        model = model or await first_model(http, base_url.rstrip("/"), headers)
        tasks: set[asyncio.Task] = set()
        started: list[asyncio.Task] = []

        async def wait_until(at_s: float) -> None:
            delay = at_s / time_scale - run.now()
            if delay > 0:
                await asyncio.sleep(delay)

        async def session(i: int, sess: traces.Session) -> None:
            messages: list[dict] = []
            for k, turn in enumerate(sess.turns):
                if k:
                    if turn.delay_ms is not None:
                        await wait_until(run.now() * time_scale + turn.delay_ms / 1000.0 / speedup)
                    if turn.at_ms is not None:
                        await wait_until(turn.at_ms / 1000.0 / speedup)
                if run.exhausted() or (duration is not None and run.now() * time_scale > duration):
                    return
                messages.append({"role": "user", "content": builder.text(turn.input_length, turn.hash_ids,
                                                                         i * 1000 + k)})  # fmt: skip
                await slots.acquire()  # beyond max_inflight, turns are late rather than unbounded
                try:
                    rec, text = await run.request(http, model, messages, turn.output_length, i, k)
                finally:
                    slots.release()
                if rec.error:
                    return
                messages.append({"role": "assistant", "content": text})

        run.t0 = time.monotonic()
        sampler = asyncio.ensure_future(_sample_forever(run))
        try:
            for i, sess in enumerate(tr.sessions):
                at = sess.start_ms / 1000.0 / speedup
                if (duration is not None and at > duration) or run.exhausted():
                    break
                await wait_until(at)
                task = asyncio.ensure_future(session(i, sess))
                started.append(task)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            # closed-loop sessions go on after the last start: wait for them (bounded by the duration, if any)
            if tasks:
                left = None if duration is None else max(0.0, duration / time_scale - run.now())
                _, pending = await asyncio.wait(set(tasks), timeout=left)
                await _drain(pending, drain_seconds)
        finally:
            sampler.cancel()
        wall = run.now()
        _raise_failures(started)
    config = {"mode": tr.format, "base_url": base_url, "model": model, "trace": tr.source or f"{tr.requests} requests",
              "sessions": len(tr.sessions), "speedup": speedup, "time_scale": time_scale, "duration": duration,
              "max_requests": max_requests, "seed": seed}  # fmt: skip
    return LoadReport(run.records, wall, time_scale, sla, config, run.samples)


async def _sample_forever(run: _Run, every: float = 0.25) -> None:
    while True:
        run.sample(run.inflight, run.inflight)
        await asyncio.sleep(every)


def _describe(w: Workload) -> dict:
    def ln(d) -> dict:
        return {"median": d.median, "sigma": d.sigma, "min": d.minimum, "max": d.maximum}

    return {"system_tokens": w.system_tokens, "first_turn_tokens": ln(w.first_turn_tokens),
            "tool_result_tokens": ln(w.tool_result_tokens), "output_tokens": ln(w.output_tokens),
            "gap_seconds": ln(w.gap_seconds), "context_limit": list(w.context_limit), "max_turns": w.max_turns}
