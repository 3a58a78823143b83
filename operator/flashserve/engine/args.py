"""Reading a `vllm serve` command line the way vLLM 0.33's argument parser does, for the mock engine.

Only flags in the shared table (flashserve.vllm_flags) are accepted; anything else is an error with exit code
2, as argparse reports unrecognised arguments. Flags marked GPU-only are validated where the table knows their
choices, then ignored. Underscores in flag names are read as dashes and `--flag.key value` sets one key of a
JSON-valued flag, as vLLM's FlexibleArgumentParser allows.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field

from flashserve import vllm_flags
from flashserve.engine.stats import validate_custom_buckets

USAGE = "usage: vllm serve MODEL [options]   (CPU mock of vLLM 0.33; see docs/engine-model.md)"
JSON_FLAGS = ("--speculative-config", "--compilation-config", "--eplb-config", "--custom-histogram-buckets")
INT_FLAGS = {
    "--tensor-parallel-size": 1, "--pipeline-parallel-size": 1, "--data-parallel-size": 1,
    "--data-parallel-size-local": 1, "--data-parallel-start-rank": 0, "--data-parallel-rpc-port": 1,
    "--api-server-count": 0, "--max-num-seqs": 1, "--max-num-batched-tokens": 1, "--block-size": 1,
    "--port": 0, "--seed": None, "--dbo-decode-token-threshold": 0, "--dbo-prefill-token-threshold": 0,
    "--ubatch-size": 1,
}
CHOICES = {
    "--all2all-backend": vllm_flags.ALL2ALL_BACKENDS,
    "--attention-backend": vllm_flags.MLA_ATTENTION_BACKENDS,
    "--kv-cache-dtype": vllm_flags.KV_CACHE_DTYPES,
}
SPEC_METHODS = ("mtp", "deepseek_mtp")


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
    engine_ranks: list[int] = field(default_factory=lambda: [0])
    ignored: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    raw: dict[str, object] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The `model_name` metric label: vLLM uses the first served name."""
        return self.served_model_names[0]


def _human_int(flag: str, text: str) -> int | None:
    """vLLM's human-readable sizes: 32k = 32000, 32K = 32768, 1m / 1M likewise; `auto` means the model's."""
    if text == "auto":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise ArgsError(f"argument {flag}: invalid value {text!r} (an integer, e.g. 131072, 128k or 128K, or auto)")
    number, suffix = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[suffix]
    value = int(number * scale)
    if value < 1:
        raise ArgsError(f"argument {flag}: must be positive")
    return value


