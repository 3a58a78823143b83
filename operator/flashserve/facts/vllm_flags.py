"""The `vllm serve` options of vLLM 0.33 and how vLLM reads one command-line token.

The table is vllm_flags.json, written from vLLM's own parser by tools/vllm-contract/harness/gen_flags.py (its
docstring lists what vLLM's FlexibleArgumentParser does to argv); tests/contract/test_flag_table.py fails when
the file drifts from the real parser. `read_token` and `resolve` repeat that pre-processing and argparse's
matching (Python 3.11: exact option strings, unique prefixes, glued single-character values), so the
operator's extraArgs guard and the mock engine read a token the way `vllm serve` does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

_DATA = json.loads(resources.files(__package__).joinpath("vllm_flags.json").read_text())

VLLM_VERSION: str = _DATA["vllm_version"]
ALLOW_ABBREV: bool = _DATA["parser"]["allow_abbrev"]


@dataclass(frozen=True)
class Option:
    """One argparse action of `vllm serve`."""

    dest: str  # the setting it writes
    flags: tuple[str, ...]  # every option string argparse matches, the canonical one first
    nargs: str  # "0" (a switch), "1", "?", "+" or "*"
    action: str
    value: str | None  # kind of value: int, float, str, json, json_or_str, human_int, human_int_or_auto, other
    none_allowed: bool  # "None" and "" mean unset
    choices: tuple | None
    negative: frozenset[str]  # option strings that set a switch to False
    group: str | None

    @property
    def name(self) -> str:
        """The spelling messages use: the first long option string."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    @property
    def takes_value(self) -> bool:
        return self.nargs != "0"


OPTIONS: tuple[Option, ...] = tuple(
    Option(
        dest=row["dest"],
        flags=tuple(row["flags"]),
        nargs=row["nargs"],
        action=row["action"],
        value=row.get("value"),
        none_allowed=row.get("none_allowed", False),
        choices=tuple(row["choices"]) if "choices" in row else None,
        negative=frozenset(row.get("negative", ())),
        group=row.get("group"),
    )
    for row in _DATA["options"]
)
BY_DEST: dict[str, Option] = {o.dest: o for o in OPTIONS}
BY_FLAG: dict[str, Option] = {f: o for o in OPTIONS for f in o.flags}
POSITIONALS: tuple[str, ...] = tuple(p["dest"] for p in _DATA["positionals"])


def _enum(name: str) -> tuple[str, ...]:
    return tuple(_DATA["enums"][name]["values"])


# Where each list comes from in vLLM is recorded next to it in vllm_flags.json ("source").
ALL2ALL_BACKENDS: tuple[str, ...] = _enum("all2all_backend")  # the parser's choices
ATTENTION_BACKENDS: tuple[str, ...] = _enum("attention_backend")  # AttentionBackendEnum member names
MLA_ATTENTION_BACKENDS: tuple[str, ...] = tuple(b for b in ATTENTION_BACKENDS if "MLA" in b)  # by vLLM's naming
KV_CACHE_DTYPES: tuple[str, ...] = _enum("kv_cache_dtype")  # vllm.config.cache.CacheDType
CUDAGRAPH_MODES: tuple[str, ...] = _enum("cudagraph_mode")  # vllm.config.compilation.CUDAGraphMode
LOAD_FORMATS: tuple[str, ...] = _enum("load_format")  # vllm.model_executor.model_loader.LoadFormats
DEEP_GEMM_WARMUPS: tuple[str, ...] = _enum("deep_gemm_warmup")  # vllm.envs VLLM_DEEP_GEMM_WARMUP choices

HISTOGRAM_FAMILIES: tuple[str, ...] = tuple(_DATA["metrics"]["histogram_families"])
# Default histogram bucket bounds (seconds).
DEFAULT_TTFT_BUCKETS: tuple[float, ...] = tuple(_DATA["metrics"]["default_ttft_buckets"])
DEFAULT_ITL_BUCKETS: tuple[float, ...] = tuple(_DATA["metrics"]["default_itl_buckets"])

# argparse reads these as values, not options (the parser has no option that looks like a negative number).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Token:
    """One argv item after FlexibleArgumentParser's rewriting."""

    text: str
    kind: str  # "option", "value" (argparse reads it as a positional or an option's value) or "end" (`--`)
    key: str = ""  # what argparse matches: dashes for underscores, without `=value` and `.sub.keys`
    inline: str | None = None  # the value after `=` (or glued to `-O`)
    dotted: str | None = None  # `a.b` of `--flag.a.b`: FlexibleArgumentParser turns it into JSON


