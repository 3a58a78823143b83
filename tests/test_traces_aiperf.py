"""Our trace reader against aiperf's own loader (aiperf 0.13.0, in its venv: tools/aiperf/install.sh) on
generated traces, plain and gzipped: the same sessions, with the same turns in the same order, the same lengths,
block ids, timestamps and delays. Locally the test skips when that venv is missing; under CI it fails."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from flashserve_testbed import traces

ROOT = Path(__file__).resolve().parents[1]
AIPERF = ROOT / "tools" / "aiperf"


@pytest.fixture(scope="module")
def aiperf_python() -> Path:
    venv = Path(subprocess.run([str(AIPERF / "install.sh"), "--print"], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        if os.environ.get("CI"):
            pytest.fail(f"the aiperf venv is missing ({venv}): `make deps` builds it")
        pytest.skip("no aiperf venv: run tools/aiperf/install.sh")
    return python


def generated_trace(rng: random.Random, sessions: int) -> list[dict]:
    """aiperf multi-turn rows: sessions interleaved in the file, first turns with a timestamp (some without),
    later turns with a delay, a few lines without a session (each its own conversation)."""
    per_session = {f"sess-{k}": rng.randint(1, 6) for k in range(sessions)}
    pending = [sid for sid, n in per_session.items() for _ in range(n)]
    rng.shuffle(pending)  # interleaved, but each session's turns keep their relative order below
    seen: dict[str, int] = {}
    rows = []
    for sid in pending:
        k = seen.get(sid, 0)
        seen[sid] = k + 1
        row: dict = {"session_id": sid, "input_length": rng.randint(1, 20000), "output_length": rng.randint(1, 900)}
        if rng.random() < 0.7:
            row["hash_ids"] = [rng.randint(0, 50) for _ in range(rng.randint(1, 6))]
        if k == 0 and rng.random() < 0.85:
            row["timestamp"] = rng.randint(0, 600_000)
        elif k > 0:
            row["delay"] = rng.choice([0, rng.randint(1, 60_000), rng.random() * 5000])
        rows.append(row)
    for _ in range(rng.randint(0, 3)):
        rows.insert(rng.randrange(len(rows) + 1), {"timestamp": rng.randint(0, 600_000),
                                                   "input_length": rng.randint(1, 9000), "output_length": 5})
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_reader_groups_and_times_turns_as_aiperf_does(tmp_path, aiperf_python):
    files = []
    for seed in range(8):
        rng = random.Random(seed)
        files.append(write(tmp_path / f"trace-{seed}.jsonl{'.gz' if seed % 2 else ''}", generated_trace(rng, 25)))
    res = subprocess.run([str(aiperf_python), str(AIPERF / "load_trace.py"), *map(str, files)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    theirs_by_file = json.loads(res.stdout)
    for path in files:
        theirs = theirs_by_file[str(path)]
        ours = traces.read(path)
        assert ours.format == "aiperf"
        named = {s.id: s for s in ours.sessions if not s.id.startswith("line-")}
        unnamed = [s for s in ours.sessions if s.id.startswith("line-")]
        assert set(named) == {sid for sid in theirs if sid.startswith("sess-")}
        assert len(unnamed) == len(theirs) - len(named)  # aiperf names those itself
        t0 = min(t["timestamp"] for turns in theirs.values() for t in turns if t["timestamp"] is not None)
        for sid, session in named.items():
            want = theirs[sid]
            assert [(t.input_length, t.output_length, list(t.hash_ids)) for t in session.turns] == [
                (t["input_length"], t["output_length"], t["hash_ids"] or []) for t in want], sid
            assert [t.delay_ms for t in session.turns[1:]] == [t["delay"] for t in want[1:]], sid
            if want[0]["timestamp"] is not None:
                assert session.start_ms == pytest.approx(want[0]["timestamp"] - t0), sid
