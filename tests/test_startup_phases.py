"""Group start-up records (controller/startup_phases.py): each phase from the pods' and the StatefulSet's own
timestamps, the cache state from the prefetch and earlier start-ups, status.startup's shape and bounds, the
histogram observed once per start-up (also across an operator restart) and StartupSlow told once.

Objects are what the API server would hold: StatefulSets and DaemonSets as the renderer makes them, with a
uid and a creationTimestamp; pods with their conditions and container states, reduced by observe.pod_view."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging

import pytest
from flashserve.api.v1alpha1 import DeepSeekServingStatus
from flashserve.api.validation import parse_serving
from flashserve.clock import iso_at
from flashserve.controller import startup_phases as sp
from flashserve.controller.metrics import _ControllerCollector
from flashserve.controller.observe import Observed, pod_view, slim
from flashserve.facts.layout import layout
from flashserve.render.naming import SERVING_LABEL, serving_label_value
from flashserve.render.renderer import render
from flashserve.render.vllm_args import kernel_cache_key

from tests.builders import NS, body, cr
from tests.fakes import FakeKube, controller, reconcile

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NODE_LOCAL = {"weightsCache": {"scope": "NodeLocal", "claimName": "weights"}, "kernelCache": {"claimName": "kernels"}}
SHARED = {"weightsCache": {"scope": "Shared", "claimName": "weights"}}
TWO_NODES = {"parallelism": {"nodesPerReplica": 2}, "replicas": 2}


def spec_of(spec: dict):
    return parse_serving(cr(copy.deepcopy(spec))).spec


def children(spec: dict) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(cr(copy.deepcopy(spec)))}


def child(spec: dict, kind: str, suffix: str = "") -> dict:
    """The rendered child of `kind` whose name ends in `suffix`."""
    return next(o for (k, n), o in children(spec).items() if k == kind and n.endswith(suffix))


def live(obj: dict, created: float | None, uid: str | None = None) -> dict:
    """A rendered object as the API server holds it: with a uid and (unless None) its creation time."""
    out = copy.deepcopy(obj)
    out["metadata"]["uid"] = uid or f"uid-{obj['metadata']['name']}"
    if created is not None:
        out["metadata"]["creationTimestamp"] = iso_at(T0 + created)
    return slim(out)  # what the operator's index keeps of it


def pod(owner: dict, name: str, node: str | None, scheduled: float | None = None, started: float | None = None,
        ready: float | None = None, restarts: int = 0, container: str = "vllm") -> dict:  # fmt: skip
    """A pod of `owner` as the kubelet reports it; times in seconds after T0, None: not reached yet."""
    tpl = owner["spec"]["template"]
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "lastTransitionTime": iso_at(T0)}]  # fmt: skip
    if scheduled is not None:
        conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": iso_at(T0 + scheduled)}]
    since = ready if ready is not None else scheduled or 0
    conditions.append({"type": "Ready", "status": "True" if ready is not None else "False",
                       "lastTransitionTime": iso_at(T0 + since)})  # fmt: skip
    state = {"waiting": {"reason": "ContainerCreating"}}
    if started is not None:
        state = {"running": {"startedAt": iso_at(T0 + started)}}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}-{restarts}",
                     "labels": dict(tpl["metadata"]["labels"]),
                     "ownerReferences": [{"kind": owner["kind"], "name": owner["metadata"]["name"],
                                          "uid": owner["metadata"]["uid"], "controller": True}]},  # fmt: skip
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running" if started is not None else "Pending", "conditions": conditions,
                   "containerStatuses": [{"name": container, "restartCount": restarts, "state": state}]},  # fmt: skip
    }


def group(spec: dict, g: int, created: float, times: list[tuple], uid: str | None = None) -> tuple[dict, list]:
    """StatefulSet of group `g` and its pods: times[k] = (node, scheduled, started, ready) of pod k."""
    sts = live(child(spec, "StatefulSet", f"-g{g}"), created, uid)
    return sts, [pod_view(pod(sts, f"{sts['metadata']['name']}-{k}", *t)) for k, t in enumerate(times)]


def prefetch(spec: dict, ready_on: dict[str, float | None]) -> tuple[dict, list]:
    """The prefetch DaemonSet and its pod on each node: Ready at the time given (None: still downloading)."""
    ds = live(child(spec, "DaemonSet", "-prefetch"), 0)
    pods = [pod_view(pod(ds, f"{ds['metadata']['name']}-{n}", n, 1, 2 if t is not None else None, t, container="pause"))
            for n, t in ready_on.items()]  # fmt: skip
    return ds, pods


def observed(*groups: tuple[dict, list], daemonsets=(), jobs=(), startup_pods=()) -> Observed:
    out = Observed()
    for sts, pods in groups:
        out.statefulsets[sts["metadata"]["name"]] = sts
        out.pods += pods
    out.daemonsets = {d["metadata"]["name"]: d for d in daemonsets}
    out.jobs = {j["metadata"]["name"]: j for j in jobs}
    out.startup_pods = list(startup_pods)
    return out


# -- the records


def test_a_multi_node_group_is_scheduled_running_and_ready_at_the_latest_of_its_pods():
    sts, pods = group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), ("n2", 5, 30, 310)])
    r = sp.startup_of(sts, pods)
    assert (r.created, r.scheduled, r.running, r.ready) == (T0, T0 + 5, T0 + 40, T0 + 310)
    assert r.complete and r.seconds_to_ready == 310
    assert r.status() == {
        "group": 0, "statefulSet": sts["metadata"]["name"], "uid": sts["metadata"]["uid"], "cacheState": "cold",
        "created": "2026-01-01T00:00:00Z", "scheduled": "2026-01-01T00:00:05Z", "running": "2026-01-01T00:00:40Z",
        "ready": "2026-01-01T00:05:10Z", "seconds": {"scheduled": 5.0, "running": 40.0, "ready": 310.0},
    }  # fmt: skip


def test_a_pod_not_yet_scheduled_or_not_yet_made_leaves_the_group_incomplete():
    sts, pods = group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), (None, None, None, None)])
    r = sp.startup_of(sts, pods)
    assert (r.scheduled, r.running, r.ready, r.complete) == (None, None, None, False)
    # Written as a merge patch: a phase not reached is null, so no earlier record's value survives in it.
    assert r.status()["seconds"] == {"scheduled": None, "running": None, "ready": None}
    assert (r.status()["scheduled"], r.status()["ready"]) == (None, None)
    # One pod of two made so far (the other not yet created): not scheduled as a group either.
    assert sp.startup_of(sts, pods[:1]).scheduled is None
    # Both bound, one engine still pulling its image: scheduled, not running.
    sts, pods = group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), ("n2", 8, None, None)])
    r = sp.startup_of(sts, pods)
    assert (r.scheduled, r.running, r.ready) == (T0 + 8, None, None)


def test_a_group_without_a_creation_time_or_held_at_zero_has_no_record():
    sts, pods = group(TWO_NODES, 0, None, [("n1", 3, 40, 300), ("n2", 5, 30, 310)])
    assert sp.startup_of(sts, pods) is None
    sts, pods = group(TWO_NODES, 0, 0, [])
    sts["spec"]["replicas"] = 0
    assert sp.startup_of(sts, pods) is None


def test_pods_of_another_statefulset_and_terminating_pods_do_not_count():
    sts, pods = group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), ("n2", 5, 30, 310)])
    other, theirs = group(TWO_NODES, 1, 0, [("n3", 1, 2, 3), ("n4", 1, 2, 900)])
    assert sp.startup_of(sts, pods + theirs).ready == T0 + 310
    going = [dataclasses.replace(pods[1], terminating=True)]
    assert sp.startup_of(sts, pods[:1] + going).ready is None


def test_a_restart_after_the_group_was_recorded_records_nothing_new():
    spec = spec_of(TWO_NODES)
    tracker = sp.StartupTracker()
    first = observed(group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), ("n2", 5, 30, 310)]))
    s = tracker.step(NS, "flash", spec, first, None, T0 + 400)
    assert [r.ready for r in s.new] == [T0 + 310] and s.status["last"]["ready"] == "2026-01-01T00:05:10Z"
    tracker.commit(NS, "flash", s, set(first.statefulsets[n]["metadata"]["uid"] for n in first.statefulsets))
    # pod 1's engine crashed and came back: later start and Ready times, same StatefulSet
    again = observed(group(TWO_NODES, 0, 0, [("n1", 3, 40, 300), ("n2", 5, 900, 1000, 1)]))
    s = tracker.step(NS, "flash", spec, again, s.status, T0 + 1100)
    assert s.new == [] and s.status is None and s.slow == []
    # The StatefulSet made again (a new uid) is a new start-up.
    remade = observed(group(TWO_NODES, 0, 2000, [("n1", 2003, 2040, 2300), ("n2", 2005, 2030, 2310)], uid="uid-2"))
    s = tracker.step(NS, "flash", spec, remade, s.status, T0 + 2400)
    assert [r.uid for r in s.new] == ["uid-2"]


# -- cache state


def one_group(spec: dict, prefetched: dict[str, float | None] | None = None, jobs=()) -> sp.Step:
    grp = group(spec, 0, 100, [("n1", 110, 150, 400), ("n2", 112, 151, 420)])
    ds, ppods = prefetch(spec, prefetched) if prefetched is not None else (None, [])
    obs = observed(grp, daemonsets=[ds] if ds else [], jobs=jobs, startup_pods=ppods)
    return sp.step("flash", spec_of(spec), obs, None, set(), set(), T0 + 500)


def test_without_a_weights_cache_a_start_up_is_cold():
    assert [r.cache_state for r in one_group(TWO_NODES).new] == ["cold"]


def test_node_local_weights_are_cached_when_the_prefetch_pod_of_every_node_was_ready_before_scheduling():
    spec = {**TWO_NODES, "startup": NODE_LOCAL}
    assert one_group(spec, {"n1": 50, "n2": 110}).new[0].cache_state == "weights-cached"
    # n2's copy completed after the engine pod was placed there: that pod downloaded (part of) its weights
    assert one_group(spec, {"n1": 50, "n2": 113}).new[0].cache_state == "cold"
    assert one_group(spec, {"n1": 50, "n2": None}).new[0].cache_state == "cold", "n2 still downloading"
    assert one_group(spec, {"n1": 50}).new[0].cache_state == "cold", "no prefetch pod on n2"
    assert one_group(spec, {"n1": 50, "n3": 50}).new[0].cache_state == "cold", "prefetched on another node"
    no_prefetch = copy.deepcopy(spec)
    no_prefetch["startup"]["weightsCache"]["prefetch"] = False
    assert one_group(no_prefetch).new[0].cache_state == "cold", "nothing tells when a copy is complete"


def job(spec: dict, done: float | None) -> dict:
    j = live(child(spec, "Job"), 0)
    if done is not None:
        complete = {"type": "Complete", "status": "True", "lastTransitionTime": iso_at(T0 + done)}
        j["status"] = {"completionTime": iso_at(T0 + done), "conditions": [complete]}
    return j


def test_shared_weights_are_cached_when_the_prefetch_job_had_succeeded_before_the_group_was_created():
    spec = {**TWO_NODES, "startup": SHARED}
    assert one_group(spec, jobs=[job(spec, 90)]).new[0].cache_state == "weights-cached"
    assert one_group(spec, jobs=[job(spec, 101)]).new[0].cache_state == "cold"
    assert one_group(spec, jobs=[job(spec, None)]).new[0].cache_state == "cold", "still running"
    assert one_group(spec).new[0].cache_state == "cold", "no Job"


def test_the_kernel_cache_key_is_the_directory_the_renderer_points_the_engines_at():
    spec = {**TWO_NODES, "startup": NODE_LOCAL}
    sts, _ = group(spec, 0, 0, [])
    s = spec_of(spec)
    assert sp.kernel_cache_key(sts) == kernel_cache_key(s, layout(s))
    assert sp.kernel_cache_key(group(TWO_NODES, 0, 0, [])[0]) is None


def test_kernels_are_warm_for_a_group_whose_engines_started_after_an_earlier_group_of_the_same_key_was_ready():
    spec = {**TWO_NODES, "startup": NODE_LOCAL}
    ds, ppods = prefetch(spec, {f"n{i}": 10 for i in range(1, 7)})
    g0 = group(spec, 0, 100, [("n1", 110, 150, 400), ("n2", 112, 151, 420)])
    g1 = group(spec, 1, 300, [("n3", 310, 430, 600), ("n4", 312, 431, 610)])  # started after g0 was ready
    s = sp.step("flash", spec_of(spec), observed(g0, g1, daemonsets=[ds], startup_pods=ppods), None, set(), set(),
                T0 + 700)
    assert [(r.group, r.cache_state) for r in s.new] == [(0, "weights-cached"), (1, "warm")]
    key = sp.kernel_cache_key(g0[0])
    assert s.status["warmKernelCaches"] == [{"key": key, "since": iso_at(T0 + 420)}]
    # Engines that started before the first group had filled the kernel cache compiled their own.
    early = group(spec, 1, 300, [("n3", 310, 330, 600), ("n4", 312, 419, 610)])
    s = sp.step("flash", spec_of(spec), observed(g0, early, daemonsets=[ds], startup_pods=ppods), None, set(),
                set(), T0 + 700)
    assert [r.cache_state for r in s.new] == ["weights-cached", "weights-cached"]
    # Remembered in status: after an operator restart, a later group starts warm.
    g2 = group(spec, 0, 5000, [("n5", 5010, 5050, 5300), ("n6", 5012, 5051, 5320)], uid="uid-g0-again")
    fresh = sp.StartupTracker()
    later = fresh.step(NS, "flash", spec_of(spec), observed(g2, daemonsets=[ds], startup_pods=ppods), s.status,
                       T0 + 5400)
    assert [r.cache_state for r in later.new] == ["warm"]
    # Warm kernels without cached weights: the download dominates, the start-up is cold.
    cold = sp.step("flash", spec_of(spec), observed(g2), s.status, set(), set(), T0 + 5400)
    assert [r.cache_state for r in cold.new] == ["cold"]


# -- status


def many(n: int, spec: dict = TWO_NODES) -> Observed:
    times = [[("a", 10 * g + 1, 10 * g + 2, 10 * g + 100 + g)] * 2 for g in range(n)]
    return observed(*(group({**spec, "replicas": n}, g, 10 * g, times[g]) for g in range(n)))


def test_status_lists_the_last_start_ups_newest_last_bounded_and_valid_for_the_typed_status():
    tracker = sp.StartupTracker()
    obs = many(11)
    s = tracker.step(NS, "flash", spec_of({**TWO_NODES, "replicas": 11}), obs, None, T0 + 1000)
    assert [r.group for r in s.new] == list(range(11))
    assert len(s.status["recent"]) == sp.RECENT_MAX == 8
    assert [e["group"] for e in s.status["recent"]] == list(range(3, 11))
    assert s.status["last"] == s.status["recent"][-1]
    assert set(s.status["last"]) == {"group", "statefulSet", "uid", "cacheState", "created", "scheduled", "running",
                                     "ready", "seconds"}  # fmt: skip
    typed = DeepSeekServingStatus.model_validate({"startup": s.status})
    assert typed.dump()["startup"] == s.status
    # What the API server keeps of a merge patch: a record with a phase not reached is valid too.
    partial = sp.startup_of(*group(TWO_NODES, 0, 0, [("n1", 3, None, None)] * 2))
    kept = {k: v for k, v in partial.status().items() if v is not None}
    kept["seconds"] = {k: v for k, v in kept["seconds"].items() if v is not None}
    assert DeepSeekServingStatus.model_validate({"startup": {"last": kept}}).dump()["startup"]["last"] == kept
    # A steady serving: nothing new, nothing to write.
    tracker.commit(NS, "flash", s, {o["metadata"]["uid"] for o in obs.statefulsets.values()})
    assert tracker.step(NS, "flash", spec_of({**TWO_NODES, "replicas": 11}), obs, s.status, T0 + 2000).status is None


# -- the histogram


def histogram(tracker: sp.StartupTracker) -> dict[tuple, float]:
    """(phase, cache_state) -> observations, from what the metrics endpoint serves."""
    out = {}
    for family in tracker.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                out[(sample.labels["phase"], sample.labels["cache_state"])] = sample.value
    return out


def test_each_start_up_is_observed_once_also_across_an_operator_restart():
    spec = spec_of({**TWO_NODES, "replicas": 11})
    obs = many(11)
    uids = {o["metadata"]["uid"] for o in obs.statefulsets.values()}
    tracker = sp.StartupTracker()
    s = tracker.step(NS, "flash", spec, obs, None, T0 + 1000)
    tracker.commit(NS, "flash", s, uids)
    tracker.commit(NS, "flash", tracker.step(NS, "flash", spec, obs, s.status, T0 + 1001), uids)
    assert histogram(tracker) == {("scheduled", "cold"): 11, ("running", "cold"): 11, ("ready", "cold"): 11}
    buckets = {s.labels["le"]: s.value for f in tracker.collect() for s in f.samples
               if s.name.endswith("_bucket") and s.labels["phase"] == "ready"}  # fmt: skip
    assert buckets["90"] == 0 and buckets["120"] == 11 and buckets["+Inf"] == 11, "ready 100..110 s after created"
    # A new operator: status lists 8 of the 11, and the 3 older ones were ready before the newest listed.
    restarted = sp.StartupTracker()
    s2 = restarted.step(NS, "flash", spec, obs, s.status, T0 + 2000)
    restarted.commit(NS, "flash", s2, uids)
    assert s2.new == [] and histogram(restarted) == {}
    # A start-up that completes after the restart is observed.
    grown = many(12)
    s3 = restarted.step(NS, "flash", spec_of({**TWO_NODES, "replicas": 12}), grown, s.status, T0 + 2000)
    assert [r.group for r in s3.new] == [11]


def test_the_operator_metrics_endpoint_serves_the_histogram():
    kube = FakeKube()
    c = controller(kube)
    c.startups._observe((NS, "flash", "ready", "warm"), 42.0)
    names = {f.name for f in _ControllerCollector(c).collect()}
    assert "flashserve_group_startup_seconds" in names


# -- through the reconciler: status written once, StartupSlow once


def timed(kube: FakeKube, name: str, created: float, ready: float | None) -> Observed:
    """What the watches show of `kube`, with the StatefulSets created at `created` and their pods bound,
    started and (unless `ready` is None) Ready at the times given (seconds after T0)."""
    obs = kube.observed(NS, serving_label_value(name))
    for sts in obs.statefulsets.values():
        sts["metadata"]["creationTimestamp"] = iso_at(T0 + created)
    obs.pods = [dataclasses.replace(p, scheduled_at=T0 + created + 2, started_at=T0 + created + 5,
                                    ready=ready is not None, ready_at=None if ready is None else T0 + ready)
                for p in obs.pods]  # fmt: skip
    return obs


def run(c, b: dict, obs: Observed) -> None:
    asyncio.run(c.reconcile(b, obs, logging.getLogger("test")))


@pytest.fixture
def wall(clock):
    """The reconciler's wall clock at T0 + 10000 s."""
    clock.now = T0 + 10_000 - 1_767_225_600.0
    return clock


