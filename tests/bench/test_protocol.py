"""The held-out protocol: the scenario generator, the train/test seeds, the equal-attainment choice and the
targets' checks."""

from __future__ import annotations

import pytest
from flashserve_testbed.bench import cli, protocol
from flashserve_testbed.bench.measures import Result
from flashserve_testbed.bench.protocol import (
    GEN_FAMILIES,
    GRIDS,
    generate,
    held_out_seeds,
    train_seeds,
)


def test_generator_is_a_function_of_family_and_seed():
    for fam in GEN_FAMILIES:
        a, b = generate(fam, 1001), generate(fam, 1001)
        assert a == b and a.name == f"{fam}-1001"
        assert generate(fam, 1002) != a
        assert protocol.family_of(a.name) == fam


def test_train_and_test_seeds_never_meet():
    assert set(train_seeds(protocol.MAX_SEEDS)).isdisjoint(held_out_seeds(protocol.MAX_SEEDS))
    assert train_seeds(2) == train_seeds(5)[:2]  # a bigger set extends the small one
    for bad in (0, protocol.MAX_SEEDS + 1):
        with pytest.raises(ValueError):
            train_seeds(bad)


def test_generated_families_span_their_ranges():
    steps = [generate("step", s) for s in train_seeds(60)]
    factors = [max(m for _, m in sc.knots) for sc in steps]
    assert 1.5 <= min(factors) < 2.5 and 12 < max(factors) <= 20
    startups = [generate(f, s).startup_median_s for f in GEN_FAMILIES for s in train_seeds(20)]
    assert 30 <= min(startups) < 60 and 900 < max(startups) <= 1200
    assert all(sc.base_replicas * max(m for _, m in sc.knots) <= 16.5 for sc in steps)
    sessions = generate("sessions", 1001)
    assert sessions.sessions is not None and sessions.sessions.context_limit is not None
    diurnal = generate("diurnal", 1001)
    assert min(m for _, m in diurnal.knots) < 0.81 and max(m for _, m in diurnal.knots) == pytest.approx(1, abs=0.01)


def _res(policy: str, scenario: str, seed: int, attainment: float, x_oracle: float, peak: int = 4) -> Result:
    return Result(policy=policy, scenario=scenario, seed=seed, attainment=attainment, speed_p90=0, speed_p50=0,
                  ttft_p90_s=0, gpu_hours=10 * x_oracle, tokens_per_dollar=1, output_tokens_per_dollar=1,
                  scale_actions=0, replicas_mean=1, replicas_max=peak, requests=1, unfinished=0, output_tokens=1,
                  sim_seconds=1, cpu_seconds=0, oracle_gpu_hours=10.0)  # fmt: skip


def test_equal_attainment_is_the_cheapest_setting_that_reaches_ours_on_train():
    train = [_res("flashserve", "step-1001", 1001, 0.95, 1.5), _res("flashserve", "step-1002", 1002, 0.97, 1.5)]
    # hpa: 0.5 and 0.6 reach our median (96%), 0.6 is cheaper; the rest fall short
    hpa = dict(zip(GRIDS["hpa"], [(0.99, 1.9), (0.965, 1.4), (0.95, 1.2), (0.9, 1.1), (0.85, 1.0), (0.8, 0.9)]))
    for v, (att, x) in hpa.items():
        train += [_res(protocol.sweep_spec("hpa", v).label, f"step-100{i}", 1000 + i, att, x) for i in (1, 2)]
    # static never reaches it: its best-attaining setting, marked as not reached
    for v in GRIDS["static"]:
        train += [_res(protocol.sweep_spec("static", v).label, "step-1001", 1001, 0.9 + v / 100, v)]
    goal, choices = protocol.choose_equal(train)
    assert goal == pytest.approx(0.96)
    assert choices["hpa"].spec.share == 0.6 and choices["hpa"].reached
    assert choices["static"].spec.share == max(GRIDS["static"]) and not choices["static"].reached


