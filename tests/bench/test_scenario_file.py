"""Scenario files: the reader, its errors (exit 2 naming the key), and the built-in scenarios as files."""

from __future__ import annotations

import statistics

import pytest
from flashserve_testbed.bench import cli, scenario_file
from flashserve_testbed.bench.workloads import (
    QUICK_SCENARIO,
    SCENARIOS,
    Nominal,
    Scenario,
    Session,
    SessionStats,
)

MIN = 60.0

GOOD = """
scenarios:
  - name: my-crowd
    duration_min: 12
    base_replicas: 0.8
    shape: {step: {at_min: 3, factor: 3, rise_min: 0.5, hold_min: 5, decay_min: 2}}
    bursts: {per_hour: 2, minutes: 1}
    startup_median_s: 60
    warmup_s: 60
    sessions:
      context_limit: [20000, 40000]
      output_tokens: {median: 300, sigma: 0.5, min: 1, max: 4000}
      tool_gap_s: {median: 20, sigma: 0.2, min: 0.3, max: 180}
    profile: {max_model_len: 65536}
  - name: a-day
    duration_min: 120
    base_replicas: 2
    shape: {diurnal: {period_min: 120, trough: 0.25}}
"""


def test_a_good_file_gives_its_scenarios(profile):
    crowd, day = scenario_file.parse(GOOD)
    assert crowd.name == "my-crowd" and crowd.duration_s == 12 * MIN and crowd.startup_median_s == 60
    assert crowd.knots == ((0, 1), (180, 1), (210, 3), (510, 3), (630, 1))
    assert crowd.multiplier(200) == pytest.approx(1 + 2 * 20 / 30)
    assert (crowd.bursts_per_hour, crowd.burst_minutes, crowd.burst_spread_s) == (2, 1, 60)
    # the diurnal shape: `trough` at the start and the end, the peak (1) half a period later
    assert day.multiplier(0) == pytest.approx(0.25) and day.multiplier(60 * MIN) == pytest.approx(1.0)
    assert day.sessions is None and day.profile_for(profile) is profile


def test_session_overrides_reach_the_sessions(profile):
    crowd, _ = scenario_file.parse(GOOD)
    prof = crowd.profile_for(profile)
    assert prof.max_model_len == 65536 and prof.workload.session_context_limit == (20000, 40000)
    # untouched keys keep the profile's
    assert prof.workload.first_turn_tokens == profile.workload.first_turn_tokens
    s = Session(1, 7, prof, 512, prof.max_model_len)
    assert 20000 <= s.limit <= 40000
    outputs, gaps = [], []
    for sid in range(1, 200):
        s = Session(sid, 7, prof, 512, prof.max_model_len)
        while (turn := s.next_turn()) is not None:
            outputs.append(turn[1])
            gaps.append(s.gap())
    assert 250 < statistics.median(outputs) < 350
    assert 18 < statistics.median(gaps) < 22  # the default tool gap's median is 4 s
    # the session statistics (the fluid model's and the workload's rate) follow them too
    nominal = Nominal(0.04, 113.5)
    assert SessionStats.sample(prof, 512, nominal, 300).gap_s > 2 * SessionStats.sample(profile, 512, nominal, 300).gap_s


