"""`--flashserve-set` and `--heldout --train-only`: FlashServe's policy run with PolicyConfig fields set,
labelled so that settings never mix, and the train-only mode that chooses them without the test set."""

from __future__ import annotations

from dataclasses import replace

import pytest
from flashserve_testbed.bench import cli, protocol
from flashserve_testbed.bench.measures import Result
from flashserve_testbed.bench.policies import FlashServe, PolicySpec, build, check_flashserve, parse_overrides

from tests.builders import bench_context as context


def test_values_are_parsed_as_their_fields_type_and_sorted():
    got = parse_overrides(["scale_down_utilization=0.7", "learn_startup=false", "scale_down_step=2",
                           "trend_horizon_s=none", "overload_demand_at_sla=on", "mode=Advisory"])  # fmt: skip
    assert got == (("learn_startup", False), ("mode", "Advisory"), ("overload_demand_at_sla", True),
                   ("scale_down_step", 2), ("scale_down_utilization", 0.7), ("trend_horizon_s", None))  # fmt: skip
    assert isinstance(dict(got)["scale_down_step"], int)
    assert parse_overrides([]) == ()


@pytest.mark.parametrize(("item", "says"), [
    ("scale_down_utilisation=0.7", "scale_down_utilisation: is not a PolicyConfig field"),
    ("max_replicas=9", "max_replicas: is set from each run"),
    ("scale_down_utilization", "give FIELD=VALUE"),
    ("scale_down_utilization=lots", "scale_down_utilization='lots': give a value of type float"),
    ("scale_down_utilization=nan", "give a finite number"),
    ("scale_down_utilization=none", "give a value of type float"),  # this field cannot be unset
    ("learn_startup=maybe", "learn_startup='maybe': give true or false"),
])  # fmt: skip
def test_a_bad_item_is_refused_naming_the_field(item, says):
    with pytest.raises(ValueError, match="--flashserve-set") as exc:
        parse_overrides([item])
    assert says in str(exc.value)


def test_a_field_given_twice_is_refused():
    with pytest.raises(ValueError, match="scale_up_utilization: given twice"):
        parse_overrides(["scale_up_utilization=0.9", "scale_up_utilization=1.1"])


def test_the_label_carries_the_setting():
    ov = parse_overrides(["scale_down_utilization=0.7", "learn_startup=false"])
    assert PolicySpec("flashserve").label == "flashserve"
    assert PolicySpec("flashserve", overrides=ov).label == "flashserve@learn_startup=false+scale_down_utilization=0.7"
    sweep = PolicySpec("flashserve", "sweep", 0.9, "scale_up_utilization", ov)
    assert sweep.label == "flashserve@u=0.9+learn_startup=false+scale_down_utilization=0.7"


def test_build_hands_the_fields_to_the_policy_config(calib):
    ov = parse_overrides(["scale_down_utilization=0.7", "peak_window_startups=2", "learn_startup=false"])
    spec = PolicySpec("flashserve", overrides=ov)
    pol = build(spec, calib, 300.0, 100.0, learn_startup=True)
    assert isinstance(pol, FlashServe) and pol.name == spec.label
    cfg = pol.config(context(calib, 100.0))
    assert cfg.scale_down_utilization == 0.7 and cfg.peak_window_startups == 2.0
    assert cfg.learn_startup is False  # the override wins over the run's setting
    assert cfg.peak_window_s == 600.0
    # a swept knob and the set fields together
    both = build(PolicySpec("flashserve", "sweep", 1.1, "scale_up_utilization", ov), calib, 300.0, 100.0)
    cfg = both.config(context(calib, 100.0))
    assert cfg.scale_up_utilization == 1.1 and cfg.scale_down_utilization == 0.7
    assert (both.knob, both.knob_value) == ("scale_up_utilization", 1.1)  # the CSV names the swept knob
    assert (pol.knob, pol.knob_value) == ("scale_up_utilization", 1.0)  # numbers only in the knob columns
    plain = build(PolicySpec("flashserve"), calib, 300.0, 100.0).config(context(calib, 100.0))
    assert plain.scale_down_utilization == 0.8 and plain.peak_window_s == 1200.0


