"""Mooncake trace lines and the prompts built from their hash ids."""

from __future__ import annotations

import pytest
from flashserve_testbed.loadgen.mooncake import (
    BLOCK_TOKENS,
    PromptBuilder,
    TraceRecord,
    load,
    parse_line,
)


def test_parse_a_line():
    rec = parse_line('{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}')
    assert rec == TraceRecord(27482.0, 6955, 52, (46, 47, 48))
    assert parse_line("   ") is None
    assert parse_line('{"timestamp": 0, "input_length": 5, "output_length": 1}').hash_ids == ()


@pytest.mark.parametrize("bad", ['{"timestamp": 1, "input_length": 5}', "[1, 2]", '{"timestamp": "x", '
                                 '"input_length": 1, "output_length": 1}', '{"timestamp": 1, "input_length": 0, '
                                 '"output_length": 1}', "not json"])
def test_bad_lines(bad):
    with pytest.raises(ValueError):
        parse_line(bad)


def test_load_sorts_limits_and_names_the_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 20, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n\n'
                 '{"timestamp": 10, "input_length": 10, "output_length": 2, "hash_ids": [2]}\n')
    assert [r.timestamp_ms for r in load(f)] == [10, 20]
    assert len(load(f, limit=1)) == 1
    f.write_text('{"timestamp": 1}\n')
    with pytest.raises(ValueError, match="t.jsonl:1"):
        load(f)


def test_prompts_share_exactly_their_common_leading_blocks():
    b = PromptBuilder(seed=1)
    a = b.prompt(TraceRecord(0, 1500, 10, (1, 2, 3)), unique=0)
    c = b.prompt(TraceRecord(0, 1500, 10, (1, 2, 9)), unique=1)
    assert len(a) == len(c) == 1500 * 4  # 4 characters a token
    block = BLOCK_TOKENS * 4
    assert a[: 2 * block] == c[: 2 * block] and a[2 * block :] != c[2 * block :]
    longer = b.prompt(TraceRecord(0, 2000, 10, (1,)), unique=5)  # past its hashed blocks: unique filler
    other = b.prompt(TraceRecord(0, 2000, 10, (1,)), unique=6)
    assert len(longer) == 8000 and longer[:block] == a[:block] and longer[block:] != other[block:]
    assert PromptBuilder(seed=1).block(7) == b.block(7)
