"""How long the next replica group will take to start, learned from the start-ups the serving has had.

The policy's horizons are all "one start-up time": how far ahead a rising trend is projected (what is
ordered now serves from then on), how long a surplus must last before a replica is given up (the ski-rental
rule: not for less than it costs to get back) and how long a recent peak keeps its replicas. The spec's
`replicaStartupSeconds` is a guess made once; caches make it wrong in both directions (a cached node starts a
replica in a fraction of a cold start, an empty node pool or a new image in several times a cached one).

The learner keeps the seconds-to-ready of recent completed start-ups, per cache state (`cold`,
`weights-cached`, `warm`: the labels the operator's start-up records and the test bed agree on), and
predicts the next start-up as:

* per population, the weighted median of its last WINDOW start-ups plus the spec value as a prior sample
  of weight PRIOR_WEIGHT (below one: the first observation outweighs it; a median: one start-up stuck on an
  image pull or a node repair moves the estimate by one rank, not by its size);
* the population to predict from is the one most of the last RECENT start-ups belong to, the newest of them
  on a tie. So once a serving's caches have produced cached start-ups its next ones are expected cached,
  until cold ones (a new image, new nodes, an evicted cache) are again the recent majority. One cold
  start-up among cached ones (a node new to the pool) does not switch the horizons to the cold time.

With no start-up seen the prediction is the spec value, so a serving whose operator reports none behaves
exactly as before. A start-up is learned from once: inputs may repeat the last few (status.startup.recent),
and the keys already learned from are remembered (the newest SEEN_KEYS of them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

COLD, WEIGHTS_CACHED, WARM = "cold", "weights-cached", "warm"
CACHE_STATES = (COLD, WEIGHTS_CACHED, WARM)

WINDOW = 16
"""Start-ups kept per cache state: enough for a median to shrug off a few outliers, short enough to follow
a change of hardware, image or cache within a day of scaling."""
PRIOR_WEIGHT = 0.5
"""Weight of the spec value among a population's samples (each start-up weighs 1)."""
RECENT = 4
"""Start-ups whose cache states decide which population predicts the next one."""
SEEN_KEYS = 64
"""Keys of start-ups already learned from that are remembered (more than the operator ever repeats)."""


@dataclass(frozen=True)
class StartupSample:
    """One completed start-up of a replica group, as the operator (or the simulator) saw it."""

    key: str
    """Identifies the start-up (the group's StatefulSet uid): a key already learned from is ignored."""
    seconds: float
    """Created to ready."""
    cache_state: str
    """cold, weights-cached or warm; anything else counts as cold (the slowest, so the safe guess)."""


def _label(cache_state: str) -> str:
    return cache_state if cache_state in CACHE_STATES else COLD


@dataclass(frozen=True)
class StartupLearner:
    samples: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """(cache state, seconds of its last WINDOW start-ups, oldest first), in CACHE_STATES order."""
    recent: tuple[str, ...] = ()
    """Cache states of the last RECENT start-ups, oldest first."""
    seen: tuple[str, ...] = ()
    """Keys learned from, oldest first (at most SEEN_KEYS)."""

    @property
    def n(self) -> int:
        """Start-ups held (over every population)."""
        return sum(len(v) for _, v in self.samples)

    def by_state(self) -> dict[str, tuple[float, ...]]:
        return dict(self.samples)

    def observe(self, startups: Iterable[StartupSample]) -> StartupLearner:
        """The learner after these start-ups; those already learned from, or with no usable seconds, are
        skipped. Returns self when nothing is new (steady state writes nothing)."""
        seen = list(self.seen)
        known = set(seen)
        pops = {k: list(v) for k, v in self.samples}
        recent = list(self.recent)
        changed = False
        for s in startups:
            secs = s.seconds
            if s.key in known or not isinstance(secs, (int, float)) or not math.isfinite(secs) or secs <= 0:
                continue
            label = _label(s.cache_state)
            pops.setdefault(label, []).append(float(secs))
            pops[label] = pops[label][-WINDOW:]
            recent = (recent + [label])[-RECENT:]
            seen.append(s.key)
            known.add(s.key)
            changed = True
        if not changed:
            return self
        return StartupLearner(
            samples=tuple((k, tuple(pops[k])) for k in CACHE_STATES if pops.get(k)),
            recent=tuple(recent),
            seen=tuple(seen[-SEEN_KEYS:]),
        )

    def estimate(self, cache_state: str, prior_s: float) -> float:
        """The population's weighted median, the spec value `prior_s` one sample of weight PRIOR_WEIGHT."""
        values = self.by_state().get(cache_state, ())
        return weighted_median([(v, 1.0) for v in values] + [(prior_s, PRIOR_WEIGHT)])

    def estimates(self, prior_s: float) -> dict[str, float]:
        """Per cache state that has start-ups: its estimate."""
        return {k: self.estimate(k, prior_s) for k, v in self.samples if v}

    def population(self) -> str | None:
        """The cache state expected of the next start-up: the majority of the recent ones, the newest of them
        on a tie; None when none was seen."""
        if not self.recent:
            return None
        counts = {k: self.recent.count(k) for k in self.recent}
        top = max(counts.values())
        return next(k for k in reversed(self.recent) if counts[k] == top)

    def predict(self, prior_s: float) -> float:
        """Seconds the next start-up is expected to take: the estimate of the expected population, or the
        spec value while no start-up was seen."""
        pop = self.population()
        return prior_s if pop is None else self.estimate(pop, prior_s)

    def to_dict(self) -> dict:
        out: dict = {}
        if self.samples:
            out["samples"] = {k: [round(v, 1) for v in vals] for k, vals in self.samples}
        if self.recent:
            out["recent"] = list(self.recent)
        if self.seen:
            out["seen"] = list(self.seen)
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> StartupLearner:
        """Tolerant: malformed parts are dropped, never raised (a hand-edited annotation must not stop the
        operator)."""
        if not isinstance(data, dict):
            return cls()
        raw = data.get("samples")
        pops: list[tuple[str, tuple[float, ...]]] = []
        if isinstance(raw, dict):
            for k in CACHE_STATES:
                vals = raw.get(k)
                if not isinstance(vals, list):
                    continue
                good = tuple(float(v) for v in vals if _positive(v))[-WINDOW:]
                if good:
                    pops.append((k, good))
        rec = data.get("recent")
        recent = tuple(x for x in rec if x in CACHE_STATES)[-RECENT:] if isinstance(rec, list) else ()
        keys = data.get("seen")
        seen = tuple(str(x) for x in keys if isinstance(x, str))[-SEEN_KEYS:] if isinstance(keys, list) else ()
        return cls(samples=tuple(pops), recent=recent, seen=seen)


def weighted_median(items: list[tuple[float, float]]) -> float:
    """The smallest value whose cumulative weight reaches half the total (the mean of two values when a
    cumulative weight hits half exactly)."""
    items = sorted(items)
    half = sum(w for _, w in items) / 2.0
    acc = 0.0
    for i, (v, w) in enumerate(items):
        acc += w
        if math.isclose(acc, half) and i + 1 < len(items):
            return (v + items[i + 1][0]) / 2.0
        if acc > half:
            return v
    return items[-1][0]


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
