"""Scenarios as data: the YAML files `flashserve bench autoscale --scenario-file` reads, and the built-in
scenarios (bench/scenarios/*.yaml, read by the same reader).

A file holds `scenarios:`, a list of scenarios. Times are in minutes where a scenario is shaped (`*_min`)
and in seconds where a mechanism is (`*_s`). The typed models below are the schema: a bad file is refused
with the key's path (`scenarios[0].shape.step.factor`) and what to write instead.

    scenarios:
      - name: my-crowd
        duration_min: 60
        base_replicas: 2            # fleet the base session rate needs at the SLA capacity
        shape:                      # one of points / step / ramp / diurnal (none: constant)
          step: {at_min: 10, factor: 6, rise_min: 0.5, hold_min: 20, decay_min: 5}
        bursts: {per_hour: 4, minutes: 1.5, spread_s: 60}
        drift: {amplitude: 0.1, period_min: 60}
        startup_median_s: 120
        sessions:                   # the session model (default: the engine profile's workload)
          context_limit: [60000, 180000]
          output_tokens: {median: 300, sigma: 0.8, min: 1, max: 4000}
          tool_gap_s: {median: 10, sigma: 1, min: 0.3, max: 180}
        profile: {max_model_len: 262144}
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

BUILTIN_DIR = Path(__file__).with_name("scenarios")
BUILTIN_FILES = ("agentic-bursty", "diurnal", "flash-crowd")
QUICK_FILE = "quick-flash"
MIN = 60.0

PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
# Ceilings far above any scenario worth simulating, so that a slip (1e300 minutes, 1e12 replicas) is refused
# naming its key instead of running until memory is gone.
MAX_MINUTES = 30 * 24 * 60.0
MAX_REPLICAS = 10_000.0
MAX_FACTOR = 1000.0
MAX_KNOTS = 100_000
Minutes = Annotated[float, Field(ge=0, le=MAX_MINUTES)]
Factor = Annotated[float, Field(gt=0, le=MAX_FACTOR)]
Lax = Strict(False)  # YAML has no tuples: a pair is written as a list (its items stay strict)


class _Model(BaseModel):
    # strict: `"10"` or `true` for a number is a slip, not a number (an int is still a float); no .inf or .nan,
    # with which a run never ends
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Dist(_Model):
    """A lognormal draw, clamped to [min, max]."""

    median: PositiveFloat = Field(description="Median of the draw.")
    sigma: NonNegFloat = Field(description="Standard deviation of its logarithm (0: always the median).")
    min: NonNegFloat = Field(0.0, description="Smallest value a draw takes.")
    max: PositiveFloat = Field(math.inf, description="Largest value a draw takes.")

    @model_validator(mode="after")
    def _ordered(self) -> Dist:
        if not self.min <= self.median <= self.max:
            raise ValueError(f"needs min <= median <= max (got {self.min:g}, {self.median:g}, {self.max:g})")
        return self


class StepShape(_Model):
    """The rate steps from 1 to `factor` at `at_min` (over `rise_min`), holds, then decays back to 1."""

    at_min: Minutes = Field(description="When the step starts, minutes into the scenario.")
    factor: Factor = Field(description="Rate multiplier at the top of the step (e.g. 2.5 or 10).")
    rise_min: Minutes = Field(1.0, description="Minutes from the base rate to the top.")
    hold_min: Minutes = Field(description="Minutes the top holds.")
    decay_min: Minutes = Field(0.0, description="Minutes from the top back to the base rate.")


class RampShape(_Model):
    """The rate ramps linearly from 1 to `to` between `start_min` and `start_min + ramp_min`, then holds
    `hold_min` (none: to the end) and falls back to 1 over `down_min`."""

    start_min: Minutes = Field(description="When the ramp starts.")
    ramp_min: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        description="Minutes the ramp takes (its speed: (to - 1) / ramp_min)."
    )
    to: Factor = Field(description="Rate multiplier at the top of the ramp.")
    hold_min: Minutes | None = Field(None, description="Minutes at the top; none: to the end.")
    down_min: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        1.0, description="Minutes back to the base rate after the hold."
    )


class DiurnalShape(_Model):
    """A day as a cosine: the rate is 1 at the peak and `trough` at the trough, `period_min` apart twice."""

    period_min: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        description="Length of the (compressed) day in minutes."
    )
    trough: Annotated[float, Field(gt=0, le=1)] = Field(description="Rate at the trough relative to the peak.")
    trough_at_min: Minutes = Field(0.0, description="When the trough is, minutes into the scenario.")
    points_per_period: Annotated[int, Field(ge=4, le=1000)] = Field(
        48, description="Knots the cosine is sampled at (linear in between)."
    )


class Shape(_Model):
    """The session rate's multiplier over time: exactly one of the four ways to give it."""

    points: Annotated[list[Annotated[tuple[Minutes, Annotated[float, Field(ge=0, le=MAX_FACTOR)]], Lax]],
                      Field(max_length=MAX_KNOTS)] | None = Field(
        None, description="(minute, multiplier) points, linear in between and flat beyond the ends."
    )  # fmt: skip
    step: StepShape | None = None
    ramp: RampShape | None = None
    diurnal: DiurnalShape | None = None

    @model_validator(mode="after")
    def _one(self) -> Shape:
        given = [k for k in ("points", "step", "ramp", "diurnal") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of points, step, ramp, diurnal (got {', '.join(given) or 'none'})")
        if self.points is not None:
            if not self.points:
                raise ValueError("points: give at least one (minute, multiplier) point")
            times = [t for t, _ in self.points]
            if times != sorted(times):
                raise ValueError("points: minutes must not decrease")
        return self

    def knots(self, duration_min: float) -> tuple[tuple[float, float], ...]:
        """(seconds, multiplier) knots of Scenario."""
        if self.points is not None:
            pts = [(t, m) for t, m in self.points]
        elif self.step is not None:
            s = self.step
            top = s.at_min + s.rise_min
            pts = [(0.0, 1.0), (s.at_min, 1.0), (top, s.factor), (top + s.hold_min, s.factor),
                   (top + s.hold_min + s.decay_min, 1.0)]  # fmt: skip
        elif self.ramp is not None:
            r = self.ramp
            top = r.start_min + r.ramp_min
            pts = [(0.0, 1.0), (r.start_min, 1.0), (top, r.to)]
            if r.hold_min is not None:
                pts += [(top + r.hold_min, r.to), (top + r.hold_min + r.down_min, 1.0)]
        else:
            d = self.diurnal
            n = max(2, math.ceil(d.points_per_period * duration_min / d.period_min))
            pts = []
            for i in range(n + 1):
                t = duration_min * i / n
                phase = 2 * math.pi * (t - d.trough_at_min) / d.period_min
                pts.append((t, d.trough + (1 - d.trough) * (1 - math.cos(phase)) / 2))
        # at equal times keep the later point (a vertical step), as Scenario.multiplier reads them
        return tuple((t * MIN, float(m)) for t, m in pts)


class Bursts(_Model):
    """CI fan-outs: bursts start by a Poisson process, each as many sessions as `minutes` of base-rate
    arrivals, spread over `spread_s`."""

    per_hour: Annotated[float, Field(ge=0, le=3600)] = Field(description="Mean bursts per hour.")
    minutes: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        description="Size of a burst, in minutes' worth of base-rate sessions."
    )
    spread_s: Annotated[float, Field(gt=0, le=MAX_MINUTES * MIN)] = Field(
        60.0, description="Seconds over which a burst's sessions start."
    )


