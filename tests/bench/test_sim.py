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
        # the oracle's fleet is the smallest that meets the SLA: a policy below its GPU-hours must miss it
        assert res.gpu_hours >= oracle - 1e-9 or res.attainment < out["oracle"].attainment - 0.05, name
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


def _aiperf_trace(path, sessions=60, turns=4, long_every=0):
    """Agentic-looking aiperf sessions: a shared 2-block system prompt, tool results `delay` ms after each
    answer; every `long_every`-th session has a last turn too long for the model's context."""
    import gzip

    rows = []
    for k in range(sessions):
        for t in range(turns):
            row = {"session_id": f"s{k}", "input_length": 1500 if t == 0 else 400, "output_length": 60}
            if t == 0:
                row |= {"timestamp": k * 2500, "hash_ids": [1, 2, 1000 + k]}
            else:
                row["delay"] = 3000
            if long_every and k % long_every == 0 and t == turns - 1:
                row["input_length"] = 300_000
            rows.append(row)
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return path


def test_aiperf_sessions_replay_closed_loop(tmp_path, tiny, profile, calib):
    trace = _aiperf_trace(tmp_path / "agentic.jsonl.gz")
    sc = replace(tiny, name="aiperf", trace=str(trace), duration_s=150.0, warmup_s=10.0)
    w = _workload(sc, 1, profile, calib)
    assert w.sessions and not w.trace and len(w.starts) == len(w.sessions)
    # one representative rank sees about a quarter of the sessions, each whole
    assert 0.1 < len(w.sessions) / 60 < 0.5
    res = _run(w, calib, "hpa")
    assert res.requests > 10 and res.refused == 0
    # later turns resend the conversation: the oracle's demand counts every turn of every kept session
    assert len(w.occ_starts) == sum(len(s.turns) for s in w.sessions if s.start_ms / 1000.0 - 10.0 < 150.0)


def test_turns_over_max_model_len_are_refused_not_a_crash(tmp_path, tiny, profile, calib):
    trace = _aiperf_trace(tmp_path / "long.jsonl", long_every=2)
    sc = replace(tiny, name="aiperf-long", trace=str(trace), duration_s=150.0, warmup_s=10.0)
    res = _run(_workload(sc, 1, profile, calib), calib, "hpa")
    assert res.refused >= 1 and res.requests > 0
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text("".join(json.dumps({"timestamp": i * 500, "input_length": 300_000 if i % 3 == 0 else 900,
                                            "output_length": 20}) + "\n" for i in range(200)))  # fmt: skip
    res = _run(_workload(replace(sc, trace=str(mooncake)), 1, profile, calib), calib, "hpa")
    assert res.refused >= 1 and res.requests > 0


def test_cli_scenarios_none_runs_only_the_trace(tmp_path, capsys):
    trace = _aiperf_trace(tmp_path / "agentic.jsonl.gz", sessions=20)
    out = tmp_path / "r.csv"
    rc = cli.main(["autoscale", "--trace", str(trace), "--scenarios", "none", "--policies", "hpa", "--no-tuned",
                   "--no-sweep", "--seeds", "1", "--minutes", "1", "--csv", str(out), "--quiet", "--no-plots"])
    assert rc == 0
    rows = out.read_text().splitlines()
    assert rows[1:] and all(",trace-agentic," in r for r in rows[1:])
    assert cli.main(["autoscale", "--scenarios", "none", "--quiet"]) == 2
    assert "--scenarios none needs --trace" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "a", "input_length": 3}\n')
    assert cli.main(["autoscale", "--trace", str(bad), "--quiet"]) == 2
    assert "bad.jsonl:1: a trace line needs `output_length`" in capsys.readouterr().err


def test_cli_quick_json_schema(tmp_path):
    out = tmp_path / "r.json"
    rc = cli.main(["autoscale", "--quick", "--minutes", "3", "--policies", "flashserve", "hpa", "--no-tuned",
                   "--json", str(out), "--csv", str(tmp_path / "r.csv"), "--quiet", "--no-plots",
                   "--decision-log", str(tmp_path / "log")])  # fmt: skip
    assert rc == 0
    (log,) = (tmp_path / "log").iterdir()
    first = json.loads(log.read_text().splitlines()[0])
    assert log.name.startswith("quick-flash-seed1-flashserve") and log.name.endswith("-affinity.jsonl")
    assert first["t"] >= 0
    assert {"reason", "desired", "readings"} <= first.keys()
    recs = json.loads(out.read_text())
    assert [r["policy"] for r in recs] == ["oracle", "bound", "flashserve", "hpa"]
    for r in recs:
        for key in ("policy", "attainment", "gpu_hours", "tokens_per_dollar", "scale_actions"):
            assert key in r
        assert 0.0 <= r["attainment"] <= 1.0
        assert r["gpu_hours"] > 0 and r["tokens_per_dollar"] > 0
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("policy,scenario,seed,attainment") and len(rows) == 5


