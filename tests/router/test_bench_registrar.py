"""The registrar benchmark (flashserve_testbed/router/bench_registrar.py) on the real vllm-router, at a size a
test affords: it syncs a fresh IGW router, checks what the router then lists, and prints the table."""

from __future__ import annotations

import pytest
from flashserve_testbed.router import bench_registrar

pytestmark = pytest.mark.timeout(120)


def test_the_benchmark_times_the_operators_syncs_against_the_binary(capsys, vllm_router_bin):
    assert bench_registrar.main(["--workers", "8", "--runs", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1
    first, steady, remove = (float(x) for x in rows[0].strip("| ").split(" | ")[1:])
    assert 0 < first < 10_000 and 0 < steady and 0 < remove < 10_000  # ms; the reconciler waits 10 s


def test_sizes_below_one_pod_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_registrar.main(["--workers", "2"])
    assert exc.value.code == 2 and "--workers" in capsys.readouterr().err
