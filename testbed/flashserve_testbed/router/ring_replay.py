"""The simulator's `router` routing model replaying a real run's sessions, for calibrating it against the real
vllm-router (bench_vllm_router.py --suite calibrate).

The load generator's requests of one run (session id, start, prompt and output tokens) go, in start order,
through the benchmark's own fleet (`bench.fleet.Fleet`, routing `router`) whose pods carry the real engines'
URLs, so the ring is the one the binary built; each replica runs the simulator's engine model with the mock
engine's profile and its data-parallel ranks (the mock's `--data-parallel-size`), prefix cache included. A
session's cache units follow the simulator's own layout (bench/workloads.py): the shared system prompt's
units are the same for every session, the rest are the session's own, so a turn hits on what an earlier turn
of the session computed on that replica and on the system prompt wherever any session ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashserve_testbed.bench.fleet import Fleet
from flashserve_testbed.bench.workloads import SESSION_ID_SHIFT
from flashserve_testbed.engine.profile import load as load_profile
from flashserve_testbed.loadgen.report import RequestRecord


@dataclass
class _Session:
    """What the fleet's router reads of a session."""

    sid: int
    units: int = 0
    sys_units: int = 0
    replica: object = None

    def block_hashes(self) -> list[int]:
        base = self.sid << SESSION_ID_SHIFT
        return [j if j < self.sys_units else base | j for j in range(self.units)]


@dataclass(frozen=True)
class Replay:
    requests_per_engine: list[int]
    hit_rate: float | None
    cached_tokens: dict[tuple[int, int], int]  # (session, turn) -> prompt tokens the engine model found cached


def replay(records: list[RequestRecord], urls: list[str], profile: str, sla: float = 100.0, seed: int = 1,
           cache_unit: int | None = None, num_speculative_tokens: int | None = None) -> Replay:  # fmt: skip
    """Route `records` (one run of `run_load`) with the simulator's router model over `urls` and serve them
    with its engine model; per-engine request counts (in `urls` order) and the prefix-cache hit rate.
    `cache_unit`: the prefix cache's unit in tokens (default the benchmark's, CACHE_UNIT_TOKENS; 0: one per
    KV block, as the mock engine and vLLM cache). `num_speculative_tokens`: the engines' MTP drafts (default
    the profile's; a mock started without --speculative-config runs none, and decodes slower)."""
    prof = load_profile(profile)
    fleet = Fleet(prof, sla, seed, all_ranks=True, routing="router")
    if cache_unit is not None:
        fleet.cfg.cache_unit_tokens = cache_unit
    if num_speculative_tokens is not None:
        fleet.cfg.num_speculative_tokens = num_speculative_tokens
    groups = [fleet.order(0.0, ready=True) for _ in urls]
    for g, url in zip(groups, urls):
        g.pod = url  # the ring's worker ids: the binary's worker URLs
    fleet._set_ready()
    unit = fleet.cfg.cache_unit_tokens or fleet.cfg.block_size
    sys_units = prof.workload.shared_system_prompt_tokens // unit
    sessions: dict[int, _Session] = {}
    counts = dict.fromkeys(urls, 0)
    served = {}
    for rec in sorted((r for r in records if not r.error and r.prompt_tokens > 0), key=lambda r: r.start):
        for g in groups:
            for r in g.ranks:
                r.engine.advance(rec.start)
        s = sessions.setdefault(rec.session, _Session(rec.session, sys_units=sys_units))
        out = max(1, rec.completion_tokens)
        # the answer is cached too (the next turn starts with it); the last key is the unit it ends inside
        s.units = -(-(rec.prompt_tokens + out) // unit)
        rank = fleet.route_session(s, rec.start)
        counts[rank.group.pod] += 1
        served[(rec.session, rec.turn)] = rank.engine.add_request(None, rec.prompt_tokens, out, rec.start, block_hashes=s.block_hashes(),
                                hashes_cover_output=True, hashes_chained=True,
                                shared_prefix_tokens=prof.workload.shared_system_prompt_tokens)  # fmt: skip
    end = max((r.start for r in records), default=0.0) + 600.0  # schedule what is still waiting
    for g in groups:
        for r in g.ranks:
            r.engine.advance(end)
    queries = sum(r.engine.stats.prefix_queries for g in groups for r in g.ranks)
    hits = sum(r.engine.stats.prefix_hits for g in groups for r in g.ranks)
    return Replay([counts[u] for u in urls], hits / queries if queries else None,
                  {k: req.cached_tokens for k, req in served.items()})