def read_token(text: str) -> Token:
    if text == "--":
        return Token(text, "end")
    if not text.startswith("-") or text == "-" or _NEGATIVE_NUMBER.match(text):
        return Token(text, "value")
    if text.startswith("-O") and not text.startswith("--"):
        # -O3, -Odecode, -O=3, -O.x all become --optimization-level <rest>; a bare -O takes the next item
        inline = None if text == "-O" else (text[3:] if text[2] == "=" else text[2:])
        return Token(text, "option", "--optimization-level", inline)
    name, eq, inline = text.partition("=")
    if name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + tail
    key, dot, dotted = name.partition(".")
    return Token(text, "option", key, inline if eq else None, dotted if dot else None)


@dataclass(frozen=True)
class Resolved:
    """What argparse makes of an option token."""

    token: Token
    candidates: tuple[str, ...]  # the option strings it matches: one, none (unknown) or several (ambiguous)
    glued: str | None = None  # the value glued to a single-character option (`-n2`)

    @property
    def option(self) -> Option | None:
        return BY_FLAG[self.candidates[0]] if len(self.candidates) == 1 else None

    @property
    def flag(self) -> str | None:
        return self.candidates[0] if len(self.candidates) == 1 else None


def matching_flags(key: str) -> tuple[str, ...]:
    """The option strings argparse (Python 3.11) considers for an option name: itself if it is one, else those
    it is a prefix of (long options only with allow_abbrev), plus a single-character option it starts with."""
    if key in BY_FLAG:
        return (key,)
    if key.startswith("--"):
        return tuple(f for f in BY_FLAG if f.startswith(key)) if ALLOW_ABBREV else ()
    glued = (key[:2],) if key[:2] in BY_FLAG else ()
    return glued + tuple(f for f in BY_FLAG if f.startswith(key) and f != key[:2])


def resolve(text: str) -> Resolved:
    tok = read_token(text)
    if tok.kind != "option":
        return Resolved(tok, ())
    single = not tok.key.startswith("--")
    if single and tok.inline is not None and tok.dotted is None and tok.key not in BY_FLAG:
        candidates = matching_flags(text)  # argparse matches single-dash prefixes with the `=value` still on
    else:
        candidates = matching_flags(tok.key)
    if not candidates and " " in tok.key:
        return Resolved(Token(text, "value"), ())  # argparse takes an unknown token with a space as a value
    glued = None
    if len(candidates) == 1 and candidates[0] != tok.key and not tok.key.startswith("--"):
        glued = text[2:] if candidates[0] == tok.key[:2] else None
    return Resolved(tok, candidates, glued)


def lookup(token: str) -> Option | None:
    """The option a token names exactly (`--x=v` included), or None: for command lines the operator writes,
    which spell every flag out."""
    return BY_FLAG.get(token.split("=", 1)[0])


# ---- prefixes that can only mean given settings (for the guard and its CEL rule) ----------------------------


@dataclass(frozen=True)
class Cover:
    """Tokens whose name starts with `prefix` (or, when `exact`, equals it) can only set one of the covered
    settings, or make vLLM exit (an ambiguous or unknown option)."""

    prefix: str
    exact: bool


def covers(dests: Iterable[str]) -> tuple[Cover, ...]:
    """The shortest prefixes of the covered options' strings that no other option string starts with.

    A token starting with such a prefix is a prefix of a covered option string (so it is that option, or
    ambiguous among covered ones), a covered option with `=value` or `.key`, or an unknown option: never an
    uncovered setting. Where an uncovered option string starts with a covered one (`--kv-cache-dtype-skip-layers`
    and `--kv-cache-dtype`), only the exact spelling is covered; its shorter prefixes are ambiguous to vLLM.
    """
    covered = set(dests)
    out: list[Cover] = []
    for option in (BY_DEST[d] for d in sorted(covered)):
        for flag in option.flags:
            first = 3 if flag.startswith("--") else 2
            for end in range(first, len(flag) + 1):
                prefix = flag[:end]
                others = [f for f in BY_FLAG if f.startswith(prefix) and BY_FLAG[f].dest not in covered]
                if not flag.startswith("--") and prefix[:2] in BY_FLAG and BY_FLAG[prefix[:2]].dest not in covered:
                    others.append(prefix[:2])  # `-qx` is `-q x`
                if not others:
                    out.append(Cover(prefix, False))
                    break
            else:
                out.append(Cover(flag, True))
    if "optimization_level" in covered:
        out.append(Cover("-O", False))  # FlexibleArgumentParser's -O forms (no option string starts with -O)
    anys = {c.prefix for c in out if not c.exact}
    minimal = {c for c in out if not any(c.prefix.startswith(p) and (c.exact or p != c.prefix) for p in anys)}
    return tuple(sorted(minimal, key=lambda c: (c.prefix, c.exact)))


def covered_by(text: str, cover: Iterable[Cover]) -> str | None:
    """The cover prefix a token falls under, or None; what the generated regex matches, in Python."""
    tok = read_token(text)
    if tok.kind != "option":
        return None
    if text.startswith("-O") and not text.startswith("--"):
        return "-O" if any(c.prefix == "-O" for c in cover) else None
    # the cover prefixes hold no `=` or `.`, so they compare with the name (underscores already dashes)
    for c in cover:
        if (c.exact and tok.key == c.prefix) or (not c.exact and tok.key.startswith(c.prefix)):
            return c.prefix
    return None