def test_cli_refuses_a_bad_field_and_train_only_without_heldout(capsys):
    assert cli.main(["autoscale", "--heldout", "--flashserve-set", "bogus=1", "--quiet"]) == 2
    assert "--flashserve-set bogus: is not a PolicyConfig field" in capsys.readouterr().err
    assert cli.main(["autoscale", "--quick", "--flashserve-set", "scale_up_utilization=x", "--quiet"]) == 2
    assert "scale_up_utilization='x'" in capsys.readouterr().err
    # a value out of range is refused by name before any run, not met as a division by zero mid-run
    assert cli.main(["autoscale", "--quick", "--flashserve-set", "scale_up_utilization=0", "--quiet"]) == 2
    assert "--flashserve-set scale_up_utilization=0.0: give a number > 0" in capsys.readouterr().err
    assert cli.main(["autoscale", "--quick", "--flashserve-set", "release_share=1.5", "--quiet"]) == 2
    assert "release_share=1.5: give a number > 0 and <= 1" in capsys.readouterr().err
    assert cli.main(["autoscale", "--train-only", "--quiet"]) == 2
    assert "--train-only is a mode of --heldout" in capsys.readouterr().err
    # decision logs come from the train set only: the test set's decisions are nothing to develop on
    assert cli.main(["autoscale", "--heldout", "--decision-log", "/nonexistent", "--quiet"]) == 2
    assert "--heldout --decision-log needs --train-only" in capsys.readouterr().err


def test_a_set_field_the_knob_sweep_contradicts_is_refused_before_any_run(monkeypatch, capsys):
    from flashserve_testbed.bench import calibrate

    def no_run(*a, **k):
        raise AssertionError("a run started")

    monkeypatch.setattr(calibrate, "calibrate", no_run)
    # valid alone (the default scale_up_utilization is 1.0), but the sweep runs scale_up_utilization=0.9
    argv = ["autoscale", "--scenarios", "agentic-bursty", "--policies", "flashserve", "--startups", "none",
            "--flashserve-set", "scale_down_utilization=0.95", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "flashserve@u=0.9+scale_down_utilization=0.95" in err
    assert "scale_down_utilization=0.95 is above scale_up_utilization=0.9" in err and "--no-sweep" in err
    # without the sweep the same setting runs
    check = PolicySpec("flashserve", overrides=parse_overrides(["scale_down_utilization=0.95"]))
    check_flashserve(check)


def test_the_protocol_runs_the_set_policy_on_train_and_test(profile):
    from flashserve_testbed.bench.sim import Settings

    ours = PolicySpec("flashserve", overrides=parse_overrides(["scale_down_utilization=0.7"]))
    scs = [protocol.generate("step", 1001), protocol.generate("ramp", 1001)]
    only = protocol.train_tasks(scs, Settings(), ours, baselines=False).tasks()
    assert [t.label for t in only] == [ours.label, ours.label]  # no oracle, no baseline
    full = protocol.train_tasks(scs, Settings(), ours).tasks()
    assert {t.label for t in full} >= {"oracle", ours.label, "hpa@0.5"} and "flashserve" not in {t.label for t in full}
    test = protocol.held_out_tasks([protocol.generate("step", 2001)], Settings(), {}, ours).tasks()
    assert ours.label in {t.label for t in test} and "flashserve" not in {t.label for t in test}


def _res(policy: str, scenario: str, attainment: float, x_oracle: float) -> Result:
    seed = int(scenario.rsplit("-", 1)[1])
    return Result(policy=policy, scenario=scenario, seed=seed, attainment=attainment, speed_p90=0, speed_p50=0,
                  ttft_p90_s=0, gpu_hours=10 * x_oracle, tokens_per_dollar=1, output_tokens_per_dollar=1,
                  scale_actions=0, replicas_mean=1, replicas_max=4, requests=1, unfinished=0, output_tokens=1,
                  sim_seconds=1, cpu_seconds=0, oracle_gpu_hours=10.0)  # fmt: skip


def test_train_medians_are_per_family_and_over_all_of_ours_only():
    label = "flashserve@scale_down_utilization=0.7"
    train = [_res(label, "step-1001", 0.90, 1.2), _res(label, "step-1002", 0.96, 1.4),
             _res(label, "ramp-1001", 0.99, 1.1), _res("flashserve", "ramp-1001", 0.5, 9.0)]  # fmt: skip
    med = protocol.train_medians(train, label)
    assert list(med) == ["all", "step", "ramp"]
    assert med["step"] == (pytest.approx(0.93), pytest.approx(1.3), 2)
    assert med["all"] == (pytest.approx(0.96), pytest.approx(1.2), 3)
    text = protocol.train_markdown(train, label)
    assert f"| {label} | 96.00% / 1.200 | 93.00% / 1.300 | 99.00% / 1.100 |" in text


def test_the_held_out_table_and_checks_read_the_set_policys_row():
    label = "flashserve@peak_window_startups=2"
    test = [_res("oracle", "step-2001", 0.99, 1.0), _res(label, "step-2001", 0.95, 1.5),
            _res("hpa", "step-2001", 0.97, 1.3)]  # fmt: skip
    text, ch = protocol.markdown(test, 0.95, {}, label)
    assert f"| {label} | 95.0% / 1.50 | 95.0% / 1.50 |" in text
    assert [d.split(" (")[0] for d in ch.dominated] == ["step: hpa"]


def test_cli_train_only_runs_the_set_policy_on_the_train_set_alone(monkeypatch, calib, capsys, tmp_path):
    from flashserve_testbed.bench import calibrate, fluid

    seen = {}

    def run_train(profile, calib_, settings, fams, n_train, jobs, curve, progress, ours, frontier=False):
        seen.update(fams=fams, n_train=n_train, ours=ours, frontier=frontier)
        return [_res(ours.label, "step-1001", 0.9, 1.2), _res(ours.label, "step-1002", 0.96, 1.4)]

    def no_test_set(*a, **k):
        raise AssertionError("--train-only ran the test set")

    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: calib)
    monkeypatch.setattr(fluid, "build_curve", lambda *a, **k: None)
    monkeypatch.setattr(protocol, "run_train", run_train)
    monkeypatch.setattr(protocol, "run", no_test_set)
    out, csv_path = tmp_path / "t.json", tmp_path / "t.csv"
    assert cli.main(["autoscale", "--heldout", "--train-only", "--families", "step", "--quiet", "--json", str(out),
                     "--csv", str(csv_path), "--flashserve-set", "peak_window_startups=2"]) == 0  # fmt: skip
    assert seen["fams"] == ["step"] and seen["n_train"] == 2
    assert seen["ours"].label == "flashserve@peak_window_startups=2"
    assert "| flashserve@peak_window_startups=2 | 93.00% / 1.300 | 93.00% / 1.300 |" in capsys.readouterr().out
    import json

    got = json.loads(out.read_text())
    assert got["setting"] == "flashserve@peak_window_startups=2" and got["train"]["all"]["runs"] == 2
    assert seen["frontier"] is False and "over_frontier" not in got["train"]["all"]  # no bound runs: not read
    # --csv holds every train run, one row each (it was ignored in this mode)
    rows = csv_path.read_text().splitlines()
    assert len(rows) == 3 and all(",step-100" in r for r in rows[1:])


