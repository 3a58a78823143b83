"""Reading a `vllm serve` command line the way vLLM 0.33's argument parser does, for the mock engine.

The options are those of the table in flashserve.facts.vllm_flags, written from vLLM's own parser: every option
string, alias, `--no-`/`--disable-` negation, unique prefix, underscore spelling, `=value`, `-O` form,
`--flag.key value` sub-key and `--config FILE` vLLM accepts is accepted, with vLLM's value types and choices;
anything else is an error with exit code 2, as argparse reports it. Options the mock does not model (GPU
kernels, most server knobs) are checked, then listed in `ignored`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field

import yaml
from flashserve.facts import vllm_flags
from flashserve.facts.vllm_flags import Option

from flashserve_testbed.engine.stats import validate_custom_buckets

USAGE = "usage: vllm serve MODEL [options]   (CPU mock of vLLM 0.33; see docs/engine-model.md)"
# Lower bounds the mock enforces, by dest (vLLM checks these later, in its config classes).
INT_MINIMUMS = {
    "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
    "data_parallel_size_local": 1, "data_parallel_start_rank": 0, "data_parallel_rpc_port": 1,
    "api_server_count": 0, "max_num_seqs": 1, "max_num_batched_tokens": 1, "block_size": 1,
    "port": 0, "dbo_decode_token_threshold": 0, "dbo_prefill_token_threshold": 0, "ubatch_size": 1,
}  # fmt: skip
# Values vLLM checks after parsing (the parser has no choices for these): the mock serves an MLA model.
CHOICES = {
    "attention_backend": vllm_flags.MLA_ATTENTION_BACKENDS,
    "kv_cache_dtype": vllm_flags.KV_CACHE_DTYPES,
}
# What the mock models; any other option given is checked and then listed as ignored.
MODELLED = frozenset({
    "host", "port", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
    "gpu_memory_utilization", "enable_prefix_caching", "enable_chunked_prefill", "speculative_config",
    "custom_histogram_buckets", "tensor_parallel_size", "data_parallel_size", "data_parallel_size_local",
    "data_parallel_start_rank", "data_parallel_hybrid_lb", "data_parallel_external_lb", "headless",
    "api_server_count", "seed", "served_model_name", "model", "config", "enable_scale_out",
})  # fmt: skip
# DeepSeek V4.1 checkpoints ship DSpark draft stages, no classic MTP head (vLLM 0.33 config/speculative.py).
SPEC_METHODS = ("dspark",)


class ArgsError(Exception):
    """A command line vLLM would refuse; the message reads like argparse's."""


class HelpRequested(Exception):
    pass


@dataclass
class ServeArgs:
    model: str
    served_model_names: list[str]
    host: str = "127.0.0.1"
    host_given: bool = False  # --host on the command line (without it a container binds every interface)
    port: int = 8000
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    custom_buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)
    tensor_parallel_size: int = 1
    dp_size: int = 1
    dp_local: int = 1
    dp_start_rank: int = 0
    hybrid_lb: bool = False
    external_lb: bool = False
    headless: bool = False
    seed: int | None = None
    # the render routes (/v1/chat/completions/render, ...) answer only with it (vLLM's scale_out factories)
    enable_scale_out: bool = False
    engine_ranks: list[int] = field(default_factory=lambda: [0])
    ignored: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    raw: dict[str, object] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The `model_name` metric label: vLLM uses the first served name."""
        return self.served_model_names[0]


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _human_int(flag: str, text: str) -> int | None:
    """vLLM's human-readable sizes: 32k = 32000, 32K = 32768, 1m / 1M likewise; `auto` means the model's."""
    if text == "auto":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text.strip())
    if not m:
        raise ArgsError(f"argument {flag}: invalid value {text!r} (an integer, e.g. 131072, 128k or 128K, or auto)")
    number, suffix = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30, "t": 10**12,
             "T": 2**40}[suffix]  # fmt: skip
    value = int(number * scale)
    if value < 1:
        raise ArgsError(f"argument {flag}: must be positive")
    return value


def _int(flag: str, text: str, dest: str | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgsError(f"argument {flag}: invalid int value: {text!r}") from None
    minimum = INT_MINIMUMS.get(dest or "")
    if minimum is not None and value < minimum:
        raise ArgsError(f"argument {flag}: must be >= {minimum}, got {value}")
    return value


def _json(flag: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ArgsError(f"argument {flag}: invalid JSON ({e.msg}): {text!r}") from None


def _check_value(option: Option, flag: str, text: str) -> None:
    """argparse's `type` and `choices` checks, with the kind of value the table records."""
    if option.none_allowed and text in ("", "None"):
        return
    kind = option.value
    if kind == "int":
        _int(flag, text)
    elif kind == "float":
        try:
            float(text)
        except ValueError:
            raise ArgsError(f"argument {flag}: invalid float value: {text!r}") from None
    elif kind in ("human_int", "human_int_or_auto"):
        if not (kind == "human_int_or_auto" and text in ("-1", "auto")):
            _human_int(flag, text)
    elif kind == "json" or (kind == "json_or_str" and text.lstrip().startswith("{")):
        _json(flag, text)
    if option.choices is not None:
        wanted = text.lower() if kind == "other" else text
        if wanted not in [str(c) for c in option.choices]:
            choices = ", ".join(repr(str(c)) for c in option.choices)
            raise ArgsError(f"argument {flag}: invalid choice: {text!r} (choose from {choices})")


