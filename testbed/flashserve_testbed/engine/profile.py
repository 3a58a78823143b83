"""Calibration profiles: the hardware-and-model numbers the engine model runs on, kept as YAML data.

A profile describes one vLLM replica (one `vllm serve` group) of DeepSeek-V4.1-Flash on a given machine. The
model simulates each data-parallel engine (one per GPU) separately, so the step-time coefficients and the KV
capacity are per engine; `gpus_per_replica` and the start-up distribution are per replica.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "gb200-4gpu"
GIB = 1024**3


@dataclass(frozen=True)
class StepTime:
    """t = fixed + per_decode_token * decode_tokens + per_context_token * context + per_prefill_token * prefill.

    decode_tokens counts every token a decoding sequence feeds the model in a step, i.e. 1 + the number of
    speculative (MTP draft) tokens it verifies.
    """

    fixed_s: float
    per_decode_token_s: float
    per_context_token_s: float
    per_prefill_token_s: float

    def seconds(self, decode_tokens: float, context_tokens: float, prefill_tokens: float) -> float:
        return (
            self.fixed_s
            + self.per_decode_token_s * decode_tokens
            + self.per_context_token_s * context_tokens
            + self.per_prefill_token_s * prefill_tokens
        )


@dataclass(frozen=True)
class LogNormal:
    median: float
    sigma: float
    minimum: float = 1.0
    maximum: float = math.inf

    def draw(self, rng: random.Random) -> float:
        value = self.median * math.exp(rng.gauss(0.0, self.sigma)) if self.sigma > 0 else self.median
        return min(self.maximum, max(self.minimum, value))

    @property
    def mean(self) -> float:
        """Mean of the untruncated distribution (the YAML comments quote it)."""
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True)
class Workload:
    """The agentic traffic the default profile was fitted on; the curve tool and the tests replay it."""

    output_tokens: LogNormal
    shared_system_prompt_tokens: int
    first_turn_tokens: LogNormal
    tool_result_tokens: LogNormal
    session_context_limit: tuple[int, int]


@dataclass(frozen=True)
class Calibration:
    low_concurrency_tokens_per_s: float
    sla_tokens_per_s: float
    throughput_per_gpu_at_sla: float
    prompt_per_output_token: float
    cached_prompt_fraction: float
    # True: the targets are public measurements the step-time coefficients were fitted to. False: they are
    # what this profile's coefficients produce on the workload (derived from another profile), kept so the
    # tests notice when the model drifts.
    fitted: bool = True


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpu_product: str
    gpus_per_replica: int
    nodes_per_replica: int
    engines_per_replica: int
    gpu_memory_gib: float
    non_kv_memory_gib: float
    kv_bytes_per_token: int
    step: StepTime
    mtp_acceptance: tuple[float, ...]
    mtp_acceptance_spread: float
    calibrated_spec_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    gpu_memory_utilization: float
    startup: LogNormal
    workload: Workload
    calibration: Calibration
    source: str = field(default="", compare=False)

    def kv_blocks(self, gpu_memory_utilization: float | None = None, block_size: int | None = None) -> int:
        """KV-cache blocks of one engine: what vLLM's memory profiler would find after weights and activations."""
        util = self.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
        bs = block_size or self.block_size
        free = util * self.gpu_memory_gib * GIB - self.non_kv_memory_gib * GIB
        if free <= 0:
            raise ValueError(
                f"gpu-memory-utilization {util} leaves no room for the KV cache on {self.gpu_product} "
                f"({self.non_kv_memory_gib} GiB of weights and activations)"
            )
        return int(free // (self.kv_bytes_per_token * bs))

    def accepted_per_step(self, spec_tokens: int) -> float:
        """Mean tokens a decoding sequence gains per step with `spec_tokens` MTP drafts."""
        return 1.0 + sum(self.mtp_acceptance[: max(0, spec_tokens)])

    def draw_startup_seconds(self, rng: random.Random) -> float:
        return self.startup.draw(rng)


def _lognormal(d: dict) -> LogNormal:
    return LogNormal(
        median=float(d["median"]),
        sigma=float(d.get("sigma", 0.0)),
        minimum=float(d.get("min", 1.0)),
        maximum=float(d.get("max", math.inf)),
    )


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load(name_or_path: str | Path | None = None) -> Profile:
    """A profile by name (a file in profiles/) or by path; the default profile when None or empty."""
    ref = str(name_or_path or DEFAULT_PROFILE)
    path = Path(ref)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PROFILE_DIR / f"{ref}.yaml"
    if not path.exists():
        raise ValueError(f"unknown engine profile {ref!r}: use a path or one of {', '.join(available())}")
    doc = yaml.safe_load(path.read_text())
    hw, mem, st, spec, eng, wl, cal = (
        doc["hardware"],
        doc["memory"],
        doc["step_time"],
        doc["speculative"],
        doc["engine_defaults"],
        doc["workload"],
        doc["calibration"],
    )
    acceptance = tuple(float(x) for x in spec["acceptance_by_position"])
    if any(not 0.0 <= x <= 1.0 for x in acceptance):
        raise ValueError(f"{path}: acceptance_by_position must be within [0, 1]")
    return Profile(
        name=str(doc["name"]),
        description=str(doc.get("description", "")).strip(),
        gpu_product=str(hw["gpu_product"]),
        gpus_per_replica=int(hw["gpus_per_replica"]),
        nodes_per_replica=int(hw.get("nodes_per_replica", 1)),
        engines_per_replica=int(hw["engines_per_replica"]),
        gpu_memory_gib=float(mem["gpu_memory_gib"]),
        non_kv_memory_gib=float(mem["non_kv_memory_gib"]),
        kv_bytes_per_token=int(mem["kv_bytes_per_token"]),
        step=StepTime(
            fixed_s=float(st["fixed_ms"]) / 1e3,
            per_decode_token_s=float(st["per_decode_token_us"]) / 1e6,
            per_context_token_s=float(st["per_context_token_ns"]) / 1e9,
            per_prefill_token_s=float(st["per_prefill_token_us"]) / 1e6,
        ),
        mtp_acceptance=acceptance,
        mtp_acceptance_spread=float(spec.get("per_request_spread", 0.0)),
        calibrated_spec_tokens=int(spec["calibrated_num_speculative_tokens"]),
        max_num_seqs=int(eng["max_num_seqs"]),
        max_num_batched_tokens=int(eng["max_num_batched_tokens"]),
        max_model_len=int(eng["max_model_len"]),
        block_size=int(eng["block_size"]),
        gpu_memory_utilization=float(eng["gpu_memory_utilization"]),
        startup=_lognormal(doc["startup_seconds"]),
        workload=Workload(
            output_tokens=_lognormal(wl["output_tokens"]),
            shared_system_prompt_tokens=int(wl["shared_system_prompt_tokens"]),
            first_turn_tokens=_lognormal(wl["first_turn_tokens"]),
            tool_result_tokens=_lognormal(wl["tool_result_tokens"]),
            session_context_limit=(int(wl["session_context_limit"][0]), int(wl["session_context_limit"][1])),
        ),
        calibration=Calibration(
            low_concurrency_tokens_per_s=float(cal["low_concurrency_tokens_per_s"]),
            sla_tokens_per_s=float(cal["sla_tokens_per_s"]),
            throughput_per_gpu_at_sla=float(cal["throughput_per_gpu_at_sla"]),
            prompt_per_output_token=float(cal["prompt_per_output_token"]),
            cached_prompt_fraction=float(cal["cached_prompt_fraction"]),
            fitted=bool(cal.get("fitted", True)),
        ),
        source=str(path),
    )
