#!/usr/bin/env bash
# System packages the local cluster needs: Prometheus from Debian (2.x; file_sd scraping on loopback).
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; then
  exit 0
fi
echo "[deps] installing prometheus (Debian package, no recommends)" >&2
sudo_cmd=()
[ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts nothing here (no systemd); the cluster script runs its own instance on 127.0.0.1.
