"""Writes operator/flashserve/facts/vllm_flags.json: the `vllm serve` options of the installed vLLM, read from vLLM's
own argument parser, built exactly as `vllm serve` builds it (vllm/entrypoints/cli/main.py: a top-level
FlexibleArgumentParser, `add_subparsers(dest="subparser")`, then ServeSubcommand.subparser_init, which calls
vllm/entrypoints/common/cli_args.py:make_arg_parser: model_tag, --headless, --api-server-count, --config,
--grpc, FrontendArgs and AsyncEngineArgs).

Run it with the contract venv's python (tools/vllm-contract/install.sh --print names the venv):

    <venv>/bin/python tools/vllm-contract/harness/gen_flags.py [--print|--check]

    (no option)  write the JSON file
    --print      print the JSON on stdout instead
    --check      exit 1 with a diff when the checked-in file differs from what the parser gives

How FlexibleArgumentParser (vllm/utils/argparse_utils.py, 0.33.0) rewrites argv before argparse sees it,
checked in the source and, where it matters to the operator's guard, probed below (`_probe`):

- underscores: in a token starting with `--`, `_` becomes `-` between the `--` and the first `.` (and before
  the first `=`): `--max_num_seqs=5` is `--max-num-seqs=5`. Single-dash tokens are left alone.
- dotted JSON sub-keys: any token starting with `-` whose name (the part before `=`) holds a `.`:
  `--compilation-config.cudagraph_mode=NONE`, `-cc.cudagraph_mode NONE` (the next token is taken as the value,
  whatever it looks like), `--x.key+ a,b` (list items). The pieces are merged per key and appended at the END
  of argv as `--x '{"cudagraph_mode": "NONE"}'`, so they replace (not merge with) a plain `--x '{...}'`.
  Values are JSON, else a human-readable int (`80g`), else a string. Works for short options too.
- `-O`: a token starting with `-O` other than `-O` itself (`-O3`, `-Odecode`, `-O=3`, `-O.x`) becomes
  `--optimization-level <rest>`; `-O` followed by 0, 1, 2 or 3 becomes `--optimization-level`. There is no
  `-O` option string: a bare `-O` before anything else is an unrecognized argument.
- `--config FILE`: only an exact `--config` token: the YAML file's keys are spliced in as flags (between the
  model and the rest), so a file can set any option. `--config=FILE` only sets the `config` option.
- `--model X` / `--model=X` (exact token) is moved to the front as the positional model.
- `--help=<keyword>` becomes `--help` (help search); `--help` prints and exits.
- abbreviations: vLLM leaves argparse's `allow_abbrev` on (recorded below), so a unique prefix of a long option
  (`--max-num-se`) is that option and a prefix shared by several option strings is an "ambiguous option"
  error. argparse (Python 3.11) matches single-dash prefixes always (`-t` is `-tp` when no other single-dash
  option starts with `-t`) and lets a single-character option take its value glued on (`-n2`, `-r0`).
- `=`: `--flag=value` and `-x=value` are argparse's own; `--` ends the options (everything after it is
  positional), also argparse's own.
- BooleanOptionalAction is replaced by vLLM's EnableDisableAction: `--x` / `--no-x`, and for `--enable-x` also
  `--disable-x` (and the reverse); `--no-enable-x` / `--no-disable-x` stay registered but hidden from help.

Besides the options, the file records the enums the operator and the mock engine check values against, each
with its source in vLLM, and the Prometheus histogram bucket families and two default bucket lists.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import json
import os
import sys
import typing
from pathlib import Path

# The parser needs a platform to compute defaults; the CPU one is what this machine-independent table needs.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

OUT = Path(__file__).resolve().parents[3] / "operator" / "flashserve" / "facts" / "vllm_flags.json"

# argparse `type` callables, by the name of the innermost function, to the kind of value they accept.
_TYPE_KINDS = {
    "int": "int",
    "float": "float",
    "str": "str",
    "loads": "json",
    "parse_dataclass": "json",
    "union_dict_and_str": "json_or_str",
    "human_readable_int": "human_int",
    "human_readable_int_or_auto": "human_int_or_auto",
    "parse_reasoning_parser": "str",
}


def build_serve_parser():
    """The `vllm serve` subparser and its top-level parser, as vllm/entrypoints/cli/main.py builds them."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand().subparser_init(subparsers)
    return top, serve


def _value_kind(action: argparse.Action) -> tuple[str | None, bool]:
    """(kind of value, whether "None" / "" mean unset) for an action's `type`."""
    fn, optional = action.type, False
    while fn is not None and getattr(fn, "__name__", "") in ("_optional_type", "_parse_type") and fn.__closure__:
        optional |= fn.__name__ == "_optional_type"
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
        fn = cells.get("return_type")
    if fn is None:
        return (None if action.nargs == 0 else "str"), optional
    return _TYPE_KINDS.get(getattr(fn, "__name__", ""), "other"), optional


def _nargs(action: argparse.Action) -> str:
    return {None: "1", 0: "0"}.get(action.nargs, str(action.nargs))