BAD = [
    ("    shape: {step: {at_min: 1, factr: 3, hold_min: 2}}\n",
     "scenarios[0].shape.step.factr: unknown key; did you mean 'factor'?"),
    ("    burts: {per_hour: 3}\n", "scenarios[0].burts: unknown key; did you mean 'bursts'?"),
    ("    shape: {points: [[0, 1], [5, 2]], step: {at_min: 1, factor: 3, hold_min: 2}}\n",
     "scenarios[0].shape: give exactly one of points, step, ramp, diurnal (got points, step)"),
    ("    shape: {points: [[5, 1], [0, 2]]}\n", "scenarios[0].shape: points: minutes must not decrease"),
    ("    sessions: {context_limit: [5000, 100]}\n", "scenarios[0].sessions: context_limit: give [lo, hi]"),
    ("    sessions: {output_tokens: {median: 5, sigma: 1, min: 10}}\n",
     "scenarios[0].sessions.output_tokens: needs min <= median <= max"),
    ("    profile: {max_model_len: 0}\n", "scenarios[0].profile.max_model_len: Input should be greater than 0"),
    ("    startup_median_s: fast\n", "scenarios[0].startup_median_s: Input should be a valid number"),
    ("    warmup_s: '60'\n", "scenarios[0].warmup_s: Input should be a valid number (got '60')"),
    ("    base_replicas: 1.0e+12\n", "not valid YAML at line 5, column 5: the key 'base_replicas' is given twice"),
    ("    shape: {step: {at_min: 500, factor: 3, hold_min: 2}}\n",
     "scenarios[0]: shape.step.at_min 500 is at or past the end of the run (duration_min 10)"),
    ("    shape: {diurnal: {period_min: 0.001, trough: 0.5}}\n", "scenarios[0]: shape.diurnal: 4.8e+05 knots"),
    ("    shape: {step: {at_min: 1, factor: 1.0e+6, hold_min: 2}}\n",
     "scenarios[0].shape.step.factor: Input should be less than or equal to 1000"),
    ("    sessions: {system_prompt_tokens: 5000}\n    profile: {max_model_len: 1000}\n",
     "scenarios[0]: sessions.system_prompt_tokens (5000) and the smallest first turn leave no room in "
     "profile.max_model_len (1000): every request would be refused; raise max_model_len or shorten the system "
     "prompt; fix this value\n"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_a_bad_file_exits_2_naming_the_key(tmp_path, capsys, extra, message):
    path = tmp_path / "bad.yaml"
    path.write_text("scenarios:\n  - name: x\n    duration_min: 10\n    base_replicas: 1\n" + extra)
    assert cli.main(["autoscale", "--scenario-file", str(path), "--engine", "fluid", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--scenario-file {path}: {message}" in err, err


def test_a_scenario_whose_first_turn_cannot_fit_the_profile_exits_2(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text("scenarios:\n  - {name: x, duration_min: 10, base_replicas: 1, profile: {max_model_len: 100}}\n")
    assert cli.main(["autoscale", "--scenario-file", str(path), "--engine", "fluid", "--quiet"]) == 2
    assert "scenario 'x': its first turn needs at least" in capsys.readouterr().err


def test_numbers_in_exponent_form_and_huge_values(tmp_path):
    (sc,) = scenario_file.parse("scenarios:\n  - {name: x, duration_min: 1e1, base_replicas: 2}\n")
    assert sc.duration_s == 600.0
    for text, key in (("duration_min: 1.0e+300, base_replicas: 2", "duration_min"),
                      ("duration_min: 10, base_replicas: 1.0e+12", "base_replicas"),
                      ("duration_min: 10, base_replicas: 2, warmup_s: 1.0e+300", "warmup_s")):  # fmt: skip
        with pytest.raises(scenario_file.ScenarioFileError, match=f"scenarios\\[0\\].{key}: Input should be less"):
            scenario_file.parse(f"scenarios:\n  - {{name: x, {text}}}\n", "f.yaml")


@pytest.mark.parametrize(("text", "message"), [
    ("scenarios:\n  - name: x\n    base_replicas: 1\n", "scenarios[0].duration_min: required key missing; add it"),
    ("scenarios: []\n", "scenarios: List should have at least 1 item"),
    ("- name: x\n", "(top level): expected a mapping with `scenarios:`"),
    ("scenarios: [\n", "not valid YAML at line 2"),
    ("scenarios:\n  - {name: x, duration_min: 1, base_replicas: 1}\n  - {name: x, duration_min: 2, base_replicas: 1}\n",
     "f.yaml: scenarios[1].name: two scenarios are named 'x'; give each its own name"),
    ("scenarios:\n  - {name: X Y, duration_min: 1, base_replicas: 1}\n", "scenarios[0].name: String should match"),
])  # fmt: skip
def test_reader_errors_name_the_place(text, message):
    with pytest.raises(scenario_file.ScenarioFileError) as exc:
        scenario_file.parse(text, "f.yaml")
    assert str(exc.value).startswith("f.yaml: ") and message in str(exc.value), str(exc.value)


SCENARIO = "scenarios:\n  - name: x\n    duration_min: {duration}\n    base_replicas: {replicas}\n{extra}"


def run_file(tmp_path, text, *argv):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return cli.main(["autoscale", "--scenario-file", str(path), "--engine", "fluid", "--quiet", *argv])


def refused(text: str) -> str:
    with pytest.raises(scenario_file.ScenarioFileError) as exc:  # the CLI exits 2 on it (tests above)
        scenario_file.parse(text, "f.yaml")
    return str(exc.value)


# a run with any of these never ended (and its memory grew): refused before it starts (tested on the reader, so that
# a regression fails rather than hangs)
@pytest.mark.parametrize(("duration", "replicas", "extra", "message"), [
    (".inf", 1, "", "scenarios[0].duration_min: Input should be a finite number (got inf)"),
    (10, ".inf", "", "scenarios[0].base_replicas: Input should be a finite number (got inf)"),
    (10, 1, "    shape: {points: [[0, 1], [1, .inf]]}\n", "scenarios[0].shape.points[1][1]: Input should be a finite"),
    (10, 1, "    shape: {points: [[0, 1], [.inf, 2]]}\n", "scenarios[0].shape.points[1][0]: Input should be a finite"),
    (10, 1, "    shape: {points: [[0, .nan]]}\n", "scenarios[0].shape.points[0][1]: Input should be a finite"),
    (10, 1, "    bursts: {per_hour: .inf, minutes: 1}\n", "scenarios[0].bursts.per_hour: Input should be a finite"),
    (10, 1, "    sessions: {output_tokens: {median: 5, sigma: 1, max: .inf}}\n",
     "scenarios[0].sessions.output_tokens.max: Input should be a finite"),
])  # fmt: skip
def test_non_finite_numbers_are_refused_naming_the_key(duration, replicas, extra, message):
    err = refused(SCENARIO.format(duration=duration, replicas=replicas, extra=extra))
    assert err.startswith(f"f.yaml: {message}") and "fix this value" in err, err


# YAML's types are the ones written: a quoted number or a boolean is a slip, refused (an int is still a float)
@pytest.mark.parametrize(("duration", "replicas", "extra", "message"), [
    ('"10"', 1, "", "scenarios[0].duration_min: Input should be a valid number (got '10')"),
    (10, "true", "", "scenarios[0].base_replicas: Input should be a valid number (got True)"),
    (10, 1, "    sessions: {context_limit: [1000.5, 2000]}\n",
     "scenarios[0].sessions.context_limit[0]: Input should be a valid integer (got 1000.5)"),
    (10, 1, "    shape: {points: [[0, yes]]}\n", "scenarios[0].shape.points[0][1]: Input should be a valid number"),
    (10, 1, "    profile: {max_model_len: '4096'}\n",
     "scenarios[0].profile.max_model_len: Input should be a valid integer (got '4096')"),
])  # fmt: skip
def test_numbers_must_be_written_as_numbers(duration, replicas, extra, message):
    err = refused(SCENARIO.format(duration=duration, replicas=replicas, extra=extra))
    assert err.startswith(f"f.yaml: {message}"), err
    # ints for floats, and pairs written as YAML lists, are fine
    text = SCENARIO.format(duration=10, replicas=2, extra="    shape: {points: [[0, 1], [5, 2]]}\n"
                                                          "    sessions: {context_limit: [1000, 2000]}\n")
    (sc,) = scenario_file.parse(text)
    assert sc.base_replicas == 2.0 and sc.knots == ((0, 1), (300, 2))


def test_a_list_items_error_is_explained_by_the_list_key():
    err = refused(SCENARIO.format(duration=10, replicas=1, extra="    shape: {points: [[0, 1, 2]]}\n"))
    assert "f.yaml: scenarios[0].shape.points[0]: Tuple should have at most 2 items" in err
    assert "fix this value. points: (minute, multiplier) points" in err, err


@pytest.mark.parametrize(("extra", "message"), [
    ("    sessions: {system_prompt_tokens: " + "9" * 5000 + "}\n",
     "s.yaml: line 5: system_prompt_tokens: a number of more than 4300 digits"),
    ("    description: [" + "[" * 5000 + "]" * 5000 + "]\n", "s.yaml: not valid YAML: nested too deeply"),
    ("    description: 2024-13-01\n", "s.yaml: a value YAML cannot read (month must be in 1..12)"),
])  # fmt: skip
def test_values_yaml_cannot_convert_exit_2(tmp_path, capsys, extra, message):
    assert run_file(tmp_path, SCENARIO.format(duration=10, replicas=1, extra=extra)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--scenario-file", "s.yaml"], ["--scenarios", "bogus"], ["--scenarios", "diurnal"]])
def test_quick_refuses_other_scenarios_instead_of_ignoring_them(tmp_path, capsys, argv):
    (tmp_path / "s.yaml").write_text("not: a scenario file\n")
    argv = [str(tmp_path / a) if a == "s.yaml" else a for a in argv]
    assert cli.main(["autoscale", "--quick", "--engine", "fluid", "--quiet", *argv]) == 2
    assert "--quick runs its own scenario (quick-flash): drop --scenario-file/--scenarios" in capsys.readouterr().err


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert cli.main(["autoscale", "--scenario-file", str(tmp_path / "nope.yaml"), "--quiet"]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err


# The published scenarios as they were defined in code before they became files (docs/autoscaling-benchmark.md's
# tables were measured on exactly these): the files must give the same Scenario, field for field.
PUBLISHED = {
    "agentic-bursty": {"duration_s": 75 * MIN, "base_replicas": 2.4, "drift": 0.15, "drift_period_s": 60 * MIN,
                       "bursts_per_hour": 4.0, "burst_minutes": 1.5, "burst_spread_s": 60.0},
    "diurnal": {"duration_s": 100 * MIN, "base_replicas": 1.4,
                "knots": ((0, 1.0), (15 * MIN, 1.0), (50 * MIN, 2.6), (70 * MIN, 2.6), (100 * MIN, 1.3))},
    "flash-crowd": {"duration_s": 75 * MIN, "base_replicas": 1.6,
                    "knots": ((0, 1.0), (15 * MIN, 1.0), (17 * MIN, 2.5), (42 * MIN, 2.5), (48 * MIN, 1.6),
                              (57 * MIN, 1.0))},
    "quick-flash": {"duration_s": 20 * MIN, "base_replicas": 0.8,
                    "knots": ((0, 1.0), (6 * MIN, 1.0), (7 * MIN, 2.0), (13 * MIN, 2.0), (16 * MIN, 1.0)),
                    "warmup_s": 180.0, "startup_median_s": 120.0},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_builtin_scenarios_are_their_files_and_unchanged(name):
    builtin = QUICK_SCENARIO if name == "quick-flash" else SCENARIOS[name]
    (from_file,) = scenario_file.load(scenario_file.BUILTIN_DIR / f"{name}.yaml")
    assert from_file == builtin
    published = Scenario(name=name, description=builtin.description, **PUBLISHED[name])
    assert builtin == published
    assert builtin.description  # the table's one-line description comes from the file


def test_cli_runs_a_scenario_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    out = tmp_path / "r.csv"
    rc = cli.main(["autoscale", "--scenario-file", str(path), "--policies", "hpa", "--no-tuned",
                   "--no-sweep", "--no-bound", "--seeds", "1", "--minutes", "2", "--csv", str(out), "--quiet",
                   "--no-plots"])  # fmt: skip
    assert rc == 0
    rows = out.read_text().splitlines()[1:]
    assert {r.split(",")[1] for r in rows} == {"my-crowd", "a-day"}  # only the file's, no built-in
