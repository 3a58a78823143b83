"""Which data-parallel engine of one API server takes a request: the mock engine's rule (replica.py), which the
fleet simulator uses too (bench/fleet.py) so that a simulated replica spreads a session's turns over its ranks
exactly as a mock replica does.

vLLM 0.33's own balancer (DPLBAsyncMPClient.get_core_engine_for_request) scores ranks by load only, scanning
from a start index that rotates per request so ties do not favour one rank. The mock keeps that scan and its
rotation, and (`FLASHSERVE_MOCK_DP_ROUTING=prefix`, the default) prefers, among the ranks within `slack` of the
least-loaded score, the one holding the longest cached prefix of the request.
"""

from __future__ import annotations

from collections.abc import Sequence

from flashserve_testbed.engine.profile import Profile


def slack(profile: Profile) -> int:
    """How much busier than the least-loaded rank a cache hit may be (before the floor // 4 term): a
    sixteenth of the sequences a rank runs at the SLA (4 for the calibrated profiles, 1 for the demo's), so
    affinity never costs a user the SLA."""
    cal = profile.calibration
    at_sla = cal.throughput_per_gpu_at_sla / (cal.sla_tokens_per_s * (cal.prompt_per_output_token + 1))
    return max(1, round(at_sla / 16))


def choose(engines: Sequence, keys: Sequence[int], start: int, base_slack: int, prefix: bool = True) -> int:
    """Index into `engines` (perfmodel.Engine) of the rank that takes a request with cache keys `keys`.

    The scan starts at `start` (the caller rotates it by one per request, as vLLM does): the first rank in
    scan order with the lowest load score (4 x waiting + running), unless `prefix` and one of the ranks within
    max(base_slack, floor // 4) of that score holds a cached prefix of `keys`: then the one with the longest
    (the less loaded, then the first in scan order, among equals)."""
    n = len(engines)
    order = [(start + i) % n for i in range(n)]
    scores = [engines[i].load_score() for i in range(n)]
    best = min(order, key=scores.__getitem__)  # min keeps the first of equals: scan order
    if n == 1 or not prefix or not keys:
        return best
    floor = scores[best]
    bound = floor + max(base_slack, floor // 4)
    top, top_key = best, (0, 0)
    for i in order:
        if scores[i] <= bound:
            key = (engines[i].cached_prefix_units(keys), -scores[i])
            if key > top_key:
                top, top_key = i, key
    return top if top_key[0] > 0 else best
