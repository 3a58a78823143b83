"""The test bed's one definition of a sample quantile, so that a p99 means the same in the load generator's
report, the benchmark's tables and the router's wire timings.

Nearest rank, rounding up: the quantile q of n samples is the ceil(q x n)-th smallest. Every figure is then a
value some request saw, never one between two, and a small sample's tail is its slowest request (of 35
requests the 99th percentile is the 35th), which is what a latency budget should be checked against.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """The `q` quantile (0 to 1) of `values` by nearest rank; None for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside 0-1")
    xs = sorted(values)
    if not xs:
        return None
    # round first: 0.07 x 100 is 7.000000000000001 in floating point, and its ceiling would skip a rank
    rank = math.ceil(round(q * len(xs), 9))
    return xs[min(len(xs) - 1, max(0, rank - 1))]
