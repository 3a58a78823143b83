"""The routing choice: session, new-session spreading, prefix, least loaded, and the load slack."""

from __future__ import annotations

from flashserve_testbed.router.affinity import (
    Policy,
    PrefixIndex,
    SessionTable,
    block_hashes,
    choose,
    prompt_text,
    session_key,
)

P = Policy(slack_abs=2, slack_rel=0.5)


def test_session_affinity_holds_within_the_slack_and_breaks_beyond():
    assert choose({"a": 3, "b": 1}, {}, "a", P).reason == "session"
    moved = choose({"a": 4, "b": 1}, {}, "a", P)
    assert moved == moved.__class__("b", "least_loaded")
    assert choose({"b": 0}, {}, "gone", P).pod == "b"  # its engine left


def test_slack_grows_with_the_mean_load():
    # mean 30 -> slack 15: 40 vs 25 keeps the affinity
    assert choose({"a": 40, "b": 25, "c": 25}, {}, "a", P).pod == "a"
    assert choose({"a": 45, "b": 25, "c": 25}, {}, "a", P).pod != "a"


def test_new_sessions_spread_by_load_then_by_active_sessions():
    assert choose({"a": 1, "b": 0}, {}, None, P, new_session=True, sessions={"b": 9}).pod == "b"
    assert choose({"a": 0, "b": 0}, {}, None, P, new_session=True, sessions={"a": 3, "b": 2}).pod == "b"
    assert choose({"a": 0, "b": 0}, {}, None, P, new_session=True, sessions={}).reason == "new_session"


def test_prefix_wins_only_when_it_tells_engines_apart():
    assert choose({"a": 1, "b": 0}, {"a": 5, "b": 2}, None, P) .reason == "prefix"
    # every engine holds the same prefix (a shared system prompt): no preference, least loaded
    c = choose({"a": 1, "b": 0}, {"a": 5, "b": 5}, None, P)
    assert (c.pod, c.reason) == ("b", "least_loaded")
    assert choose({"a": 6, "b": 0}, {"a": 5}, None, P).pod == "b"  # too busy for its prefix


def test_least_loaded_ties_rotate():
    picks = {choose({"a": 0, "b": 0, "c": 0}, {}, None, P, tiebreak=i).pod for i in range(3)}
    assert picks == {"a", "b", "c"}


def test_block_hashes_are_chained_prefixes():
    a = block_hashes("x" * 2048 + "y" * 1024, 1024, 100)
    b = block_hashes("x" * 2048 + "z" * 1024 + "tail", 1024, 100)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert block_hashes("x" * 1023, 1024, 100) == []
    assert len(block_hashes("x" * 10240, 1024, 4)) == 4
    # the same block text after a different prefix hashes differently
    assert block_hashes("y" * 1024 + "x" * 1024, 1024, 9)[1] != a[1]


def test_prompt_text_is_stable_as_a_conversation_grows():
    turn1 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "A1"},
                          {"role": "user", "content": [{"type": "text", "text": "U2"}]}]}
    assert prompt_text(turn2).startswith(prompt_text(turn1))
    assert prompt_text({"prompt": ["hello"]}) == "hello"
    assert prompt_text({"prompt": [1, 2, 3]}) == "1,2,3"
    assert prompt_text({}) == ""


def test_prefix_index_scores_the_longest_leading_run_per_engine():
    idx = PrefixIndex(capacity=100, per_block=2)
    idx.record([1, 2, 3], "a")
    idx.record([1, 2, 9], "b")
    assert idx.match([1, 2, 3, 4], ["a", "b"]) == {"a": 3, "b": 2}
    assert idx.match([7, 1, 2], ["a", "b"]) == {}
    assert idx.match([1, 2, 3], ["b"]) == {"b": 2}  # only candidates count
    idx.record([1], "c")  # per_block=2: the oldest engine of block 1 is forgotten
    assert idx.match([1, 2, 3], ["a", "b", "c"]) == {"b": 2, "c": 1}


def test_prefix_index_is_bounded():
    idx = PrefixIndex(capacity=3, per_block=4)
    idx.record([1, 2, 3, 4, 5], "a")
    assert len(idx.blocks) == 3 and idx.match([1], ["a"]) == {}


def test_session_table_counts_recent_sessions():
    t = SessionTable(10)
    t.put("s1", "a", 1.0)
    t.put("s2", "a", 5.0)
    t.put("s3", "b", 6.0)
    t.put("s1", "b", 7.0)
    assert t.get("s1") == "b"
    assert t.active(since=5.0) == {"b": 2, "a": 1}
    assert t.active(since=6.5) == {"b": 1}


def test_session_key_header_then_user():
    assert session_key({"user": "u"}, {"x-session-id": "h"}) == "h"
    assert session_key({"user": "u"}, {}) == "u"
    assert session_key({}, {}) is None
