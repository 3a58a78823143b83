"""Performance model of one vLLM 0.33 engine (one data-parallel rank) serving DeepSeek-V4.1-Flash.

The model follows vLLM's v1 scheduler closely enough that its speed, queueing, KV pressure and prefix-cache
behaviour respond to load the way a real engine does:

* continuous batching under `max_num_seqs` and a per-step token budget (`max_num_batched_tokens`), decode
  tokens first, then chunked prefill of running requests, then new admissions in FCFS order;
* step time `t = fixed + b * decode_tokens + c * context_tokens + d * prefill_tokens` (see profile.StepTime);
* MTP speculative decoding: a decoding request gains `A` tokens per step on average (1 + accepted drafts),
  with a per-request acceptance drawn from the profile;
* a KV cache of fixed capacity in blocks, with recompute preemption of the most recently admitted request
  when a step cannot get the blocks it needs;
* a prefix cache keyed by chain hashes with LRU eviction of unreferenced blocks (prefixcache.py).

Time is virtual seconds supplied by the caller, so the same object runs under a discrete-event simulator
(`next_event_time()` / `advance(t)`) or under the HTTP server, which advances it to the scaled wall clock.
Between changes of batch composition the model advances whole runs of decode steps in O(1): every decoding
request shares the global step counter, its progress is `floor(A * steps)`, and context grows linearly, so
step times form an arithmetic progression that is summed and histogrammed in closed form. Per-request work
happens only when a request is admitted, changes phase, is preempted or finishes.

Known simplifications: DP ranks run independently (vLLM keeps MoE ranks in lock-step, so one rank's prefill
also slows the others); decode KV growth is accounted as a fluid (tokens/block_size + half a block per
sequence) rather than block by block; prefill attention cost over cached context is folded into the
per-prefill-token coefficient.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from flashserve_testbed.engine.prefixcache import PrefixCache
from flashserve_testbed.engine.profile import Profile
from flashserve_testbed.engine.stats import EngineStats, default_buckets
from flashserve_testbed.engine.tokenizer import id_block_hashes

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"
_EPS = 1e-9


@dataclass
class EngineConfig:
    """The `vllm serve` settings the model honours (per engine)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    num_speculative_tokens: int = 0
    cache_unit_tokens: int = 0  # 0: one cache key per KV block
    buckets: dict[str, tuple[float, ...]] | None = None

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "EngineConfig":
        block_size = overrides.pop("block_size", None) or profile.block_size
        util = overrides.pop("gpu_memory_utilization", None)
        cfg = cls(
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            max_model_len=profile.max_model_len,
            block_size=block_size,
            num_blocks=profile.kv_blocks(util, block_size),
            num_speculative_tokens=profile.calibrated_spec_tokens,
        )
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise TypeError(f"unknown engine setting {key!r}")
            setattr(cfg, key, value)
        return cfg


class Request:
    """One request inside the engine. Times are virtual seconds; None until they happen."""

    __slots__ = (
        "rid", "prompt_len", "output_len", "max_tokens", "finish_reason", "keys", "arrival", "accept",
        "state", "computed", "target", "chunk", "emitted", "held", "private", "start_step", "ctx0",
        "finish_step", "gen", "num_preemptions", "cached_tokens", "prefill_computed", "first_scheduled",
        "first_token", "last_token", "finish_time", "user", "tail", "shared",
    )

    def __init__(self, rid, prompt_len: int, output_len: int, max_tokens: int | None, finish_reason: str,
                 keys: list[int], arrival: float, accept: float, user=None) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.max_tokens = max_tokens
        self.finish_reason = finish_reason
        self.keys = keys
        self.arrival = arrival
        self.accept = accept  # mean tokens gained per decode step
        self.state = WAITING
        self.computed = 0  # tokens whose KV is computed (prefill progress)
        self.target = prompt_len  # tokens to compute before the next sample (prompt + output after preemption)
        self.chunk = 0  # prefill tokens scheduled in the current round
        self.emitted = 0  # output tokens banked (not counting the current decode run)
        self.held = 0  # leading cache keys this request references
        self.private = 0.0  # KV blocks outside the prefix cache (prefill phase only; decode is fluid)
        self.start_step = 0
        self.ctx0 = 0.0
        self.finish_step = 0
        self.gen = 0
        self.num_preemptions = 0
        self.cached_tokens = 0
        self.prefill_computed = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish_time: float | None = None
        self.user = user  # free slot for the caller (e.g. the HTTP stream)
        self.tail: int | None = None  # key of the unit its content ends inside (coarse units only)
        self.shared = 0  # leading prompt tokens every request with the same leading keys has (coarse units only)

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def tokens_per_second(self) -> float | None:
        """Per-user decode speed the way benchmarks report it: (tokens - 1) / (last - first token)."""
        if self.first_token is None or self.finish_time is None or self.emitted < 2:
            return None
        span = self.finish_time - self.first_token
        return (self.emitted - 1) / span if span > 0 else None

    def __repr__(self) -> str:
        return f"Request({self.rid!r}, {self.state}, prompt={self.prompt_len}, out={self.emitted}/{self.output_len})"


