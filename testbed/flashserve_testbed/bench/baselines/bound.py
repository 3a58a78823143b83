"""The start-up-aware bound: a clairvoyant that pays the same start-up times as everyone else.

The oracle (oracle.py) knows the future and starts replicas instantly; no autoscaler can come near it when a
replica takes minutes to start. This policy knows the same future, the oracle's replica need over time, and
also the start-up time each replica it orders will take (the k-th draw of the run's start-up stream, the
same draw any policy's k-th order gets). It orders each replica one start-up before the need rises to it
(earlier where a later order's longer start-up has to be placed in time: orders take the draws in turn),
and releases a replica once no instant within the next start-up needs it (after that, ordering it again
would be in time). So it shows what any autoscaler could do on this traffic with these start-ups: the
distance between a policy and it is the policy's, the distance between it and the oracle is start-up time.

It is not an upper bound on attainment: it holds the oracle's capacity (ceil(demand / SLA capacity)), which
on the simulated engines buys the oracle's ~98.5%, not 100%; a policy with more headroom can beat it on
attainment at more GPU-hours. The target function is pure (tests/bench/test_bound.py pins it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from flashserve_testbed.bench.context import Context, Policy
from flashserve_testbed.bench.measures import need_at

EVAL_S = 5.0
"""Its evaluation interval: finer than any autoscaler's, so that the bound does not pay for coarse timing."""


def _changes(steps: Sequence[tuple[float, int]], times: list[float], a: float, b: float) -> list[float]:
    """`a` and the times in (a, b] where the need changes: where a shortfall can first appear."""
    i = bisect.bisect_right(times, a)
    j = bisect.bisect_right(times, b)
    return [a] + times[i:j]


def _due(now: float, ready: list[float], startups: Sequence[float], steps, times: list[float], dt: float) -> bool:
    """Whether the next order must be placed now. Orders take the start-ups in turn (the next gets
    startups[0], the one after startups[1], ...), so it is due when waiting one evaluation would make it, or
    any order after it, late: the j-th replica short of the need (from the first instant the next order
    could serve) must be ordered by then minus its own start-up. `ready`: sorted ready times of the groups."""
    if not startups:
        return False
    start, end = now + startups[0], now + dt + max(startups)
    points = sorted(set(_changes(steps, times, start, end) + [r for r in ready if start < r <= end]))
    missing = 0
    for tau in points:
        deficit = need_at(steps, tau) - bisect.bisect_right(ready, tau)
        while deficit > missing and missing < len(startups):
            if tau - startups[missing] < now + dt:
                return True
            missing += 1
    return False


def target(now: float, ready_at: Sequence[float], startups: Sequence[float], steps: Sequence[tuple[float, int]],
           dt: float, lo: int, hi: int, times: list[float] | None = None) -> int:  # fmt: skip
    """Replicas to hold at `now`, knowing the need (`steps`, sorted (time, replicas) changes), when each group
    held becomes ready (`ready_at`, index order; the last is the one a release removes) and the start-up
    times the next orders will take (`startups`, in order). `dt`: time to the next evaluation."""
    times = [t for t, _ in steps] if times is None else times
    n = len(ready_at)
    ready = sorted(ready_at)
    k = 0
    while n + k < hi and _due(now, ready, startups[k : k + hi - n], steps, times, dt):
        bisect.insort(ready, now + startups[k])
        k += 1
    if k:
        return n + k
    # Release the last group while nothing needs it: no instant before an order placed now could be ready
    # (it serves those itself), and no order due now without it (one placed later replaces it in time, and
    # its start-up costs less than holding it until then: the ski-rental break-even, known in advance).
    horizon = now + (startups[0] if startups else 0.0) + dt
    held = list(ready_at)
    while len(held) > lo:
        last = held[-1]
        rest = sorted(held[:-1])
        checks = _changes(steps, times, now, horizon) + ([last] if now < last <= horizon else [])
        if any(tau >= last and need_at(steps, tau) > bisect.bisect_right(rest, tau) for tau in checks):
            break
        if _due(now, rest, startups[: hi - len(rest)], steps, times, dt):
            break
        held.pop()
    return max(lo, min(hi, len(held)))


class StartupAwareBound(Policy):
    """The clairvoyant with start-ups (module docstring). `attach` gives it the fleet's start-up stream, which
    it reads without consuming: it knows each order's start-up before placing it."""

    name = "bound"
    interval_s = EVAL_S
    offset_s = 0.0

    def __init__(self, steps: Sequence[tuple[float, int]], warmup_s: float) -> None:
        self.steps = list(steps)
        self.times = [t for t, _ in self.steps]
        self.off = warmup_s
        self.fleet = None

    def attach(self, fleet) -> None:
        self.fleet = fleet

    def upcoming(self, k: int) -> list[float]:
        """The start-up times of the next k orders, without drawing them."""
        if self.fleet is None:
            return [0.0] * k
        return self.fleet.peek_startups(k)

    def decide(self, ctx: Context) -> int | None:
        now = ctx.now - self.off  # the need is in scenario time
        ready_at = [g.ready_at - self.off for g in ctx.groups]
        want = target(now, ready_at, self.upcoming(max(1, ctx.max_replicas - len(ready_at))), self.steps,
                      self.interval_s, ctx.min_replicas, ctx.max_replicas, self.times)  # fmt: skip
        return want if want != ctx.current else None
