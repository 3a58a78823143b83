"""Request traces as users have them, read once for the benchmark (`flashserve bench autoscale --trace`) and the
load generator (`flashserve load --trace`).

Two formats, told apart by their content (never by the file name), plain or gzipped (told by gzip's magic bytes):

- Mooncake (FAST'25 open traces): one JSON object a line with `timestamp` (ms since the trace began),
  `input_length` and `output_length` (tokens) and `hash_ids` (one id per 512-token block of the prompt, equal
  ids meaning equal blocks). Every line is one request, sent open loop at its timestamp; its prompt is the
  whole `input_length`.
- aiperf multi-turn (aiperf's `mooncake_trace` loader with `session_id`): lines that share a `session_id` are the
  turns of one conversation, in file order. The first turn starts at its `timestamp` (ms); each later turn is
  sent `delay` ms after the previous answer ended (closed loop; a later turn with only a `timestamp` is sent at
  that time or when the previous answer ends, whichever is later). A turn's `input_length` is its new tokens:
  its prompt is the conversation so far (earlier prompts and answers) plus them. aiperf starts sessions that
  have no timestamp by its own concurrency settings; here they start `untimed_gap_ms` apart, in file order.

Both become sessions (a Mooncake request is a one-turn session), so one replay path serves both.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BLOCK_TOKENS = 512
GZIP_MAGIC = b"\x1f\x8b"
UNTIMED_GAP_MS = 1000.0
# Far above any model's context window (the longest are a few million tokens), yet a prompt this long (40 MB of
# text) still fits in memory: a count beyond it is a broken trace, not a workload.
MAX_TOKENS = 10_000_000
# A replay runs in real time: a trace that spans more than a month is a unit mix-up (s or us read as ms), not a plan.
MAX_SPAN_DAYS = 30
MAX_SPAN_MS = MAX_SPAN_DAYS * 24 * 3600 * 1000.0

Format = Literal["mooncake", "aiperf"]


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file, the line and the key."""


@dataclass(frozen=True)
class Turn:
    input_length: int
    """New prompt tokens of this turn (the whole prompt for a Mooncake request)."""
    output_length: int
    hash_ids: tuple[int, ...] = ()
    delay_ms: float | None = None
    """Wait after the previous answer ended before sending this turn (later turns)."""
    at_ms: float | None = None
    """Earliest send time, ms from the trace's start (a first turn's start, or a later turn's timestamp)."""


@dataclass(frozen=True)
class Session:
    id: str
    start_ms: float
    turns: tuple[Turn, ...]

    def prompt_lengths(self, answered: list[int] | None = None) -> list[int]:
        """Each turn's whole prompt, in tokens, if each answer is as long as its output_length (or as the
        lengths given): earlier prompts and answers plus the turn's new tokens."""
        out, context = [], 0
        for i, turn in enumerate(self.turns):
            prompt = context + turn.input_length
            out.append(prompt)
            context = prompt + (answered[i] if answered is not None else turn.output_length)
        return out


@dataclass(frozen=True)
class Trace:
    format: Format
    sessions: tuple[Session, ...]
    """Sorted by start time; start times are relative to the first (the earliest starts at 0)."""
    source: str = ""

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def closed_loop(self) -> bool:
        return self.format == "aiperf"


