"""Rebuilding a benchmark report from saved runs: the CSV round trip, reruns replacing runs, the command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from flashserve_testbed.bench import report
from flashserve_testbed.bench.cli import main
from flashserve_testbed.bench.measures import Result

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench"


def _run(policy: str, seed: int, attainment: float, gpu_hours: float, **kw) -> Result:
    base = dict(policy=policy, scenario="flash-crowd", seed=seed, attainment=attainment, speed_p90=110.0,
                speed_p50=120.0, ttft_p90_s=0.05, gpu_hours=gpu_hours, tokens_per_dollar=4.5e8,
                output_tokens_per_dollar=3.5e6, scale_actions=4, replicas_mean=2.5, replicas_max=5,
                requests=1000, unfinished=0, output_tokens=10**6, sim_seconds=4500.0, cpu_seconds=30.0,
                startup_median_s=420.0, oracle_gpu_hours=10.0, step_attainment=0.9)  # fmt: skip
    return Result(**{**base, **kw})


def test_csv_round_trip_keeps_every_field(tmp_path):
    runs = [_run("oracle", 1, 0.98, 10.0), _run("flashserve", 1, 0.9, 20.0),
            _run("flashserve@p=75", 1, 0.85, 15.0, knob="percentile", knob_value=75.0, kind="sweep",
                 step_attainment=None)]  # fmt: skip
    path = tmp_path / "runs.csv"
    report.write_csv(runs, path)
    back = report.read_csv(path)
    assert back == runs


def test_a_rerun_replaces_its_run_in_place_and_leaves_the_others():
    first = [_run("oracle", 1, 0.98, 10.0), _run("flashserve", 1, 0.9, 20.0), _run("hpa", 1, 0.8, 14.0),
             _run("flashserve", 2, 0.91, 21.0)]  # fmt: skip
    rerun = [_run("flashserve", 1, 0.92, 18.0), _run("flashserve", 3, 0.95, 19.0)]
    merged = report.merge(first, rerun)
    assert [(r.policy, r.seed, r.gpu_hours) for r in merged] == [
        ("oracle", 1, 10.0), ("flashserve", 1, 18.0), ("hpa", 1, 14.0), ("flashserve", 2, 21.0),
        ("flashserve", 3, 19.0)]  # fmt: skip
    # a sweep setting or another start-up time is another run, not a rerun
    other = [replace(first[1], kind="startup", startup_median_s=30.0)]
    assert len(report.merge(first, other)) == len(first) + 1


def test_read_csv_names_the_bad_cell(tmp_path):
    path = tmp_path / "runs.csv"
    report.write_csv([_run("flashserve", 1, 0.9, 20.0)], path)
    path.write_text(path.read_text().replace(",20,", ",twenty,"))
    with pytest.raises(ValueError, match=r"line 2: gpu_hours='twenty' is not a number"):
        report.read_csv(path)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a benchmark results CSV"):
        report.read_csv(other)


def test_report_command_rebuilds_the_table_with_the_rerun(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.json").write_text((DOCS / "calibration.json").read_text())
    full, rerun = tmp_path / "full.csv", tmp_path / "rerun.csv"
    report.write_csv([_run("oracle", 1, 0.98, 10.0), _run("flashserve", 1, 0.9, 20.0), _run("hpa", 1, 0.8, 14.0)], full)
    report.write_csv([_run("flashserve", 1, 0.93, 17.0)], rerun)
    assert main(["report", str(full), str(rerun), "--out", str(out), "--no-plots"]) == 0
    recs = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert recs["flashserve"]["gpu_hours"] == 17.0 and recs["flashserve"]["attainment"] == 0.93
    assert recs["hpa"]["gpu_hours"] == 14.0
    table = (out / "table.md").read_text()
    assert "| flashserve | 93.00% |" in table and "## flash-crowd" in table
    assert len(report.read_csv(out / "results.csv")) == 3


def test_report_command_without_calibration_says_what_to_pass(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    report.write_csv([_run("flashserve", 1, 0.9, 20.0)], runs)
    out = tmp_path / "empty"
    assert main(["report", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "calibration.json: no such file" in err and "--calibration" in err
    assert not out.exists()  # nothing written


def test_agreement_pairs_the_same_runs_and_summarizes_the_differences():
    a = [_run("oracle", 1, 0.98, 10.0), _run("flashserve", 1, 0.90, 22.0), _run("flashserve", 2, 0.95, 18.0),
         _run("hpa", 1, 0.80, 14.0)]  # fmt: skip
    b = [_run("flashserve", 2, 0.96, 20.0), _run("flashserve", 1, 0.93, 20.0), _run("oracle", 1, 0.98, 10.0),
         _run("flashserve", 1, 0.5, 1.0, kind="startup", startup_median_s=30.0)]  # fmt: skip
    pairs = report.paired(a, b)
    # hpa has no counterpart; the start-up run is another setting, not a rerun
    assert [(x.policy, x.seed, y.attainment) for x, y in pairs] == [
        ("oracle", 1, 0.98), ("flashserve", 1, 0.93), ("flashserve", 2, 0.96)]  # fmt: skip
    ag = report.agreement(pairs[1:], "flashserve")
    assert ag.runs == 2
    assert ag.attainment_median_pt == pytest.approx(2.0)  # 3 and 1 points
    assert ag.attainment_p90_pt == pytest.approx(3.0)
    assert ag.gpu_hours_median_pct == pytest.approx(10.0)  # +10% and -10%
    assert report.agreement([], "none") is None


def test_compare_command_prints_the_agreement_and_refuses_disjoint_runs(tmp_path, capsys):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    report.write_csv([_run("oracle", 1, 0.98, 10.0), _run("flashserve", 1, 0.90, 22.0)], a)
    report.write_csv([_run("oracle", 1, 0.97, 10.0), _run("flashserve", 1, 0.93, 20.0)], b)
    report.write_csv([_run("hpa", 7, 0.8, 14.0)], c)
    assert main(["compare", str(a), str(b), "--plot", str(tmp_path / "agree.png")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("flashserve"))
    assert line.split()[1:4] == ["1", "3.00", "3.0"] and line.split()[4] == "10.0"
    assert (tmp_path / "agree.png").stat().st_size > 10_000
    assert main(["compare", str(a), str(c)]) == 2
    assert "no run in common" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err


def test_startup_sweep_table_keeps_learning_off_apart_and_measures_the_rise():
    runs = []
    for seed in (1, 2, 3):
        for s, on, off in ((30.0, 0.96, 0.99), (120.0, 0.94, 0.97), (900.0, 0.95, 0.90)):
            runs.append(_run("flashserve", seed, on, 20.0, kind="startup", startup_median_s=s))
            runs.append(_run("flashserve", seed, off, 20.0, kind="startup", startup_median_s=s,
                             startup_learning="off"))  # fmt: skip
    table = report.startup_sweep_table(runs)
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in table.splitlines() if line.startswith("| flash")}
    assert set(rows) == {"flashserve", "flashserve (learning off)"}
    assert rows["flashserve"].endswith("| 1.0 |")  # 94% at 2 min, 95% at 15 min: one point of rise
    assert rows["flashserve (learning off)"].endswith("| 0.0 |")
    assert report.monotonicity_gap([(30.0, 0.9), (60.0, 0.95), (90.0, 0.92)]) == pytest.approx(5.0)
    # the table's records keep them apart too
    assert {r["policy"] for r in report.records([replace(r, kind="table") for r in runs])} == set(rows)


def test_equal_attainment_between_two_sets_of_sweeps():
    def sweep(cost_of):  # default at 0.90 and two knob settings around it
        return [_run("flashserve", 1, 0.90, cost_of(0.90)),
                _run("flashserve@u=0.9", 1, 0.95, cost_of(0.95), kind="sweep"),
                _run("flashserve@u=1.15", 1, 0.85, cost_of(0.85), kind="sweep")]  # fmt: skip

    a = sweep(lambda att: 10.0 + 100.0 * (att - 0.8))  # GPU-hours
    b = sweep(lambda att: 5.0 + 50.0 * (att - 0.8))  # half of it
    (row,) = report.equal_attainment_between(a, b)
    assert row["scenario"] == "flash-crowd"
    ((t, ca, cb),) = row["at"]  # both defaults at 0.90: one target
    assert t == 0.9 and cb / ca == pytest.approx(0.5)
    assert report.equal_attainment_between(a, [replace(r, policy="hpa") for r in b]) == []  # no flashserve in B


def test_refused_requests_get_a_column_only_when_there_are_some():
    served = [_run("flashserve", s, 0.99, 10.0) for s in (1, 2, 3)]
    assert "refused" not in report.text_table(report.records(served))
    refused = [replace(r, refused=25) for r in served]
    recs = report.records(refused)
    assert recs[0]["refused"] == 25
    text = report.text_table(recs)
    assert text.splitlines()[0].split()[-1] == "refused" and text.splitlines()[2].split()[-1] == "25"
    assert "| refused |" in report.markdown_table(recs)
