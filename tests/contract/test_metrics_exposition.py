"""The mock engine's `/metrics` against the real vLLM 0.33's, for the same rendered command line, and the SLA
speed reading on the real exposition.

The real side is vLLM's own `PrometheusStatLogger` in the contract venv, on the VllmConfig vLLM builds for the
argv on the stubbed Blackwell platform, with a few requests recorded through its API, written by
prometheus_client's `generate_latest` (tools/vllm-contract/harness/metrics_exposition.py). Compared per `vllm:`
family: type, HELP, and every series' name and label set, bucket bounds (`le`) and enumerated label values
(reasons, sources, sleep states, positions, `finished_reason`) included; sample values are not compared, nor
the values of `vllm:cache_config_info`'s labels (only their names; value differences are printed). The
`<family>_created` gauges prometheus_client adds in single-process mode are left out on both sides
(engine/metrics.py says why).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field

import pytest
from flashserve_testbed.bench.prom import bucket_quantile

from ..engine.conftest import start_mock
from .conftest import run_in_vllm
from .pods import engine_pods

pytestmark = pytest.mark.timeout(900)

SPECS = {
    "default": {},
    "ttft-sla": {"autoscaling": {"sla": {"ttftSeconds": 2}}},
    "b200-no-mtp": {"placement": {"accelerator": "B200"}, "engine": {"speculative": {"enabled": False}}},
    "no-mtp": {"engine": {"speculative": {"enabled": False}}},
}
TPOT = "vllm:request_time_per_output_token_seconds"
GEN = "vllm:request_generation_tokens"
ONE_TOKEN_SHARE = 0.31
LINE = re.compile(r"^([^\s{]+)(?:\{(.*)\})? (\S+)$")
PAIR = re.compile(r'([^=,]+)="((?:[^"\\]|\\.)*)"')


def pod(name: str) -> dict:
    """Pod 0 of the rendered serving: its exact argv after `vllm serve`, its environment, its accelerator."""
    cr = {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing", "metadata": {"name": "flash"},
          "spec": SPECS[name]}  # fmt: skip
    return engine_pods(cr)[0]


def argv(name: str) -> list[str]:
    return pod(name)["argv"]


def case(name: str, case_id: str, requests: list[list[float]]) -> dict:
    p = pod(name)
    return {"id": case_id, "argv": p["argv"], "env": p["env"], "accelerator": p["accelerator"], "requests": requests}


def request_mix(seed: int = 7, n: int = 1200, engines: int = 4) -> list[list[float]]:
    """[engine, output tokens, decode seconds]: ONE_TOKEN_SHARE one-token requests, the rest decoding at a
    spread of speeds around 100 tok/s (the default SLA, where the rendered buckets are finest)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if rng.random() < ONE_TOKEN_SHARE:
            out.append([i % engines, 1, 0.0])
        else:
            tokens = rng.randint(20, 400)
            tpot = math.exp(rng.gauss(math.log(0.0095), 0.18))
            out.append([i % engines, tokens, tpot * (tokens - 1)])
    return out


@dataclass
class Family:
    kind: str = ""
    help: str = ""
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    info_values: dict[str, set[str]] = field(default_factory=dict)


def families(text: str) -> dict[str, Family]:
    """`vllm:` families of an exposition: TYPE, HELP and the (sample name, labels) of every series. No vLLM
    family's name ends in `_created`: those are prometheus_client's creation-time gauges, left out."""
    out: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            _, what, name, rest = (line.split(" ", 3) + [""])[:4]
            if not name.startswith("vllm:") or name.endswith("_created"):
                continue
            fam = out.setdefault(name, Family())
            if what == "TYPE":
                fam.kind = rest
            elif what == "HELP":
                fam.help = rest
            continue
        m = LINE.match(line)
        if not m or not m.group(1).startswith("vllm:") or m.group(1).endswith("_created"):
            continue
        sample, labels = m.group(1), tuple(sorted(PAIR.findall(m.group(2) or "")))
        fam_name = _family_of(sample, out)
        if fam_name is None:
            raise AssertionError(f"a series before its family's TYPE line: {line}")
        fam = out[fam_name]
        if fam_name == "vllm:cache_config_info":
            for k, v in labels:
                fam.info_values.setdefault(k, set()).add(v)
            labels = tuple((k, v if k == "engine" else "") for k, v in labels)
        fam.series.add((sample, labels))
    return out


