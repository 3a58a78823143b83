"""Mooncake traces (FAST'25 "Mooncake" open traces): one JSON object a line with `timestamp` (ms since the
trace began), `input_length` and `output_length` (tokens) and `hash_ids`, one id per 512-token block of the
prompt, equal ids meaning equal blocks (a shared prefix).

Replay turns each id into a fixed 512-token text block, so requests that share leading ids share a prompt
prefix and hit the engine's prefix cache as they did in production.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

BLOCK_TOKENS = 512
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(line: str) -> TraceRecord | None:
    """A record, or None for a blank line. Raises ValueError naming the missing or bad field."""
    line = line.strip()
    if not line:
        return None
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("a trace line must be a JSON object")
    try:
        rec = TraceRecord(float(doc["timestamp"]), int(doc["input_length"]), int(doc["output_length"]),
                          tuple(int(h) for h in doc.get("hash_ids") or ()))
    except KeyError as e:
        raise ValueError(f"trace line lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad trace line: {e}") from None
    if rec.input_length < 1 or rec.output_length < 1:
        raise ValueError("input_length and output_length must be positive")
    return rec


def load(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    out: list[TraceRecord] = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            try:
                rec = parse_line(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            if rec is not None:
                out.append(rec)
                if limit and len(out) >= limit:
                    break
    out.sort(key=lambda r: r.timestamp_ms)
    return out


class PromptBuilder:
    """Text of exactly `input_length` tokens whose i-th 512-token block is fixed by hash_ids[i]."""

    def __init__(self, seed: int = 0, cache_blocks: int = 4096) -> None:
        self.seed = seed
        self.cache: OrderedDict[int, str] = OrderedDict()
        self.cache_blocks = cache_blocks
        rng = random.Random(seed)
        self.words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=3)) + " " for _ in range(4096)]

    def block(self, hash_id: int) -> str:
        text = self.cache.get(hash_id)
        if text is None:
            rng = random.Random(hash_id * 1_000_003 + self.seed)
            text = f"[{hash_id:>10}] " + "".join(rng.choices(self.words, k=BLOCK_TOKENS))
            text = text[: BLOCK_TOKENS * CHARS_PER_TOKEN]
            self.cache[hash_id] = text
            if len(self.cache) > self.cache_blocks:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(hash_id)
        return text

    def prompt(self, rec: TraceRecord, unique: int) -> str:
        """`unique` (e.g. the record's index) fills tokens past the last hashed block, so they are not shared."""
        want = rec.input_length * CHARS_PER_TOKEN
        parts, size = [], 0
        for h in rec.hash_ids:
            if size >= want:
                break
            parts.append(self.block(h))
            size += BLOCK_TOKENS * CHARS_PER_TOKEN
        if size < want:
            rng = random.Random(unique * 7919 + self.seed + 1)
            filler = "".join(rng.choices(self.words, k=(want - size) // CHARS_PER_TOKEN + 1))
            parts.append(filler)
        return "".join(parts)[:want]