def test_checks_find_a_dominating_baseline_and_the_bound_misses():
    test = []
    for fam, seed in (("step", 2001), ("bursts", 2001)):
        sc = f"{fam}-{seed}"
        test += [_res("oracle", sc, seed, 0.99, 1.0), _res("bound", sc, seed, 0.996, 1.1, peak=4),
                 _res("flashserve", sc, seed, 0.98 if fam == "step" else 0.995, 1.6, peak=9 if fam == "step" else 5),
                 _res("hpa", sc, seed, 0.97, 1.3), _res("kpa", sc, seed, 0.99 if fam == "step" else 0.9, 1.4),
                 _res("hpa@0.6", sc, seed, 0.975, 1.5)]  # fmt: skip
    choices = {"hpa": protocol.Choice("hpa", protocol.sweep_spec("hpa", 0.6), 0.96, 1.4, True)}
    text, ch = protocol.markdown(test, 0.96, choices)
    assert [d.split(" (")[0] for d in ch.dominated] == ["step: kpa"]  # better on both axes on step only
    assert ch.equal_best == "hpa-equal" and ch.equal_saving == pytest.approx(1 - 1.6 / 1.5)
    assert ch.bound_runs == 2 and ch.bound_misses == ["step-2001 98.0%"]
    assert ch.overshoot == ["step-2001 9 vs 4"]
    assert "| flashserve | 98.8% / 1.60 | 98.0% / 1.60 | 99.5% / 1.60 |" in text
    assert "| hpa-equal |" in text and "FAIL no baseline better" in text


def test_cli_refuses_heldout_with_scenarios(capsys):
    assert cli.main(["autoscale", "--heldout", "--scenarios", "diurnal", "--quiet"]) == 2
    assert "--heldout generates its scenarios" in capsys.readouterr().err
    assert cli.main(["autoscale", "--heldout", "--families", "spikes", "--quiet"]) == 2
    assert "unknown family 'spikes'" in capsys.readouterr().err
    assert cli.main(["autoscale", "--heldout", "--test-seeds", "0", "--quiet"]) == 2


def test_the_bound_check_is_not_passed_when_no_run_qualifies():
    ch = protocol.Checks(dominated=[], equal_saving=0.25, equal_best="hpa-equal", bound_runs=0, bound_misses=[],
                         overshoot=[])  # fmt: skip
    lines = ch.lines()
    assert lines[0].startswith("- PASS no baseline") and lines[1].startswith("- PASS >= 20% fewer")
    assert lines[2].startswith("- n/a attainment >= 99%")


def _frontier_runs(sc: str, seed: int, bound: dict[float, tuple[float, float]]) -> list[Result]:
    """The clairvoyants' runs of one scenario: `bound` maps a utilization to (attainment, x oracle); the
    oracle is 0.05 x cheaper at the same attainment."""
    out = []
    for u, (att, x) in bound.items():
        suffix = "" if u == 1.0 else f"@{u:g}"
        out += [_res(f"bound{suffix}", sc, seed, att, x), _res(f"oracle{suffix}", sc, seed, att, x - 0.05)]
    return out


def test_the_frontier_brackets_our_attainment_and_judges_the_target_against_the_bound():
    test = []
    for seed in (2001, 2002):
        sc = f"step-{seed}"
        test += _frontier_runs(sc, seed, {1.0: (0.95, 1.05), 0.95: (0.965, 1.10), 0.9: (0.98, 1.20), 0.8: (0.995, 1.4)})
        test += [_res("flashserve", sc, seed, 0.97, 1.5), _res("hpa@0.6", sc, seed, 0.97, 1.45)]
    choices = {"hpa": protocol.Choice("hpa", protocol.sweep_spec("hpa", 0.6), 0.96, 1.4, True)}
    text, ch = protocol.markdown(test, 0.96, choices)
    b = ch.floor["bound"]
    # 97%: bound@0.9 is the cheapest reaching it, bound@0.95 the best short of it
    assert b.reaching == ("bound@0.9", 0.98, pytest.approx(1.20)) and b.short[0] == "bound@0.95"
    assert ch.floor["oracle"].reaching[0] == "oracle@0.9"
    assert ch.target_x == pytest.approx(0.8 * 1.45)  # 1.16: between 1.10 (short) and 1.20 (reaching)
    # the bracket (1.10 short of 97%, 1.20 reaching it) leaves 1.16 open; interpolated the bound spends 1.13
    assert b.at == pytest.approx(1.10 + 0.10 / 3) and "within what the bound reaches (interpolated: 1.13)" in text
    assert protocol.Floor("bound", b.reaching, b.short).verdict(1.16).endswith("undecided at this grid")
    assert protocol.Floor("bound", b.reaching, b.short, 1.18).verdict(1.16) == (
        "beyond what the bound reaches (interpolated: 1.18)")
    assert b.verdict(1.25) == "within what the bound reaches" and b.verdict(1.05) == "beyond what the bound reaches"
    # the clairvoyants are not baselines: cheaper and better, they dominate nothing; their rows are in the table
    assert ch.dominated == [] and "| bound@0.9 | 98.0% / 1.20 |" in text
    assert "frontier at the policy's median test attainment (97.0%)" in text
    # over the frontier: 1.50 / (1.10 + 0.10 x (97.0 - 96.5) / (98.0 - 96.5)); hpa@0.6 is not a row of its own
    assert "| flashserve | 1.32 | 1.32 |" in text and "| bound" not in text.split("Over the frontier")[1]


