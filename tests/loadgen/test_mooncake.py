"""The prompts built from a trace's hash ids (the reader is tested in tests/test_traces.py)."""

from __future__ import annotations

from flashserve_testbed.loadgen.mooncake import BLOCK_TOKENS, PromptBuilder


def test_prompts_share_exactly_their_common_leading_blocks():
    b = PromptBuilder(seed=1)
    a = b.text(1500, (1, 2, 3), unique=0)
    c = b.text(1500, (1, 2, 9), unique=1)
    assert len(a) == len(c) == 1500 * 4  # 4 characters a token
    block = BLOCK_TOKENS * 4
    assert a[: 2 * block] == c[: 2 * block] and a[2 * block :] != c[2 * block :]
    longer = b.text(2000, (1,), unique=5)  # past its hashed blocks: unique filler
    other = b.text(2000, (1,), unique=6)
    assert len(longer) == 8000 and longer[:block] == a[:block] and longer[block:] != other[block:]
    assert PromptBuilder(seed=1).block(7) == b.block(7)
