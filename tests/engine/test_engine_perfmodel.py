"""The engine performance model: calibration curve, batching, prefix cache, preemption, determinism."""

from __future__ import annotations

import math

import pytest
from flashserve.render.vllm_args import itl_buckets
from flashserve_testbed.engine import profile as profiles
from flashserve_testbed.engine.curve import concurrency_at_speed, simulate
from flashserve_testbed.engine.perfmodel import Engine, EngineConfig

pytestmark = pytest.mark.timeout(120)

DEFAULT = profiles.load()


@pytest.fixture(scope="module")
def default_curve():
    return {c: simulate(DEFAULT, c, duration_s=100, warmup_s=25) for c in (1, 8, 32, 56, 72, 96)}


def test_default_profile_is_the_fitted_gb200_one():
    assert DEFAULT.name == "gb200-4gpu"
    assert DEFAULT.calibration.fitted
    assert DEFAULT.gpus_per_replica == 4 and DEFAULT.engines_per_replica == 4
    assert DEFAULT.startup.median >= 120  # a real replica takes minutes


def test_low_concurrency_speed_matches_profile(default_curve):
    target = DEFAULT.calibration.low_concurrency_tokens_per_s
    assert default_curve[1].per_user_tokens_per_s == pytest.approx(target, rel=0.04)


def test_speed_at_calibrated_load_matches_profile(default_curve):
    cal = DEFAULT.calibration
    points = [default_curve[c] for c in sorted(default_curve)]
    c_sla = concurrency_at_speed(points, cal.sla_tokens_per_s)
    assert c_sla is not None, "per-user speed never crosses the SLA in the simulated range"
    lo, hi = default_curve[56], default_curve[72]
    f = (c_sla - lo.concurrency) / (hi.concurrency - lo.concurrency)
    throughput = lo.throughput_per_gpu + f * (hi.throughput_per_gpu - lo.throughput_per_gpu)
    assert throughput == pytest.approx(cal.throughput_per_gpu_at_sla, rel=0.08)
    # the workload the figures refer to: input-heavy, cache-heavy agentic traffic
    for p in (lo, hi):
        assert p.prompt_per_output == pytest.approx(cal.prompt_per_output_token, rel=0.12)
        assert p.cached_fraction == pytest.approx(cal.cached_prompt_fraction, abs=0.03)
        assert p.preemptions == 0


def test_speed_falls_and_throughput_rises_with_concurrency(default_curve):
    cs = sorted(default_curve)
    speeds = [default_curve[c].per_user_tokens_per_s for c in cs]
    thr = [default_curve[c].throughput_per_gpu for c in cs]
    assert all(a > b for a, b in zip(speeds, speeds[1:])), speeds
    assert all(a < b for a, b in zip(thr, thr[1:])), thr


def test_demo_profile_meets_the_sla_at_two_sequences_per_gpu():
    prof = profiles.load("gb200-4gpu-demo")
    assert simulate(prof, 1, duration_s=60, warmup_s=10).per_user_tokens_per_s == pytest.approx(120, rel=0.05)
    assert simulate(prof, 2, duration_s=90, warmup_s=20).per_user_tokens_per_s == pytest.approx(100, rel=0.06)


@pytest.mark.parametrize("name", [n for n in profiles.available() if n != profiles.DEFAULT_PROFILE and not n.endswith("-demo")])
def test_other_profiles_match_their_calibration(name):
    prof = profiles.load(name)
    assert prof.gpus_per_replica >= 8 and prof.engines_per_replica == prof.gpus_per_replica
    low = simulate(prof, 1, duration_s=60, warmup_s=10)
    assert low.per_user_tokens_per_s == pytest.approx(prof.calibration.low_concurrency_tokens_per_s, rel=0.04)
    # at the concurrency that gives the SLA speed, the throughput the profile documents
    c = round(prof.calibration.throughput_per_gpu_at_sla / (prof.calibration.sla_tokens_per_s * 130))
    mid = simulate(prof, c, duration_s=90, warmup_s=20)
    assert mid.per_user_tokens_per_s == pytest.approx(prof.calibration.sla_tokens_per_s, rel=0.06)
    assert mid.throughput_per_gpu == pytest.approx(prof.calibration.throughput_per_gpu_at_sla, rel=0.1)


def test_profile_lookup_by_path_and_errors(tmp_path):
    path = profiles.PROFILE_DIR / "b200-8gpu.yaml"
    assert profiles.load(str(path)).name == "b200-8gpu"
    with pytest.raises(ValueError, match="unknown engine profile"):
        profiles.load("no-such-profile")


