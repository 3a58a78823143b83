#!/usr/bin/env bash
# A small venv with aiperf 0.13.0's trace loaders, the judge of our trace reader (tests/test_traces_aiperf.py).
# Cached outside the repository, keyed by the aiperf version and the requirements' hash; --print prints its path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
AIPERF_VERSION=0.13.0
key="aiperf-${AIPERF_VERSION}_$(sha256sum "$here/requirements.txt" | cut -c1-12)"
root="${FLASHSERVE_AIPERF_CACHE:-$HOME/.cache/flashserve/aiperf}"
venv="$root/$key"
if [[ "${1:-}" == "--print" ]]; then echo "$venv"; exit 0; fi
if [[ -x "$venv/bin/python" && -f "$venv/.complete" ]]; then
  echo "aiperf venv: $venv (cached)"; exit 0
fi
echo "aiperf venv: building $venv"
rm -rf "$venv"
mkdir -p "$root"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements.txt"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps "aiperf==${AIPERF_VERSION}"
"$venv/bin/python" -c "from aiperf.dataset.loader.mooncake_trace import MooncakeTraceDatasetLoader" 
touch "$venv/.complete"
echo "aiperf venv: ready"