def test_a_start_up_is_written_to_status_once_and_a_steady_serving_writes_nothing(events, wall):
    kube = FakeKube()
    c = controller(kube)
    spec = {"replicas": 1, "routing": {"enabled": False}}
    status = reconcile(c, kube, body("flash", spec))
    run(c, body("flash", spec, status=status), timed(kube, "flash", 9000, None))
    assert "startup" not in kube.status.get((NS, "flash"), {})
    patches = len(kube.status_patches)
    run(c, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 9000, 9300))
    assert len(kube.status_patches) == patches + 1
    startup = kube.status[(NS, "flash")]["startup"]
    assert startup["last"]["seconds"] == {"scheduled": 2.0, "running": 5.0, "ready": 300.0}
    assert startup["recent"] == [startup["last"]]
    kube.calls.clear()
    for _ in range(2):
        run(c, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 9000, 9300))
    assert [call for call in kube.calls if call[0] == "status"] == []
    assert not [e for e in events if e["reason"] == "StartupSlow"], "300 s is within the 3600 s probe budget"


def test_startup_slow_is_told_once_per_group_while_it_starts_and_not_again_when_it_is_ready(events, wall):
    kube = FakeKube()
    c = controller(kube)
    spec = {"replicas": 1, "routing": {"enabled": False}}
    status = reconcile(c, kube, body("flash", spec))
    sts = next(iter(kube.observed(NS, serving_label_value("flash")).statefulsets.values()))
    assert sp.probe_budget(sts) == 3600.0  # periodSeconds 10 x failureThreshold 360
    for _ in range(2):  # created 4000 s ago, still not ready
        run(c, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 6000, None))
    slow = [e for e in events if e["reason"] == "StartupSlow"]
    assert len(slow) == 1 and slow[0]["type"] == "Warning"
    assert "group 0" in slow[0]["message"] and "4000 s" in slow[0]["message"] and "3600 s" in slow[0]["message"]
    run(c, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 6000, 9900))
    assert len([e for e in events if e["reason"] == "StartupSlow"]) == 1
    assert kube.status[(NS, "flash")]["startup"]["last"]["seconds"]["ready"] == 3900.0


