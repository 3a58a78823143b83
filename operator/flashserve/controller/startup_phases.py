"""Start-up of each replica group, measured per phase from the API's own timestamps (docs/startup.md).

A group is one StatefulSet; its start-up is recorded once per StatefulSet uid, when all its pods are Ready for
the first time the operator sees it:

  created   = the StatefulSet's metadata.creationTimestamp
  scheduled = the latest PodScheduled=True lastTransitionTime over the group's pods (all pods bound)
  running   = the latest state.running.startedAt of the engine container over the group's pods
  ready     = the latest Ready=True lastTransitionTime over the group's pods

A pod that restarts after its group was recorded records nothing new: the record is of the group's start-up,
not of its later recoveries. Each record carries the cache state the group started in (cold, weights-cached,
warm), decided from what the operator observes of the prefetch and of earlier start-ups (`cache_state`).

Everything here is pure except `StartupTracker`, which holds, per serving, what has been recorded already (so a
start-up is counted once) and the histogram the metrics endpoint serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from prometheus_client.core import HistogramMetricFamily

from flashserve.api.v1alpha1 import STARTUP_RECENT_MAX as RECENT_MAX
from flashserve.api.v1alpha1 import STARTUP_WARM_KERNELS_MAX as WARM_KERNELS_MAX
from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.clock import iso_at, parse_iso
from flashserve.controller.observe import ENGINE_CONTAINER, Observed, PodView, statefulset_of
from flashserve.render.naming import COMPONENT_LABEL, GROUP_LABEL
from flashserve.render.startup import PREFETCH_COMPONENT, prefetch_daemonset_name, prefetch_job_name
from flashserve.render.vllm_args import KERNEL_CACHE_MOUNT

COLD, WEIGHTS_CACHED, WARM = "cold", "weights-cached", "warm"
PHASES = ("scheduled", "running", "ready")
# From a warm group on a pre-pulled node (tens of seconds) to a cold DeepSeek-class launch on a large
# layout (the NVIDIA recipe's "up to ~60 minutes", and more with a slow download): 10 s .. 2 h.
BUCKETS = (10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0, 420.0, 600.0, 900.0, 1200.0,
           1800.0, 2700.0, 3600.0, 5400.0, 7200.0)  # fmt: skip
# Kubernetes' probe defaults, for a probe that leaves a field out
PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "failureThreshold": 3}


@dataclass(frozen=True)
class GroupStartup:
    group: int
    statefulset: str
    uid: str
    created: float
    scheduled: float | None
    running: float | None
    ready: float | None
    cache_state: str

    @property
    def complete(self) -> bool:
        return self.ready is not None

    @property
    def seconds_to_ready(self) -> float | None:
        return None if self.ready is None else self.ready - self.created

    def seconds(self) -> dict[str, float]:
        """Seconds from creation to each phase reached."""
        return {ph: t - self.created for ph in PHASES if (t := getattr(self, ph)) is not None}

    def status(self) -> dict:
        """The record as status.startup holds it (times as the API writes them: RFC 3339, whole seconds). A
        phase not reached is null, not left out: status is written as a merge patch, and a key left out would
        keep the previous record's value."""
        seconds = self.seconds()
        return {
            "group": self.group,
            "statefulSet": self.statefulset,
            "uid": self.uid,
            "cacheState": self.cache_state,
            "created": iso_at(self.created),
            **{ph: None if (t := getattr(self, ph)) is None else iso_at(t) for ph in PHASES},
            "seconds": {ph: seconds.get(ph) for ph in PHASES},
        }


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _group_index(sts: dict) -> int:
    try:
        return int((_meta(sts).get("labels") or {}).get(GROUP_LABEL, "-1"))
    except ValueError:
        return -1


def group_pods(sts: dict, pods: list[PodView]) -> list[PodView]:
    """The live pods of a StatefulSet: controlled by its uid (by name, for a pod that names no controller)."""
    uid, name = _meta(sts).get("uid") or "", _meta(sts).get("name") or ""
    return [p for p in pods if not p.terminating
            and (p.owner_uid == uid if p.owner_uid else statefulset_of(p.name) == name)]  # fmt: skip