def cover_regex(cover: Iterable[Cover]) -> str:
    """An RE2 pattern (no lookarounds, no backslashes, so it survives a CEL string literal) that matches the
    tokens `covered_by` finds, with search semantics as CEL's `matches`. Grouped by common prefixes."""
    trie_long: dict = {}
    trie_short: dict = {}
    for c in cover:
        trie, rest = (trie_long, c.prefix[2:]) if c.prefix.startswith("--") else (trie_short, c.prefix[1:])
        node = trie
        for ch in rest:
            node = node.setdefault(ch, {})
        node["$any" if not c.exact else "$exact"] = {}

    def render(node: dict, long: bool) -> str:
        if "$any" in node:
            return ""
        alts = ["[=.]|$"] if "$exact" in node else []
        for ch in sorted(k for k in node if not k.startswith("$")):
            piece = "[-_]" if (long and ch == "-") else ch
            alts.append(piece + render(node[ch], long))
        return alts[0] if len(alts) == 1 and "$exact" not in node else "(" + "|".join(alts) + ")"

    parts = ["--" + render(trie_long, True)] if trie_long else []
    parts += ["-" + render(trie_short, False)] if trie_short else []
    return "^(" + "|".join(parts) + ")" if parts else "^$."  # the last one matches nothing


# ---- every spelling of an option, for tests that hold the guard and the mock to the table --------------------


def sample_value(option: Option) -> str:
    """A value the parser accepts for an option (checked against the real parser by the contract test)."""
    if option.choices:
        return str(option.choices[0])
    if option.action == "LoRAParserAction":
        return "name=path"  # its own action reads name=path or JSON
    return {"int": "2", "float": "0.5", "json": "{}", "json_or_str": "{}", "human_int": "2k",
            "human_int_or_auto": "4096", "other": "1"}.get(option.value or "", "x")  # fmt: skip


@dataclass(frozen=True)
class Spelling:
    argv: tuple[str, ...]  # the items, the value included where the option needs one
    vllm: str  # what real vLLM does with them: "sets" the option's dest, or "error" (exits at start)
    form: str  # "flag", "equals", "underscore", "prefix", "dotted" or "-O"


def spellings(option: Option, sub_key: str | None = None) -> list[Spelling]:
    """Every way to write the option: each option string, `=value`, underscores, each prefix (argparse
    expands the unique ones; the others are ambiguous errors), `.sub.key` forms (`sub_key` is `k=v`; without
    it a `.x=1` form whose fate follows from the kind of value) and, for the optimization level, `-O` forms."""
    value = sample_value(option)
    out: list[Spelling] = []

    def add(flag: str, form: str, vllm: str = "sets") -> None:
        if option.takes_value:
            out.append(Spelling((flag, value), vllm, form))
            # argparse matches a single-dash prefix with its `=value` on, so `-t=2` is no option at all
            equals = "error" if form == "prefix" and not flag.startswith("--") else vllm
            out.append(Spelling((f"{flag}={value}",), equals, form if form != "flag" else "equals"))
        else:
            out.append(Spelling((flag,), vllm, form))
            out.append(Spelling((f"{flag}=1",), "error", "equals"))  # a switch refuses an explicit value

    for flag in option.flags:
        add(flag, "flag")
        if flag.startswith("--") and "-" in flag[2:]:
            add("--" + flag[2:].replace("-", "_"), "underscore")
        first = 3 if flag.startswith("--") else 2
        for end in range(first, len(flag)):
            prefix = flag[:end]
            if prefix in BY_FLAG:
                continue  # another option's own spelling
            if len(matching_flags(prefix)) == 1:
                add(prefix, "prefix")
            else:  # argparse (3.11) calls a prefix of several option strings ambiguous, even of one option
                out.append(Spelling((prefix,) + ((value,) if option.takes_value else ()), "error", "prefix"))
        if sub_key is not None:
            key, _, sub_value = sub_key.partition("=")
            out.append(Spelling((f"{flag}.{key}={sub_value}",), "sets", "dotted"))
            out.append(Spelling((f"{flag}.{key}", sub_value), "sets", "dotted"))
        elif option.nargs == "1" and option.value in ("str", "int", "float"):
            # the sub-keys become the JSON text '{"x": 1}': a string option takes it, a number does not
            fits = option.value == "str" and not option.choices
            out.append(Spelling((f"{flag}.x=1",), "sets" if fits else "error", "dotted"))
    if option.dest == "optimization_level":
        out += [Spelling((o,), "sets", "-O") for o in ("-O3", "-O=3", "-Odecode", "-O.x")]
        out.append(Spelling(("-O", "3"), "sets", "-O"))
    return out
