"""The simulator's routing models (bench/routing.py, Fleet.route_session): service spreads requests uniformly,
affinity and router keep a session on one replica, the router's ring remaps exactly the keys whose nearest
virtual node changed when the worker set changes, and a run reports its prefix-cache hit rate."""

from __future__ import annotations

from collections import Counter

import pytest
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS, Fleet, pick_rank
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.routing import (
    VIRTUAL_NODES,
    HashRing,
    fbi_hash,
    furc_hash,
    murmur64a,
    rendezvous_pick,
    session_key,
)
from flashserve_testbed.bench.sim import Settings, Simulation, Workload
from flashserve_testbed.engine import dprank
from flashserve_testbed.engine import profile as profiles


class _Session:
    """What the fleet's router reads of a session: its id, its replica, its prefix keys."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.replica = None

    def block_hashes(self) -> list[int]:
        return [self.sid]


def _fleet(profile, routing: str, replicas: int = 4) -> Fleet:
    f = Fleet(profile, 100.0, seed=1, routing=routing)
    for _ in range(replicas):
        f.order(0.0, ready=True)
    return f


def test_murmur64a_matches_the_reference_implementation():
    # the empty key with seed 0 mixes to 0 in MurmurHash64A; a seed or a byte changes it
    assert murmur64a(b"", 0) == 0
    assert murmur64a(b"hello", 0) == murmur64a(b"hello", 0) != murmur64a(b"hello", 1)
    # every tail length (1-7 bytes after the 8-byte blocks) is mixed in: no two prefixes collide
    values = {murmur64a(b"0123456789abcdef"[:n], 4193360111) for n in range(17)}
    assert len(values) == 17


def test_furc_hash_stays_in_range_and_is_consistent_when_m_grows():
    keys = [f"k{i}".encode() for i in range(300)]
    for m in (2, 3, 7, 100):
        assert all(0 <= furc_hash(k, m) < m for k in keys)
    # furc is a consistent hash: going from m to m + 1 buckets, a key moves only into the new bucket
    for m in (3, 7, 20):
        for k in keys:
            before, after = furc_hash(k, m), furc_hash(k, m + 1)
            assert after == before or after == m


def test_service_spreads_a_sessions_requests_uniformly(profile):
    f = _fleet(profile, "service")
    s = _Session(7)
    hits = Counter(f.route_session(s, 0.0).group.index for _ in range(4000))
    assert set(hits) == {0, 1, 2, 3}
    assert all(abs(n / 4000 - 0.25) < 0.03 for n in hits.values())


@pytest.mark.parametrize("routing", ["affinity", "router"])
def test_affinity_and_router_keep_a_session_on_one_replica(profile, routing):
    f = _fleet(profile, routing)
    sessions = [_Session(i) for i in range(1, 41)]
    first = {s.sid: f.route_session(s, 0.0).group.index for s in sessions}
    for _ in range(5):
        assert {s.sid: f.route_session(s, 0.0).group.index for s in sessions} == first
    assert len(set(first.values())) > 1  # and sessions do not all land on one replica
    # the fleet's session counts follow the sessions
    assert sum(g.sessions for g in f.active) == len(sessions)


def test_router_sends_a_session_where_vllm_routers_ring_does(profile):
    f = _fleet(profile, "router")
    ring = HashRing([g.pod for g in f.active])
    for sid in range(1, 60):
        assert f.route_session(_Session(sid), 0.0).group.pod == ring.lookup(session_key(f"s{sid}"))


def test_ring_remaps_only_the_keys_of_the_changed_worker():
    keys = [session_key(f"s{i}") for i in range(600)]
    ring = HashRing(["a", "b", "c"])
    before = {k: ring.lookup(k) for k in keys}
    assert len(ring._points) == 3 * VIRTUAL_NODES
    ring.update(["a", "b", "c", "d"])  # scale-up: keys move only to the new worker, about a quarter of them
    after = {k: ring.lookup(k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == "d" for k in moved)
    assert 0.1 < len(moved) / len(keys) < 0.45
    # each key goes to the first virtual node at or after its own position (wrapping)
    points = sorted((fbi_hash(f"{w}:{i}"), w) for w in "abcd" for i in range(VIRTUAL_NODES))
    for k in keys[:50]:
        h = fbi_hash(k)
        assert after[k] == next((w for p, w in points if p >= h), points[0][1])
    ring.update(["a", "c", "d"])  # b drained: only b's keys move, and they spread over the others
    gone = {k: ring.lookup(k) for k in keys}
    assert all(gone[k] == after[k] for k in keys if after[k] != "b")
    assert {gone[k] for k in keys if after[k] == "b"} == {"a", "c", "d"}


def test_router_moves_sessions_of_a_drained_replica_and_on_scale_up(profile):
    f = _fleet(profile, "router", replicas=3)
    sessions = [_Session(i) for i in range(1, 200)]
    before = {s.sid: f.route_session(s, 0.0).group for s in sessions}
    f.remove_last(1.0)  # the highest index leaves routing (drain)
    after = {s.sid: f.route_session(s, 0.0).group for s in sessions}
    drained = f.draining[0] if f.draining else next(g for g in f.all if g.state == "gone")
    for s in sessions:
        if before[s.sid] is drained:
            assert after[s.sid] is not drained
        else:
            assert after[s.sid] is before[s.sid]
    g = f.order(2.0, ready=True)  # a new pod (new identity on the ring): a share of sessions moves to it
    again = {s.sid: f.route_session(s, 0.0).group for s in sessions}
    moved = [sid for sid in again if again[sid] is not after[sid]]
    assert moved and all(again[sid] is g for sid in moved)


def test_unknown_routing_is_refused_with_the_choices(profile):
    with pytest.raises(ValueError, match="routing: 'sticky' is not a routing model: choose service, affinity, router, router-rank, "
                       "router-pod-vllm, router-sticky, router-rendezvous"):
        Fleet(profile, 100.0, seed=1, routing="sticky")


def test_a_run_reports_its_prefix_hit_rate_and_routing_shapes_it(tiny, profile, calib):
    w = Workload(tiny, 3, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
    out = {}
    for routing in ("service", "affinity", "router"):
        pol = build(PolicySpec("static"), calib, tiny.startup_median_s, 100.0)
        out[routing] = Simulation(w, pol, Settings(routing=routing)).run()
    for routing, res in out.items():
        assert res.routing == routing
        assert 0.0 < res.prefix_hit_rate < 1.0
    # random routing per request loses the conversation's cache; session routing keeps it
    assert out["service"].prefix_hit_rate < out["affinity"].prefix_hit_rate - 0.1
    assert out["service"].prefix_hit_rate < out["router"].prefix_hit_rate - 0.1


def test_cli_refuses_other_routings_with_the_fluid_model(capsys):
    from flashserve_testbed.bench import cli

    assert cli.main(["autoscale", "--engine", "fluid", "--routing", "router", "--quick"]) == 2
    assert "the fluid model keeps session affinity only" in capsys.readouterr().err


def test_report_keeps_routing_models_apart_and_reads_files_written_before_them(tmp_path):
    from dataclasses import replace

    from flashserve_testbed.bench import report
    from flashserve_testbed.bench.measures import Result

    def _run(policy, seed, attainment, gpu_hours, **kw):
        return Result(policy=policy, scenario="flash-crowd", seed=seed, attainment=attainment, speed_p90=110.0,
                      speed_p50=120.0, ttft_p90_s=0.05, gpu_hours=gpu_hours, tokens_per_dollar=4.5e8,
                      output_tokens_per_dollar=3.5e6, scale_actions=4, replicas_mean=2.5, replicas_max=5,
                      requests=1000, unfinished=0, output_tokens=10**6, sim_seconds=4500.0, cpu_seconds=30.0,
                      **kw)  # fmt: skip

    runs = [_run("flashserve", 1, 0.99, 20.0, prefix_hit_rate=0.84),
            _run("flashserve", 1, 0.93, 40.0, routing="service", prefix_hit_rate=0.5)]  # fmt: skip
    recs = report.records(runs)
    assert [(r["policy"], r["routing"], r["gpu_hours"], r["prefix_hit_rate"]) for r in recs] == [
        ("flashserve", "service", 40.0, 0.5), ("flashserve", "affinity", 20.0, 0.84)]  # fmt: skip
    assert len(report.merge(runs[:1], runs[1:])) == 2  # another routing is another run, not a rerun
    assert "| 84% | affinity |" in report.markdown_table(recs)
    path = tmp_path / "runs.csv"
    report.write_csv(runs, path)
    assert report.read_csv(path) == runs
    # a CSV from before the routing columns: its runs were session affinity, hit rate unknown
    lines = path.read_text().splitlines()
    cols = lines[0].split(",")
    keep = [i for i, c in enumerate(cols) if c not in ("routing", "prefix_hit_rate")]
    path.write_text("\n".join(",".join(row.split(",")[i] for i in keep) for row in lines[:2]) + "\n")
    assert report.read_csv(path) == [replace(runs[0], prefix_hit_rate=None)]


def _one_replica_prefix_on_rank_0(prof, routing: str):
    """A fleet of one ready replica, every rank simulated, whose rank 0 holds the prefix `keys` (idle again)."""
    fleet = Fleet(prof, 100.0, 1, all_ranks=True, routing=routing)
    g = fleet.order(0.0, ready=True)
    fleet._set_ready()
    r0 = g.ranks[0].engine
    keys = list(range(1, 40))
    r0.add_request("warm", 39 * r0.unit, 1, 0.0, block_hashes=keys, hashes_cover_output=True, hashes_chained=True)
    while (t := r0.next_event_time()) is not None:
        r0.advance(t)
    return fleet, g, keys


@pytest.mark.parametrize("name, slack", [("gb200-4gpu-demo", 1), ("gb200-4gpu", 4)])
def test_a_replicas_ranks_are_chosen_by_the_mock_engines_rule(name, slack):
    # Within a replica the simulator picks a data-parallel rank as the mock engine does (engine/dprank.py): a
    # rank with the request's prefix cached wins only within the profile's slack of the least-loaded score
    # (1 for the demo profile, whose ranks run 2 sequences at the SLA; 4 for the calibrated one), and ties
    # go to the first rank of a scan that rotates per request.
    prof = profiles.load(name)
    assert dprank.slack(prof) == slack
    fleet, g, keys = _one_replica_prefix_on_rank_0(prof, "router")
    r0 = g.ranks[0].engine
    for i in range(slack + 1):  # rank 0 runs slack + 1 requests: just past the slack
        r0.add_request(i, 100, 4000, 100.0)
    r0.advance(100.1)
    assert r0.load_score() == slack + 1
    assert pick_rank(g, keys, fleet.dp_slack) is g.ranks[1]  # least loaded; its scan started at rank 0
    # ranks 1-3 tie: the first in scan order, which now starts at rank 1, then at rank 2
    assert pick_rank(g, [], fleet.dp_slack) is g.ranks[1]
    assert pick_rank(g, [], fleet.dp_slack) is g.ranks[2]
    for r in g.ranks[1:]:  # one request each: rank 0 is now within the slack, and it holds the prefix
        r.engine.add_request("b", 100, 4000, 100.0)
        r.engine.advance(100.1)
    assert pick_rank(g, keys, fleet.dp_slack) is g.ranks[0]


def test_router_rank_pins_a_session_to_the_rank_vllm_routers_dp_ring_names(profile):
    # DP-aware routing: the ring's workers are `<pod>@<rank>`, as vllm-router lists an engine URL per rank; a
    # session's every turn goes to that rank, and sessions use the ranks of every pod
    f = Fleet(profile, 100.0, seed=1, routing="router-rank", all_ranks=True)
    for _ in range(3):
        f.order(0.0, ready=True)
    ring = HashRing([f"{g.pod}@{i}" for g in f.active for i in range(profile.engines_per_replica)])
    placed = set()
    for sid in range(1, 200):
        s = _Session(sid)
        rank = f.route_session(s, 0.0)
        assert f"{rank.group.pod}@{rank.index}" == ring.lookup(session_key(f"s{sid}"))
        assert all(f.route_session(s, 0.0) is rank for _ in range(3))
        placed.add((rank.group.index, rank.index))
    assert len(placed) == 3 * profile.engines_per_replica
    # one representative rank per replica: a pod's ranks all lead to it
    one = Fleet(profile, 100.0, seed=1, routing="router-rank")
    for _ in range(3):
        one.order(0.0, ready=True)
    assert {one.route_session(_Session(sid), 0.0).group.index for sid in range(1, 60)} == {0, 1, 2}


def test_rendezvous_picks_the_highest_score_and_moves_only_the_sessions_a_changed_worker_takes_or_gives():
    keys = [session_key(f"s{i}") for i in range(600)]
    workers = ["a@0", "a@1", "b@0", "b@1", "c@0", "c@1"]
    scores: dict[str, dict[str, int]] = {k: {} for k in keys}
    before = {k: rendezvous_pick(k, workers, scores[k]) for k in keys}
    for k in keys[:50]:  # by definition: the worker whose "<key>:<url>" hashes highest
        assert before[k] == max(workers, key=lambda w: fbi_hash(f"{k}:{w}"))
    counts = Counter(before.values())
    assert set(counts) == set(workers) and max(counts.values()) < 2 * min(counts.values())
    grown = workers + ["d@0", "d@1"]  # scale-up: a key moves only to the new pod's ranks, about a quarter of them
    after = {k: rendezvous_pick(k, grown, scores[k]) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k].startswith("d@") for k in moved) and 0.15 < len(moved) / len(keys) < 0.35
    shrunk = [w for w in grown if not w.startswith("b@")]  # b drained: only its keys move, over every other pod
    gone = {k: rendezvous_pick(k, shrunk, scores[k]) for k in keys}
    assert all(gone[k] == after[k] for k in keys if not after[k].startswith("b@"))
    assert {gone[k][0] for k in keys if after[k].startswith("b@")} == {"a", "c", "d"}
    assert rendezvous_pick("k", [], {}) is None


def test_router_rendezvous_pins_a_session_to_its_rank_and_rescores_it_when_the_pods_change(profile):
    f = Fleet(profile, 100.0, seed=1, routing="router-rendezvous", all_ranks=True)
    for _ in range(3):
        f.order(0.0, ready=True)
    workers = [f"{g.pod}@{i}" for g in f.active for i in range(profile.engines_per_replica)]
    sessions = [_Session(sid) for sid in range(1, 150)]
    homes = {}
    for s in sessions:
        rank = homes[s.sid] = f.route_session(s, 0.0)
        assert f"{rank.group.pod}@{rank.index}" == rendezvous_pick(session_key(f"s{s.sid}"), workers, {})
        assert all(f.route_session(s, 0.0) is rank for _ in range(2))
    assert len({(r.group.index, r.index) for r in homes.values()}) == len(workers)
    new = f.order(1.0, ready=True)  # a pod joins: a session moves only to one of its ranks
    again = {s.sid: f.route_session(s, 1.0) for s in sessions}
    moved = [sid for sid in again if again[sid] is not homes[sid]]
    assert moved and all(again[sid].group is new for sid in moved)
    assert [g.sessions for g in f.active] == [sum(r.group is g for r in again.values()) for g in f.active]
    f.end_session(sessions[0])
    assert sessions[0].sid not in f.hrw_scores and sessions[0].sid not in f.hrw_home


def test_router_pod_vllm_balances_ranks_by_load_only(profile):
    # vLLM 0.33's balancer inside a pod has no prefix preference: a session's turns rotate over idle ranks
    # where the mock's balancer (`router`) keeps returning to the rank that holds the prefix
    turns = {}
    for routing in ("router", "router-pod-vllm"):
        f, _, keys = _one_replica_prefix_on_rank_0(profile, routing)
        s = _Session(5)
        s.block_hashes = lambda: keys
        turns[routing] = {f.route_session(s, 0.0).index for _ in range(4)}
    assert turns["router"] == {0}
    assert turns["router-pod-vllm"] == {0, 1, 2, 3}


def test_router_sticky_places_new_sessions_by_count_over_ranks_and_keeps_them_until_their_pod_leaves(profile):
    """sticky_least_loaded over ranks (docs/vllm-router.md): every rank of 3 pods takes one session before any
    takes a second, a session's turns keep its rank, one whose pod drains moves to the least-loaded rank left,
    and an ended session frees its place."""
    f = Fleet(profile, 100.0, seed=1, routing="router-sticky", all_ranks=True)
    for _ in range(3):
        f.order(0.0, ready=True)
    ranks = 3 * profile.engines_per_replica
    sessions = [_Session(sid) for sid in range(2 * ranks)]
    homes = {s.sid: f.route_session(s, 0.0) for s in sessions}
    assert Counter((r.group.index, r.index) for r in homes.values()) == Counter(
        {(g, i): 2 for g in range(3) for i in range(profile.engines_per_replica)})
    assert all(f.route_session(s, 0.0) is homes[s.sid] for s in sessions)
    assert [g.sessions for g in f.active] == [2 * profile.engines_per_replica] * 3
    drained = f.remove_last(1.0)
    moved = [s for s in sessions if homes[s.sid].group is drained]
    after = {s.sid: f.route_session(s, 0.0) for s in moved}
    assert all(r.group is not drained for r in after.values())
    assert max(Counter((r.group.index, r.index) for r in (after | {
        s.sid: homes[s.sid] for s in sessions if s.sid not in after}).values()).values()) == 3
    for s in sessions[:2]:
        f.end_session(s)
    counts = {(g, i): f.sticky_count.get((g, i), 0) for g in f.ready_list for i in range(profile.engines_per_replica)}
    new = f.route_session(_Session(1000), 0.0)
    assert counts[(new.group, new.index)] == min(counts.values()) == 2


def test_router_sticky_with_the_binarys_idle_expiry_counts_ended_sessions_until_a_sweep_finds_them(profile):
    """The binary is not told that a conversation ended: an ended session keeps its rank's count until it has been
    idle for the TTL and a sweep (at most once a minute) finds it. So a pod that joins after the old pods'
    sessions ended takes every new session while its count catches up with theirs; without a TTL (a client that
    calls /finish_session) new sessions spread over every pod. A session idle past the TTL is placed again."""
    per_pod = profile.engines_per_replica

    def new_homes(ttl: float | None) -> Counter:
        f = Fleet(profile, 100.0, seed=1, routing="router-sticky", sticky_ttl_s=ttl)
        for _ in range(2):
            f.order(0.0, ready=True)
        old = [_Session(sid) for sid in range(4 * per_pod)]
        for s in old:
            f.route_session(s, 1.0)
        for s in old:
            f.end_session(s)
        f.order(10.0, ready=True)
        return Counter(f.route_session(_Session(100 + i), 20.0).group.index for i in range(3 * per_pod))

    assert new_homes(None) == Counter({0: per_pod, 1: per_pod, 2: per_pod})
    assert new_homes(600.0) == Counter({2: 2 * per_pod, 0: per_pod})  # ties: the first pod (the binary hashes)

    f = Fleet(profile, 100.0, seed=1, routing="router-sticky", sticky_ttl_s=600.0)
    for _ in range(2):
        f.order(0.0, ready=True)
    ended = [_Session(sid) for sid in range(2 * per_pod)]
    for s in ended:
        f.route_session(s, 0.0)
        f.end_session(s)
    kept = _Session(999)
    first = f.route_session(kept, 0.0)
    assert sum(f.sticky_count.values()) == 2 * per_pod + 1
    assert f.route_session(kept, 599.0) is first  # idle 599 s: still its rank; the sweep at 599 s finds nothing
    f.route_session(_Session(1000), 659.0)  # a minute after that sweep, on a request: the ended sessions go
    assert sum(f.sticky_count.values()) == 2
    f.route_session(_Session(1001), 1190.0)  # a sweep: `kept` (idle 591 s) stays
    home = f.sticky_home[kept.sid]
    f.sticky_count[home] += 5  # its rank got busy since: placed again, it goes elsewhere
    f.route_session(kept, 1200.0)  # idle 601 s, found on its own request, not by a sweep
    assert f.sticky_home[kept.sid] != home
    assert sum(f.sticky_count.values()) - 5 == len(f.sticky_home) == 3


@pytest.mark.parametrize("argv", [["--sticky-ttl", "0", "--routing", "router-sticky"], ["--sticky-ttl", "600"]])
def test_cli_refuses_a_sticky_ttl_it_cannot_apply(argv, capsys):
    from flashserve_testbed.bench import cli

    assert cli.main(["autoscale", "--quick", *argv]) == 2
    assert "--sticky-ttl: give seconds above 0, with --routing router-sticky" in capsys.readouterr().err