def _sub_value(text: str) -> object:
    """A `--flag.key` value, as FlexibleArgumentParser reads it: JSON, else a human-readable int, else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return _human_int("", text) if re.fullmatch(r"\d+(\.\d+)?[kKmMgGtT]", text.strip()) else text
    except ArgsError:
        return text


def _pull_config(argv: list[str]) -> list[str]:
    """`--config FILE` (that exact item): the YAML file's keys become flags after the model, as vLLM does."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise ArgsError("No config file specified! Please check your command-line arguments.")
    path = argv[at + 1]
    if not path.endswith((".yaml", ".yml")):
        raise ArgsError(f"Config file must be of a yaml/yml type. {path.rsplit('.', 1)[-1]} supplied")
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except OSError as e:
        raise ArgsError(f"cannot read the config file {path}: {e.strerror}") from None
    pulled: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            if value:
                pulled.append(f"--{key}")
            elif f"--no-{key}" in vllm_flags.BY_FLAG:
                pulled.append(f"--no-{key}")
        elif isinstance(value, list):
            pulled += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            pulled += [f"--{key}", json.dumps(value)]
        else:
            pulled += [f"--{key}", str(value)]
    rest = argv[:at] + argv[at + 2 :]
    model = 1 if rest and not rest[0].startswith("-") else 0
    return rest[:model] + pulled + rest[model:]


def _is_value(token: str) -> bool:
    return vllm_flags.resolve(token).token.kind == "value"


def _set_nested(tree: dict, keys: list[str], value: object) -> None:
    for key in keys[:-1]:
        if not isinstance(tree.get(key), dict):
            tree[key] = {}
        tree = tree[key]
    if keys[-1].endswith("+"):  # `--x.key+ a,b` appends list items
        items = value.split(",") if isinstance(value, str) else [value]
        tree.setdefault(keys[-1][:-1], []).extend(items)
    else:
        tree[keys[-1]] = value