def pods_by_statefulset(mine: Observed) -> dict[str, list[PodView]]:
    """Each StatefulSet's live pods, found in one pass (a serving may hold thousands of pods)."""
    name_of = {(_meta(s).get("uid") or ""): n for n, s in mine.statefulsets.items()}
    out: dict[str, list[PodView]] = {n: [] for n in mine.statefulsets}
    for p in mine.pods:
        name = name_of.get(p.owner_uid) if p.owner_uid else statefulset_of(p.name)
        if name in out and not p.terminating:
            out[name].append(p)
    return out


def _latest(times: list[float | None], want: int) -> float | None:
    """The latest of `want` times, or None while fewer than `want` are known."""
    known = [t for t in times if t is not None]
    return max(known) if want > 0 and len(known) >= want else None


def replicas(sts: dict) -> int:
    want = (sts.get("spec") or {}).get("replicas", 1)
    return want if isinstance(want, int) else 1


def startup_of(sts: dict, pods: list[PodView], cache_state: str = COLD) -> GroupStartup | None:
    """The start-up of one group as its objects show it now; None without a creation time or a uid, or while
    it asks for no pods (a group held at zero)."""
    meta = _meta(sts)
    created, uid = parse_iso(meta.get("creationTimestamp")), meta.get("uid")
    want = replicas(sts)
    if created is None or not uid or want < 1:
        return None
    mine = group_pods(sts, pods)
    ready = _latest([p.ready_at if p.ready else None for p in mine], want)
    return GroupStartup(
        group=_group_index(sts),
        statefulset=meta.get("name") or "",
        uid=uid,
        created=created,
        scheduled=_latest([p.scheduled_at for p in mine], want),
        running=_latest([p.started_at for p in mine], want),
        ready=ready,
        cache_state=cache_state,
    )