def test_no_frontier_line_without_the_frontier_runs_and_none_reaching_is_beyond():
    test = [_res("bound", "step-2001", 2001, 0.95, 1.05), _res("flashserve", "step-2001", 2001, 0.97, 1.5),
            _res("hpa@0.9", "step-2001", 2001, 0.97, 1.4)]  # a baseline's sweep is labelled like a frontier run
    text, ch = protocol.markdown(test, 0.96, {})
    assert ch.floor is None and not any("frontier" in line for line in ch.lines()) and "frontier" not in text
    test += _frontier_runs("step-2001", 2001, {0.9: (0.96, 1.2)})
    _, ch = protocol.markdown(test, 0.96, {})
    assert ch.floor["bound"].reaching is None and ch.floor["bound"].short == ("bound@0.9", 0.96, pytest.approx(1.2))
    assert ch.floor["bound"].verdict(2.0) == "beyond what the bound reaches"
    assert ch.target_x is None and "no setting reaches it" in ch.floor_line()


def test_cli_refuses_frontier_outside_the_protocol(capsys):
    assert cli.main(["autoscale", "--frontier", "--quiet"]) == 2
    assert "--frontier is a mode of --heldout" in capsys.readouterr().err


def test_on_the_train_set_the_frontier_reads_the_policy_against_the_bound_per_family():
    train = []
    for fam in ("step", "ramp"):
        sc = f"{fam}-1001"
        train += _frontier_runs(sc, 1001, {1.0: (0.95, 1.05), 0.9: (0.98, 1.20)})
        train.append(_res("flashserve", sc, 1001, 0.965 if fam == "step" else 0.99, 1.5))
    over = protocol.over_frontier(train)
    assert over["step"] == pytest.approx(1.5 / 1.125) and over["ramp"] is None  # 99%: past the bound's settings
    assert over["all"] == pytest.approx(1.5 / (1.05 + 0.15 * (0.9775 - 0.95) / 0.03))
    assert "| over the frontier | 1.263 | 1.333 | - |" in protocol.train_markdown(train)
    alone = [r for r in train if r.policy == "flashserve"]
    assert protocol.over_frontier(alone) == {} and "over the frontier" not in protocol.train_markdown(alone)


def test_frontier_at_interpolates_between_the_settings_that_bracket_an_attainment():
    cells = {("bound", "all"): protocol.Cell(0.95, 1.05, 0, 2), ("bound@0.9", "all"): protocol.Cell(0.98, 1.20, 0, 2),
             ("bound@0.8", "all"): protocol.Cell(0.995, 1.40, 0, 2)}  # fmt: skip
    assert protocol.frontier_at(cells, "bound", "all", 0.965) == pytest.approx(1.125)
    assert protocol.frontier_at(cells, "bound", "all", 0.99) == pytest.approx(1.20 + 0.2 * 10 / 15)
    assert protocol.frontier_at(cells, "bound", "all", 0.999) is None  # beyond its best-attaining setting
    assert protocol.frontier_at(cells, "oracle", "all", 0.97) is None  # no such runs
