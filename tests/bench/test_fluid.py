"""The fluid model: its load test, its arrivals and oracle against the engine model's, and runs of every kind
of policy through it (the full validation against the engine model is in docs/autoscaling-benchmark.md)."""

from __future__ import annotations

import json

import pytest
from flashserve_testbed.bench import cli, fluid
from flashserve_testbed.bench.calibrate import load_test
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.sim import Settings, Simulation, Workload

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def curve(profile):
    return fluid.build_curve(profile, 100.0, sessions=(8, 32, 96, 128, 160, 192, 256, 512, 1024), seconds=100.0)


def _fw(scenario, seed, profile, calib):
    return fluid.FluidWorkload(scenario, seed, profile, calib, CACHE_UNIT_TOKENS)


def _run(w, calib, curve, family, **settings):
    pol = build(PolicySpec(family), calib, w.scenario.startup_median_s, 100.0)
    return fluid.FluidSimulation(w, pol, Settings(engine="fluid", **settings), curve).run()


def test_load_test_with_tool_gaps_is_slower_at_the_same_concurrency(profile):
    # sessions between turns keep prefixes in the cache and make the load fluctuate: at the same mean
    # concurrency the engine meets the SLA for fewer tokens than under back-to-back load
    gaps = load_test(profile, 160, 100.0, 100.0, 30.0, gaps=True).point
    assert 20 < gaps.concurrency < 80  # most sessions are in their tool gap
    flat = load_test(profile, round(gaps.concurrency), 100.0, 100.0, 30.0).point
    assert flat.concurrency == round(gaps.concurrency)
    assert gaps.attainment < flat.attainment - 0.05


def test_curve_is_monotone_and_its_histograms_are_distributions(curve):
    conc = curve.conc
    assert conc == sorted(conc) and len(set(conc)) == len(conc)
    for p in curve.points:
        for shares in (p.tpot, p.itl, p.ttft):
            assert sum(shares) == pytest.approx(1.0)
        assert 0.0 <= p.attainment <= 1.0 and p.running <= p.concurrency + 1.0
    assert curve.points[0].attainment > 0.99 and curve.points[-1].attainment < 0.05
    i, f = curve.locate((conc[1] + conc[2]) / 2)
    assert (i, f) == (1, pytest.approx(0.5))
    assert curve.at("tokens", i, f) == pytest.approx((curve.points[1].tokens + curve.points[2].tokens) / 2)


def test_same_sessions_and_oracle_as_the_engine_model(tiny, profile, calib):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    fw = _fw(tiny, 3, profile, calib)
    assert fw.starts == w.starts
    assert fw.oracle_gpu_hours == pytest.approx(w.oracle_gpu_hours, rel=0.15)


def test_static_fleet_agrees_with_the_engine_model(tiny, profile, calib, curve):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    pol = build(PolicySpec("static"), calib, tiny.startup_median_s, 100.0)
    model = Simulation(w, pol, Settings()).run()
    res = _run(_fw(tiny, 3, profile, calib), calib, curve, "static")
    assert res.gpu_hours == pytest.approx(model.gpu_hours)
    assert res.unfinished == 0
    assert res.requests == pytest.approx(model.requests, rel=0.1)
    assert res.output_tokens == pytest.approx(model.output_tokens, rel=0.1)
    assert res.attainment == pytest.approx(model.attainment, abs=0.03)


def test_policies_read_the_fluid_prometheus(tiny, profile, calib, curve):
    fw = _fw(tiny, 3, profile, calib)
    res = _run(fw, calib, curve, "flashserve", decisions=True)
    read = [d["readings"] for d in res.decisions if d["readings"].get("speedAtPercentile") is not None]
    assert read and all(r["speedSource"] == "requests" for r in read)
    assert all(50.0 < r["speedAtPercentile"] < 200.0 for r in read)
    again = _run(fw, calib, curve, "flashserve", decisions=True)
    assert again.row() | {"cpu_seconds": 0} == res.row() | {"cpu_seconds": 0}
    for family in ("hpa", "kpa", "aibrix-apa", "dynamo", "wva"):
        r = _run(fw, calib, curve, family)
        assert 0.0 < r.attainment <= 1.0 and r.gpu_hours > 0 and r.unfinished == 0
    oracle = fluid.run_oracle(fw, Settings(engine="fluid"), curve)
    assert oracle.gpu_hours == fw.oracle_gpu_hours and oracle.attainment > 0.9


def test_a_crowd_overloads_a_fleet_that_cannot_grow(tiny, profile, calib, curve):
    # the tiny scenario doubles its rate at minute two: one replica that may not grow misses the SLA for
    # much of it, the closed loop slows the sessions down, and everything still finishes after the end
    fw = _fw(tiny.scaled(base_replicas=1.2), 1, profile, calib)
    pol = build(PolicySpec("static"), calib, 60.0, 100.0)
    pol.fixed_replicas = lambda w: 1
    res = fluid.FluidSimulation(fw, pol, Settings(engine="fluid", max_replicas=1), curve).run()
    assert res.attainment < 0.7 and res.unfinished == 0 and res.replicas_max == 1


def test_cli_rejects_traces_with_the_fluid_model(tmp_path, capsys):
    rc = cli.main(["autoscale", "--engine", "fluid", "--trace", str(tmp_path / "t.jsonl"), "--quiet"])
    assert rc == 2
    assert "--engine fluid" in capsys.readouterr().err


def test_cli_quick_with_the_fluid_model(tmp_path):
    out = tmp_path / "r.json"
    rc = cli.main(["autoscale", "--quick", "--engine", "fluid", "--policies", "flashserve", "static", "--no-tuned",
                   "--json", str(out), "--out", str(tmp_path / "o"), "--quiet", "--no-plots"])  # fmt: skip
    assert rc == 0
    recs = {r["policy"]: r for r in json.loads(out.read_text())}
    assert set(recs) == {"oracle", "bound", "flashserve", "static"}
    assert recs["static"]["attainment"] > 0.9 and recs["flashserve"]["gpu_hours"] > 0
    assert "fluid model" in (tmp_path / "o" / "table.md").read_text()


def test_speed_command_refuses_an_empty_day(capsys):
    assert cli.main(["speed", "--engine", "fluid", "--hours", "0"]) == 2
    assert "--hours and --peak-replicas must be > 0" in capsys.readouterr().err


def test_the_fluid_oracle_at_a_lower_utilization_needs_more(tiny, profile, calib):
    fw = _fw(tiny, 3, profile, calib)
    assert fw.oracle_at(1.0) == (fw.oracle_gpu_hours, fw.oracle_steps)
    gpu_h, _ = fw.oracle_at(0.5)
    # ceil(c / (0.5 k)) is at least ceil(c / k) and at most twice it
    assert fw.oracle_gpu_hours < gpu_h <= 2 * fw.oracle_gpu_hours + 1e-9
