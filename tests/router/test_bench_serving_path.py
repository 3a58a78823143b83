"""The pure parts of the serving-path hit-rate benchmark: rates, medians over rounds, the targets' verdicts."""

from __future__ import annotations

import math

import pytest
from flashserve_testbed.router.bench_serving_path import (
    ceiling_summary,
    ceilings,
    first_turn_share,
    hit_rate,
    markdown,
    rank_balancer_env,
    router_workers,
    summarize,
    target_lines,
)


def test_hit_rate_is_the_counters_change_not_their_totals():
    assert hit_rate((100.0, 1000.0), (190.0, 1100.0)) == pytest.approx(0.9)
    assert math.isnan(hit_rate((5.0, 10.0), (5.0, 10.0)))


def test_medians_and_differences_come_from_the_rounds():
    s = summarize({"routed": [0.80, 0.90, 0.86], "single": [0.88, 0.89, 0.90], "service": [0.60, 0.66, 0.64]})
    assert s["median"] == {"routed": 0.86, "single": 0.89, "service": 0.64}
    assert s["routed_minus_single_points"] == pytest.approx(-3.0)
    assert s["routed_minus_service_points"] == pytest.approx(22.0)
    assert s["per_round_routed_minus_single_points"] == pytest.approx([-8.0, 1.0, -4.0])
    assert s["per_round_routed_minus_service_points"] == pytest.approx([20.0, 24.0, 22.0])
    assert s["near_single"] and not s["above_service"]
    lines = target_lines(s, "40 s")
    assert lines[0].startswith("PASS [40 s] routed within 5 points of single: -3.0")
    assert lines[1].startswith("FAIL [40 s] routed at least 25 points above service: +22.0")


def test_targets_at_and_past_their_bounds():
    at = summarize({"routed": [0.90], "single": [0.95], "service": [0.65]})
    assert at["near_single"] and at["above_service"]  # -5.0 and +25.0 meet the targets
    past = summarize({"routed": [0.90], "single": [0.951], "service": [0.651]})
    assert not past["near_single"] and not past["above_service"]
    above_single = summarize({"routed": [0.97], "single": [0.91], "service": [0.5]})
    assert not above_single["near_single"]  # "within 5 points" either way


def test_a_round_without_queries_is_left_out_and_a_mode_without_any_is_an_error():
    s = summarize({"routed": [float("nan"), 0.8], "single": [0.82], "service": [0.5]})
    assert s["median"]["routed"] == 0.8
    with pytest.raises(ValueError, match="service"):
        summarize({"routed": [0.8], "single": [0.82], "service": [float("nan")]})


def test_first_turn_share_counts_ok_requests_prompt_tokens():
    reqs = [{"turn": 0, "prompt_tokens": 1000}, {"turn": 1, "prompt_tokens": 2000},
            {"turn": 2, "prompt_tokens": 1000}, {"turn": 0, "prompt_tokens": 5000, "error": "HTTP 500"}]
    assert first_turn_share(reqs) == pytest.approx(0.25)
    assert first_turn_share([]) is None


def test_the_table_lists_every_round_and_the_errors():
    def mode(rate, errors=None):
        return {"hit_rate": rate, "first_turn_share": 0.1, "errors": errors or {}}

    rounds = [{"modes": {"routed": mode(0.8), "single": mode(0.9), "service": mode(0.6, {"500": 2})}},
              {"modes": {"routed": mode(0.85), "single": mode(0.88), "service": mode(0.62)}}]
    window = {"rounds": rounds, "summary": summarize({k: [r["modes"][k]["hit_rate"] for r in rounds]
                                                      for k in ("routed", "single", "service")})}
    table = markdown(window, 8).splitlines()
    assert table[2].startswith("| routed | 3 | 24 | 82.5% | 80.0%, 85.0% |")
    assert table[4].endswith("| 2 |")


SESSION = [  # one session: the first turn hits the shared system prompt (768 tokens), later ones their history
    {"session": 7, "turn": 0, "prompt_tokens": 1100, "cached_tokens": 768, "completion_tokens": 100},
    {"session": 7, "turn": 1, "prompt_tokens": 1500, "cached_tokens": 1152, "completion_tokens": 50},
    {"session": 7, "turn": 2, "prompt_tokens": 2000, "cached_tokens": 0, "completion_tokens": 10},
]


def test_affinity_ceiling_hits_each_turns_history_to_whole_blocks():
    c = ceilings(SESSION, replicas=3)
    # 768 (system prompt); min(1100 + 100, 1499) -> 1152; min(1500 + 50, 1999) -> 1536
    assert c["affinity"] == pytest.approx((768 + 1152 + 1536) / 4600)
    assert c["random"] < c["affinity"]


def test_random_ceiling_is_affinity_on_one_replica_and_the_system_prompt_on_very_many():
    assert ceilings(SESSION, replicas=1)["random"] == pytest.approx(ceilings(SESSION, replicas=1)["affinity"])
    assert ceilings(SESSION, replicas=10**9)["random"] == pytest.approx(3 * 768 / 4600)


