"""The trace reader (flashserve_testbed.traces): Mooncake and aiperf multi-turn, plain or gzipped, told apart by
content; errors name the line and the key."""

from __future__ import annotations

import gzip
import json

import pytest
from flashserve_testbed import traces
from flashserve_testbed.traces import TraceError


def write(path, rows, gz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


MOONCAKE = [{"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 10, "output_length": 2}]  # fmt: skip
AIPERF = [
    {"session_id": "a", "timestamp": 500, "input_length": 300, "output_length": 40, "hash_ids": [1]},
    {"session_id": "b", "timestamp": 100, "input_length": 50, "output_length": 4},
    {"session_id": "a", "delay": 2000, "input_length": 150, "output_length": 20, "hash_ids": [7]},
    {"session_id": "a", "delay": 0, "input_length": 10, "output_length": 1},
]


def test_mooncake_lines_are_one_turn_sessions_in_time_order(tmp_path):
    tr = traces.read(write(tmp_path / "t.jsonl", MOONCAKE))
    assert tr.format == "mooncake" and not tr.closed_loop and tr.requests == 2
    assert [s.start_ms for s in tr.sessions] == [0.0, 1000.0]  # relative to the first
    assert tr.sessions[1].turns == (traces.Turn(600, 5, (1, 2), None, 1000.0),)


def test_aiperf_sessions_group_turns_in_file_order(tmp_path):
    tr = traces.read(write(tmp_path / "t.jsonl", AIPERF))
    assert tr.format == "aiperf" and tr.closed_loop and tr.requests == 4
    assert [(s.id, s.start_ms, len(s.turns)) for s in tr.sessions] == [("b", 0.0, 1), ("a", 400.0, 3)]
    a = tr.sessions[1]
    assert [t.delay_ms for t in a.turns] == [None, 2000.0, 0.0]
    # a turn's prompt is the conversation so far plus its new tokens
    assert a.prompt_lengths() == [300, 300 + 40 + 150, 300 + 40 + 150 + 20 + 10]


def test_gzip_is_told_by_content_not_name(tmp_path):
    plain = traces.read(write(tmp_path / "a.jsonl", AIPERF))
    assert traces.read(write(tmp_path / "a.jsonl.gz", AIPERF, gz=True)) == traces.Trace(
        plain.format, plain.sessions, str(tmp_path / "a.jsonl.gz"))  # fmt: skip
    assert traces.read(write(tmp_path / "looks-plain.jsonl", MOONCAKE, gz=True)).requests == 2


def test_sessions_without_timestamps_start_apart(tmp_path):
    rows = [{"session_id": "x", "input_length": 5, "output_length": 1},
            {"session_id": "y", "input_length": 5, "output_length": 1}]  # fmt: skip
    tr = traces.read(write(tmp_path / "t.jsonl", rows), untimed_gap_ms=250)
    assert [s.start_ms for s in tr.sessions] == [0.0, 250.0]


def test_a_byte_order_mark_is_not_content(tmp_path):
    for gz in (False, True):
        path = tmp_path / f"bom{gz}.jsonl"
        text = "\ufeff" + "".join(json.dumps(r) + "\n" for r in AIPERF)
        path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
        assert traces.read(path).requests == 4


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"input_length": 5, "output_length": 1}], r"t.jsonl:1: a Mooncake trace line needs `timestamp`"),
        ([{"timestamp": 1, "input_length": 5}], r"t.jsonl:1: a trace line needs `output_length`"),
        ([{"timestamp": 1, "input_length": 0, "output_length": 1}], r"`input_length` must be an integer from 1 to"),
        ([{"timestamp": "x", "input_length": 1, "output_length": 1}], r"`timestamp` must be a number of ms"),
        ([MOONCAKE[0], "not json"], r"t.jsonl:2: not JSON"),
        (["[1, 2]"], r"t.jsonl:1: a trace line must be a JSON object"),
        ([{"session_id": "a", "text_input": "hi", "output_length": 1}], r"`text_input` traces are not replayed"),
        ([{"session_id": "", "input_length": 1, "output_length": 1}], r"`session_id` must be a non-empty string"),
        ([{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": "abc"}], r"`hash_ids` must be a list"),
        ([{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": False}], r"`hash_ids` must be a list"),
        ([{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": {}}], r"`hash_ids` must be a list"),
        ([{"session_id": 1, "input_length": 1, "output_length": 1},
          {"session_id": "1", "input_length": 1, "output_length": 1}],
         r"t.jsonl:2: `session_id` '1' is written both as a number and as a string"),
        ([{"session_id": "a", "timestamp": 500, "input_length": 1, "output_length": 1},
          {"session_id": "a", "timestamp": 100, "input_length": 1, "output_length": 1}],
         r"t.jsonl:2: `timestamp` 100 is before an earlier turn of session 'a'"),
    ],
)
def test_bad_lines_name_the_line_and_key(tmp_path, rows, message):
    with pytest.raises(TraceError, match=message.replace("ms", "milliseconds")):
        traces.read(write(tmp_path / "t.jsonl", rows))


def test_binary_and_empty_files_are_refused_clearly(tmp_path):
    (tmp_path / "bin").write_bytes(b"\x00\xff\xfe\x80" * 10)
    with pytest.raises(TraceError, match="not a text or gzipped JSON-lines trace"):
        traces.read(tmp_path / "bin")
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(TraceError, match="the trace has no records"):
        traces.read(tmp_path / "empty")
    with pytest.raises(TraceError, match="no such file"):
        traces.read(tmp_path / "missing")


def test_limit_keeps_the_first_lines(tmp_path):
    assert traces.read(write(tmp_path / "t.jsonl", AIPERF), limit=2).requests == 2


# JSON's NaN, Infinity and 1e999 (a float too large: infinity) are read by Python's json; so is any integer
MOONCAKE_LINE = '{{"timestamp": 0, "input_length": {}, "output_length": 5}}'


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999", "1e23", str(10**23), str(10**400),
                                   str(traces.MAX_TOKENS + 1), "2.5"])  # fmt: skip
def test_token_counts_must_be_whole_and_bounded(tmp_path, value):
    with pytest.raises(TraceError, match=r"t.jsonl:2: `input_length` must be an integer from 1 to 10,000,000"):
        traces.read(write(tmp_path / "t.jsonl", [MOONCAKE[0], MOONCAKE_LINE.format(value)]))
    row = {"session_id": "a", "input_length": 5, "output_length": float(value) if value != "2.5" else 2.5}
    with pytest.raises(TraceError, match=r"t.jsonl:1: `output_length` must be an integer from 1 to 10,000,000"):
        traces.read(write(tmp_path / "t.jsonl", [row]))
    top = {"timestamp": 0, "input_length": traces.MAX_TOKENS, "output_length": traces.MAX_TOKENS}
    assert traces.read(write(tmp_path / "t.jsonl", [top])).sessions[0].turns[0].input_length == traces.MAX_TOKENS


@pytest.mark.parametrize(("line", "why"), [
    ('{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 5}', r"Exceeds the limit \(4300 digits\)"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])  # fmt: skip
def test_lines_json_cannot_take_name_the_line(tmp_path, line, why):
    with pytest.raises(TraceError, match=rf"t.jsonl:2: not JSON \({why}"):
        traces.read(write(tmp_path / "t.jsonl", [MOONCAKE[0], line]))


def test_a_corrupt_gzip_body_is_refused_naming_the_file(tmp_path):
    body = gzip.compress(json.dumps(MOONCAKE[0]).encode() * 50)
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(body[:10] + b"\xff" * 40 + body[50:])  # a valid header, then garbage
    with pytest.raises(TraceError, match=r"t.jsonl.gz: a corrupt gzip file \(Error -3"):
        traces.read(path)


DAY_MS = 24 * 3600 * 1000


@pytest.mark.parametrize(("rows", "message"), [
    # the span counts from the trace's first timestamp: epoch milliseconds are fine, a far-off one is not
    ([{"timestamp": 1.7e12, "input_length": 5, "output_length": 1},
      {"timestamp": 1.7e12 + 31 * DAY_MS, "input_length": 5, "output_length": 1}], r"t.jsonl:2: `timestamp` puts"),
    ([{"timestamp": 0, "input_length": 5, "output_length": 1},
      {"timestamp": 1e308, "input_length": 5, "output_length": 1}], r"t.jsonl:2: `timestamp` puts .* 1.16e\+300 days"),
    ([{"timestamp": 0, "input_length": 5, "output_length": 1},
      {"timestamp": 10**400, "input_length": 5, "output_length": 1}], r"t.jsonl:2: `timestamp` must be a number of"),
    # delays add up along a session
    ([{"session_id": "a", "timestamp": 0, "input_length": 5, "output_length": 1}]
     + [{"session_id": "a", "delay": 10 * DAY_MS, "input_length": 5, "output_length": 1}] * 4,
     r"t.jsonl:5: `delay` puts this request 40 days into the replay; a trace may span 30 days at most"),
    ([{"session_id": "a", "input_length": 5, "output_length": 1},
      {"session_id": "a", "timestamp": 40 * DAY_MS, "input_length": 5, "output_length": 1}], r"t.jsonl:2: `timestamp`"),
])  # fmt: skip
def test_a_trace_may_not_span_more_than_a_month(tmp_path, rows, message):
    with pytest.raises(TraceError, match=message):
        traces.read(write(tmp_path / "t.jsonl", rows))
    month = [{"timestamp": 0, "input_length": 5, "output_length": 1},
             {"timestamp": 30 * DAY_MS, "input_length": 5, "output_length": 1}]  # fmt: skip
    assert traces.read(write(tmp_path / "t.jsonl", month)).sessions[-1].start_ms == 30 * DAY_MS
