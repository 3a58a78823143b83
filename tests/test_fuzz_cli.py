"""The short form of e2e/fuzz_cli.py: every hostile kind of file at its most extreme (bar the multi-megabyte
ones, which the full run has) and a slice of the admission corpus, through `flashserve validate` and
`flashserve render`: no crash, no hang, the same verdict from both, a reason for every refusal."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from flashserve.commands.kubectl_yaml import MAX_INT_CHARS

from e2e.fuzz_cli import Extreme, Result, check, hostile, run, samples, summarize, write

SMALL = 200_000  # bytes: files above this are the slow, size-only cases


def _run(batch, time_limit: float = 20.0) -> tuple:
    with tempfile.TemporaryDirectory(prefix="flashserve-fuzz-") as tmp:
        t0 = time.monotonic()
        results = run(write(batch, Path(tmp)), workers=2, time_limit=time_limit)
        return summarize(results, time.monotonic() - t0), results


def test_two_hundred_files_neither_crash_nor_hang_and_both_commands_agree():
    extreme = [s for s in hostile(Extreme(0)) if len(s.data) < SMALL]
    corpus = [s for s in samples(400, seed=5) if s.klass.startswith("corpus:")][: 200 - len(extreme)]
    kinds = {s.klass for s in extreme}
    assert {"aliases:billionLaughs", "nested:flowList", "int:replicas", "notUtf8", "binary:nul", "name:int"} <= kinds
    figures, results = _run(extreme + corpus)
    bad = [(r.klass, r.crash, r.hang, r.validate_rc, r.render_rc) for r in results
           if r.crash or r.hang or r.unnamed or r.validate_rc != r.render_rc]  # fmt: skip
    assert figures.files == len(extreme) + len(corpus) and bad == []
    assert figures.accepted and figures.refused, "the batch has files of both verdicts"
    assert figures.wall_s < 60


def test_an_integer_too_long_for_python_is_refused_with_its_place(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("apiVersion: flashserve.io/v1alpha1\nkind: DeepSeekServing\nmetadata: {name: flash}\n"
                    f"spec: {{replicas: {'9' * 5000}}}\n")  # fmt: skip
    r = check(str(path), 0, "int")
    assert (r.validate_rc, r.render_rc, r.crash) == (2, 2, None)
    short = tmp_path / "short.yaml"
    short.write_text(path.read_text().replace("9" * 5000, "9" * MAX_INT_CHARS))
    r = check(str(short), 0, "int")
    assert (r.validate_rc, r.render_rc, r.crash) == (2, 2, None), "refused by the schema (over 256), not the loader"


def test_the_runner_reports_a_crash_and_a_hang_and_goes_on(monkeypatch, tmp_path):
    import e2e.fuzz_cli as fuzz

    def fake_check(path: str, index: int, klass: str) -> Result:
        text = Path(path).read_text()
        if text == "hang":
            time.sleep(60)
        r = Result(index, klass, validate_rc=0, render_rc=0 if text != "disagree" else 2)
        r.crash = "Traceback: boom" if text == "crash" else None
        return r

    monkeypatch.setattr(fuzz, "check", fake_check)  # the workers are forked: they see it
    batch = [fuzz.Sample(k, k.encode()) for k in ("ok", "hang", "crash", "ok", "disagree", "ok")]
    figures, _ = _run(batch, time_limit=1.0)
    assert figures.files == 6, "the files after the hang were still checked"
    assert (figures.crashes, figures.hangs, figures.disagree, figures.clean) == (1, 1, 1, False)


@pytest.mark.parametrize("kind", ["name:huge", "string:maxModelLen"])
def test_an_error_that_quotes_a_huge_value_is_cut(kind, tmp_path, capsys):
    from flashserve.commands.render import ERROR_MAX_CHARS, validate_main

    sample = next(s for s in hostile(Extreme(0)) if s.klass == kind)
    path = tmp_path / "f.yaml"
    path.write_bytes(sample.data)
    assert validate_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert max(len(line) for line in err.splitlines()) <= ERROR_MAX_CHARS + 100


def test_a_file_of_too_many_values_is_refused_before_it_takes_minutes(tmp_path):
    from flashserve.commands.kubectl_yaml import MAX_NODES

    sample = next(s for s in hostile(Extreme(0)) if s.klass == "string:manyArgs")  # 100,000 list items
    path = tmp_path / "many.yaml"
    path.write_bytes(sample.data)
    t0 = time.perf_counter()
    r = check(str(path), 0, sample.klass)
    assert (r.validate_rc, r.render_rc, r.crash) == (2, 2, None)
    assert time.perf_counter() - t0 < 15, "both commands stop at the cap, not at the end of the file"
    many = next(s for s in hostile(Extreme(0)) if s.klass == "docs:many")  # 50 servings in one file
    path.write_bytes(many.data)
    assert check(str(path), 0, many.klass).validate_rc == 0, f"{MAX_NODES} values leave room for many servings"
