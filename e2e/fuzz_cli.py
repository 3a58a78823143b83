"""Fuzz `flashserve validate` and `flashserve render` with thousands of DeepSeekServing files: the admission
corpus (tests/differential_corpus.py: valid, broken by each rule, randomly mutated) and hostile files (not
UTF-8, binary, nested deeper than any parser stack, alias bombs, non-string names, huge numbers and strings,
odd YAML types). Each file runs through both commands in a worker process, with a time limit per file and a
memory cap per worker, and is counted as

  crash     a traceback, or an exit status other than 0 (accepted) and 2 (refused, with the field named)
  hang      over the time limit (the worker is killed and a new one takes the next file)
  disagree  validate accepts a file that render refuses, or the other way round
  unnamed   refused without a line on stderr saying why

The run fails (exit 1) unless each is 0. Not part of `make test`; tests/test_fuzz_cli.py runs a short form.

    .venv/bin/python -m e2e.fuzz_cli [--files 4000] [--workers 2] [--time-limit 20] [--seed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tests.differential_corpus import corpus

HEAD = b"apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\n"
MEMORY_CAP = 2 * 1024**3  # per worker: a blow-up is a MemoryError (a crash), never the machine's memory


@dataclass(frozen=True)
class Sample:
    klass: str
    data: bytes


@dataclass
class Result:
    index: int
    klass: str
    validate_rc: int | None = None
    render_rc: int | None = None
    crash: str | None = None  # the traceback's last lines, or "exit N"
    unnamed: bool = False
    seconds: float = 0.0
    hang: bool = False


def _doc(name, spec=None, **extra) -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": name},
            "spec": {} if spec is None else spec, **extra}  # fmt: skip


def _dump(obj) -> bytes:
    return yaml.safe_dump(obj, sort_keys=False, allow_unicode=True).encode()


def _with(obj, text: str) -> bytes:
    """`obj` as YAML with each BIG replaced by `text` as written: numbers too long for Python to print, and
    values too long for the YAML emitter to write in good time."""
    return _dump(obj).replace(b"BIG", text.encode())


class Extreme(random.Random):
    """Draws the last choice, which `hostile` lists as the largest, deepest or longest."""

    def choice(self, seq):  # type: ignore[no-untyped-def,override]
        return seq[-1]


def hostile(rng: random.Random) -> list[Sample]:
    """One file of each hostile kind, drawn afresh for each call (sizes, depths and values vary; the last
    choice of each is the most extreme, see Extreme)."""
    ok = _dump(_doc("flash"))
    depth = rng.choice([65, 200, 2000, 50_000])
    laughs = ["a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    laughs += [f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]" for p, c in zip("abcdefgh", "bcdefghi")]
    big = rng.choice(["-", ""]) + "9" * rng.choice([19, 40, 400, 5000])  # Python prints 4,300 digits at most
    huge_len = rng.choice([70_000, 1_000_000, 3_500_000])  # under the 4 MiB cap: parsed, then refused
    samples = [
        ("notUtf8", ok.replace(b"flash", b"fl\xe4sh")),
        ("notUtf8:latin1File", "metadata: {name: 'caf\u00e9'}\n".encode("latin-1")),
        ("notUtf8:utf16", "kind: DeepSeekServing\nmetadata: {name: x}\n".encode("utf-16")),
        ("binary:random", rng.randbytes(rng.choice([1, 100, 4096]))),
        ("binary:nul", ok + b"\0"),
        ("binary:noNul", bytes(rng.choice(range(1, 256)) for _ in range(512))),
        ("nested:flowList", b"spec: " + b"[" * depth + b"]" * depth + b"\n"),
        ("nested:flowMap", b"spec: " + b"{a: " * depth + b"1" + b"}" * depth + b"\n"),
        ("nested:block", "".join("  " * i + "a:\n" for i in range(min(depth, 1500))).encode() + b"  " * 1500 + b"1\n"),
        ("nested:spec", _with(_doc("flash", {"engine": {"env": [{"name": "A", "value": "BIG"}]}}),
                              "[" * depth + "]" * depth)),
        ("aliases:billionLaughs", ("\n".join(laughs) + "\nmetadata: {name: *i}\n").encode()),
        ("aliases:one", b"x: &n flash\nmetadata: {name: *n}\n"),
        ("aliases:merge", b"base: &b {replicas: 1}\nspec:\n  <<: *b\nmetadata: {name: flash}\n"),
        ("name:int", _with(_doc("BIG"), rng.choice(["0", "7", big]))),
        ("name:float", HEAD + b"metadata: {name: 1.5e3}\n"),
        ("name:list", _dump(_doc(["a", "b"]))),
        ("name:map", _dump(_doc({"a": 1}))),
        ("name:null", HEAD + b"metadata: {name: null}\n"),
        ("name:bool", HEAD + b"metadata: {name: yes}\n"),
        ("name:date", HEAD + b"metadata: {name: 2026-01-01}\n"),
        ("name:huge", _with(_doc("BIG"), "a" * huge_len)),
        ("int:replicas", _with(_doc("flash", {"replicas": "BIG"}), big)),
        ("int:port", _with(_doc("flash", {"engine": {"port": "BIG"}}), big)),
        ("int:maxModelLen", _with(_doc("flash", {"engine": {"maxModelLen": "BIG"}}), big)),
        ("int:gpuMemoryUtilization", _with(_doc("flash", {"engine": {"gpuMemoryUtilization": "BIG"}}), big)),
        ("int:hex", HEAD + b"metadata: {name: flash}\nspec: {replicas: 0x" + b"f" * rng.choice([20, 5000]) + b"}\n"),
        ("int:annotation", _with(_doc("flash", metadata={"name": "flash", "annotations": {"x": "BIG"}}), big)),
        ("int:nodes", _with(_doc("flash", {"parallelism": {"nodesPerReplica": "BIG"}}), big)),
        ("float:inf", HEAD + b"metadata: {name: flash}\nspec: {engine: {gpuMemoryUtilization: .inf}, replicas: .nan}\n"),
        ("float:exp", HEAD + b"metadata: {name: flash}\nspec: {engine: {gpuMemoryUtilization: 1e400}}\n"),
        ("string:model", _with(_doc("flash", {"model": {"name": "BIG"}}), "m" * huge_len)),
        ("string:extraArgs", _with(_doc("flash", {"engine": {"extraArgs": ["--x=BIG"]}}), "y" * huge_len)),
        ("string:manyArgs", _with(_doc("flash", {"engine": {"extraArgs": "BIG"}}),
                                   "[" + ", ".join(["--a"] * rng.choice([1000, 100_000])) + "]")),
        ("string:maxModelLen", _with(_doc("flash", {"engine": {"maxModelLen": "BIG"}}),
                                      "'" + "9" * rng.choice([1000, 40_000]) + "'")),
        ("string:surrogate", HEAD + b'metadata: {name: flash}\nspec: {model: {name: "\\ud800x"}}\n'),
        ("string:surrogateName", HEAD + b'metadata: {name: "fl\\udfffash"}\n'),
        ("string:control", HEAD + b'metadata: {name: flash}\nspec: {engine: {image: "a\\x1b[2Jb"}}\n'),
        ("string:bom", b"\xef\xbb\xbf" + ok),
        ("string:crlf", ok.replace(b"\n", b"\r\n")),
        ("type:topList", b"- 1\n- 2\n"),
        ("type:topScalar", b"just a string\n"),
        ("type:metadataList", HEAD + b"metadata: [name, flash]\n"),
        ("type:specList", HEAD + b"metadata: {name: flash}\nspec: [1, 2]\n"),
        ("type:specString", HEAD + b"metadata: {name: flash}\nspec: replicas\n"),
        ("type:intKeys", HEAD + b"metadata: {name: flash}\nspec: {1: 2, true: 3}\n"),
        ("type:nullKey", HEAD + b"metadata: {name: flash}\nspec: {~: 2}\n"),
        ("type:complexKey", HEAD + b"metadata: {name: flash}\nspec: {? [a, b] : 1}\n"),
        ("type:binaryTag", HEAD + b"metadata: {name: flash}\nspec: {model: {name: !!binary aGVsbG8=}}\n"),
        ("type:setTag", HEAD + b"metadata: {name: flash}\nspec: !!set {a, b}\n"),
        ("type:dateValue", HEAD + b"metadata: {name: flash}\nspec: {model: {revision: 2026-01-01}}\n"),
        ("type:timestampValue", HEAD + b"metadata: {name: flash}\nspec: {engine: {image: 2026-01-01T10:00:00Z}}\n"),
        ("type:pythonTag", HEAD + b"metadata: {name: flash}\nspec: !!python/object/apply:os.system [echo hi]\n"),
        ("type:unknownTag", HEAD + b"metadata: {name: flash}\nspec: !custom {a: 1}\n"),
        ("docs:many", b"".join(b"---\n" + _dump(_doc(f"flash-{i}")) for i in range(rng.choice([2, 50])))),
        ("docs:sameName", b"---\n" + ok + b"---\n" + ok),
        ("docs:mixed", ok + b"---\n- 1\n---\nnull\n"),
        ("docs:empty", b""),
        ("docs:comments", b"# only a comment\n"),
        ("docs:separators", b"---\n---\n...\n"),
        ("yaml:broken", b"metadata: {name: flash\nspec: [\n"),
        ("yaml:tabs", HEAD + b"metadata:\n\tname: flash\n"),
        ("yaml:dupKeys", HEAD + b"metadata: {name: a, name: b}\nspec: {replicas: 1, replicas: 2}\n"),
        ("yaml:longLine", HEAD + b"metadata: {name: flash}\n# " + b"x" * rng.choice([100_000, 3_000_000]) + b"\n"),
        ("size:overLimit", b"# " + b"x" * (4 * 1024 * 1024 + 10) + b"\n" + ok),
    ]
    return [Sample(k, d) for k, d in samples]


def samples(n: int, seed: int = 1) -> list[Sample]:
    """`n` files: the admission corpus (as YAML, drawn with this seed) and rounds of hostile files, about one
    hostile file in five."""
    rng = random.Random(seed)
    hostile_n = max(len(hostile(random.Random(0))), n // 5)
    out: list[Sample] = hostile(Extreme(seed))
    while len(out) < hostile_n:
        out += hostile(rng)
    out = out[:hostile_n]
    rounds = 0
    while len(out) < n:
        mutated = max(50, n - len(out))
        cases = corpus(seed=seed + rounds, valid=max(20, mutated // 10), broken_rounds=max(1, mutated // 400),
                       mutated=mutated)  # fmt: skip
        out += [Sample(f"corpus:{c.klass}", _dump(c.obj)) for c in cases[: n - len(out)]]
        rounds += 1
    rng.shuffle(out)  # heavy and light files mixed, so workers share the load
    return out


def _call(fn, argv: list[str]) -> tuple[int, str, str | None]:
    """Run a command function as the CLI would: strict UTF-8 stdout (a pipe or terminal), stderr with
    backslashreplace (Python's own default for it). (status, stderr text, crash or None)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    crash = None
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = int(fn(argv) or 0)
            except SystemExit as exc:  # argparse, or a command that exits
                rc = exc.code if isinstance(exc.code, int) else 1
            out.flush()
            err.flush()
    except BaseException:  # noqa: BLE001 - anything escaping a command is what this counts
        crash = "".join(traceback.format_exc().strip().splitlines(keepends=True)[-3:])
    if crash is None and rc not in (0, 2):
        crash = f"exit {rc}"
    err.seek(0)
    return rc, err.buffer.read().decode("utf-8", "replace"), crash


def check(path: str, index: int, klass: str) -> Result:
    from flashserve.commands.render import main as render_main
    from flashserve.commands.render import validate_main

    t0 = time.perf_counter()
    r = Result(index, klass)
    r.validate_rc, v_err, v_crash = _call(validate_main, [path])
    r.render_rc, r_err, r_crash = _call(render_main, ["-f", path])  # the default output, YAML
    r.crash = v_crash or r_crash
    r.unnamed = (r.validate_rc == 2 and "error: " not in v_err) or (r.render_rc == 2 and "error: " not in r_err)
    r.seconds = time.perf_counter() - t0
    return r


def _worker(paths: list[tuple[int, str, str]], conn) -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    sys.setrecursionlimit(10_000)  # the CLI's own default stack, not a smaller one
    for index, path, klass in paths:
        conn.send(("start", index))
        conn.send(("done", check(path, index, klass)))
    conn.send(("end", None))


def run(files: list[tuple[int, str, str]], workers: int = 2, time_limit: float = 20.0) -> list[Result]:
    """Check each (index, path, class) in `workers` processes; a file over `time_limit` is a hang: its worker
    is killed and a fresh one goes on with that worker's remaining files."""
    ctx = mp.get_context("fork")
    queues = [files[i::workers] for i in range(workers)]
    results: dict[int, Result] = {}
    live: list[dict] = []

    def spawn(todo: list[tuple[int, str, str]]) -> None:
        if not todo:
            return
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(todo, child), daemon=True)
        proc.start()
        child.close()
        live.append({"proc": proc, "conn": parent, "todo": list(todo), "current": None, "since": 0.0})

    for q in queues:
        spawn(q)
    while live:
        for w in list(live):
            while w["conn"].poll(0):
                try:
                    what, value = w["conn"].recv()
                except EOFError:
                    what, value = "eof", None
                if what == "start":
                    w["current"], w["since"] = value, time.monotonic()
                elif what == "done":
                    results[value.index] = value
                    w["todo"] = [t for t in w["todo"] if t[0] != value.index]
                    w["current"] = None
                else:
                    w["todo"] = [] if what == "end" else w["todo"]
                    break
            late = w["current"] is not None and time.monotonic() - w["since"] > time_limit
            dead = not w["proc"].is_alive() and not w["conn"].poll(0)
            if late or dead or (not w["todo"] and not w["proc"].is_alive()):
                if w["proc"].is_alive():
                    w["proc"].kill()
                w["proc"].join()
                live.remove(w)
                rest = w["todo"]
                if w["current"] is not None and rest:
                    index, _, klass = rest[0]
                    results[index] = Result(index, klass, hang=late, seconds=time.monotonic() - w["since"],
                                            crash=None if late else f"worker died ({w['proc'].exitcode})")  # fmt: skip
                    rest = rest[1:]
                spawn(rest)
        time.sleep(0.01)
    return [results[i] for i, _, _ in files if i in results]