def open_text(path: str | Path) -> io.TextIOBase:
    """The file as text, gunzipped when its first bytes are gzip's magic number, without a byte-order mark."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")  # a byte-order mark, as some editors write, is not content


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _int(doc: dict, key: str, where: str, minimum: int, maximum: int = MAX_TOKENS) -> int:
    value = doc.get(key)
    # NaN fails every comparison, so int() below never sees NaN or infinity
    in_range = isinstance(value, (int, float)) and not isinstance(value, bool) and minimum <= value <= maximum
    if not in_range or value != int(value):
        raise TraceError(f"{where}: `{key}` must be an integer from {minimum} to {maximum:,} (tokens), got "
                         f"{_shown(value)}")  # fmt: skip
    return int(value)


def _ms(doc: dict, key: str, where: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    # the upper bound refuses infinity and integers too large for a float (NaN fails every comparison)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= sys.float_info.max:
        raise TraceError(f"{where}: `{key}` must be a number of milliseconds >= 0, got {_shown(value)}")
    return float(value)


def _turn(doc: dict, where: str) -> Turn:
    for key in ("text_input", "messages", "payload"):
        if key in doc:
            raise TraceError(f"{where}: `{key}` traces are not replayed (their token counts are unknown): give "
                             "`input_length` and `output_length` instead")  # fmt: skip
    if "input_length" not in doc:
        raise TraceError(f"{where}: a trace line needs `input_length` (prompt tokens)")
    if "output_length" not in doc:
        raise TraceError(f"{where}: a trace line needs `output_length` (answer tokens)")
    ids = doc.get("hash_ids")
    ids = [] if ids is None else ids
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise TraceError(f"{where}: `hash_ids` must be a list of integers")
    return Turn(input_length=_int(doc, "input_length", where, 1), output_length=_int(doc, "output_length", where, 1),
                hash_ids=tuple(ids), delay_ms=_ms(doc, "delay", where), at_ms=_ms(doc, "timestamp", where))  # fmt: skip


def read(path: str | Path, limit: int | None = None, untimed_gap_ms: float = UNTIMED_GAP_MS) -> Trace:
    """Read a Mooncake or aiperf multi-turn trace (plain or gzipped). `limit` keeps the first that many lines.
    Raises TraceError naming the line and the key."""
    docs: list[tuple[int, dict]] = []
    try:
        with open_text(path) as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{n}: not JSON ({exc.msg})") from None
                except ValueError as exc:  # an integer of more digits than Python converts
                    raise TraceError(f"{path}:{n}: not JSON ({str(exc).split(':')[0]})") from None
                except RecursionError:
                    raise TraceError(f"{path}:{n}: not JSON (nested too deeply)") from None
                if not isinstance(doc, dict):
                    raise TraceError(f"{path}:{n}: a trace line must be a JSON object")
                docs.append((n, doc))
                if limit and len(docs) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text or gzipped JSON-lines trace ({exc.reason} at byte {exc.start})") from None
    except zlib.error as exc:  # a gzip header, then a body that does not decompress
        raise TraceError(f"{path}: a corrupt gzip file ({exc})") from None
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise TraceError(f"{path}: no such file") from None
        raise TraceError(f"{path}: cannot read it ({exc})") from None
    if not docs:
        raise TraceError(f"{path}: the trace has no records")
    return parse(docs, str(path), untimed_gap_ms)


def parse(docs: list[tuple[int, dict]], source: str = "<trace>", untimed_gap_ms: float = UNTIMED_GAP_MS) -> Trace:
    """Sessions from (line number, record) pairs: aiperf multi-turn when any record has a `session_id`."""
    fmt: Format = "aiperf" if any("session_id" in d for _, d in docs) else "mooncake"
    lines: dict[str, list[int]] = {}  # each session's turns' line numbers, for errors
    if fmt == "mooncake":
        sessions = []
        for n, doc in docs:
            turn = _turn(doc, f"{source}:{n}")
            if turn.at_ms is None:
                raise TraceError(f"{source}:{n}: a Mooncake trace line needs `timestamp` (ms since the trace "
                                 "began); lines with `session_id` are read as aiperf multi-turn sessions")  # fmt: skip
            sessions.append(Session(f"req-{n}", turn.at_ms, (Turn(turn.input_length, turn.output_length,
                                                                   turn.hash_ids, None, turn.at_ms),)))  # fmt: skip
            lines[f"req-{n}"] = [n]
        t0 = min(s.start_ms for s in sessions)
        sessions = [Session(s.id, s.start_ms - t0, tuple(_shift(t, t0) for t in s.turns)) for s in sessions]
    else:
        by_id: dict[str, list[Turn]] = {}
        kinds: dict[str, type] = {}
        for n, doc in docs:
            where = f"{source}:{n}"
            sid = doc.get("session_id")
            if sid is None:
                sid = f"line-{n}"  # aiperf: a line without a session is a conversation of its own
            elif not isinstance(sid, (str, int)) or isinstance(sid, bool) or str(sid) == "":
                raise TraceError(f"{where}: `session_id` must be a non-empty string, got {sid!r}")
            if kinds.setdefault(str(sid), type(sid)) is not type(sid):
                raise TraceError(f"{where}: `session_id` {sid!r} is written both as a number and as a string in "
                                 "this trace: write every session's id one way")  # fmt: skip
            turn = _turn(doc, where)
            turns = by_id.setdefault(str(sid), [])
            last = next((t.at_ms for t in reversed(turns) if t.at_ms is not None), None)
            if turn.at_ms is not None and last is not None and turn.at_ms < last:
                raise TraceError(f"{where}: `timestamp` {turn.at_ms:g} is before an earlier turn of session {sid!r} "
                                 f"({last:g}): a session's turns come in order")  # fmt: skip
            lines.setdefault(str(sid), []).append(n)
            if not turns and turn.delay_ms is not None and turn.at_ms is None:
                turn = Turn(turn.input_length, turn.output_length, turn.hash_ids, None, None)  # nothing to wait for
            turns.append(turn)
        timed = [t[0].at_ms for t in by_id.values() if t[0].at_ms is not None]
        t0 = min(timed) if timed else 0.0
        sessions, untimed = [], 0
        for sid, turns in by_id.items():
            if turns[0].at_ms is not None:
                sessions.append(Session(sid, turns[0].at_ms - t0, tuple(_shift(t, t0) for t in turns)))
            else:  # from the trace's start, in file order
                sessions.append(Session(sid, untimed * untimed_gap_ms, tuple(_shift(t, t0) for t in turns)))
                untimed += 1
    _within_span(sessions, lines, source)
    sessions.sort(key=lambda s: s.start_ms)
    return Trace(fmt, tuple(sessions), source)


def _within_span(sessions: list[Session], lines: dict[str, list[int]], source: str) -> None:
    """Refuse a trace that would have the replay send a request more than MAX_SPAN_DAYS after it began (counting
    the waits the trace gives, not the answers' time), naming the line and the key that asks for it."""
    for s in sessions:
        t, key = s.start_ms, "timestamp" if s.turns[0].at_ms is not None else None
        for k, (n, turn) in enumerate(zip(lines[s.id], s.turns)):
            if k:
                t, key = t + (turn.delay_ms or 0.0), "delay"
                if turn.at_ms is not None and turn.at_ms > t:
                    t, key = turn.at_ms, "timestamp"
            if t > MAX_SPAN_MS:
                what = f"`{key}` puts this request" if key else "this session has no `timestamp` and starts"
                raise TraceError(f"{source}:{n}: {what} {t / 86_400_000:.3g} days into the replay; a trace may span "
                                 f"{MAX_SPAN_DAYS} days at most (`timestamp` and `delay` are in milliseconds)")


def _shift(turn: Turn, t0: float) -> Turn:
    if turn.at_ms is None or t0 == 0:
        return turn
    return Turn(turn.input_length, turn.output_length, turn.hash_ids, turn.delay_ms, turn.at_ms - t0)