class Drift(_Model):
    """A slow sinusoidal wander of the rate."""

    amplitude: Annotated[float, Field(ge=0, lt=1)] = Field(description="Relative amplitude (0.15: +-15%).")
    period_min: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        90.0, description="Period of the wander in minutes."
    )


class Sessions(_Model):
    """Overrides of the session model (each unset key keeps the engine profile's workload)."""

    context_limit: Annotated[tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]], Lax] | None = Field(
        None, description="A session ends once its context passes a limit drawn uniformly from [lo, hi] tokens."
    )
    system_prompt_tokens: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Shared system prompt of every session (cached across sessions)."
    )
    first_turn_tokens: Dist | None = Field(None, description="New tokens of a session's first turn.")
    tool_result_tokens: Dist | None = Field(None, description="New tokens of each later turn (the tool result).")
    output_tokens: Dist | None = Field(None, description="Output tokens of a turn.")
    tool_gap_s: Dist | None = Field(None, description="Seconds the agent's tool runs between two turns.")

    @model_validator(mode="after")
    def _limits(self) -> Sessions:
        if self.context_limit is not None and self.context_limit[0] > self.context_limit[1]:
            raise ValueError("context_limit: give [lo, hi] with lo <= hi")
        return self


class ProfileOverrides(_Model):
    """Overrides of the engine profile for this scenario."""

    max_model_len: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Longest prompt + output the engines accept (longer requests are refused, HTTP 400)."
    )