@dataclass
class Snapshot:
    time: float
    running: int
    waiting: int
    decoding: int
    kv_usage: float
    kv_blocks: int
    prompt_tokens: int
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    finished: int
    cached_blocks: float = field(default=0.0)


@dataclass
class _Round:
    steps: int
    first: float  # duration of the first step
    growth: float  # each further step is this much longer (context grows)
    prefill: bool


class Engine:
    def __init__(self, profile: Profile, seed: int = 0, config: EngineConfig | None = None) -> None:
        self.profile = profile
        self.cfg = cfg = config or EngineConfig.from_profile(profile)
        if cfg.max_model_len > cfg.num_blocks * cfg.block_size:
            raise ValueError(
                f"max_model_len {cfg.max_model_len} needs more KV cache than one engine has "
                f"({cfg.num_blocks} blocks of {cfg.block_size} tokens); lower --max-model-len"
            )
        self.rng = random.Random(seed)
        self.step_model = profile.step
        self.spec = max(0, cfg.num_speculative_tokens)
        self.acceptance = profile.mtp_acceptance[: self.spec]
        self.bs = cfg.block_size
        unit = cfg.cache_unit_tokens or cfg.block_size
        if unit % cfg.block_size:
            raise ValueError("cache_unit_tokens must be a multiple of the block size")
        self.unit = unit
        self.caching = cfg.enable_prefix_caching
        self.cache = PrefixCache(weight=unit / cfg.block_size)
        self.stats = EngineStats({**default_buckets(cfg.max_model_len), **(cfg.buckets or {})})

        self.t = 0.0  # time of the last step boundary
        self.step = 0  # global decode step counter
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order; the last one is preempted first
        self.prefilling: list[Request] = []
        self._heap: list[tuple[int, int, int, Request]] = []
        self._seq = 0
        self._salt = 0
        # decoder aggregates (fluid)
        self.n_dec = 0
        self.sum_accept = 0.0
        self.ctx_base = 0.0  # sum over decoders of ctx0 - accept * start_step
        self.sum_start = 0  # sum of start_step
        self.dec_held_blocks = 0.0
        self.pre_private = 0.0
        self._round: _Round | None = None
        self._finished: list[Request] = []
        self.finished_count = 0
        self.accepted_done = 0  # accepted draft tokens of decode runs already closed

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        rid,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        *,
        block_hashes: Sequence[int] | None = None,
        hash_unit_tokens: int | None = None,
        hashes_cover_output: bool = False,
        hashes_chained: bool = False,
        token_ids: Sequence[int] | None = None,
        max_tokens: int | None = None,
        finish_reason: str | None = None,
        user=None,
        shared_prefix_tokens: int = 0,
    ) -> Request:
        """Queue a request arriving at `now`.

        `block_hashes` identify the prompt's blocks of `hash_unit_tokens` tokens (default: the cache unit),
        as token-block hashes or Mooncake `hash_ids`; `hashes_cover_output` says they also cover the output
        the request will produce (the HTTP server knows its synthetic output in advance, so the next turn of
        a conversation hits the cache on it). `hashes_chained` says each hash already identifies its whole
        prefix (saves re-chaining them). Alternatively `token_ids` gives the prompt's token ids (optionally
        followed by the output's) and the engine hashes their blocks itself. Without either the request shares
        nothing with others.

        With a cache unit coarser than the KV block, the KV blocks past a request's last full unit are kept
        too (vLLM caches every full block): one chained key past the full units names the unit the request's
        content ends inside, and a later request with that key there finds them; `shared_prefix_tokens` says
        how many leading prompt tokens every request with the same leading keys has (a shared system prompt
        ending inside a unit), so a request continuing differently still finds that prompt's blocks.
        """
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        if prompt_tokens + output_tokens > self.cfg.max_model_len:
            raise ValueError(
                f"prompt ({prompt_tokens}) + output ({output_tokens}) tokens exceed max_model_len "
                f"{self.cfg.max_model_len}"
            )
        self._advance(now)
        if token_ids is not None and self.caching:
            block_hashes = id_block_hashes(token_ids, self.unit)
            hash_unit_tokens, hashes_chained = self.unit, True
            hashes_cover_output = len(token_ids) >= prompt_tokens + output_tokens
        keys = self._keys(
            prompt_tokens, output_tokens, block_hashes, hash_unit_tokens, hashes_cover_output, hashes_chained
        )
        reason = finish_reason or ("length" if max_tokens is not None and output_tokens >= max_tokens else "stop")
        req = Request(rid, prompt_tokens, output_tokens, max_tokens, reason, keys, now, self._draw_accept(), user)
        if self.unit > self.bs and hashes_chained and block_hashes and (hash_unit_tokens or self.unit) == self.unit:
            # One chained key past the full units is the unit this request's content ends inside: what it
            # computes of it is found by the next request whose key there is the same (its next turn).
            n = (prompt_tokens + output_tokens if hashes_cover_output else prompt_tokens) // self.unit
            if n == len(keys) and len(block_hashes) > n:
                req.tail = block_hashes[n]
        if self.unit > self.bs and shared_prefix_tokens % self.unit >= self.bs:
            req.shared = min(shared_prefix_tokens, prompt_tokens)
        self.waiting.append(req)
        rnd = self._round
        if rnd is not None and not rnd.prefill and self.waiting[0] is req:
            # a decode run was planned without this arrival: end it at the first boundary after `now`
            rnd.steps = min(rnd.steps, self._steps_to_reach(rnd, now))
        return req

    def abort(self, req: Request, now: float) -> None:
        """Drop a request (client went away); its blocks go back to the cache."""
        self._advance(now)
        if req.state == FINISHED:
            return
        if req.state == WAITING:
            self.waiting.remove(req)
            req.finish_reason = "abort"
            self._close(req, self.t)
            return
        req.finish_reason = "abort"
        self._leave_running(req)
        self._close(req, self.t)
        self._round = None

    # ------------------------------------------------------------------ time
    def next_event_time(self) -> float | None:
        """End of the round in progress (a completion, a prefill chunk, or an arrival's admission point);
        None when idle with nothing queued."""
        if self._round is None:
            self._round = self._plan()
        if self._round is None:
            return None
        return self.t + _duration(self._round, self._round.steps)

    def advance(self, until: float) -> list[Request]:
        """Run every step that ends by `until`; returns the requests that finished since the last call
        (including any finished while `add_request`/`abort` moved the clock)."""
        self._advance(until)
        out, self._finished = self._finished, []
        return out

    def _advance(self, until: float) -> None:
        while True:
            if self._round is None:
                self._round = self._plan()
                if self._round is None:
                    self.t = max(self.t, until)
                    break
            rnd = self._round
            done = _steps_within(rnd, until - self.t)
            if done < rnd.steps:
                if done:
                    self._run_decode(rnd, done)
                    rnd.first += rnd.growth * done
                    rnd.steps -= done
                break
            self._complete(rnd)
            self._round = None

    # ------------------------------------------------------------------ views
    def emitted(self, req: Request) -> int:
        """Output tokens `req` has produced so far."""
        if req.state == DECODE:
            return min(req.output_len, req.emitted + int(req.accept * (self.step - req.start_step) + _EPS))
        return req.emitted

    def kv_blocks_used(self) -> float:
        return self.cache.held_blocks + self.pre_private + self._dec_private(self.step)

    def generation_tokens(self) -> int:
        live = 0
        for r in self.running:
            if r.state == DECODE:
                live += self.emitted(r) - r.emitted
        return self.stats.generation_tokens_done + live

    def spec_counters(self) -> tuple[int, int, int, list[int]]:
        """(drafts, draft tokens, accepted tokens, accepted per position) as vLLM counts them."""
        if not self.spec:
            return 0, 0, 0, []
        live_steps = self.n_dec * self.step - self.sum_start
        drafts = self.stats.spec_drafts_done + live_steps
        accepted = self.accepted_done
        for r in self.running:
            if r.state == DECODE:
                steps = self.step - r.start_step
                accepted += min(r.output_len, r.emitted + int(r.accept * steps + _EPS)) - r.emitted - steps
        accepted = max(0, accepted)
        total_rate = sum(self.acceptance) or 1.0
        per_pos = [round(accepted * a / total_rate) for a in self.acceptance]
        return drafts, drafts * self.spec, accepted, per_pos

    def snapshot(self) -> Snapshot:
        """O(1) view for schedulers and routers (generation_tokens() is the exact, O(batch) counter)."""
        used = self.kv_blocks_used()
        return Snapshot(
            time=self.t,
            running=len(self.running),
            waiting=len(self.waiting),
            decoding=self.n_dec,
            kv_usage=min(1.0, max(0.0, used / self.cfg.num_blocks)),
            kv_blocks=self.cfg.num_blocks,
            prompt_tokens=self.stats.prompt_tokens,
            prefix_queries=self.stats.prefix_queries,
            prefix_hits=self.stats.prefix_hits,
            preemptions=self.stats.preemptions,
            finished=self.finished_count,
            cached_blocks=self.cache.free_blocks,
        )

    def load_score(self) -> int:
        """vLLM's DP load-balancing score: waiting requests weigh four times running ones."""
        return 4 * len(self.waiting) + len(self.running)

    def cached_prefix_units(self, keys: Sequence[int]) -> int:
        """How many leading cache keys of a would-be request are cached here (for prefix-aware routing)."""
        return self.cache.match(keys, len(keys)) if self.caching else 0

    # ------------------------------------------------------------------ internals: keys
    def _keys(self, prompt, output, hashes, unit_tokens, cover_output, chained) -> list[int]:
        if not self.caching:
            return []
        unit = self.unit
        total_units = (prompt + output) // unit
        covered_tokens = prompt + output if cover_output else prompt
        keys: list[int] = []
        if hashes:
            h_unit = unit_tokens or unit
            # only hashes of blocks that are full within what they cover identify content this engine caches
            hashes = hashes[: covered_tokens // h_unit]
            if not chained:
                chained, prev = [], 0
                for h in hashes:
                    prev = hash((prev, h))
                    chained.append(prev)
            else:
                chained = list(hashes)
            if h_unit == unit:
                keys = chained
            elif h_unit % unit == 0:
                m = h_unit // unit
                keys = [hash((k, j)) for k in chained for j in range(m)]
            elif unit % h_unit == 0:
                m = unit // h_unit
                keys = chained[m - 1 :: m]
            else:
                raise ValueError(f"hash unit {h_unit} tokens does not divide or multiply the cache unit {unit}")
            keys = keys[:total_units]
        if len(keys) < total_units:
            # the rest is private to this request (a fresh prompt or its own output): unique keys, so that a
            # preempted request still finds its own blocks when it is recomputed
            self._salt += 1
            prev = hash(("private", self._salt, keys[-1] if keys else 0))
            for j in range(total_units - len(keys)):
                keys.append(hash((prev, j)))
        return keys

    def _draw_accept(self) -> float:
        if not self.spec:
            return 1.0
        spread = self.profile.mtp_acceptance_spread
        scale = min(1.5, max(0.5, self.rng.gauss(1.0, spread))) if spread > 0 else 1.0
        return 1.0 + sum(min(1.0, a * scale) for a in self.acceptance)

    # ------------------------------------------------------------------ internals: KV accounting
    def _dec_private(self, step: int) -> float:
        if not self.n_dec:
            return 0.0
        tokens = self.ctx_base + self.sum_accept * step + self.n_dec * self.spec
        return tokens / self.bs + 0.5 * self.n_dec - self.dec_held_blocks

    def _reserve(self, blocks: float) -> bool:
        """Make `blocks` free KV blocks available, evicting unreferenced cached blocks if needed."""
        if blocks <= 0:
            return True
        used = self.kv_blocks_used()
        spare = self.cfg.num_blocks - used - self.cache.free_blocks
        if blocks <= spare + _EPS:
            return True
        if blocks <= self.cfg.num_blocks - used + _EPS:
            self.cache.evict(blocks - spare)
            return True
        return False

    def _cache_computed(self, req: Request, tokens_with_kv: int) -> None:
        """Reference the cache keys of every unit whose KV `req` has fully computed."""
        if not self.caching:
            return
        full = min(tokens_with_kv // self.unit, len(req.keys))
        if full > req.held:
            self.cache.acquire(req.keys[req.held : full])
            req.held = full

    # ------------------------------------------------------------------ internals: scheduling
    def _plan(self) -> _Round | None:
        """Schedule the next step(s) at boundary self.t, as vLLM's scheduler would."""
        cfg, t = self.cfg, self.t
        k1 = 1 + self.spec
        # 1. running decodes need room for next step's tokens
        grow = self.sum_accept / self.bs
        preempted = False
        while self.n_dec and not self._reserve(grow):
            self._preempt(self.running[-1])
            preempted = True
            grow = self.sum_accept / self.bs
        budget = cfg.max_num_batched_tokens - self.n_dec * k1
        prefill_tokens = 0
        # 2. running requests still in prefill, in admission order
        for req in list(self.prefilling):
            if req.state != PREFILL:
                continue  # preempted by an earlier request of this loop
            req.chunk = 0
            if budget <= 0:
                continue
            chunk = min(req.target - req.computed, budget)
            need = math.ceil((req.computed + chunk) / self.bs) - self.cache.weight * req.held - req.private
            while not self._reserve(need + grow):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                grow = self.sum_accept / self.bs
                if victim is req:
                    break
            if req.state != PREFILL:
                break
            req.private += max(0.0, need)
            self.pre_private += max(0.0, need)
            req.chunk = chunk
            budget -= chunk
            prefill_tokens += chunk
        # 3. admit waiting requests (not in a step that had to preempt, as vLLM's scheduler)
        while not preempted and self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            req = self.waiting[0]
            if req.arrival > t:
                break
            hit_units = 0
            if self.caching:
                hit_units = self.cache.match(req.keys, (req.target - 1) // self.unit)
            hit = hit_units * self.unit
            if hit_units and (self.cache.tails or self.cache.shared):
                hit = self._tail_hit(req, hit_units, hit)
            remaining = req.target - hit
            if not cfg.enable_chunked_prefill and remaining > budget and self.running:
                break
            chunk = remaining if not cfg.enable_chunked_prefill else min(remaining, budget)
            if hit_units:
                self.cache.acquire(req.keys[:hit_units])
            need = math.ceil((hit + chunk) / self.bs) - self.cache.weight * hit_units
            if not self._reserve(need + grow):
                if hit_units:
                    self.cache.release(req.keys[:hit_units])
                break
            self.waiting.popleft()
            req.held = hit_units
            req.computed = hit
            req.private = need
            self.pre_private += need
            req.chunk = chunk
            req.state = PREFILL
            budget -= chunk
            prefill_tokens += chunk
            if req.first_scheduled is None:
                req.first_scheduled = t
                req.cached_tokens = hit
                req.prefill_computed = req.prompt_len - hit
                self.stats.prefix_queries += req.prompt_len if self.caching else 0
                self.stats.prefix_hits += hit
            self.running.append(req)
            self.prefilling.append(req)
        # 4. how long the batch stays as it is
        step = self.step_model
        first = step.seconds(
            self.n_dec * k1, self.ctx_base + self.sum_accept * self.step, prefill_tokens
        )
        growth = step.per_context_token_s * self.sum_accept
        if prefill_tokens:
            return _Round(1, first, growth, True)
        if not self.n_dec:
            if self.waiting and self.waiting[0].arrival > t and not self.running:
                self.t = self.waiting[0].arrival
                return self._plan()
            return None  # idle (or blocked with nothing running, which admission sizing rules out)
        steps = self._next_finish_step() - self.step
        if grow > 0:
            room = self.cfg.num_blocks - self.kv_blocks_used()
            steps = min(steps, max(1, int(room / grow)))
        rnd = _Round(max(1, steps), first, growth, False)
        if self.waiting and self.waiting[0].arrival > t:
            rnd.steps = min(rnd.steps, self._steps_to_reach(rnd, self.waiting[0].arrival))
        return rnd

    def _next_finish_step(self) -> int:
        heap = self._heap
        while heap:
            fstep, _, gen, req = heap[0]
            if req.state == DECODE and req.gen == gen:
                return fstep
            heapq.heappop(heap)
        return self.step + 1_000_000_000

    def _steps_to_reach(self, rnd: _Round, when: float) -> int:
        """Smallest number of steps of `rnd` whose end is at or after `when`."""
        span = when - self.t
        if span <= 0:
            return 1
        n = _steps_within(rnd, span)
        if _duration(rnd, n) < span - _EPS:
            n += 1
        return max(1, n)

    def _run_decode(self, rnd: _Round, n: int) -> None:
        """Account n decode steps of an unchanged batch (no prefill)."""
        if self.n_dec:
            self.stats.itl.observe_progression(rnd.first, rnd.growth, n, self.n_dec)
            self.stats.iteration_tokens.observe(round(self.sum_accept), n)
        self.t += _duration(rnd, n)
        self.step += n
        overflow = self.kv_blocks_used() + self.cache.free_blocks - self.cfg.num_blocks
        if overflow > 0:
            self.cache.evict(overflow)

    def _complete(self, rnd: _Round) -> None:
        t_end = self.t + _duration(rnd, rnd.steps)
        if not rnd.prefill:
            self._run_decode(rnd, rnd.steps)
        else:
            if self.n_dec:
                self.stats.itl.observe(rnd.first, self.n_dec)
            iteration = self.sum_accept
            self.t = t_end
            self.step += 1
            still = []
            for req in self.prefilling:
                if req.state != PREFILL:
                    continue
                if req.chunk:
                    req.computed += req.chunk
                    req.chunk = 0
                    before = req.held
                    self._cache_computed(req, req.computed)
                    moved = (req.held - before) * self.cache.weight
                    req.private -= moved
                    self.pre_private -= moved
                if req.computed >= req.target:
                    iteration += self._sample_after_prefill(req)
                else:
                    still.append(req)
            self.prefilling = still
            self.stats.iteration_tokens.observe(iteration)
            overflow = self.kv_blocks_used() + self.cache.free_blocks - self.cfg.num_blocks
            if overflow > 0:
                self.cache.evict(overflow)
        # decodes that reached their length
        heap = self._heap
        while heap and heap[0][0] <= self.step:
            _, _, gen, req = heapq.heappop(heap)
            if req.state == DECODE and req.gen == gen:
                self._leave_running(req)
                self._close(req, self.t)

    def _sample_after_prefill(self, req: Request) -> int:
        """The step that finished a prefill also samples a token. Returns tokens counted for the iteration."""
        t = self.t
        req.emitted += 1
        self.stats.generation_tokens_done += 1
        counted = 1
        if req.first_token is None:
            req.first_token = t
            self.stats.ttft.observe(t - req.arrival)
            self.stats.prompt_tokens += req.prompt_len
            self.stats.prompt_tokens_cached += req.cached_tokens
            counted += req.prompt_len
        else:
            self.stats.itl.observe(t - (req.last_token if req.last_token is not None else t))
        req.last_token = t
        self.pre_private -= req.private
        req.private = 0.0
        if req.emitted >= req.output_len:
            self.running.remove(req)
            self._release(req, req.computed)
            self._close(req, t)
            return counted
        req.state = DECODE
        req.start_step = self.step
        req.ctx0 = req.computed + 1
        self.n_dec += 1
        self.sum_accept += req.accept
        self.ctx_base += req.ctx0 - req.accept * self.step
        self.sum_start += self.step
        self.dec_held_blocks += req.held * self.cache.weight
        remaining = req.output_len - req.emitted
        steps = max(1, math.ceil(remaining / req.accept - _EPS))
        while int(req.accept * (steps - 1) + _EPS) >= remaining and steps > 1:
            steps -= 1
        req.finish_step = self.step + steps
        self._seq += 1
        heapq.heappush(self._heap, (req.finish_step, self._seq, req.gen, req))
        return counted

    def _leave_running(self, req: Request) -> None:
        """Take a running request out of the batch, banking its decode progress and freeing its blocks."""
        if req.state == DECODE:
            steps = self.step - req.start_step
            total = self.emitted(req)
            gained = total - req.emitted
            self.stats.generation_tokens_done += gained
            if self.spec:
                self.stats.spec_drafts_done += steps
                self.accepted_done += max(0, gained - steps)
            req.emitted = total
            if gained:
                # vLLM stamps the last token at the step that produced it; the run ended at self.t
                req.last_token = self.t
            self.n_dec -= 1
            self.sum_accept -= req.accept
            self.ctx_base -= req.ctx0 - req.accept * req.start_step
            self.sum_start -= req.start_step
            self.dec_held_blocks -= req.held * self.cache.weight
            if not self.n_dec:
                self.sum_accept = self.ctx_base = self.dec_held_blocks = 0.0
            tokens_with_kv = req.prompt_len + req.emitted - 1
        else:
            self.pre_private -= req.private
            req.private = 0.0
            tokens_with_kv = req.computed
            if req in self.prefilling:
                self.prefilling.remove(req)
        self.running.remove(req)
        req.gen += 1
        self._release(req, tokens_with_kv)

    def _release(self, req: Request, tokens_with_kv: int) -> None:
        if self.caching:
            self._cache_computed(req, tokens_with_kv)
            if req.held:
                n = req.held
                if req.tail is not None and n == len(req.keys):
                    # vLLM caches every full KV block, so the blocks past the last full unit stay too
                    blocks = (tokens_with_kv - n * self.unit) // self.bs
                    if blocks > 0:
                        self.cache.note_tail(req.keys[n - 1], req.tail, blocks)
                m = req.shared // self.unit
                if m and n >= m and tokens_with_kv >= req.shared:
                    self.cache.note_shared(req.keys[m - 1], (req.shared - m * self.unit) // self.bs)
                self.cache.release(req.keys[:n])
        req.held = 0

    def _tail_hit(self, req: Request, hit_units: int, hit: int) -> int:
        """`hit` (tokens in `hit_units` full cached units) plus the blocks an earlier request cached of the
        next unit, when this request's next unit is that one; never the last prompt token (vLLM recomputes
        it), in whole blocks."""
        last = req.keys[hit_units - 1]
        blocks = self.cache.shared.get(last, 0)
        tail = self.cache.tails.get(last)
        if tail is not None and tail[0] == (req.keys[hit_units] if hit_units < len(req.keys) else req.tail):
            blocks = max(blocks, tail[1])
        if not blocks:
            return hit
        return max(hit, min(hit + blocks * self.bs, (req.target - 1) // self.bs * self.bs))

    def _preempt(self, req: Request) -> None:
        self._leave_running(req)
        req.state = WAITING
        req.computed = 0
        req.chunk = 0
        req.target = req.prompt_len + req.emitted
        req.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _close(self, req: Request, t: float) -> None:
        req.state = FINISHED
        req.finish_time = t
        s = self.stats
        s.success[req.finish_reason] = s.success.get(req.finish_reason, 0) + 1
        s.e2e.observe(t - req.arrival)
        sched = req.first_scheduled if req.first_scheduled is not None else t
        first = req.first_token if req.first_token is not None else t
        last = req.last_token if req.last_token is not None else first
        s.queue.observe(sched - req.arrival)
        s.prefill.observe(first - sched)
        s.decode.observe(max(0.0, last - first))
        s.inference.observe(max(0.0, last - sched))
        # vLLM observes every finished request, with 0 when there was no decode step (at most one token).
        s.tpot.observe(max(0.0, last - first) / (req.emitted - 1) if req.emitted > 1 else 0.0)
        s.req_prompt_tokens.observe(req.prompt_len)
        s.req_generation_tokens.observe(req.emitted)
        s.req_max_generation_tokens.observe(req.emitted)
        if req.max_tokens:
            s.req_max_tokens.observe(req.max_tokens)
        s.req_n.observe(1)
        s.req_preemptions.observe(req.num_preemptions)
        if req.first_scheduled is not None:
            s.req_prefill_computed.observe(req.prefill_computed)
        self.finished_count += 1
        self._finished.append(req)


def _duration(rnd: _Round, n: int) -> float:
    return n * rnd.first + rnd.growth * n * (n - 1) / 2


def _steps_within(rnd: _Round, span: float) -> int:
    """Largest n <= rnd.steps with _duration(rnd, n) <= span."""
    if span < rnd.first - _EPS * 10:
        return 0
    g, a = rnd.growth, rnd.first
    if g <= 0:
        n = int((span + _EPS) / a)
    else:
        b = a - g / 2
        n = int((-b + math.sqrt(b * b + 2 * g * span)) / g)
    n = min(n, rnd.steps)
    while n > 0 and _duration(rnd, n) > span + _EPS:
        n -= 1
    while n < rnd.steps and _duration(rnd, n + 1) <= span + _EPS:
        n += 1
    return n
