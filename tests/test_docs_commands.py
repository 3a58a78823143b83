"""Every `flashserve` command the README and docs/ show is one the command line takes: its command exists and
argparse accepts its options and values. The commands are parsed, not run (a parse ends the call), so a
benchmark of an hour costs nothing here. What argparse cannot see (a file that must exist, a range a command
checks after parsing) is for each command's own tests.

Checked: each command in a fenced block (continuation lines joined, what follows a pipe, `&&`, `;`, `&` or a
comment dropped), and each inline `flashserve ...` span of three or more words (shorter ones name a command
or an option in prose). Skipped: commands with placeholders (`<file>`, `FIELD=VALUE`, `[...]`, `$VAR`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex

import pytest

from flashserve.cli import commands
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PROGRAM = re.compile(r"^(?:\S*/)?flashserve\s+(.*)$")
_PLACEHOLDER = re.compile(r"[<>$\[\]{}]|\.\.\.|\b[A-Z][A-Z_]+\b")
_SHELL_TAIL = re.compile(r"\s+(?:\||>|&&|;|&|#)(?:\s|$)")


def _commands(text: str) -> list[tuple[str, str]]:
    """(kind, the command's words after `flashserve`) for each command shown in a markdown text."""
    found: list[tuple[str, str]] = []
    prose: list[str] = []
    fenced, pending = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            prose.append(line.strip())
            continue
        pending = f"{pending} {line.strip()}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        match = _PROGRAM.match(re.sub(r"^\$\s+", "", pending))
        pending = ""
        # output that starts with the program's name ("flashserve load: ...", a table's row) is not a command
        if match and re.match(r"^(?:[a-z][a-z-]*|-\S+)(?:\s|$)", match.group(1)):
            found.append(("block", match.group(1)))
    for match in re.finditer(r"`((?:\S*/)?flashserve [^`]+)`", " ".join(prose)):
        words = _PROGRAM.match(match.group(1)).group(1)
        if len(words.split()) >= 3:
            found.append(("inline", words))
    return found


def _shown() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for kind, words in _commands(doc.read_text()):
            words = _SHELL_TAIL.split(words)[0].strip()
            if not _PLACEHOLDER.search(words):
                out.append((f"{doc.relative_to(ROOT)} ({kind})", words))
    return out


SHOWN = _shown()


class _Parsed(Exception):
    pass


def test_the_docs_show_commands():
    # the extraction itself: if it found nothing, every case below would pass vacuously
    assert len(SHOWN) >= 60, SHOWN
    kinds = {where.rsplit("(", 1)[1] for where, _ in SHOWN}
    assert kinds == {"block)", "inline)"}
    assert sum(words.startswith("bench autoscale") for _, words in SHOWN) >= 20


def test_extraction_joins_continuations_and_drops_what_the_shell_adds():
    text = ("x\n```sh\n$ .venv/bin/flashserve bench autoscale \\\n    --seeds 1 2 | tee out\n"
            "flashserve load: an error\n```\nand `flashserve bench autoscale --quick` or `flashserve render`\n")
    block, inline = ("block", "bench autoscale --seeds 1 2 | tee out"), ("inline", "bench autoscale --quick")
    assert _commands(text) == [block, inline]
    assert _SHELL_TAIL.split("run &   # the operator")[0] == "run"


@pytest.mark.parametrize("where, words", SHOWN, ids=[f"{w}: {c[:60]}" for w, c in SHOWN])
def test_a_command_the_docs_show_parses(where, words, monkeypatch):
    argv = shlex.split(words)
    found = commands()
    assert argv[0] in found, f"{where}: `flashserve {words}`: no command {argv[0]!r}"
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    module, function = found[argv[0]][0].split(":")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(_Parsed):
        try:
            getattr(importlib.import_module(module), function)(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: `flashserve {words}` is refused: {err.getvalue().strip()[-400:]} (exit {exc.code})")
