"""How many agentic sessions should be active at each moment: a sequence of segments.

String form, segments separated by `;`:

    ramp 0 64 60s; hold 64 2m; burst 128 10s; step 16 60s; diurnal 8 64 10m 30m

    ramp FROM TO DURATION          linear change
    hold N DURATION / step N ...   constant (a step up or down from the level before)
    burst N DURATION               constant, meant short: sessions arrive at once, then leave
    diurnal LOW HIGH PERIOD DURATION   LOW + (HIGH - LOW) * (1 - cos(2 pi t / PERIOD)) / 2, starting at LOW

YAML form: a list of such strings, or of mappings such as `{ramp: {from: 0, to: 64, duration: 60s}}`,
`{hold: {users: 64, duration: 2m}}`, `{diurnal: {low: 8, high: 64, period: 10m, duration: 30m}}`; optionally
under a top-level `schedule:` key. Times are engine seconds (wall seconds times the time scale).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

KINDS = ("ramp", "hold", "step", "burst", "diurnal")


def seconds(value: object) -> float:
    """"90", "90s", "2m", "1h30m", "500ms" or a number."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]*)?", text):
        return float(text)
    parts = re.findall(r"([0-9]+(?:\.[0-9]*)?)(ms|h|m|s)", text)
    if not parts or "".join(a + u for a, u in parts) != text:
        raise ValueError(f"invalid duration {value!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(a) * scale[u] for a, u in parts)


@dataclass(frozen=True)
class Segment:
    kind: str
    duration: float
    start: float  # users at the segment's start (ramp FROM, diurnal LOW, the level of hold/step/burst)
    end: float  # users at its end (ramp TO, diurnal HIGH)
    period: float = 0.0

    def users(self, t: float) -> float:
        if self.kind == "ramp":
            return self.start + (self.end - self.start) * (t / self.duration if self.duration else 1.0)
        if self.kind == "diurnal":
            return self.start + (self.end - self.start) * (1 - math.cos(2 * math.pi * t / self.period)) / 2
        return self.start

    def text(self) -> str:
        if self.kind == "ramp":
            return f"ramp {self.start:g} {self.end:g} {self.duration:g}s"
        if self.kind == "diurnal":
            return f"diurnal {self.start:g} {self.end:g} {self.period:g}s {self.duration:g}s"
        return f"{self.kind} {self.start:g} {self.duration:g}s"


@dataclass(frozen=True)
class Schedule:
    segments: tuple[Segment, ...]

    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.segments)

    def users(self, t: float) -> int:
        """Target active sessions at engine time t (0 after the end)."""
        if t < 0:
            return 0
        for seg in self.segments:
            if t < seg.duration:
                return max(0, round(seg.users(t)))
            t -= seg.duration
        return 0

    @property
    def peak(self) -> int:
        """Most sessions at once (sampled; exact for every kind but a diurnal cut mid-period, which is close)."""
        return max(round(seg.users(seg.duration * i / 256)) for seg in self.segments for i in range(257))

    def __str__(self) -> str:
        return "; ".join(s.text() for s in self.segments)


def _number(value: object, what: str) -> float:
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {value!r} is not a number") from None
    if n < 0 or math.isnan(n):
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return n


def segment(kind: str, args: list[object]) -> Segment:
    kind = kind.lower()
    want = {"ramp": 3, "hold": 2, "step": 2, "burst": 2, "diurnal": 4}
    if kind not in want:
        raise ValueError(f"unknown schedule segment {kind!r} (one of {', '.join(KINDS)})")
    if len(args) != want[kind]:
        raise ValueError(f"{kind} takes {want[kind]} values, got {len(args)}: {args}")
    duration = seconds(args[-1])
    if duration <= 0:
        raise ValueError(f"{kind}: duration must be positive")
    if kind == "ramp":
        return Segment(kind, duration, _number(args[0], "ramp from"), _number(args[1], "ramp to"))
    if kind == "diurnal":
        low, high, period = _number(args[0], "diurnal low"), _number(args[1], "diurnal high"), seconds(args[2])
        if period <= 0:
            raise ValueError("diurnal: period must be positive")
        return Segment(kind, duration, low, high, period)
    level = _number(args[0], f"{kind} users")
    return Segment(kind, duration, level, level)


def parse(text: str) -> Schedule:
    segs = []
    for part in re.split(r"[;\n]", text):
        words = part.replace("->", " ").split()
        if words:
            segs.append(segment(words[0], words[1:]))
    if not segs:
        raise ValueError("empty schedule")
    return Schedule(tuple(segs))


_KEYS = {"ramp": ("from", "to", "duration"), "hold": ("users", "duration"), "step": ("users", "duration"),
         "burst": ("users", "duration"), "diurnal": ("low", "high", "period", "duration")}


def from_doc(doc: object) -> Schedule:
    if isinstance(doc, dict) and "schedule" in doc:
        doc = doc["schedule"]
    if isinstance(doc, str):
        return parse(doc)
    if not isinstance(doc, list) or not doc:
        raise ValueError("a schedule document is a non-empty list of segments")
    segs = []
    for item in doc:
        if isinstance(item, str):
            segs.extend(parse(item).segments)
        elif isinstance(item, dict) and len(item) == 1:
            kind, fields = next(iter(item.items()))
            if kind not in _KEYS or not isinstance(fields, dict):
                raise ValueError(f"bad schedule segment {item!r}")
            missing = [k for k in _KEYS[kind] if k not in fields]
            if missing:
                raise ValueError(f"{kind} needs {', '.join(missing)}")
            segs.append(segment(kind, [fields[k] for k in _KEYS[kind]]))
        else:
            raise ValueError(f"bad schedule segment {item!r}")
    return Schedule(tuple(segs))


def load(spec: str | Path | Schedule) -> Schedule:
    """A Schedule, a path to a YAML/JSON file, or the string form."""
    if isinstance(spec, Schedule):
        return spec
    text = str(spec)
    path = Path(text)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        return from_doc(yaml.safe_load(path.read_text()))
    return parse(text)
