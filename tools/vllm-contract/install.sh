#!/usr/bin/env bash
# Builds the contract venv: the real vLLM 0.33.0 wheel on CPU, for the contract tests (tests/contract/) that
# run rendered command lines through vLLM's own parser, engine-config checks and metrics logger.
# The venv lives outside the repository, keyed by the vLLM version, the Python version and the pinned
# requirements, so a second run finds it and returns at once. Prints the venv's directory on its last line.
#
#   tools/vllm-contract/install.sh            build it if missing (about 6.5 GB; ~1-5 min, network bound)
#   tools/vllm-contract/install.sh --print    only print the directory (exit 1 if it is not built)
#   tools/vllm-contract/install.sh --freeze   print the pinned list of a built venv (maintainers)
#
# vllm is installed with --no-deps from its wheel, then exactly the pins of requirements.txt, also --no-deps:
# nothing else can slip in. uv (pinned, installed into the cache too) does the installs; pip would take ~5x
# longer for torch's CUDA libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
VLLM_VERSION=0.33.0
UV_VERSION=0.13.9
python=${PYTHON:-python3}

pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
req_hash=$(sha256sum "$here/requirements.txt" | cut -c1-12)
cache_root=${FLASHSERVE_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashserve/vllm-venv}
venv="$cache_root/vllm-${VLLM_VERSION}_py${pyver}_${req_hash}"
log() { printf '[vllm-venv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${1:-}" = "--print" ]; then [ -f "$venv/.complete" ] && [ -f "$venv/wheels/.complete" ] && echo "$venv"; exit $?; fi

uv_dir="$cache_root/uv-$UV_VERSION"
uv="$uv_dir/bin/uv"
if [ ! -x "$uv" ]; then
  log "installing uv $UV_VERSION into $uv_dir"
  rm -rf "$uv_dir"
  "$python" -m venv --without-pip "$uv_dir"
  "$python" -m pip --python "$uv_dir/bin/python" install -q "uv==$UV_VERSION"
fi
export UV_CACHE_DIR="$cache_root/uv-cache" UV_NO_PROGRESS=1

if [ "${1:-}" = "--freeze" ]; then
  "$uv" pip freeze --python "$venv/bin/python" | grep -v '^vllm @'
  exit 0
fi

if [ ! -f "$venv/.complete" ]; then
  start=$(date +%s)
  rm -rf "$venv"
  mkdir -p "$cache_root"
  log "building $venv"
  "$uv" venv -q --python "$python" "$venv"
  log "step 1/2: vllm==$VLLM_VERSION (wheel, no dependencies)"
  "$uv" pip install -q --compile-bytecode --python "$venv/bin/python" --no-deps "vllm==$VLLM_VERSION"
  log "step 2/2: $(grep -cv '^#' "$here/requirements.txt") pinned dependencies (torch and its CUDA libraries are most of it)"
  "$uv" pip install -q --compile-bytecode --python "$venv/bin/python" --no-deps -r "$here/requirements.txt"
  log "checking that the parser and the engine config import"
  VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c \
    'import vllm.engine.arg_utils, vllm.entrypoints.cli.serve, vllm.v1.metrics.loggers' >/dev/null 2>&1 \
    || { log "the venv does not import vLLM: see the output of: $venv/bin/python -c 'import vllm.engine.arg_utils'"; exit 1; }
  touch "$venv/.complete"
  # uv hard-links the venv's files to its download cache, so the two together take about the venv's size.
  log "done in $(( $(date +%s) - start ))s, $(du -sh "$cache_root" | cut -f1) on disk with uv's download cache"
fi
# FlashInfer is left out of the venv (importing it needs CUDA packages), but the cache variable the operator
# sets for it is checked against the source of the exact version vLLM pins: its wheel, downloaded, not installed.
wheels="$venv/wheels"
if [ ! -f "$wheels/.complete" ]; then
  pin=$(sed -n 's/^Requires-Dist: flashinfer-python==\([^ ;]*\).*/\1/p' "$venv"/lib/python*/site-packages/vllm-"$VLLM_VERSION".dist-info/METADATA | head -n1)
  [ -n "$pin" ] || { log "vllm $VLLM_VERSION's metadata pins no flashinfer-python"; exit 1; }
  log "downloading flashinfer-python==$pin (vLLM's pin; read by the contract tests, not installed)"
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "flashinfer-python==$pin"
  touch "$wheels/.complete"
fi
echo "$venv"
