"""Agentic sessions: a shared system prompt, a task, then turns that each resend the whole conversation plus a
new tool result, with short answers and a tool-call gap between turns.

Lengths follow the calibration profile's workload (flashserve/engine/profiles) unless overridden, so load on a
mock engine matches what its speed curve was fitted on. Text is sized for the mock tokenizer (4 characters a
token) and is unique per session, so the only prefix shared across sessions is the system prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from flashserve_testbed.engine.profile import LogNormal
from flashserve_testbed.engine.profile import load as load_profile

CHARS_PER_TOKEN = 4
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Workload:
    system_tokens: int = 12000
    first_turn_tokens: LogNormal = LogNormal(2500, 0.7, 200, 40000)
    tool_result_tokens: LogNormal = LogNormal(3000, 1.0, 50, 60000)
    output_tokens: LogNormal = LogNormal(150, 1.1, 8, 4096)
    gap_seconds: LogNormal = LogNormal(2.0, 0.8, 0.2, 60.0)  # tool execution between an answer and the next turn
    context_limit: tuple[int, int] = (18000, 76000)  # a session ends once its context passes a draw from this
    max_turns: int = 0  # 0: no limit besides the context

    @classmethod
    def from_profile(cls, name: str | None = None, **overrides) -> "Workload":
        w = load_profile(name).workload
        base = cls(system_tokens=w.shared_system_prompt_tokens, first_turn_tokens=w.first_turn_tokens,
                   tool_result_tokens=w.tool_result_tokens, output_tokens=w.output_tokens,
                   context_limit=w.session_context_limit)
        return replace(base, **overrides)

    def scaled(self, factor: float) -> "Workload":
        """Prompts and context limits times `factor` (smaller machines, quicker tests); outputs unchanged."""
        def ln(d: LogNormal) -> LogNormal:
            return LogNormal(max(1.0, d.median * factor), d.sigma, max(1.0, d.minimum * factor),
                             max(1.0, d.maximum * factor))

        lo, hi = self.context_limit
        return replace(self, system_tokens=int(self.system_tokens * factor),
                       first_turn_tokens=ln(self.first_turn_tokens), tool_result_tokens=ln(self.tool_result_tokens),
                       context_limit=(max(1, int(lo * factor)), max(1, int(hi * factor))))


class Words:
    """Random 3-letter words and a space: n tokens of text are exactly 4n characters."""

    def __init__(self, seed: int, vocabulary: int = 4096) -> None:
        rng = random.Random(seed)
        self.words = ["".join(rng.choices(_LETTERS, k=3)) + " " for _ in range(vocabulary)]

    def text(self, rng: random.Random, tokens: int) -> str:
        return "".join(rng.choices(self.words, k=max(0, tokens)))


class Session:
    """One conversation. `next_turn()` gives the messages to send; `answer()` appends the reply."""

    def __init__(self, sid: int, workload: Workload, words: Words, system_text: str, seed: int) -> None:
        self.sid = sid
        self.w = workload
        self.words = words
        self.rng = random.Random(seed)
        lo, hi = workload.context_limit
        self.limit = self.rng.randint(min(lo, hi), max(lo, hi))
        self.messages: list[dict] = [{"role": "system", "content": system_text}]
        self.context = len(system_text) // CHARS_PER_TOKEN
        self.turns = 0

    def next_turn(self) -> tuple[list[dict], int]:
        """(messages, max_tokens): the task on the first turn, a tool result after; the conversation so far."""
        if self.turns == 0:
            tokens = int(self.w.first_turn_tokens.draw(self.rng))
            self.messages.append({"role": "user", "content": f"task {self.sid}: " + self.words.text(self.rng, tokens)})
        else:
            tokens = int(self.w.tool_result_tokens.draw(self.rng))
            # tool output as a user message: every OpenAI server takes it without a matching tool_call id
            self.messages.append({"role": "user", "content": "tool result: " + self.words.text(self.rng, tokens)})
        self.context += tokens
        self.turns += 1
        return self.messages, max(1, int(self.w.output_tokens.draw(self.rng)))

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
        self.context += len(text) // CHARS_PER_TOKEN

    def gap(self) -> float:
        return self.w.gap_seconds.draw(self.rng)

    @property
    def finished(self) -> bool:
        return self.context >= self.limit or (self.w.max_turns > 0 and self.turns >= self.w.max_turns)
