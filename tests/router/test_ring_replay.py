"""The simulator's router model replaying a load run (ring_replay.py): each session's requests go to the
engine vllm-router's ring picks for its X-Session-ID, and later turns hit the prefix cache there."""

from __future__ import annotations

from flashserve_testbed.bench.routing import HashRing, session_key
from flashserve_testbed.loadgen.report import RequestRecord
from flashserve_testbed.router.ring_replay import replay

URLS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"]


def _records(sessions: int, turns: int) -> list[RequestRecord]:
    out = []
    for s in range(1, sessions + 1):
        prompt = 3000
        for t in range(turns):
            out.append(RequestRecord(session=s, turn=t, start=s * 0.1 + t * 5.0, prompt_tokens=prompt,
                                     completion_tokens=200, status=200))  # fmt: skip
            prompt += 200 + 1500
    return out


def test_requests_go_where_the_ring_sends_their_session_and_later_turns_hit():
    recs = _records(12, 4)
    res = replay(recs, URLS, "gb200-4gpu-demo")
    ring = HashRing(URLS)
    want = [0, 0, 0]
    for r in recs:
        want[URLS.index(ring.lookup(session_key(f"s{r.session}")))] += 1
    assert res.requests_per_engine == want
    one_turn = replay(_records(12, 1), URLS, "gb200-4gpu-demo")
    # a session's later turns reuse its own earlier turns on the same engine: far more hits than first turns
    assert res.hit_rate > one_turn.hit_rate + 0.2