def test_cli_heldout_hands_the_set_policy_to_the_protocol(monkeypatch, calib, capsys):
    from flashserve_testbed.bench import calibrate, fluid

    seen = {}

    def run(profile, calib_, settings, fams, n_train, n_test, jobs, curve, progress, ours, frontier=False):
        seen["ours"] = ours
        return [], [_res("oracle", "step-2001", 0.99, 1.0), _res(ours.label, "step-2001", 0.97, 1.3)], 0.95, {}

    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: calib)
    monkeypatch.setattr(fluid, "build_curve", lambda *a, **k: None)
    monkeypatch.setattr(protocol, "run", run)
    assert cli.main(["autoscale", "--heldout", "--quiet", "--no-plots", "--flashserve-set", "scale_up_utilization=0.9"]) == 0
    assert seen["ours"].overrides == (("scale_up_utilization", 0.9),)
    assert "| flashserve@scale_up_utilization=0.9 | 97.0% / 1.30 |" in capsys.readouterr().out


def test_startups_none_means_no_sweep_and_a_bad_value_names_the_flag(capsys):
    assert cli.parse_startups(None) is None
    assert cli.parse_startups(["none"]) == []
    assert cli.parse_startups([]) == []
    assert cli.parse_startups(["30", "1200"]) == [30.0, 1200.0]
    for bad in (["soon"], ["0"], ["-5"], ["inf"], ["none", "30"]):
        with pytest.raises(ValueError, match="--startups"):
            cli.parse_startups(bad)
    assert cli.main(["autoscale", "--quick", "--startups", "soon", "--quiet"]) == 2
    assert "--startups: 'soon'" in capsys.readouterr().err


def test_a_further_routing_model_keeps_no_bound_and_runs_no_sweep_or_timeline():
    from flashserve_testbed.bench.runner import Plan
    from flashserve_testbed.bench.workloads import QUICK_SCENARIO

    spec = PolicySpec("flashserve")
    name = QUICK_SCENARIO.name
    plan = Plan(scenarios=[QUICK_SCENARIO], seeds=[1, 2], table=[spec], sweep=[spec], sweep_scenarios=[name],
                sweep_seeds=[1], startups=[30.0], startup_specs=[spec], startup_scenario=name, startup_seeds=[1],
                timeline_scenario=name, timeline_seed=1, bound=False)  # fmt: skip
    assert len(plan.tasks()) > 4  # the first model's plan has the sweep, the start-ups and the timeline
    again = cli.further_routing(plan, "router-rank")
    tasks = again.tasks()
    assert {t.settings.routing for t in tasks} == {"router-rank"}
    assert len(tasks) == 2 * 2  # per seed: the oracle and the one policy, no bound
    assert all(t.kind == "table" and not t.settings.timeline for t in tasks)
    assert len(cli.further_routing(replace(plan, bound=True), "service").tasks()) == 2 * 3