def test_ceilings_leave_out_failed_requests_and_need_some():
    failed = {"session": 7, "turn": 3, "prompt_tokens": 9000, "error": "HTTP 400"}
    assert ceilings([*SESSION, failed])["affinity"] == pytest.approx(ceilings(SESSION)["affinity"])
    assert ceilings([failed])["affinity"] is None


def test_ceiling_summary_takes_medians_over_rounds():
    def rnd(aff, rand):
        c = {"affinity": aff, "random": rand}
        return {"modes": {"routed": {"ceilings": c}, "service": {"ceilings": c}}}

    c = ceiling_summary([rnd(0.9, 0.7), rnd(0.8, 0.7), rnd(0.95, 0.65)])
    assert c["routed"]["affinity"] == 0.9 and c["routed"]["random"] == 0.7
    assert c["routed"]["gap_points"] == pytest.approx(20.0)
    assert ceiling_summary([{"modes": {"routed": {}, "service": {}}}]) is None


def test_a_kv_capacity_becomes_the_fewest_blocks_that_hold_it_through_the_servings_own_fields():
    from flashserve_testbed.engine.profile import load
    from flashserve_testbed.router.bench_serving_path import engine_for_kv, serving_name

    p = load("gb200-4gpu-demo")
    assert engine_for_kv(None) == {} and serving_name("routed", None) == "routed"
    for kv in (12800, 12801, 32768):
        e = engine_for_kv(kv)
        blocks = p.kv_blocks(e["gpuMemoryUtilization"])
        # the engines' own memory arithmetic gives the cache asked for, to the block, and no context over it
        assert blocks == -(-kv // p.block_size)
        assert p.kv_blocks(round(e["gpuMemoryUtilization"] - 1e-6, 6)) < blocks
        assert e["maxModelLen"] == min(p.max_model_len, blocks * p.block_size)
    assert serving_name("service", 12800) == "service-kv12800"
    with pytest.raises(ValueError, match="room"):
        engine_for_kv(10**9)


def test_the_report_names_each_capacity_and_window():
    from flashserve_testbed.router.bench_serving_path import report

    def window(seconds, rates):
        return {"seconds": seconds, "rounds": [{"modes": {m: {"hit_rate": rates[m][0], "errors": {},
                                                                "first_turn_share": 0.1} for m in rates}}],
                "hit_rate": rates, "summary": summarize(rates)}

    rates = {"routed": [0.86], "single": [0.88], "service": [0.55]}
    out = {"config": {"sessions_per_replica": 8},
           "capacities": [{"kv_tokens": None, "windows": [window(40, rates)]},
                          {"kv_tokens": 12800, "windows": [window(40, rates)]}]}
    text = "\n".join(report(out))
    assert "## 40 s window, 1 rounds" in text and "## KV 12.8K/engine, 40 s window, 1 rounds" in text
    assert "PASS [KV 12.8K/engine, 40 s] routed at least 25 points above service: +31.0" in text


def test_resident_tokens_is_littles_law_over_the_runs_span_and_engines():
    from flashserve_testbed.router.bench_serving_path import resident_tokens

    reqs = [{"start": 0.0, "end": 10.0, "prompt_tokens": 900, "completion_tokens": 100},   # 1000 held 10 s
            {"start": 5.0, "end": 10.0, "prompt_tokens": 3000, "completion_tokens": 1000},  # 4000 held 5 s
            {"start": 0.0, "end": 9.0, "prompt_tokens": 10**6, "error": "HTTP 400"}]       # refused: holds nothing
    # (1000 * 10 + 4000 * 5) / 10 s = 3000 tokens resident, over 2 engines
    assert resident_tokens(reqs, engines=2) == pytest.approx(1500)
    assert resident_tokens(reqs[2:], engines=2) is None


def test_the_rank_balancer_reaches_the_mock_engines_through_the_servings_env_field():
    from flashserve.api.validation import parse_serving

    from tests.builders import cr

    assert rank_balancer_env(None) == {}
    engine = rank_balancer_env("load")
    assert engine == {"env": [{"name": "FLASHSERVE_MOCK_DP_ROUTING", "value": "load"}]}
    # the operator admits it as a plain env entry of the engine container
    spec = parse_serving(cr({"engine": engine})).spec
    assert [(e.name, e.value) for e in spec.engine.env] == [("FLASHSERVE_MOCK_DP_ROUTING", "load")]


def test_a_dp_aware_router_lists_each_rank_of_each_engine():
    engines = ["http://127.0.0.5:8000", "http://127.0.0.9:8000"]
    assert router_workers(engines, 1) == engines
    assert router_workers(engines, 2) == ["http://127.0.0.5:8000@0", "http://127.0.0.5:8000@1",
                                          "http://127.0.0.9:8000@0", "http://127.0.0.9:8000@1"]


def test_the_busiest_rank_share_is_over_the_run_not_the_counters_totals():
    from flashserve_testbed.router.bench_serving_path import busiest_share

    assert busiest_share([100, 0, 5, 5], [104, 2, 7, 7]) == 4 / 2.5
    assert busiest_share([1, 1], [3, 3]) == 1.0
    assert busiest_share([1, 1], [1, 1]) is None and busiest_share([], []) is None
