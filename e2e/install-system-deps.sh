#!/usr/bin/env bash
# System packages the tests need, from Debian:
#   prometheus  the local cluster's Prometheus (2.x; file_sd scraping on loopback)
#   tcpdump     the router's share of TTFT read off the loopback wire (testbed/flashserve_testbed/router/wiretime.py)
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing+=(prometheus)
command -v tcpdump >/dev/null 2>&1 || [ -x /usr/bin/tcpdump ] || missing+=(tcpdump)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "[deps] installing ${missing[*]} (Debian packages, no recommends)" >&2
sudo_cmd=()
[ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Neither starts anything here (no systemd); the cluster script runs its own Prometheus on 127.0.0.1.