def test_startup_sweep_runs_on_every_seed(tiny):
    from flashserve_testbed.bench.runner import Plan

    plan = Plan(scenarios=[tiny], seeds=[1, 2, 3], table=[PolicySpec("hpa")], startups=[30.0, 600.0],
                startup_specs=[PolicySpec("hpa")], startup_scenario="tiny", startup_seeds=[1, 2, 3])  # fmt: skip
    sweep = [(t.seed, t.settings.startup_median_s, t.label) for t in plan.tasks() if t.kind == "startup"]
    assert sorted({seed for seed, _, _ in sweep}) == [1, 2, 3]
    assert len(sweep) == 3 * 2 * 3  # seeds x start-ups x (oracle + bound + hpa)


def test_cli_startup_sweep_runs_on_every_seed_with_no_sweep(tmp_path):
    # --no-sweep skips the knob sweeps only: start-ups named with --startups are swept, on every seed given
    trace = _aiperf_trace(tmp_path / "agentic.jsonl.gz", sessions=20)
    out = tmp_path / "r.csv"
    rc = cli.main(["autoscale", "--trace", str(trace), "--scenarios", "none", "--policies", "hpa", "--no-tuned",
                   "--no-sweep", "--no-bound", "--startups", "60", "--seeds", "1", "2", "--minutes", "1",
                   "--startup-model", "cached-node", "--csv", str(out), "--quiet", "--no-plots"])  # fmt: skip
    assert rc == 0
    from flashserve_testbed.bench.report import read_csv

    runs = read_csv(out)
    sweep = [(r.seed, r.policy) for r in runs if r.kind == "startup" and r.startup_median_s == 60.0]
    assert sorted(sweep) == [(1, "hpa"), (1, "oracle"), (2, "hpa"), (2, "oracle")]
    assert {r.startup_model for r in runs} == {"cached-node"}


@pytest.mark.parametrize("routing", ["affinity", "service"])
def test_the_router_counts_arrivals_only_where_there_is_a_router(tiny, profile, calib, routing):
    # The policy reads the arrival rate from the router's vllm_router_requests_total, counted as requests
    # reach it: what a deployment with a router exports, over the same window as the engine rates. A plain
    # Service has no router and no such counter. Every request the run saw arrived once at the router.
    w = _workload(tiny, 3, profile, calib)
    pol = build(PolicySpec("flashserve"), calib, w.scenario.startup_median_s, 100.0)
    sim = Simulation(w, pol, Settings(decisions=True, routing=routing))
    res = sim.run()
    rates = [d["readings"].get("arrivalRate") for d in res.decisions]
    if routing == "service":
        assert not any(rates) and not sim.prom.router
        return
    assert all(r is not None and r > 0 for r in rates[4:])
    assert sim.arrivals * sim.fleet.rank_weight == sim.prom.router[-1][1]
    assert sim.arrivals >= res.requests
    # the other half of the arrival-based demand: output tokens per finished request, from the engines
    assert [d["readings"].get("meanOutputTokens") for d in res.decisions][-1] > 1


def test_decision_logs_of_runs_under_two_routings_are_two_files(tmp_path):
    from types import SimpleNamespace

    def res(routing):
        return SimpleNamespace(scenario="flash-crowd", seed=1, policy="flashserve", startup_median_s=420.0,
                               routing=routing, decisions=[{"t": 0.0, "routing": routing}])  # fmt: skip

    cli._write_decisions(tmp_path, [res("router-rank"), res("affinity"), res("affinity")])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["flash-crowd-seed1-flashserve-startup420-affinity-2.jsonl",
                     "flash-crowd-seed1-flashserve-startup420-affinity.jsonl",
                     "flash-crowd-seed1-flashserve-startup420-router-rank.jsonl"]  # fmt: skip
    assert json.loads((tmp_path / names[2]).read_text())["routing"] == "router-rank"