class ScenarioSpec(_Model):
    """One scenario of a scenario file."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", max_length=63)] = Field(
        description="Name in tables and CSVs: lower-case letters, digits, '-' and '.'."
    )
    description: str = Field("", description="One line on what the scenario tests.")
    duration_min: Annotated[float, Field(gt=0, le=MAX_MINUTES)] = Field(
        description="Measured minutes (after the warm-up)."
    )
    base_replicas: Annotated[float, Field(gt=0, le=MAX_REPLICAS)] = Field(
        description="The fleet the base session rate needs at the SLA capacity (the shape multiplies it)."
    )
    shape: Shape | None = Field(None, description="The rate's multiplier over time; none: constant 1.")
    drift: Drift | None = None
    bursts: Bursts | None = None
    warmup_s: Annotated[float, Field(ge=0, le=MAX_MINUTES * MIN)] = Field(
        300.0, description="Traffic before t=0 on the initial fleet, no autoscaling."
    )
    startup_median_s: Annotated[float, Field(gt=0, le=MAX_MINUTES * MIN)] | None = Field(
        None, description="Median replica start-up; none: the engine profile's (7 minutes by default)."
    )
    sessions: Sessions | None = None
    profile: ProfileOverrides | None = None

    @model_validator(mode="after")
    def _within_the_run(self) -> ScenarioSpec:
        sh = self.shape
        starts = {"shape.step.at_min": sh.step.at_min if sh and sh.step else None,
                  "shape.ramp.start_min": sh.ramp.start_min if sh and sh.ramp else None}  # fmt: skip
        for key, at in starts.items():
            if at is not None and at >= self.duration_min:
                raise ValueError(f"{key} {at:g} is at or past the end of the run (duration_min {self.duration_min:g}): "
                                 "it would never happen")  # fmt: skip
        if sh and sh.diurnal:
            knots = sh.diurnal.points_per_period * self.duration_min / sh.diurnal.period_min
            if knots > MAX_KNOTS:
                raise ValueError(f"shape.diurnal: {knots:.3g} knots (points_per_period x duration_min / period_min); "
                                 f"at most {MAX_KNOTS}: a longer period_min or fewer points_per_period")  # fmt: skip
        s, limit = self.sessions, self.profile.max_model_len if self.profile else None
        if limit is not None and s is not None and s.system_prompt_tokens is not None:
            first = s.system_prompt_tokens + (s.first_turn_tokens.min if s.first_turn_tokens else 1)
            if first >= limit:
                raise ValueError(f"sessions.system_prompt_tokens ({s.system_prompt_tokens}) and the smallest first "
                                 f"turn leave no room in profile.max_model_len ({limit}): every request would be "
                                 "refused; raise max_model_len or shorten the system prompt")  # fmt: skip
        return self

    def to_scenario(self):
        from flashserve_testbed.bench.workloads import Scenario, SessionOverrides
        from flashserve_testbed.engine.profile import LogNormal

        def dist(d: Dist | None):
            return None if d is None else LogNormal(d.median, d.sigma, d.min, d.max)

        s = self.sessions or Sessions()
        overrides = SessionOverrides(
            context_limit=s.context_limit, system_prompt_tokens=s.system_prompt_tokens,
            first_turn_tokens=dist(s.first_turn_tokens), tool_result_tokens=dist(s.tool_result_tokens),
            output_tokens=dist(s.output_tokens), tool_gap=dist(s.tool_gap_s),
            max_model_len=self.profile.max_model_len if self.profile else None,
        )  # fmt: skip
        extra: dict[str, Any] = {}
        if self.drift is not None:
            extra.update(drift=self.drift.amplitude, drift_period_s=self.drift.period_min * MIN)
        if self.bursts is not None:
            extra.update(bursts_per_hour=self.bursts.per_hour, burst_minutes=self.bursts.minutes,
                         burst_spread_s=self.bursts.spread_s)  # fmt: skip
        return Scenario(
            name=self.name, description=self.description, duration_s=self.duration_min * MIN,
            base_replicas=self.base_replicas,
            knots=self.shape.knots(self.duration_min) if self.shape is not None else ((0.0, 1.0),),
            warmup_s=self.warmup_s, startup_median_s=self.startup_median_s,
            sessions=None if overrides.is_empty() else overrides, **extra,
        )  # fmt: skip


class ScenarioFile(_Model):
    """A scenario file: one or more scenarios."""

    scenarios: Annotated[list[ScenarioSpec], Field(min_length=1)] = Field(description="The scenarios it holds.")


class ScenarioFileError(ValueError):
    """A scenario file that cannot be read: the message names the file, the key and the fix."""


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "tuple") or str(part).startswith(("function-", "tagged-")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _model_at(loc: tuple):
    """The model of the mapping `loc` points at (None past a leaf)."""
    m: Any = ScenarioFile
    for part in loc:
        if isinstance(part, int):
            continue
        field = m.model_fields.get(part) if isinstance(m, type) and issubclass(m, BaseModel) else None
        if field is None:
            return None
        m = next((a for a in _unwrap(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return m


def _field(loc: tuple):
    keys = [p for p in loc if not isinstance(p, int)]
    if not keys:
        return None
    m = _model_at(tuple(keys[:-1]))
    return m.model_fields.get(keys[-1]) if isinstance(m, type) and issubclass(m, BaseModel) else None


def _unwrap(ann) -> list:
    args = getattr(ann, "__args__", None)
    if not args:
        return [ann]
    out = []
    for a in args:
        out += _unwrap(a)
    return out


def _explain(exc: ValidationError, source: str) -> str:
    # an unknown key first: a misspelt key also shows as the right one missing
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = tuple(err["loc"])
    where = _path(loc)
    kind = err["type"]
    more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        keys = list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        fix = (f"did you mean {close[0]!r}? " if close else "") + (f"the keys here: {', '.join(keys)}" if keys else "remove it")
        return f"{source}: {where}: unknown key; {fix}{more}"
    field = _field(loc)
    key = next((p for p in reversed(loc) if not isinstance(p, int)), "")  # `points`, not the point's index
    # a rule over a whole list item (a scenario's own validator): its message says it all
    whole_item = kind == "value_error" and bool(loc) and isinstance(loc[-1], int)
    what = f". {key}: {field.description}" if field is not None and field.description and not whole_item else ""
    if kind == "missing":
        return f"{source}: {where}: required key missing; add it{more}{what}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = f" (got {got!r})" if not isinstance(got, (dict, list)) and kind != "value_error" else ""
    return f"{source}: {where}: {msg}{shown}; fix this value{more}{what}"


class _Loader(yaml.SafeLoader):
    """YAML as people write it in these files: a key given twice is refused (not last-wins), and `1e1` is a
    number (YAML 1.1 wants `1.0e+1`)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)  # fmt: skip
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def unservable(scenario, profile) -> str | None:
    """Why no session of a synthetic scenario could send one request on `profile`, else None: its first turn
    (the system prompt and the smallest first prompt, one output token) does not fit max_model_len."""
    if scenario.trace:
        return None
    prof = scenario.profile_for(profile)
    w = prof.workload
    first = w.shared_system_prompt_tokens + int(w.first_turn_tokens.minimum) + 1
    if first > prof.max_model_len:
        return (f"its first turn needs at least {first} tokens (system prompt {w.shared_system_prompt_tokens}), more "
                f"than max_model_len {prof.max_model_len}: every request would be refused; raise "
                "profile.max_model_len or shorten the prompts")  # fmt: skip
    return None


