"""Which engine gets a request: the session's engine; for a new session, the engine with the fewest requests in
flight and then the fewest recently active sessions (sessions are long, so spreading them spreads the load to
come); without a session, the engine holding the longest cached prefix; else the least loaded one. An
affinity holds only while its engine is not much busier than the least loaded. Pure: the server feeds it
loads, an index of prompt blocks, and the session table.

Prompts are cut into fixed blocks of characters whose hashes are chained, so a block's hash names the whole
prefix up to it; the index remembers, per block, the engines recently sent a prompt containing it. That is
what a prefix-aware gateway keeps (an approximation of each engine's KV cache): blocks every engine has seen,
such as a shared system prompt, tell engines apart by nothing, and only blocks some engines lack count.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    block_chars: int = 1024  # ~256 tokens at 4 characters per token
    max_blocks: int = 512  # hash at most the first ~128K tokens
    slack_abs: int = 4  # affinity holds while its engine has at most this many more requests than the least loaded
    slack_rel: float = 0.5  # ... or this fraction of the mean load, whichever is larger
    max_inflight: int = 0  # per engine; beyond it requests queue in the router (0: no limit)
    engines_per_block: int = 8  # engines remembered per prompt block
    index_blocks: int = 200_000  # prompt blocks remembered per serving (LRU)
    sessions: int = 100_000  # sessions remembered per serving (LRU)
    session_idle_seconds: float = 120.0  # a session quiet this long no longer counts as active on its engine


@dataclass(frozen=True)
class Choice:
    pod: str
    reason: str  # session, new_session, prefix or least_loaded


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, sort_keys=True)


def prompt_text(body: dict) -> str:
    """A canonical text of the prompt, stable as a conversation grows by appended messages."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        if body.get("tools"):
            parts.append("\x1etools\x1f" + json.dumps(body["tools"], sort_keys=True))
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"\x1e{m.get('role', '')}\x1f{_text(m.get('content'))}")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return ",".join(map(str, prompt))
    return ""


def block_hashes(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the full blocks of `text` (a partial last block names no reusable cache)."""
    out: list[int] = []
    prev = 0
    for j in range(min(len(text) // block_chars, max_blocks)):
        prev = hash((prev, text[j * block_chars : (j + 1) * block_chars]))
        out.append(prev)
    return out


def session_key(body: dict, headers) -> str | None:
    """A conversation's identity: the X-Session-ID header, else OpenAI's `user` field."""
    sid = headers.get("x-session-id") if headers is not None else None
    if sid:
        return str(sid)
    user = body.get("user")
    return str(user) if user else None


class LRU(OrderedDict):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)

    def touch(self, key):
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


class SessionTable:
    """Session -> (engine, last seen), most recent last."""

    def __init__(self, capacity: int) -> None:
        self.lru = LRU(capacity)

    def get(self, sid: str) -> str | None:
        entry = self.lru.get(sid)
        return entry[0] if entry else None

    def put(self, sid: str, pod: str, now: float) -> None:
        self.lru.put(sid, (pod, now))

    def active(self, since: float) -> dict[str, int]:
        """Sessions per engine seen at or after `since`."""
        counts: dict[str, int] = {}
        for pod, seen in reversed(self.lru.values()):
            if seen < since:
                break
            counts[pod] = counts.get(pod, 0) + 1
        return counts


class PrefixIndex:
    def __init__(self, capacity: int, per_block: int) -> None:
        self.blocks = LRU(capacity)
        self.per_block = per_block

    def match(self, hashes: list[int], pods) -> dict[str, int]:
        """For each of `pods`, how many leading blocks it was recently sent."""
        alive = set(pods)
        scores: dict[str, int] = {}
        for i, h in enumerate(hashes):
            seen = self.blocks.touch(h)
            if not seen:
                break
            alive &= set(seen)
            if not alive:
                break
            for pod in alive:
                scores[pod] = i + 1
        return scores

    def record(self, hashes: list[int], pod: str) -> None:
        for h in hashes:
            seen = self.blocks.get(h)
            if seen is None:
                self.blocks.put(h, [pod])
                continue
            if pod in seen:
                seen.remove(pod)
            seen.append(pod)
            del seen[: -self.per_block]
            self.blocks.move_to_end(h)


def choose(loads: dict[str, int], prefix_scores: dict[str, int], session_pod: str | None, policy: Policy,
           tiebreak: int = 0, new_session: bool = False, sessions: dict[str, int] | None = None) -> Choice:
    """`loads`: requests in flight on each engine that may take one more (never empty). `new_session`: the request
    names a session not seen yet; `sessions`: recently active sessions per engine."""
    low = min(loads.values())
    mean = sum(loads.values()) / len(loads)
    slack = max(policy.slack_abs, policy.slack_rel * mean)

    def within(pod: str) -> bool:
        return loads[pod] - low <= slack

    if session_pod in loads and within(session_pod):
        return Choice(session_pod, "session")
    if new_session:
        counts = sessions or {}
        return Choice(min(loads, key=lambda p: (loads[p], counts.get(p, 0), p)), "new_session")
    floor = min(prefix_scores.get(p, 0) for p in loads)
    best = max((p for p in loads if prefix_scores.get(p, 0) > floor and within(p)),
               key=lambda p: (prefix_scores[p], -loads[p], p), default=None)
    if best is not None:
        return Choice(best, "prefix")
    ties = sorted(p for p, n in loads.items() if n == low)
    return Choice(ties[tiebreak % len(ties)], "least_loaded")
