"""Prompt text for trace replay (traces are read by flashserve_testbed.traces): each hash id of a Mooncake or
aiperf trace (one id per 512-token block, equal ids meaning equal blocks) becomes a fixed 512-token text block,
so requests that share leading ids share a prompt prefix and hit the engine's prefix cache as they did in
production.
"""

from __future__ import annotations

import random
from collections import OrderedDict

BLOCK_TOKENS = 512
CHARS_PER_TOKEN = 4


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

    def text(self, input_length: int, hash_ids: tuple[int, ...], unique: int) -> str:
        """`input_length` tokens of text; `unique` (e.g. the request's index) fills tokens past the last hashed
        block, so they are not shared."""
        want = input_length * CHARS_PER_TOKEN
        parts, size = [], 0
        for h in hash_ids:
            if size >= want:
                break
            parts.append(self.block(h))
            size += BLOCK_TOKENS * CHARS_PER_TOKEN
        if size < want:
            rng = random.Random(unique * 7919 + self.seed + 1)
            filler = "".join(rng.choices(self.words, k=(want - size) // CHARS_PER_TOKEN + 1))
            parts.append(filler)
        return "".join(parts)[:want]
