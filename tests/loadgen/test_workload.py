"""Agentic sessions: a shared system prompt, growing context, sizes for the 4-characters-a-token mock."""

from __future__ import annotations

import random
from dataclasses import replace

from flashserve_testbed.engine.profile import LogNormal
from flashserve_testbed.loadgen.workload import Session, Words, Workload


def test_words_are_exactly_four_characters_a_token():
    w = Words(1)
    assert len(w.text(random.Random(0), 250)) == 1000
    assert w.text(random.Random(0), 0) == ""


def test_defaults_come_from_the_profile():
    w = Workload.from_profile()
    assert w.system_tokens == 12000 and w.output_tokens.median == 150 and w.context_limit == (18000, 76000)
    small = w.scaled(0.1)
    assert small.system_tokens == 1200 and small.context_limit == (1800, 7600)
    assert small.output_tokens == w.output_tokens


def test_a_session_resends_its_whole_conversation_each_turn():
    wl = replace(Workload.from_profile().scaled(0.1), gap_seconds=LogNormal(2.0, 0.0, 2.0, 2.0))
    words = Words(3)
    system = words.text(random.Random(3), wl.system_tokens)
    s, other = Session(1, wl, words, system, seed=11), Session(2, wl, words, system, seed=12)
    m1, out1 = s.next_turn()
    first = [dict(m) for m in m1]
    assert [m["role"] for m in m1] == ["system", "user"] and m1[0]["content"] == system
    assert 8 <= out1 <= 4096
    s.answer("the " * out1)
    m2, _ = s.next_turn()
    assert m2[: len(first)] == first and [m["role"] for m in m2[len(first):]] == ["assistant", "user"]
    assert s.gap() == 2.0
    o1, _ = other.next_turn()
    assert o1[0] == m1[0] and o1[1] != m1[1]  # only the system prompt is shared between sessions
    turns = 2
    while not s.finished:
        s.answer("x" * 40)
        s.next_turn()
        turns += 1
    assert s.context >= s.limit and turns < 100


def test_max_turns_ends_a_session():
    wl = replace(Workload.from_profile().scaled(0.01), max_turns=2)
    s = Session(1, wl, Words(1), "sys", seed=1)
    s.next_turn()
    assert not s.finished
    s.next_turn()
    assert s.finished