def test_a_group_ready_beyond_its_budget_is_told_once_and_not_again_after_an_operator_restart(events, wall):
    kube = FakeKube()
    c = controller(kube)
    spec = {"replicas": 1, "routing": {"enabled": False}}
    reconcile(c, kube, body("flash", spec))
    run(c, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 1000, 5000))
    assert [e["reason"] for e in events].count("StartupSlow") == 1
    restarted = controller(kube)
    run(restarted, body("flash", spec, status=kube.status[(NS, "flash")]), timed(kube, "flash", 1000, 5000))
    assert [e["reason"] for e in events].count("StartupSlow") == 1


# -- the prefetch pods reach the start-up through the pod index


def test_prefetch_pods_are_indexed_apart_from_engine_pods_and_kept_only_when_the_serving_owns_their_daemonset():
    from flashserve.controller import handlers
    from flashserve.controller.observe import owned
    from flashserve.render.startup import OWNER_LABEL

    spec = {**TWO_NODES, "startup": NODE_LOCAL}
    sts, _ = group(spec, 0, 0, [])
    ds, _ = prefetch(spec, {})
    engine = pod(sts, "flash-g0-0", "n1", 1, 2, 3)
    worker = pod(ds, "flash-prefetch-x", "n1", 1, 2, 3, container="pause")
    stranger = pod({**ds, "metadata": {**ds["metadata"], "uid": "uid-other"}}, "other-prefetch-y", "n2", 1, 2, 3)
    key = (NS, serving_label_value("flash"))
    wake = handlers._wakeups.setdefault(key, asyncio.Event())
    try:
        index = {}
        for b in (engine, worker, stranger):
            got = asyncio.run(handlers._index_pod(namespace=NS, labels=b["metadata"]["labels"], body=b))
            for k, v in got.items():
                index.setdefault(k, []).append(v)
        assert wake.is_set(), "a prefetch pod's change wakes its serving"
    finally:
        handlers._wakeups.pop(key, None)
    assert OWNER_LABEL in worker["metadata"]["labels"] and SERVING_LABEL not in worker["metadata"]["labels"]
    assert set(index) == {key, handlers.startup_key(key)}
    indexes: dict = {c.field: {} for c in handlers.CHILDREN}
    indexes.update(statefulsets={key: [sts]}, pods=index, daemonsets={key: [ds]})
    obs = handlers._observed([key], indexes)
    assert [p.name for p in obs.pods] == ["flash-g0-0"]
    assert sorted(p.name for p in obs.startup_pods) == ["flash-prefetch-x", "other-prefetch-y"]
    mine = owned(obs, "uid-flash", serving_label_value("flash"))
    assert [p.name for p in mine.startup_pods] == ["flash-prefetch-x"], "only pods of this serving's DaemonSet"
