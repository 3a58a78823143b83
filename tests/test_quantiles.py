"""One quantile definition across the test bed: the load generator, the benchmark and the wire timings agree."""

from __future__ import annotations

import pytest
from flashserve_testbed.bench.measures import quantile
from flashserve_testbed.loadgen.report import percentile
from flashserve_testbed.quantiles import nearest_rank


def test_nearest_rank_is_the_ceil_q_n_th_smallest():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert nearest_rank(xs, 0.0) == 1.0 and nearest_rank(xs, 1.0) == 5.0
    assert nearest_rank(xs, 0.2) == 1.0 and nearest_rank(xs, 0.21) == 2.0
    assert nearest_rank(xs, 0.5) == 3.0
    assert nearest_rank(range(1, 36), 0.99) == 35  # of 35 requests the 99th percentile is the slowest
    assert nearest_rank(range(1, 101), 0.99) == 99
    assert nearest_rank(range(1, 101), 0.07) == 7  # 0.07 x 100 is 7.000000000000001 in floating point
    assert nearest_rank(range(1, 26), 0.28) == 7
    assert nearest_rank([], 0.5) is None
    with pytest.raises(ValueError, match="outside 0-1"):
        nearest_rank([1.0], 99)


def test_every_reader_uses_it():
    xs = [float(v) for v in range(1, 101)]
    for q in (0.1, 0.5, 0.9, 0.99):
        assert percentile(xs, q * 100) == quantile(xs, q) == nearest_rank(xs, q)
    assert quantile([], 0.9) == 0.0 and quantile([1.0, float("inf")], 0.99) == float("inf")