def _jsonable(value):
    if isinstance(value, enum.Enum):
        return value.name
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def table(top, serve) -> dict:
    """The data file's content."""
    import vllm
    import vllm.envs as vllm_envs
    from vllm.config.cache import CacheDType
    from vllm.config.compilation import CUDAGraphMode
    from vllm.model_executor.model_loader import LoadFormats
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.metrics import buckets

    groups = {id(a): g.title for g in serve._action_groups for a in g._group_actions}
    strings: dict[int, list[str]] = {}
    for opt, action in serve._option_string_actions.items():
        strings.setdefault(id(action), []).append(opt)
    options = []
    for action in serve._actions:
        if not action.option_strings:
            continue
        kind, optional = _value_kind(action)
        registered = strings[id(action)]
        # the action's own list first (canonical spelling first), then the hidden ones argparse still matches
        flags = [s for s in action.option_strings if s in registered]
        flags += sorted(s for s in registered if s not in flags)
        row = {
            "dest": action.dest,
            "flags": flags,
            "nargs": _nargs(action),
            "action": type(action).__name__,
            "group": groups.get(id(action)),
        }
        negative = sorted(getattr(action, "negative_option_strings", None) or ())
        if negative:
            row["negative"] = negative
        if action.nargs != 0:
            row["value"] = kind
            if optional:
                row["none_allowed"] = True
        if action.choices is not None:
            row["choices"] = [_jsonable(c) for c in action.choices]
        if action in getattr(serve, "_deprecated", ()):
            row["deprecated"] = True
        options.append(row)
    options.sort(key=lambda r: (r["dest"], r["flags"][0]))
    positionals = [{"dest": a.dest, "nargs": _nargs(a)} for a in serve._actions if not a.option_strings]
    all2all = next(a for a in serve._actions if a.dest == "all2all_backend")
    return {
        "generated_by": "tools/vllm-contract/harness/gen_flags.py",
        "vllm_version": vllm.__version__,
        "python": "%d.%d" % sys.version_info[:2],
        "parser": {"prog": "vllm serve", "allow_abbrev": serve.allow_abbrev, "prefix_chars": serve.prefix_chars},
        "positionals": positionals,
        "options": options,
        "enums": {
            "all2all_backend": {
                "source": "choices of --all2all-backend",
                "values": [_jsonable(c) for c in all2all.choices],
            },
            "attention_backend": {
                "source": "vllm.v1.attention.backends.registry.AttentionBackendEnum (--attention-backend takes a "
                "member name; the parser has no choices)",
                "values": [m.name for m in AttentionBackendEnum],
            },
            "cudagraph_mode": {
                "source": "vllm.config.compilation.CUDAGraphMode (compilation_config.cudagraph_mode)",
                "values": [m.name for m in CUDAGraphMode],
            },
            "kv_cache_dtype": {
                "source": "vllm.config.cache.CacheDType (--kv-cache-dtype is a plain string in the parser)",
                "values": list(typing.get_args(CacheDType)),
            },
            "load_format": {
                "source": "vllm.model_executor.model_loader.LoadFormats (--load-format is a plain string in the "
                "parser; get_model_loader refuses other values unless a plugin registers them)",
                "values": list(typing.get_args(LoadFormats)),
            },
            "deep_gemm_warmup": {
                "source": "vllm.envs VLLM_DEEP_GEMM_WARMUP (env_with_choices: the engine refuses other values)",
                "values": _env_choices(vllm_envs, "VLLM_DEEP_GEMM_WARMUP"),
            },
        },
        "metrics": {
            "source": "vllm.v1.metrics.buckets",
            "histogram_families": list(typing.get_args(buckets.BucketFamilyKey)),
            "default_ttft_buckets": list(buckets.TIME_TO_FIRST_TOKEN_BUCKETS),
            "default_itl_buckets": list(buckets.INTER_TOKEN_LATENCY_BUCKETS),
        },
    }


def _env_choices(vllm_envs, name: str) -> list[str]:
    """The choices of an environment variable vLLM reads through envs.env_with_choices, from its closure."""
    getter = vllm_envs.environment_variables[name]
    cells = dict(zip(getter.__code__.co_freevars, (c.cell_contents for c in getter.__closure__ or ())))
    choices = cells["choices"]
    return list(choices() if callable(choices) else choices)


def _probe(top) -> None:
    """Fails loudly when vLLM's pre-processing stops doing what the docstring (and the operator's guard) says."""
    def parse(*argv):
        return top.parse_args(["serve", "m", *argv])

    assert parse("--max_num_seqs=5").max_num_seqs == 5, "underscore spelling"
    assert parse("--max-num-se", "6").max_num_seqs == 6, "abbreviation of a long option"
    assert parse("-t", "2").tensor_parallel_size == 2, "single-dash prefix"
    assert parse("-n2").nnodes == 2, "single-character option with its value glued on"
    assert parse("-O3").optimization_level == "3" and parse("-O", "2").optimization_level == "2", "-O forms"
    cc = parse("-cc.cudagraph_mode=NONE").compilation_config
    assert str(cc.cudagraph_mode).endswith("NONE"), "dotted sub-key on a short option"
    sc = parse("--speculative-config", '{"method": "mtp"}', "--speculative-config.num_speculative_tokens", "2")
    assert sc.speculative_config == {"num_speculative_tokens": 2}, "dotted keys replace the plain JSON value"
    assert top.parse_args(["serve", "--port", "9", "--model", "x"]).model_tag == "x", "--model moves to the front"
    assert parse("--disable-expert-parallel").enable_expert_parallel is False, "--disable- negation"
    assert parse("--no-enable-expert-parallel").enable_expert_parallel is False, "hidden --no- negation"


def render(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode not in ("", "--print", "--check"):
        print(__doc__, file=sys.stderr)
        return 2
    top, serve = build_serve_parser()
    _probe(top)
    text = render(table(top, serve))
    if mode == "--print":
        sys.stdout.write(text)
    elif mode == "--check":
        old = OUT.read_text() if OUT.exists() else ""
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                       str(OUT.name), "vllm serve parser"))
            return 1
    else:
        OUT.write_text(text)
        print(f"wrote {OUT.name}: {len(json.loads(text)['options'])} options", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