# ---------------------------------------------------------------------------------------------- mechanics
def small_engine(seed=0, **overrides) -> Engine:
    cfg = EngineConfig.from_profile(DEFAULT, **overrides)
    return Engine(DEFAULT, seed=seed, config=cfg)


def run_all(eng: Engine, until: float = 1e6) -> None:
    while (t := eng.next_event_time()) is not None and t <= until:
        eng.advance(t)


def test_single_request_timing_follows_step_model():
    eng = small_engine(num_speculative_tokens=0)
    req = eng.add_request("a", 1000, 100, 0.0)
    run_all(eng)
    st = DEFAULT.step
    prefill = st.seconds(0, 0, 1000)
    assert req.first_token == pytest.approx(prefill, rel=1e-9)
    # without MTP: one token per step, 99 decode steps with growing context
    decode = sum(st.seconds(1, 1001 + j, 0) for j in range(99))
    assert req.finish_time == pytest.approx(prefill + decode, rel=1e-6)
    assert req.emitted == 100 and req.finish_reason == "stop"


def test_mtp_raises_tokens_per_step():
    no_mtp, mtp = small_engine(num_speculative_tokens=0), small_engine(num_speculative_tokens=1)
    a = no_mtp.add_request("a", 2000, 400, 0.0)
    b = mtp.add_request("b", 2000, 400, 0.0)
    run_all(no_mtp)
    run_all(mtp)
    ratio = b.tokens_per_second() / a.tokens_per_second()
    assert 1.6 < ratio < 1.9  # ~1.8 accepted tokens per step, each step slightly dearer
    drafts, draft_tokens, accepted, per_pos = mtp.spec_counters()
    assert draft_tokens == drafts and accepted == 400 - 1 - drafts and per_pos == [accepted]


def test_chunked_prefill_respects_token_budget():
    eng = small_engine(max_num_batched_tokens=2048, num_speculative_tokens=0)
    req = eng.add_request("long", 10_000, 5, 0.0)
    steps = 0
    while req.first_token is None:
        eng.advance(eng.next_event_time())
        steps += 1
    assert steps == math.ceil(10_000 / 2048)
    assert eng.stats.iteration_tokens.n == steps


def test_max_num_seqs_caps_the_batch():
    eng = small_engine(max_num_seqs=4)
    reqs = [eng.add_request(i, 500, 50, 0.0) for i in range(10)]
    eng.advance(eng.next_event_time())
    snap = eng.snapshot()
    assert snap.running == 4 and snap.waiting == 6
    run_all(eng)
    assert all(r.finished and r.emitted == 50 for r in reqs)
    # FCFS: the first four were scheduled at once, the rest only after slots freed
    assert max(r.first_scheduled for r in reqs[:4]) < min(r.first_scheduled for r in reqs[4:])


