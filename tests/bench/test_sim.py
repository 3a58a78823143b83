"""The simulator end to end on a tiny scenario: determinism, the oracle bound, trace replay, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from flashserve_testbed.bench import cli
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.sim import Settings, Simulation, Workload, run_oracle

from .conftest import SAMPLE_TRACE

pytestmark = pytest.mark.timeout(120)


def _workload(scenario, seed, profile, calib):
    return Workload(scenario, seed, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)


def _run(workload, calib, family, variant="default"):
    pol = build(PolicySpec(family, variant), calib, workload.scenario.startup_median_s, 100.0)
    return Simulation(workload, pol, Settings()).run()


@pytest.fixture(scope="module")
def runs(tiny, profile, calib):
    w = _workload(tiny, 3, profile, calib)
    out = {"oracle": run_oracle(w, Settings())}
    for fam in ("flashserve", "hpa", "kpa", "static"):
        out[fam] = _run(w, calib, fam)
    return w, out


def test_flashserve_reads_the_per_request_speed_from_the_simulated_prometheus(tiny, profile, calib):
    # the engine model records vllm:request_time_per_output_token_seconds; the simulated Prometheus serves it
    w = _workload(tiny, 3, profile, calib)
    pol = build(PolicySpec("flashserve"), calib, w.scenario.startup_median_s, 100.0)
    res = Simulation(w, pol, Settings(decisions=True)).run()
    read = [d["readings"] for d in res.decisions if d["readings"].get("speedAtPercentile") is not None]
    assert read and sum(r["speedSource"] == "requests" for r in read) >= 0.9 * len(read)
    assert all(60.0 < r["speedAtPercentile"] < 200.0 for r in read)


def test_same_seed_same_result(tiny, profile, calib, runs):
    _, out = runs
    again = _run(_workload(tiny, 3, profile, calib), calib, "flashserve")
    assert again.row() | {"cpu_seconds": 0} == out["flashserve"].row() | {"cpu_seconds": 0}
    other = _run(_workload(tiny, 4, profile, calib), calib, "flashserve")
    assert other.output_tokens != out["flashserve"].output_tokens


def test_oracle_is_a_lower_bound_on_gpu_hours(runs):
    w, out = runs
    oracle = out["oracle"].gpu_hours
    assert oracle == pytest.approx(w.oracle_gpu_hours)
    for name, res in out.items():
        assert res.gpu_hours >= oracle - 1e-9, name
        assert res.requests > 100 and 0.0 <= res.attainment <= 1.0


def test_results_are_scored_sensibly(runs):
    _, out = runs
    st = out["static"]
    assert st.scale_actions == 0
    assert st.attainment > 0.95  # peak-sized and ready from the start
    assert out["hpa"].scale_actions >= 1  # the step up at minute two needs a replica
    for res in out.values():
        assert res.speed_p50 >= res.speed_p90 > 0
        assert res.step_attainment is not None and 0.0 < res.step_attainment <= 1.0


def test_all_ranks_mode_simulates_every_engine(tiny, profile, calib, runs):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len, all_ranks=True)
    pol = build(PolicySpec("static"), calib, tiny.startup_median_s, 100.0)
    sim = Simulation(w, pol, Settings(all_ranks=True))
    res = sim.run()
    assert all(len(g.ranks) == profile.engines_per_replica for g in sim.fleet.all if g.ranks)
    rep = runs[1]["static"]
    # four times the sessions on four times the engines: the same load per engine, the same service
    assert res.requests == pytest.approx(profile.engines_per_replica * rep.requests, rel=0.15)
    assert res.gpu_hours == rep.gpu_hours
    assert res.attainment == pytest.approx(rep.attainment, abs=0.01)
    assert res.speed_p50 == pytest.approx(rep.speed_p50, rel=0.03)


def test_trace_replay(tiny, profile, calib):
    sc = replace(tiny, name="trace", trace=str(SAMPLE_TRACE), duration_s=150.0, warmup_s=20.0)
    w = _workload(sc, 1, profile, calib)
    assert w.trace and not w.starts
    res = _run(w, calib, "hpa")
    assert res.requests > 10 and res.unfinished == 0
    # each kept conversation is replayed whole: one representative rank sees about a quarter of them
    assert 0.1 < len(w.trace) / 222 < 0.5


def test_cli_quick_json_schema(tmp_path):
    out = tmp_path / "r.json"
    rc = cli.main(["autoscale", "--quick", "--minutes", "3", "--policies", "flashserve", "hpa", "--no-tuned",
                   "--json", str(out), "--csv", str(tmp_path / "r.csv"), "--quiet", "--no-plots",
                   "--decision-log", str(tmp_path / "log")])  # fmt: skip
    assert rc == 0
    (log,) = (tmp_path / "log").iterdir()
    first = json.loads(log.read_text().splitlines()[0])
    assert log.name.startswith("quick-flash-seed1-flashserve") and first["t"] >= 0
    assert {"reason", "desired", "readings"} <= first.keys()
    recs = json.loads(out.read_text())
    assert [r["policy"] for r in recs] == ["oracle", "flashserve", "hpa"]
    for r in recs:
        for key in ("policy", "attainment", "gpu_hours", "tokens_per_dollar", "scale_actions"):
            assert key in r
        assert 0.0 <= r["attainment"] <= 1.0
        assert r["gpu_hours"] > 0 and r["tokens_per_dollar"] > 0
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("policy,scenario,seed,attainment") and len(rows) == 4