def parse(argv: list[str]) -> ServeArgs:
    """Parse the arguments after `serve` (MODEL and flags)."""
    argv = _pull_config(list(argv))
    values: dict[str, object] = {}
    sub_keys: dict[str, dict] = {}
    positionals: list[str] = []
    unknown: list[str] = []
    served: list[list[str]] = []
    given: list[Option] = []
    i = 0
    while i < len(argv):
        text = argv[i]
        i += 1
        res = vllm_flags.resolve(text)
        tok, option = res.token, res.option
        if tok.kind == "end":
            positionals += argv[i:]
            break
        if tok.kind == "value":
            positionals.append(text)
            continue
        if text == "-O" and (i >= len(argv) or argv[i] not in ("0", "1", "2", "3")):
            unknown.append(text)  # FlexibleArgumentParser rewrites `-O <level>` only for levels 0-3
            continue
        if option is None:
            if res.candidates:
                raise ArgsError(f"ambiguous option: {tok.key} could match {', '.join(res.candidates)}")
            unknown.append(text)
            if tok.inline is None and i < len(argv) and _is_value(argv[i]):
                i += 1  # skip its value too, so one error lists the unknown flags only
            continue
        flag = res.flag or option.name
        if option.dest == "help":
            raise HelpRequested()
        if option not in given:
            given.append(option)
        if tok.dotted is not None:
            if tok.inline is None:
                if i >= len(argv):
                    raise ArgsError(f"argument {flag}: expected a value for .{tok.dotted}")
                raw, i = argv[i], i + 1
            else:
                raw = tok.inline
            _set_nested(sub_keys.setdefault(option.dest, {}), tok.dotted.split("."), _sub_value(raw))
            continue
        inline = tok.inline if tok.inline is not None else res.glued
        if not option.takes_value:
            if inline is not None:
                raise ArgsError(f"argument {flag}: ignored explicit argument {inline!r}")
            values[option.dest] = flag not in option.negative
            continue
        if inline is not None:
            items = [inline]
        else:
            items = []
            while i < len(argv) and _is_value(argv[i]) and (option.nargs in ("+", "*") or not items):
                items.append(argv[i])
                i += 1
        if not items and option.nargs in ("1", "+"):
            raise ArgsError(f"argument {flag}: expected {'one argument' if option.nargs == '1' else 'at least one'}")
        for item in items:
            _check_value(option, flag, item)
        if option.dest == "served_model_name":
            served.append(items)
        elif option.dest == "model":
            positionals.insert(0, items[0])  # FlexibleArgumentParser moves `--model X` to the front
        elif option.nargs in ("+", "*"):
            values[option.dest] = items
        else:
            values[option.dest] = items[0] if items else True
    if unknown:
        raise ArgsError(f"unrecognized arguments: {' '.join(unknown)}")
    if not positionals:
        raise ArgsError("the following arguments are required: model_tag")
    if len(positionals) > 1:
        raise ArgsError(f"unrecognized arguments: {' '.join(positionals[1:])}")
    for dest, tree in sub_keys.items():
        # appended after every other item, as vLLM does: they replace a plain JSON value, they do not merge
        values[dest] = json.dumps(tree)
        option = vllm_flags.BY_DEST[dest]
        _check_value(option, option.name, values[dest])
    ignored = [o.name for o in given if o.dest not in MODELLED]
    return _build(positionals[0], values, served, ignored)


