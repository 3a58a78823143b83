"""Synthetic agentic sessions and Mooncake traces."""

from __future__ import annotations

from flashserve_testbed.bench.workloads import (
    SCENARIOS,
    Nominal,
    Session,
    TraceRequest,
    agentic_trace,
    chain_hashes,
    read_mooncake,
    session_starts,
    trace_groups,
    write_mooncake,
)

from .conftest import SAMPLE_TRACE


def test_sample_trace_is_mooncake_format():
    reqs = read_mooncake(SAMPLE_TRACE)
    assert len(reqs) > 100
    assert reqs[0].t == 0.0 and all(a.t <= b.t for a, b in zip(reqs, reqs[1:]))
    for r in reqs:
        assert r.input_length > 0 and r.output_length > 0
        assert len(r.hash_ids) == r.input_length // 512  # one id per full 512-token block
    # every conversation starts with the shared system prompt's blocks
    assert all(r.hash_ids[:23] == tuple(range(23)) for r in reqs)


def test_trace_round_trip(tmp_path, profile):
    reqs = list(agentic_trace(profile, 0.2, 120.0, Nominal(0.04, 110.0), seed=3))
    path = tmp_path / "t.jsonl"
    assert write_mooncake(path, reqs) == len(reqs)
    back = read_mooncake(path)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in back] == [
        (r.input_length, r.output_length, r.hash_ids) for r in reqs
    ]


def test_later_turns_extend_the_earlier_blocks():
    reqs = read_mooncake(SAMPLE_TRACE)
    groups = trace_groups(reqs)
    by_group: dict[int, list[TraceRequest]] = {}
    for r, g in zip(reqs, groups):
        by_group.setdefault(g, []).append(r)
    multi = [rs for rs in by_group.values() if len(rs) > 2]
    assert multi
    for rs in multi:
        for a, b in zip(rs, rs[1:]):
            assert b.hash_ids[: len(a.hash_ids)] == a.hash_ids
    assert chain_hashes([1, 2])[0] == chain_hashes([1, 3])[0] != chain_hashes([2, 2])[0]


def test_sessions_are_a_function_of_seed_and_id(profile):
    def turns(seed: int, sid: int) -> list:
        s = Session(sid, seed, profile, 512, profile.max_model_len)
        out = []
        while (t := s.next_turn()) is not None:
            out.append((t, round(s.gap(), 6), len(s.block_hashes())))
        return out

    assert turns(1, 5) == turns(1, 5)
    assert turns(1, 5) != turns(2, 5) and turns(1, 5) != turns(1, 6)
    first = turns(1, 5)
    assert first[0][0][0] >= profile.workload.shared_system_prompt_tokens
    prompts = [t[0][0] for t in first]
    assert prompts == sorted(prompts)  # the conversation only grows


def test_session_starts_follow_the_shape_and_the_seed():
    sc = SCENARIOS["flash-crowd"]
    a = session_starts(sc, 2.0, seed=1)
    assert a == session_starts(sc, 2.0, seed=1) != session_starts(sc, 2.0, seed=2)
    before = sum(1 for t in a if 200 <= t < 800)  # 10 minutes at the base rate
    crowd = sum(1 for t in a if 1200 <= t < 1800)  # 10 minutes at 2.5x
    assert 2.0 < crowd / before < 3.0
    assert min(a) >= -sc.warmup_s and max(a) < sc.duration_s
