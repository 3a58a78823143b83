"""Every `flashserve` command the README and docs/ show is one the command line takes. The commands are parsed,
not run (the parse ends the call), so a benchmark of an hour costs nothing here. What a parser cannot see (a
file that must exist, a range a command checks after parsing) is for each command's own tests.

- A command in a fenced block must parse whole: the command exists, and argparse (or, for `mock-engine serve`,
  the vLLM option table) takes its options and values. Continuation lines are joined; a command may follow
  environment assignments, `eval "$(...)"`, `export X=$(...)` or another command's `|`, `&&` or `;`; what
  follows a pipe, `&&`, `;`, `&`, a closing quote or parenthesis, or a comment is not part of it.
- A `flashserve ...` span in prose may name a command or an option without its value (`flashserve run
  --kubeconfig`): argparse may complain only of a missing value or argument, and each option it names must be
  one the command has.

Skipped: commands with placeholders (`<file>`, `FIELD=VALUE`, `[...]`, `$VAR`), and lines of output that start
with the program's name (`flashserve load: ...`, a table's row)."""

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
_PLACEHOLDER = re.compile(r"[<>$\[\]]|\{(?!\")|\.\.\.|\b[A-Z][A-Z_]+\b")  # a JSON value's `{"` is not one
_COMMAND_WORD = re.compile(r"[a-z][a-z-]*|-\S+")  # not `load:` (output) or `9` (a table's row)


def _commands(text: str) -> list[tuple[str, str]]:
    """(kind, the words after `flashserve`) for each command a markdown text shows: kind `block` for a fenced
    block's, `prose` for an inline span's."""
    found: list[tuple[str, str]] = []
    prose: list[str] = []
    fence, pending = None, ""
    for line in text.splitlines():
        marker = line.lstrip()[:3]
        if marker in ("```", "~~~") and (fence is None or marker == fence):
            fence, pending = (marker if fence is None else None), ""
            continue
        if fence is None:
            prose.append(line.strip())
            continue
        pending = f"{pending} {line.strip()}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        found += [("block", words) for words in _in_line(pending)]
        pending = ""
    for span in re.findall(r"`([^`]+)`", " ".join(prose)):
        found += [("prose", words) for words in _in_line(span)]
    return found


_PREFIX_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*|eval|export|sudo|time|\$")


def _in_line(line: str) -> list[str]:
    """The commands of one shell line: each `$(...)` on its own, then each part between `|`, `&&`, `;`, `&`
    and parentheses whose first word (after assignments, `eval`, `export`...) is the program."""
    inner = re.findall(r"\$\(([^()]*)\)", line)
    line = re.sub(r"\$\([^()]*\)", "SUBST", line)
    out = [words for part in inner for words in _in_line(part)]
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: not a command line
        return out
    part: list[str] = []
    for token in [*tokens, ";"]:
        if token and set(token) <= set(";&|()<>"):
            while part and _PREFIX_WORD.fullmatch(part[0]):
                part = part[1:]
            program = part[0].rsplit("/", 1)[-1] if part else ""
            if program == "flashserve" and len(part) > 1 and _COMMAND_WORD.fullmatch(part[1]):
                out.append(shlex.join(part[1:]))
            part = []
        else:
            part.append(token)
    return out


def _shown() -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)} ({kind})", words) for doc in DOCS for kind, words in _commands(doc.read_text())
            if not _PLACEHOLDER.search(words)]  # fmt: skip


SHOWN = _shown()


class _Parsed(Exception):
    pass


def test_the_docs_show_commands():
    # the extraction itself: if it found nothing, every case below would pass vacuously
    kinds = [where.rsplit("(", 1)[1] for where, _ in SHOWN]
    assert kinds.count("block)") >= 50 and kinds.count("prose)") >= 40, SHOWN
    assert sum(words.startswith("bench autoscale") for _, words in SHOWN) >= 20


def test_extraction_finds_commands_where_the_shell_puts_them():
    text = ("x\n```sh\n$ .venv/bin/flashserve bench autoscale \\\n    --seeds 1 2 | tee out\n"
            'eval "$(.venv/bin/flashserve cluster up --pod-readiness external)"   # the cluster\n'
            "export KUBECONFIG=$(flashserve cluster kubeconfig)\nA=1 B=2 flashserve run && flashserve render -f x\n"
            "flashserve load: an error\nflashserve  9  0.51\n```\n"
            "~~~\nflashserve validate f.yaml\n~~~\n"
            "and `flashserve bench autoscale --quick`, `flashserve run --kubeconfig` or `flashserve render`\n")  # fmt: skip
    assert _commands(text) == [
        ("block", "bench autoscale --seeds 1 2"), ("block", "cluster up --pod-readiness external"),
        ("block", "cluster kubeconfig"), ("block", "run"), ("block", "render -f x"), ("block", "validate f.yaml"),
        ("prose", "bench autoscale --quick"), ("prose", "run --kubeconfig"), ("prose", "render"),
    ]  # fmt: skip


def _parse(words: str, monkeypatch) -> tuple[argparse.ArgumentParser | None, str | None]:
    """(the parser the command built, None if it parsed or argparse's complaint)."""
    argv = shlex.split(words)
    found = commands()
    assert argv[0] in found, f"no command {argv[0]!r}"
    if argv[0] == "mock-engine":  # vLLM's own option table, not argparse; parsing it starts nothing
        from flashserve_testbed.engine import args as engine_args

        assert argv[1:2] == ["serve"], argv
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                engine_args.parse(argv[2:])
        except (SystemExit, engine_args.ArgsError) as exc:
            return None, err.getvalue().strip() or str(exc) or "refused"
        return None, None
    original, seen = argparse.ArgumentParser.parse_args, []

    def parse_and_stop(self, args=None, namespace=None):
        seen.append(self)
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    module, function = found[argv[0]][0].split(":")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            getattr(importlib.import_module(module), function)(argv[1:])
    except _Parsed:
        return seen[0], None
    except SystemExit:
        return (seen[0] if seen else None), err.getvalue().strip()[-400:] or "refused"
    raise AssertionError(f"`flashserve {words}` ran without parsing its arguments with argparse")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of the parser and of its subcommands' parsers."""
    out = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


@pytest.mark.parametrize("where, words", SHOWN, ids=[f"{w}: {c[:60]}" for w, c in SHOWN])
def test_a_command_the_docs_show_is_one_the_command_line_takes(where, words, monkeypatch):
    if where.endswith("(prose)"):
        words = words.replace("/--", " --")  # `--a/--b`: prose naming either of two options
    parser, complaint = _parse(words, monkeypatch)
    if complaint is None:
        return
    refused = f"{where}: `flashserve {words}` is refused: {complaint}"
    # prose may name an option without its value, or a command without its required arguments; nothing else
    mention = re.search(r"expected one argument|the following arguments are required", complaint)
    assert where.endswith("(prose)") and parser is not None and mention, refused
    named = [w.split("=")[0] for w in shlex.split(words)[1:] if w.startswith("-")]
    unknown = [o for o in named if o not in _options(parser)]
    assert not unknown, f"{where}: `flashserve {words}` names options the command does not have: {unknown}"
