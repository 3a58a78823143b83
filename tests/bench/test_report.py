"""Rebuilding a benchmark report from saved runs: the CSV round trip, reruns replacing runs, the command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from flashserve.bench import report
from flashserve.bench.cli import main
from flashserve.bench.measures import Result

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