def write(batch: list[Sample], directory: Path) -> list[tuple[int, str, str]]:
    out = []
    for i, s in enumerate(batch):
        path = directory / f"{i:05d}.yaml"
        path.write_bytes(s.data)
        out.append((i, str(path), s.klass))
    return out


@dataclass
class Figures:
    files: int
    hostile: int
    accepted: int
    refused: int
    crashes: int
    hangs: int
    disagree: int
    unnamed: int
    slowest_s: float
    slowest: str
    wall_s: float

    @property
    def clean(self) -> bool:
        return not (self.crashes or self.hangs or self.disagree or self.unnamed)


def summarize(results: list[Result], wall: float) -> Figures:
    return Figures(
        files=len(results),
        hostile=sum(1 for r in results if not r.klass.startswith("corpus:")),
        accepted=sum(1 for r in results if r.validate_rc == 0 and r.render_rc == 0),
        refused=sum(1 for r in results if r.validate_rc == 2 and r.render_rc == 2),
        crashes=sum(1 for r in results if r.crash),
        hangs=sum(1 for r in results if r.hang),
        disagree=sum(1 for r in results if not r.crash and not r.hang and r.validate_rc != r.render_rc),
        unnamed=sum(1 for r in results if r.unnamed),
        slowest_s=round(max((r.seconds for r in results), default=0.0), 2),
        slowest=max(results, key=lambda r: r.seconds).klass if results else "",
        wall_s=round(wall, 1),
    )