def test_prefix_cache_hits_on_the_next_turn_of_a_conversation():
    eng = small_engine()
    bs = eng.cfg.block_size
    turn1_prompt, turn1_out = 20_000, 300
    units = (turn1_prompt + turn1_out) // bs
    hashes = list(range(1, units + 1))
    r1 = eng.add_request("t1", turn1_prompt, turn1_out, 0.0, block_hashes=hashes, hashes_cover_output=True)
    run_all(eng)
    assert r1.cached_tokens == 0
    # turn 2: the whole first turn (prompt and answer) plus a new tool result
    turn2_prompt = turn1_prompt + turn1_out + 3000
    hashes2 = list(range(1, (turn2_prompt + 200) // bs + 1))
    r2 = eng.add_request("t2", turn2_prompt, 200, r1.finish_time + 5.0, block_hashes=hashes2,
                         hashes_cover_output=True)
    run_all(eng)
    assert r2.cached_tokens == units * bs  # every full block of turn 1 was reused
    assert eng.stats.prefix_hits == units * bs
    assert eng.stats.prefix_queries == turn1_prompt + turn2_prompt
    # a fresh conversation of the same length has to compute everything, so it waits longer for its first token
    r3 = eng.add_request("fresh", turn2_prompt, 200, r2.finish_time + 5.0)
    run_all(eng)
    assert r3.cached_tokens == 0
    assert (r3.first_token - r3.arrival) > 2.5 * (r2.first_token - r2.arrival)


def test_prefix_cache_disabled_never_hits():
    eng = small_engine(enable_prefix_caching=False)
    for i in range(2):
        eng.add_request(i, 5000, 10, i * 10.0, block_hashes=list(range(78)))
        run_all(eng)
    assert eng.stats.prefix_hits == 0 and eng.stats.prefix_queries == 0


def test_mooncake_hash_ids_at_512_token_granularity():
    eng = small_engine()
    # Mooncake traces hash 512-token blocks; ids 0..9 shared, the second request adds its own
    a = eng.add_request("a", 5000, 20, 0.0, block_hashes=list(range(10)), hash_unit_tokens=512)
    run_all(eng)
    b = eng.add_request("b", 6500, 20, 100.0, block_hashes=list(range(10)) + [900, 901, 902],
                        hash_unit_tokens=512)
    run_all(eng)
    assert a.cached_tokens == 0
    assert b.cached_tokens == (5000 // 512) * 512  # the full shared 512-token blocks of a's prompt
    # coarse cache units (what a fleet simulator may use for speed) give the same answer here
    coarse = small_engine(cache_unit_tokens=512)
    coarse.add_request("a", 5000, 20, 0.0, block_hashes=list(range(10)), hash_unit_tokens=512)
    run_all(coarse)
    b2 = coarse.add_request("b", 6500, 20, 100.0, block_hashes=list(range(10)) + [900], hash_unit_tokens=512)
    run_all(coarse)
    assert b2.cached_tokens == b.cached_tokens


def test_lru_evicts_the_oldest_unused_prefix_first():
    # room for roughly two 40k-token conversations
    eng = small_engine(num_blocks=1400, max_model_len=60_000)
    bs = eng.cfg.block_size

    def turn(sid, start):
        return eng.add_request(sid, 40_000, 10, start, block_hashes=[(sid, j) for j in range(40_000 // bs)])

    t = 0.0
    for sid in ("old", "mid", "new"):
        r = turn(sid, t)
        run_all(eng)
        t = r.finish_time + 1
    old = turn("old", t)
    run_all(eng)
    new = turn("new", old.finish_time + 1)
    run_all(eng)
    assert old.cached_tokens < 40_000 // 2  # evicted to make room for "new"
    assert new.cached_tokens > 40_000 * 0.9  # recent, still cached
    assert eng.cache.evictions > 0


def test_preemption_when_kv_cache_is_full_and_every_request_still_completes():
    eng = small_engine(num_blocks=800, max_model_len=40_000, num_speculative_tokens=0)
    reqs = [eng.add_request(i, 6000, 3000, 0.0) for i in range(12)]
    peak = 0.0
    while (t := eng.next_event_time()) is not None:
        eng.advance(t)
        peak = max(peak, eng.snapshot().kv_usage)
    assert eng.stats.preemptions > 0
    assert sum(r.num_preemptions for r in reqs) == eng.stats.preemptions
    assert all(r.finished and r.emitted == 3000 for r in reqs)
    assert eng.generation_tokens() == 12 * 3000
    assert peak <= 1.0 and peak > 0.9
    assert eng.stats.req_preemptions.n == 12
    # prompt tokens count once per request, not again when a preempted request is recomputed
    assert eng.stats.prompt_tokens == 12 * 6000


def test_determinism_given_a_seed():
    def trace(seed):
        r = simulate(DEFAULT, 24, duration_s=40, warmup_s=5, seed=seed)
        return (r.per_user_tokens_per_s, r.throughput_per_gpu, r.requests, r.cached_fraction)

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_many_small_advances_equal_one_big_advance():
    def run(step):
        eng = small_engine(seed=5)
        reqs = [eng.add_request(i, 3000 + 100 * i, 200 + 7 * i, 0.05 * i) for i in range(20)]
        t = 0.0
        while any(not r.finished for r in reqs):
            t += step
            eng.advance(t)
        return [(r.first_token, r.finish_time, r.emitted) for r in reqs], eng.stats.itl.counts

    coarse, fine = run(5.0), run(0.0037)
    for (f1, e1, n1), (f2, e2, n2) in zip(coarse[0], fine[0]):
        assert n1 == n2 and f1 == pytest.approx(f2, abs=1e-9) and e1 == pytest.approx(e2, abs=1e-9)
    assert coarse[1] == fine[1]


def test_abort_frees_the_request():
    eng = small_engine()
    a = eng.add_request("a", 4000, 1000, 0.0)
    eng.advance(0.5)
    assert 0 < eng.emitted(a) < 1000
    eng.abort(a, 0.5)
    assert a.finished and a.finish_reason == "abort"
    assert eng.snapshot().running == 0 and eng.kv_blocks_used() == pytest.approx(0.0, abs=1e-6)
    assert eng.stats.success["abort"] == 1


def test_request_longer_than_the_context_is_refused():
    eng = small_engine(max_model_len=8192)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request("x", 8000, 500, 0.0)


def test_token_ids_share_their_common_prefix():
    eng = small_engine()
    system = list(range(5000))
    a = eng.add_request("a", 5300, 50, 0.0, token_ids=system + [7] * 300)
    run_all(eng)
    b = eng.add_request("b", 5900, 50, 10.0, token_ids=system + [9] * 900)
    run_all(eng)
    assert a.cached_tokens == 0
    assert b.cached_tokens == (5000 // 64) * 64  # the shared system prompt's full blocks


def test_requests_without_a_decode_step_record_a_zero_time_per_output_token():
    # vLLM 0.33 (v1/metrics/stats.py) observes every finished request's mean TPOT, 0 when it produced at most
    # one token; the lowest TPOT bucket holds those zeros, and request_generation_tokens' le=1 bucket counts them.
    fine = {"inter_token_latency": tuple(itl_buckets(100.0, 1.8))}  # as rendered: lowest bound 2.5 ms
    eng = Engine(DEFAULT, seed=3, config=EngineConfig.from_profile(DEFAULT, buckets=fine))
    one = [eng.add_request(f"one-{i}", 500, 1, 0.0) for i in range(5)]
    long = [eng.add_request(f"long-{i}", 500, 60, 0.0) for i in range(7)]
    gone = eng.add_request("aborted", 500, 60, 0.0)
    eng.abort(gone, 0.0)  # still waiting: no token at all
    eng.advance(60.0)
    assert all(r.finished for r in one + long)
    st = eng.stats
    assert st.tpot.n == 13 and st.req_generation_tokens.n == 13
    assert st.tpot.counts[0] == 6 == st.req_generation_tokens.counts[0]  # 5 one-token + 1 aborted: TPOT 0
    decoded = [(r.last_token - r.first_token) / (r.emitted - 1) for r in long]
    assert st.tpot.total == pytest.approx(sum(decoded))
    assert min(decoded) > st.tpot.bounds[0]  # the long requests are not in the lowest bucket


def _two_turns(unit: int, shared: int = 0, sid: int = 1) -> tuple[int, int]:
    """Cached tokens of a conversation's two turns on one engine with cache unit `unit` (0: the KV block),
    keyed as the benchmark's sessions are: one chained key per unit, the last one the unit the content ends
    inside."""
    eng = small_engine(cache_unit_tokens=unit)
    u = eng.unit

    def keys(tokens: int) -> list[int]:
        return [(sid << 20) | j for j in range(-(-tokens // u))]

    p1, o1 = 5000, 100  # 5,100 tokens: 9 full 512-token units and 2 full 64-token blocks past them
    a = eng.add_request("a", p1, o1, 0.0, block_hashes=keys(p1 + o1), hashes_cover_output=True,
                        hashes_chained=True, shared_prefix_tokens=shared)
    run_all(eng)
    p2 = p1 + o1 + 700
    b = eng.add_request("b", p2, 50, a.finish_time + 1.0, block_hashes=keys(p2 + 50), hashes_cover_output=True,
                        hashes_chained=True, shared_prefix_tokens=shared)
    run_all(eng)
    return a.cached_tokens, b.cached_tokens


def test_coarse_cache_units_keep_the_kv_blocks_past_the_last_full_unit():
    # vLLM caches every full KV block of a finished turn (prompt and answer but its last token): the next turn
    # finds them all. With 512-token units the blocks of the unit the turn ended inside count as well.
    fine = _two_turns(0)
    assert fine == (0, (5100 - 1) // 64 * 64)
    assert _two_turns(512) == fine


def test_a_shared_system_prompt_ending_inside_a_coarse_unit_hits_its_kv_blocks():
    # two sessions sharing an 800-token system prompt: 1 unit of 512 and 4 full blocks of 64 past it
    eng = small_engine(cache_unit_tokens=512)
    shared = 800

    def keys(sid: int, tokens: int) -> list[int]:
        return [j if j < shared // 512 else (sid << 20) | j for j in range(-(-tokens // 512))]

    a = eng.add_request("a", 3000, 100, 0.0, block_hashes=keys(1, 3100), hashes_cover_output=True,
                        hashes_chained=True, shared_prefix_tokens=shared)
    run_all(eng)
    b = eng.add_request("b", 3000, 100, a.finish_time + 1.0, block_hashes=keys(2, 3100), hashes_cover_output=True,
                        hashes_chained=True, shared_prefix_tokens=shared)
    run_all(eng)
    assert b.cached_tokens == shared // 64 * 64  # 768, as 64-token blocks give; not just the full unit (512)