def _build(model: str, v: dict[str, object], served: list[list[str]], ignored: list[str]) -> ServeArgs:
    warnings: list[str] = []
    if len(served) > 1:
        # argparse keeps the last occurrence of a repeated option; vLLM's --served-model-name takes several
        # names after one flag instead
        warnings.append(
            "--served-model-name given more than once: only the last occurrence counts "
            f"({' '.join(served[-1])}); pass several names after one flag"
        )
    names = served[-1] if served else [model]
    a = ServeArgs(model=model, served_model_names=names, ignored=ignored, warnings=warnings, raw=dict(v))

    def get_int(dest: str) -> int | None:
        if dest not in v:
            return None
        option = vllm_flags.BY_DEST[dest]
        if option.value in ("human_int", "human_int_or_auto"):  # 8k, 8K
            return _int(option.name, str(_human_int(option.name, str(v[dest]))), dest)
        return _int(option.name, str(v[dest]), dest)

    if "host" in v:
        a.host = str(v["host"])
        a.host_given = True
    port = get_int("port")
    if port is not None:
        if port > 65535:
            raise ArgsError(f"argument --port: {port} is not a valid port")
        a.port = port
    a.max_num_seqs = get_int("max_num_seqs")
    a.max_num_batched_tokens = get_int("max_num_batched_tokens")
    a.block_size = get_int("block_size")
    if "max_model_len" in v:
        a.max_model_len = _human_int("--max-model-len", str(v["max_model_len"]))
    if "gpu_memory_utilization" in v:
        util = float(str(v["gpu_memory_utilization"]))
        if not 0 < util <= 1:
            raise ArgsError("argument --gpu-memory-utilization: must be in (0, 1]")
        a.gpu_memory_utilization = util
    if "enable_prefix_caching" in v:
        a.enable_prefix_caching = bool(v["enable_prefix_caching"])
    if "enable_chunked_prefill" in v:
        a.enable_chunked_prefill = bool(v["enable_chunked_prefill"])
    if "seed" in v:
        a.seed = get_int("seed")
    a.enable_scale_out = bool(v.get("enable_scale_out", False))
    for dest, choices in CHOICES.items():
        if dest in v and str(v[dest]) not in choices:
            flag = vllm_flags.BY_DEST[dest].name
            raise ArgsError(f"argument {flag}: invalid choice: {v[dest]!r} (choose from {', '.join(choices)})")
    if "compilation_config" in v:
        cc = _json("--compilation-config", str(v["compilation_config"]))
        if not isinstance(cc, dict):
            raise ArgsError("argument --compilation-config: must be a JSON object")
        mode = cc.get("cudagraph_mode")
        if mode is not None and str(mode).upper() not in vllm_flags.CUDAGRAPH_MODES:
            raise ArgsError(
                f"argument --compilation-config: unknown cudagraph_mode {mode!r} "
                f"(choose from {', '.join(vllm_flags.CUDAGRAPH_MODES)})"
            )
    if "eplb_config" in v and not isinstance(_json("--eplb-config", str(v["eplb_config"])), dict):
        raise ArgsError("argument --eplb-config: must be a JSON object")
    if "speculative_config" in v:
        spec = _json("--speculative-config", str(v["speculative_config"]))
        if not isinstance(spec, dict):
            raise ArgsError("argument --speculative-config: must be a JSON object")
        method = str(spec.get("method") or "")
        if method in ("mtp", "deepseek_mtp"):
            raise ArgsError(
                "argument --speculative-config: DeepSeek V4.1 has no classic-MTP draft: "
                "use speculative method 'dspark' instead of 'mtp'"
            )
        if method not in SPEC_METHODS:
            warnings.append(f"speculative method {method!r} is modelled with the profile's DSpark acceptance")
        n = spec.get("num_speculative_tokens", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ArgsError("argument --speculative-config: num_speculative_tokens must be a positive integer")
        a.num_speculative_tokens = n
        a.speculative_method = method
    if "custom_histogram_buckets" in v:
        try:
            raw = _json("--custom-histogram-buckets", str(v["custom_histogram_buckets"]))
            a.custom_buckets = validate_custom_buckets(raw)
        except ValueError as e:
            raise ArgsError(str(e)) from None
    _data_parallel(a, v, get_int)
    return a


def _data_parallel(a: ServeArgs, v: dict[str, object], get_int) -> None:
    """Which DP ranks this API server manages, hence the `engine` label values (vLLM 0.33 arg_utils and
    core_client: hybrid/external LB manage the local ranks from the start rank, internal LB all of them)."""
    a.tensor_parallel_size = get_int("tensor_parallel_size") or 1
    a.dp_size = get_int("data_parallel_size") or 1
    local = get_int("data_parallel_size_local")
    start = get_int("data_parallel_start_rank") or 0
    a.headless = bool(v.get("headless", False))
    a.hybrid_lb = bool(v.get("data_parallel_hybrid_lb", False))
    a.external_lb = bool(v.get("data_parallel_external_lb", False))
    if a.hybrid_lb and a.external_lb:
        raise ArgsError("--data-parallel-hybrid-lb and --data-parallel-external-lb cannot be used together")
    if a.headless and a.hybrid_lb:
        raise ArgsError("--data-parallel-hybrid-lb is not applicable with --headless")
    if a.headless and (get_int("api_server_count") or 0) > 0:
        raise ArgsError("--headless cannot be used with --api-server-count > 0")
    if a.external_lb:
        if local not in (None, 1):
            raise ArgsError("--data-parallel-size-local must be 1 with --data-parallel-external-lb")
        local = 1
    elif local is not None:
        if start and not a.headless:
            a.hybrid_lb = True  # vLLM infers hybrid load balancing from a non-zero start rank
        if a.hybrid_lb and local == 1:
            a.hybrid_lb, a.external_lb = False, True
        if local == a.dp_size:
            a.hybrid_lb = False
    else:
        if a.hybrid_lb:
            raise ArgsError("--data-parallel-size-local must be set to use --data-parallel-hybrid-lb")
        local = a.dp_size
    if local > a.dp_size:
        raise ArgsError(f"--data-parallel-size-local ({local}) exceeds --data-parallel-size ({a.dp_size})")
    if start + local > a.dp_size:
        raise ArgsError(
            f"--data-parallel-start-rank {start} + local size {local} exceeds --data-parallel-size {a.dp_size}"
        )
    a.dp_local, a.dp_start_rank = local, start
    managed = local if (a.hybrid_lb or a.external_lb) else a.dp_size
    a.engine_ranks = list(range(start, start + managed))
    if managed > local and not a.headless:
        a.warnings.append(
            f"internal load balancing over {a.dp_size} DP ranks with {local} on this node: this API server "
            f"fronts ranks {start}..{start + managed - 1}; the mock simulates all of them here"
        )


def check_host(host: str, allow_any: bool) -> str:
    """The address the mock binds: loopback unless explicitly allowed (a container image on kind)."""
    if _is_loopback(host) or allow_any:
        return host
    return "127.0.0.1"