def parse(text: str, source: str = "<scenario file>") -> list:
    """The Scenarios of a scenario file's text; ScenarioFileError naming the key and the fix otherwise."""
    try:
        doc = yaml.load(text.removeprefix("\ufeff"), Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ScenarioFileError(f"{source}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise ScenarioFileError(f"{source}: not valid YAML: nested too deeply") from None
    except ValueError as exc:  # PyYAML's constructors: an integer past Python's digit limit, a date like 2024-13-01
        limit = sys.get_int_max_str_digits()
        long = re.search(rf"\d{{{limit + 1},}}", text) if limit else None
        if long:
            line = text.count("\n", 0, long.start()) + 1
            key = re.search(r"([\w.-]+)\s*:\s*[-+]?$", text[: long.start()])
            raise ScenarioFileError(f"{source}: line {line}: {key[1] + ': ' if key else ''}a number of more than "
                                    f"{limit} digits; no key takes one that long: fix this value") from None
        raise ScenarioFileError(f"{source}: a value YAML cannot read ({str(exc).split(';')[0]}): fix it") from None
    if not isinstance(doc, dict):
        got = "an empty file" if doc is None else type(doc).__name__
        raise ScenarioFileError(f"{source}: (top level): expected a mapping with `scenarios:` (a list of "
                                f"scenarios), got {got}")  # fmt: skip
    try:
        spec = ScenarioFile.model_validate(doc)
    except ValidationError as exc:
        raise ScenarioFileError(_explain(exc, source)) from None
    names = [sc.name for sc in spec.scenarios]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ScenarioFileError(f"{source}: scenarios[{i}].name: two scenarios are named {name!r}; give each "
                                    "its own name")  # fmt: skip
    return [s.to_scenario() for s in spec.scenarios]


def load(path: str | Path) -> list:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioFileError(f"{path}: cannot read it ({exc})") from None
    return parse(text, str(path))


def builtin(name: str):
    """The built-in scenario `name` (bench/scenarios/NAME.yaml holds exactly it)."""
    (sc,) = load(BUILTIN_DIR / f"{name}.yaml")
    return sc