def _int(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgsError(f"argument {flag}: invalid int value: {text!r}") from None
    minimum = INT_FLAGS.get(flag)
    if minimum is not None and value < minimum:
        raise ArgsError(f"argument {flag}: must be >= {minimum}, got {value}")
    return value


def _json(flag: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ArgsError(f"argument {flag}: invalid JSON ({e.msg}): {text!r}") from None


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse(argv: list[str]) -> ServeArgs:
    """Parse the arguments after `serve` (MODEL and flags)."""
    values: dict[str, object] = {}
    nested: dict[str, dict] = {}
    positionals: list[str] = []
    unknown: list[str] = []
    served: list[list[str]] = []
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok in ("-h", "--help"):
            raise HelpRequested()
        if not tok.startswith("-") or tok == "-" or re.fullmatch(r"-\d+(\.\d+)?", tok):
            positionals.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        key = None
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
            if "." in name:
                name, key = name.split(".", 1)
                key = key.replace("-", "_")
        flag = vllm_flags.lookup(name)
        if flag is None or (key is not None and flag.name not in JSON_FLAGS):
            unknown.append(tok)
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                i += 1  # skip its value too, so one error lists the unknown flags only
            continue
        canonical = flag.name
        if name.startswith("--no-"):
            if eq:
                raise ArgsError(f"argument {name}: ignored explicit argument {inline!r}")
            values[canonical] = False
            continue
        if not flag.takes_value:
            if eq:
                raise ArgsError(f"argument {name}: ignored explicit argument {inline!r}")
            values[canonical] = True
            if flag.gpu_only:
                ignored.append(canonical)
            continue
        if eq:
            value = inline
        elif i < len(argv) and (not argv[i].startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", argv[i])):
            value = argv[i]
            i += 1
        else:
            raise ArgsError(f"argument {name}: expected one argument")
        if canonical == "--served-model-name":
            names = [value]
            while not eq and i < len(argv) and not argv[i].startswith("-"):
                names.append(argv[i])
                i += 1
            served.append(names)
            continue
        if key is not None:
            nested.setdefault(canonical, {})[key] = _scalar(value)
            continue
        values[canonical] = value
        if flag.gpu_only and canonical not in ignored:
            ignored.append(canonical)
    if unknown:
        raise ArgsError(f"unrecognized arguments: {' '.join(unknown)}")
    if not positionals:
        raise ArgsError("the following arguments are required: model_tag")
    if len(positionals) > 1:
        raise ArgsError(f"unrecognized arguments: {' '.join(positionals[1:])}")
    for canonical, sub in nested.items():
        base = values.get(canonical)
        merged = _json(canonical, base) if isinstance(base, str) else {}
        if not isinstance(merged, dict):
            raise ArgsError(f"argument {canonical}: must be a JSON object")
        merged.update(sub)
        values[canonical] = json.dumps(merged)
    return _build(positionals[0], values, served, ignored)


def _scalar(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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

    def get_int(flag: str) -> int | None:
        return _int(flag, str(v[flag])) if flag in v else None

    if "--host" in v:
        a.host = str(v["--host"])
        a.host_given = True
    port = get_int("--port")
    if port is not None:
        if port > 65535:
            raise ArgsError(f"argument --port: {port} is not a valid port")
        a.port = port
    a.max_num_seqs = get_int("--max-num-seqs")
    a.max_num_batched_tokens = get_int("--max-num-batched-tokens")
    a.block_size = get_int("--block-size")
    if "--max-model-len" in v:
        a.max_model_len = _human_int("--max-model-len", str(v["--max-model-len"]))
    if "--gpu-memory-utilization" in v:
        try:
            util = float(str(v["--gpu-memory-utilization"]))
        except ValueError:
            raw = v["--gpu-memory-utilization"]
            raise ArgsError(f"argument --gpu-memory-utilization: invalid float value: {raw!r}") from None
        if not 0 < util <= 1:
            raise ArgsError("argument --gpu-memory-utilization: must be in (0, 1]")
        a.gpu_memory_utilization = util
    if "--enable-prefix-caching" in v:
        a.enable_prefix_caching = bool(v["--enable-prefix-caching"])
    if "--enable-chunked-prefill" in v:
        a.enable_chunked_prefill = bool(v["--enable-chunked-prefill"])
    if "--seed" in v:
        a.seed = get_int("--seed")
    for flag, choices in CHOICES.items():
        if flag in v and str(v[flag]) not in choices:
            raise ArgsError(f"argument {flag}: invalid choice: {v[flag]!r} (choose from {', '.join(choices)})")
    if "--compilation-config" in v:
        cc = _json("--compilation-config", str(v["--compilation-config"]))
        if not isinstance(cc, dict):
            raise ArgsError("argument --compilation-config: must be a JSON object")
        mode = cc.get("cudagraph_mode")
        if mode is not None and str(mode).upper() not in vllm_flags.CUDAGRAPH_MODES:
            raise ArgsError(
                f"argument --compilation-config: unknown cudagraph_mode {mode!r} "
                f"(choose from {', '.join(vllm_flags.CUDAGRAPH_MODES)})"
            )
    if "--eplb-config" in v and not isinstance(_json("--eplb-config", str(v["--eplb-config"])), dict):
        raise ArgsError("argument --eplb-config: must be a JSON object")
    if "--speculative-config" in v:
        spec = _json("--speculative-config", str(v["--speculative-config"]))
        if not isinstance(spec, dict):
            raise ArgsError("argument --speculative-config: must be a JSON object")
        method = str(spec.get("method") or "mtp")
        if method == "deepseek_mtp":
            warnings.append("method 'deepseek_mtp' is deprecated; use 'mtp'")
        elif method not in SPEC_METHODS:
            warnings.append(f"speculative method {method!r} is modelled with the profile's MTP acceptance")
        n = spec.get("num_speculative_tokens", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ArgsError("argument --speculative-config: num_speculative_tokens must be a positive integer")
        a.num_speculative_tokens = n
        a.speculative_method = method
    if "--custom-histogram-buckets" in v:
        try:
            raw = _json("--custom-histogram-buckets", str(v["--custom-histogram-buckets"]))
            a.custom_buckets = validate_custom_buckets(raw)
        except ValueError as e:
            raise ArgsError(str(e)) from None
    _data_parallel(a, v, get_int)
    return a


def _data_parallel(a: ServeArgs, v: dict[str, object], get_int) -> None:
    """Which DP ranks this API server manages, hence the `engine` label values (vLLM 0.33 arg_utils and
    core_client: hybrid/external LB manage the local ranks from the start rank, internal LB all of them)."""
    a.tensor_parallel_size = get_int("--tensor-parallel-size") or 1
    a.dp_size = get_int("--data-parallel-size") or 1
    local = get_int("--data-parallel-size-local")
    start = get_int("--data-parallel-start-rank") or 0
    a.headless = bool(v.get("--headless", False))
    a.hybrid_lb = bool(v.get("--data-parallel-hybrid-lb", False))
    a.external_lb = bool(v.get("--data-parallel-external-lb", False))
    if a.hybrid_lb and a.external_lb:
        raise ArgsError("--data-parallel-hybrid-lb and --data-parallel-external-lb cannot be used together")
    if a.headless and a.hybrid_lb:
        raise ArgsError("--data-parallel-hybrid-lb is not applicable with --headless")
    if a.headless and (get_int("--api-server-count") or 0) > 0:
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