def fuzz(n: int, seed: int = 1, workers: int = 2, time_limit: float = 20.0) -> tuple[Figures, list[Result]]:
    batch = samples(n, seed)
    with tempfile.TemporaryDirectory(prefix="flashserve-fuzz-") as tmp:
        t0 = time.monotonic()
        results = run(write(batch, Path(tmp)), workers=workers, time_limit=time_limit)
        return summarize(results, time.monotonic() - t0), results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per file (both commands)")
    ap.add_argument("--json", help="write the figures and every bad result here")
    args = ap.parse_args(argv)
    figures, results = fuzz(args.files, args.seed, args.workers, args.time_limit)
    bad = [r for r in results if r.crash or r.hang or r.unnamed or (r.validate_rc != r.render_rc)]
    for r in bad[:40]:
        why = "hang" if r.hang else r.crash or ("unnamed" if r.unnamed else f"validate {r.validate_rc} render {r.render_rc}")
        print(f"{r.klass}: {why}")
    classes = Counter(r.klass.split(":")[0] for r in results)
    print(f"files {figures.files} (hostile {figures.hostile}; " + ", ".join(f"{k} {v}" for k, v in classes.most_common(6))
          + ")")  # fmt: skip
    print(f"accepted by both {figures.accepted}, refused by both {figures.refused}")
    print(f"crashes {figures.crashes}, hangs {figures.hangs} (limit {args.time_limit:g} s per file), "
          f"validate/render disagree {figures.disagree}, refused without a reason {figures.unnamed}")  # fmt: skip
    print(f"slowest file {figures.slowest_s} s ({figures.slowest}); wall {figures.wall_s} s on {args.workers} workers")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": asdict(figures), "bad": [asdict(r) for r in bad]}, indent=2))
    return 0 if figures.clean else 1


if __name__ == "__main__":
    sys.exit(main())
