"""Facts about vLLM's router (`vllm-router` 0.1.17, PyPI) that the API and the renderer rely on.

Checked against the binary itself (`vllm-router --help`, and the routes it answers when started on 127.0.0.1;
docs/routing.md records how), not against its documentation.
"""

from __future__ import annotations

VLLM_ROUTER_VERSION = "0.1.17"
# The project's router image (the Dockerfile's `router` stage): `vllm-router==0.1.17` on the operator's base,
# run as a non-root user. Its tag is the router's version, so the default changes only with the router.
ROUTER_IMAGE = f"ghcr.io/flashserve/flashserve-router:{VLLM_ROUTER_VERSION}"

# `--policy` choices that work on plain vLLM engines: kv_aware needs vLLM's KV events (ZMQ) and the prefill/
# decode options need disaggregated serving, neither of which the operator sets up.
POLICIES: tuple[str, ...] = (
    "consistent_hash",
    "cache_aware",
    "power_of_two",
    "round_robin",
    "random",
    "sticky_least_loaded",
)
# Policies the router's library has and `--policy` refuses: a model takes one from the first worker registered
# for it in IGW mode (`--enable-igw`), through `POST /workers` with the label `policy`. The router then has no
# pod discovery; the operator registers the engines' ranks itself (controller/router_workers.py).
WORKER_LABEL_POLICIES: tuple[str, ...] = ("rendezvous_hash",)
API_POLICIES: tuple[str, ...] = POLICIES + WORKER_LABEL_POLICIES
IGW_FLAG = "--enable-igw"
# IGW mode's worker routes (0.1.17): POST /workers {"url", "model_id", "labels"} adds a worker at once, marked
# healthy without asking it, and answers success again for a URL it has; GET /workers lists them
# ({"workers": [{"url", "model_id", "metadata": {labels}}]}); DELETE /workers/<url, percent-encoded> removes
# one, 400 WORKER_NOT_FOUND for a URL it lacks. A request names its model in `model`; one naming no model
# registered goes by the default policy (`--policy`).
WORKERS_PATH = "/workers"
POLICY_LABEL = "policy"
# In every mode (0.1.17): POST /add_worker?url=<engine URL> adds an engine (with --intra-node-data-parallel-size,
# all its ranks) and POST /remove_worker?url=<engine URL> removes it, all its ranks; each answers plain text.
# With a rank's URL (`<engine URL>@<rank>`) the removal answers success and leaves the rank listed.
ADD_WORKER_PATH = "/add_worker"
REMOVE_WORKER_PATH = "/remove_worker"

# Policies that keep state in each router process (cache_aware its prefix tree, sticky_least_loaded its table of
# sessions): two replicas place one session apart, so the client Service keeps each client on one router pod
# (client-IP affinity, for as long as kube-proxy's default, 3 hours idle).
STATEFUL_POLICIES: frozenset[str] = frozenset({"cache_aware", "sticky_least_loaded"})
CLIENT_AFFINITY_SECONDS = 10800

# Policies that ask every engine to render the prompt (POST /v1/chat/completions/render), which vLLM 0.33
# serves only with `--enable-scale-out`; without it they answer 403 and the policy routes on load alone.
RENDERING_POLICIES: frozenset[str] = frozenset({"cache_aware"})

# The router's own defaults (`vllm-router --help`), which the API's defaults repeat.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
EVICTION_INTERVAL_SECS = 120
MAX_TREE_SIZE = 33554432  # characters per worker in each model's prefix tree

DEFAULT_PORT = 8000
# The router's --prometheus-port default; its help says metrics are off without the flag, but 0.1.17 binds
# this port anyway, so the operator always passes it.
DEFAULT_METRICS_PORT = 29000

# Routes of 0.1.17, as answered on 127.0.0.1 with no workers: /liveness 200 (the process serves), /readiness
# 503 until at least one worker is healthy (200 after), /health 200 even with no workers ("All servers
# healthy"), /health_generate 503 without workers. The metrics server answers /metrics on its own port.
LIVENESS_PATH = "/liveness"
READINESS_PATH = "/readiness"

# DP-aware routing: the router lists each engine URL once per rank (`URL@rank`), places those on its ring (or
# tree), and sends the rank in `X-data-parallel-rank`, which vLLM 0.33 honours as an index into the pod's local
# engines (out of range: 400). Its help says `--api-key` is required with it; 0.1.17 starts and routes without
# one and forwards the client's own Authorization header either way (checked against an engine that logs what
# it receives), so none is passed and an engine's VLLM_API_KEY stays the clients' business.
DP_AWARE_FLAG = "--intra-node-data-parallel-size"
DP_RANK_HEADER = "X-data-parallel-rank"

# The router's log level goes in RUST_LOG (its tracing filter), not --log-level: 0.1.17 reads that flag as
# a tracing level, so `warning` and `critical`, two of the choices its help offers, silently fall back to
# info; RUST_LOG wins over the flag when both are set. At info the router logs three lines for every request
# consistent_hash routes, each carrying the request's session key (an X-Session-ID or X-User-ID: a user's
# identifier in the pod's log, at the request rate); warn drops those and the start-up and worker
# added/removed lines with them. Checked on the binary (tests/router/test_vllm_router.py).
LOG_ENV = "RUST_LOG"
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warn", "error")
DEFAULT_LOG_LEVEL = "warn"

# sticky_least_loaded counts a session against its engine until the session has been idle this long: the router
# is not told that a conversation ended (unless the client posts /finish_session), so an ended one keeps counting
# for the whole expiry, 2 hours by default (the binary prints it for an unreadable value). Idle sessions leave
# the counts in a sweep the router runs on a request at most once a minute (measured: docs/vllm-router.md).
SLL_EXPIRY_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"
SLL_DEFAULT_EXPIRY_SECS = 7200
SLL_SWEEP_SECS = 60

# The session key consistent_hash and sticky_least_loaded read first (docs/vllm-router.md).
SESSION_HEADER = "X-Session-ID"