def _family_of(sample: str, fams: dict[str, Family]) -> str | None:
    if sample in fams:
        return sample
    for suffix in ("_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in fams:
            return sample[: -len(suffix)]
    return None


def diff(real: dict[str, Family], mock: dict[str, Family], limit: int = 12) -> list[str]:
    """Human-readable differences, real vLLM first; empty when the structures match."""
    lines: list[str] = []
    for name in sorted(set(real) - set(mock)):
        lines.append(f"missing in the mock: {name} ({real[name].kind}, {len(real[name].series)} series)")
    for name in sorted(set(mock) - set(real)):
        lines.append(f"not in vLLM: {name} ({mock[name].kind})")
    for name in sorted(set(real) & set(mock)):
        r, m = real[name], mock[name]
        if r.kind != m.kind:
            lines.append(f"{name}: type {m.kind!r} in the mock, {r.kind!r} in vLLM")
        if r.help != m.help:
            lines.append(f"{name}: HELP differs\n    vLLM: {r.help}\n    mock: {m.help}")
        label_names_r = {tuple(k for k, _ in labels) for _, labels in r.series}
        label_names_m = {tuple(k for k, _ in labels) for _, labels in m.series}
        if label_names_r != label_names_m:
            lines.append(f"{name}: label names {sorted(label_names_m)} in the mock, {sorted(label_names_r)} in vLLM")
        missing, extra = sorted(r.series - m.series), sorted(m.series - r.series)
        for what, items in (("missing in the mock", missing), ("not in vLLM", extra)):
            for sample, labels in items[:limit]:
                lines.append(f"{name}: series {what}: {sample}{{{_fmt(labels)}}}")
            if len(items) > limit:
                lines.append(f"{name}: ... {len(items) - limit} more series {what}")
    return lines


def _fmt(labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


@pytest.fixture(scope="module")
def real(vllm_python) -> dict[str, str]:
    """The real expositions: every spec of SPECS with two requests per case, and the request mix (`mix`) on
    an argv whose engine config vLLM builds. One vLLM process for all."""
    cases = [case(name, name, [[0, 1, 0.0], [0, 40, 0.4]]) for name in SPECS]
    cases.append(case("no-mtp", "mix", request_mix()))
    out = json.loads(run_in_vllm(vllm_python, "metrics_exposition.py", input=json.dumps(cases)))
    for name, result in out.items():
        print(f"{name}: the real logger ran on the {result['config']} config")
    return {name: result["text"] for name, result in out.items()}


def mock_exposition(args: list[str]) -> str:
    server = start_mock(args, FLASHSERVE_MOCK_STARTUP_SECONDS="0", FLASHSERVE_MOCK_SEED="1")
    try:
        server.wait_ready()
        status, text = server.get("/metrics")
        assert status == 200
        return text
    finally:
        server.stop()


@pytest.mark.parametrize("name", list(SPECS))
def test_mock_exports_what_vllm_exports_for_the_same_argv(real, name):
    want, got = families(real[name]), families(mock_exposition(argv(name)))
    problems = diff(want, got)
    info_r, info_m = want["vllm:cache_config_info"].info_values, got["vllm:cache_config_info"].info_values
    values = [f"  {k}: vLLM {sorted(info_r[k])} mock {sorted(info_m.get(k, set()))}"
              for k in sorted(info_r) if k != "engine" and info_r[k] != info_m.get(k)]  # fmt: skip
    report = "\n".join(problems) + ("\ncache_config_info values that differ (not a failure):\n" + "\n".join(values))
    print(f"{name}: {len(want)} vLLM families, {len(got)} in the mock; "
          f"cache_config_info labels: vLLM {len(info_r)}, mock {len(info_m)}\n{report}")  # fmt: skip
    assert not problems, f"the mock's /metrics differs from vLLM 0.33's for {name}:\n{report}"
    assert len(want) >= 35 and len(info_r) >= 30  # the comparison saw the whole exposition


def test_ttft_buckets_reach_vllm_around_the_ttft_target(real):
    les = set(re.findall(r'vllm:time_to_first_token_seconds_bucket\{engine="0",le="([^"]+)"', real["ttft-sla"]))
    assert {"1.9", "2.0", "2.1"} <= les and "1.9" not in real["default"]


def _buckets(text: str, name: str, le: str | None = None) -> dict[float, float]:
    """sum by (le) of a histogram's buckets over every engine (`le` given: that bucket only)."""
    out: dict[float, float] = {}
    for m in re.finditer(rf'^{re.escape(name)}_bucket\{{(.*)\}} (\S+)$', text, re.M):
        bound = dict(PAIR.findall(m.group(1)))["le"]
        if le is None or bound == le:
            key = math.inf if bound == "+Inf" else float(bound)
            out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def _quantile(buckets: dict[float, float], q: float, less: float = 0.0) -> float:
    bounds = sorted(buckets)
    cumulative = [buckets[b] - less for b in bounds]
    return bucket_quantile(q, tuple(b for b in bounds if b != math.inf), cumulative)


def test_speed_reading_is_not_biased_by_one_token_requests(real):
    # vLLM itself (stats.update_from_finished_request) put a TPOT of 0 in the lowest bucket per one-token request.
    text, mix = real["mix"], request_mix()
    decoded = sorted(d / (t - 1) for _, t, d in mix if t > 1)
    ones = sum(1 for _, t, _ in mix if t <= 1)
    tpot = _buckets(text, TPOT)
    one_token = sum(_buckets(text, GEN, le="1.0").values())
    assert tpot[math.inf] == len(mix) and one_token == ones  # every request observed; le="1.0" counts the zeros
    lowest = min(tpot)
    assert tpot[lowest] >= ones
    rows = []
    for q in (0.9, 0.5):
        true = decoded[math.ceil(q * len(decoded)) - 1]
        naive, ours = _quantile(tpot, q), _quantile(tpot, q, less=one_token)
        rows.append((q, true, naive, ours))
        print(f"q{q:g} TPOT over requests that decoded: true {true * 1e3:.3f} ms, naive {naive * 1e3:.3f} ms "
              f"({naive / true - 1:+.1%}; speed {true / naive - 1:+.1%}), ours {ours * 1e3:.3f} ms "
              f"({ours / true - 1:+.1%})")  # fmt: skip
        assert ours == pytest.approx(true, rel=0.03), (q, true, ours)
    (_, true90, naive90, _), (_, true50, naive50, _) = rows
    # naive: the zeros pull the quantiles down, the speed up (q0.9 -> the q0.855 of decoded requests, q0.5 -> q0.275)
    assert naive90 < true90 * 0.985 and naive50 < true50 * 0.92