def _engine_container(sts: dict) -> dict:
    containers = ((((sts.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
    return next((c for c in containers if isinstance(c, dict) and c.get("name") == ENGINE_CONTAINER), {})


def kernel_cache_key(sts: dict) -> str | None:
    """The kernel-cache directory (render/vllm_args.py kernel_cache_key: accelerator, layout, image digest) the
    group's engines compile into, from VLLM_CACHE_ROOT in its template; None without a kernel cache."""
    for env in _engine_container(sts).get("env") or []:
        if isinstance(env, dict) and env.get("name") == "VLLM_CACHE_ROOT":
            value = str(env.get("value") or "")
            prefix = KERNEL_CACHE_MOUNT + "/"
            if value.startswith(prefix):
                return value[len(prefix):].split("/", 1)[0] or None
    return None


def probe_budget(sts: dict) -> float | None:
    """Seconds the engine container's startupProbe allows (initialDelaySeconds + periodSeconds x
    failureThreshold), from the StatefulSet's template; None without one."""
    probe = _engine_container(sts).get("startupProbe")
    if not isinstance(probe, dict):
        return None
    v = {k: probe.get(k, d) for k, d in PROBE_DEFAULTS.items()}
    if not all(isinstance(x, int) for x in v.values()):
        return None
    return float(v["initialDelaySeconds"] + v["periodSeconds"] * v["failureThreshold"])


def _component(obj: dict) -> str:
    return str((_meta(obj).get("labels") or {}).get(COMPONENT_LABEL, ""))


def _job_done_at(job: dict) -> float | None:
    """When a Job succeeded: its completionTime, else its Complete condition's transition; None if it has not."""
    status = job.get("status") or {}
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Complete" and c.get("status") == "True":
            return parse_iso(status.get("completionTime")) or parse_iso(c.get("lastTransitionTime"))
    return None


def weights_filled(serving: str, spec: DeepSeekServingSpec, sts: dict, pods: list[PodView],
                   mine: Observed) -> bool:  # fmt: skip
    """Whether the group's weights were in its cache before it needed them:
    NodeLocal: on every node of the group, the prefetch DaemonSet's pod was Ready (that node's copy complete)
    at or before the group's engine pod there was scheduled. Shared: the prefetch Job had succeeded at or
    before the group was created. No weights cache, or no prefetch (nothing tells when a copy is complete):
    not filled."""
    wc = spec.startup.weights_cache if spec.startup else None
    if wc is None or not wc.prefetch:
        return False
    if wc.scope == "Shared":
        created = parse_iso(_meta(sts).get("creationTimestamp"))
        job = mine.jobs.get(prefetch_job_name(serving, spec))
        done = _job_done_at(job) if job is not None else None
        return created is not None and done is not None and done <= created
    ds = mine.daemonsets.get(prefetch_daemonset_name(serving))
    if ds is None or _component(ds) != PREFETCH_COMPONENT:
        return False
    uid = _meta(ds).get("uid")
    ready_on: dict[str, float] = {}
    for p in mine.startup_pods:
        if p.owner_uid == uid and p.ready and p.ready_at is not None and p.node:
            ready_on[p.node] = min(p.ready_at, ready_on.get(p.node, p.ready_at))
    engines = group_pods(sts, pods)
    return bool(engines) and all(
        p.node in ready_on and p.scheduled_at is not None and ready_on[p.node] <= p.scheduled_at for p in engines
    )


def kernels_warm(record: GroupStartup, key: str | None, warm: dict[str, float]) -> bool:
    """Whether an earlier group of the serving had completed a start-up with the same kernel-cache key (so had
    compiled and autotuned into it) before this group's engines started."""
    if key is None or key not in warm or record.running is None:
        return False
    return warm[key] <= record.running


def label(filled: bool, warm_kernels: bool) -> str:
    """The cache-state label (the test bed's start-up model spells them the same)."""
    if not filled:
        return COLD
    return WARM if warm_kernels else WEIGHTS_CACHED


@dataclass(frozen=True)
class Slow:
    group: int
    statefulset: str
    uid: str
    seconds: float
    budget: float
    ready: bool

    def message(self) -> str:
        what = "took" if self.ready else "has been starting for"
        done = " from creation to ready" if self.ready else " since its creation and is not ready"
        return (f"group {self.group} (StatefulSet {self.statefulset}) {what} {self.seconds:.0f} s{done}, beyond "
                f"its engine startupProbe budget of {self.budget:.0f} s (initialDelaySeconds + periodSeconds x "
                "failureThreshold)")


@dataclass
class Step:
    """What one reconcile found: start-ups completed and not recorded before (oldest first), the status.startup
    that lists them (None: unchanged), and groups newly found slower than their probe budget."""

    new: list[GroupStartup] = field(default_factory=list)
    status: dict | None = None
    slow: list[Slow] = field(default_factory=list)


def warm_kernel_caches(startup_status: dict | None) -> dict[str, float]:
    """key -> when a start-up with it first completed, as status.startup.warmKernelCaches remembers them."""
    out: dict[str, float] = {}
    for e in (startup_status or {}).get("warmKernelCaches") or []:
        if isinstance(e, dict) and isinstance(e.get("key"), str) and (t := parse_iso(e.get("since"))) is not None:
            out[e["key"]] = min(t, out.get(e["key"], t))
    return out


def recorded_uids(startup_status: dict | None, records: list[GroupStartup]) -> set[str]:
    """The start-ups an earlier run of the operator recorded: the uids its status lists, and (it lists only
    the last RECENT_MAX) every complete group ready no later than the newest it lists."""
    listed = [e for e in (startup_status or {}).get("recent") or [] if isinstance(e, dict)]
    last = (startup_status or {}).get("last")
    if isinstance(last, dict):
        listed.append(last)
    uids = {str(e.get("uid")) for e in listed if e.get("uid")}
    newest = max((t for e in listed if (t := parse_iso(e.get("ready"))) is not None), default=None)
    if newest is not None:
        uids |= {r.uid for r in records if r.ready is not None and r.ready <= newest}
    return uids


def step(serving: str, spec: DeepSeekServingSpec, mine: Observed, startup_status: dict | None,
         recorded: set[str], warned: set[str], now: float) -> Step:  # fmt: skip
    """The start-ups of a serving's groups as observed now, against what was recorded and warned of before."""
    out = Step()
    warm = warm_kernel_caches(startup_status)
    found: list[tuple[GroupStartup, dict, list[PodView]]] = []
    pods = pods_by_statefulset(mine)
    for name, sts in mine.statefulsets.items():
        record = startup_of(sts, pods[name])
        if record is None:
            continue
        found.append((record, sts, pods[name]))
        budget = probe_budget(sts)
        elapsed = (record.ready if record.ready is not None else now) - record.created
        if budget is not None and elapsed > budget and record.uid not in warned and record.uid not in recorded:
            out.slow.append(Slow(record.group, record.statefulset, record.uid, elapsed, budget, record.complete))
    # Oldest first, so that an earlier group's kernels count as warm for a later one recorded at the same time.
    for record, sts, group in sorted(found, key=lambda f: (f[0].ready or 0.0, f[0].group)):
        if not record.complete or record.uid in recorded:
            continue
        key = kernel_cache_key(sts)
        state = label(weights_filled(serving, spec, sts, group, mine), kernels_warm(record, key, warm))
        record = replace(record, cache_state=state)
        out.new.append(record)
        if key is not None and key not in warm:
            warm[key] = record.ready  # type: ignore[assignment]
    if out.new:
        old = startup_status or {}
        recent = [e for e in old.get("recent") or [] if isinstance(e, dict)] + [r.status() for r in out.new]
        keys = sorted(warm.items(), key=lambda kv: (kv[1], kv[0]))[-WARM_KERNELS_MAX:]
        out.status = {"last": out.new[-1].status(), "recent": recent[-RECENT_MAX:]}
        if keys:
            out.status["warmKernelCaches"] = [{"key": k, "since": iso_at(t)} for k, t in keys]
    return out


class StartupTracker:
    """Per serving: the start-ups recorded (StatefulSet uids) and the groups warned of as slow, so each is
    counted and told once; and the histogram of recorded start-ups, per phase."""

    def __init__(self) -> None:
        self._recorded: dict[tuple[str, str], set[str]] = {}
        self._warned: dict[tuple[str, str], set[str]] = {}
        # (namespace, serving, phase, cache_state) -> (bucket counts, sum, count)
        self._hist: dict[tuple[str, str, str, str], tuple[list[int], float, int]] = {}

    def step(self, namespace: str, serving: str, spec: DeepSeekServingSpec, mine: Observed,
             startup_status: dict | None, now: float) -> Step:  # fmt: skip
        key = (namespace, serving)
        if key not in self._recorded:  # first look since the operator started: what its status lists is done
            pods = pods_by_statefulset(mine)
            records = [r for n, s in mine.statefulsets.items() if (r := startup_of(s, pods[n])) is not None]
            self._recorded[key] = recorded_uids(startup_status, records)
        return step(serving, spec, mine, startup_status, self._recorded[key], self._warned.get(key, set()), now)

    def commit(self, namespace: str, serving: str, s: Step, live_uids: set[str]) -> None:
        """The step's status was written: its start-ups are recorded and observed, its slow groups told."""
        key = (namespace, serving)
        recorded = self._recorded.setdefault(key, set())
        for r in s.new:
            recorded.add(r.uid)
            for phase, seconds in r.seconds().items():
                self._observe((namespace, serving, phase, r.cache_state), seconds)
        warned = self._warned.setdefault(key, set()) | {w.uid for w in s.slow}
        # Groups that are gone need no memory (a group made again has a new uid).
        self._recorded[key] = recorded & live_uids
        self._warned[key] = warned & live_uids

    def forget(self, namespace: str, serving: str) -> None:
        self._recorded.pop((namespace, serving), None)
        self._warned.pop((namespace, serving), None)
        self._hist = {k: v for k, v in self._hist.items() if k[:2] != (namespace, serving)}

    def _observe(self, labels: tuple[str, str, str, str], seconds: float) -> None:
        counts, total, n = self._hist.get(labels, ([0] * len(BUCKETS), 0.0, 0))
        counts = [c + (seconds <= b) for c, b in zip(counts, BUCKETS, strict=True)]
        self._hist[labels] = (counts, total + seconds, n + 1)

    def collect(self):
        family = HistogramMetricFamily(
            "flashserve_group_startup_seconds",
            "Seconds from a replica group's creation to each start-up phase (scheduled, running, ready)",
            labels=["namespace", "serving", "phase", "cache_state"],
        )
        for labels, (counts, total, n) in sorted(self._hist.items()):
            buckets = [(_bound(b), c) for b, c in zip(BUCKETS, counts, strict=True)] + [("+Inf", n)]
            family.add_metric(list(labels), buckets, total)
        yield family


def _bound(b: float) -> str:
    return str(int(b)) if b == int(b) else str(b)
