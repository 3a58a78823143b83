#!/usr/bin/env bash
# Builds the local cluster's toolchain from Go modules into a cache outside the repository:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, kwokctl, helm.
# The cache directory is keyed by the pinned versions; binaries already there are not rebuilt.
# Prints the directory holding the binaries on its last line.
#
#   e2e/toolchain/build.sh            build what is missing
#   e2e/toolchain/build.sh --print    only print the directory (exit 1 if incomplete)
#   e2e/toolchain/build.sh --regen    regenerate the wrapper go.mod/go.sum files (maintainers)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

key="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
cache_root=${FLASHSERVE_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashserve/toolchain}
bin="$cache_root/$key/bin"
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl helm)

complete() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
log() { printf '[toolchain %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${1:-}" = "--print" ]; then complete && echo "$bin"; exit $?; fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod"

regen_kubernetes() {
  # k8s.io/kubernetes points its k8s.io/* staging modules at ./staging with replace lines that consumers
  # ignore; mirror every one of them with the matching published v0.x version.
  local mod staging_ver=v0.${KUBE_VERSION#v1.}
  mod=$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module flashserve.io/toolchain/kubernetes"
    echo
    echo "go 1.25"
    echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"
    echo
    grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$mod" | awk -v v="$staging_ver" '{print "replace " $1 " => " $1 " " v}'
  } > "$here/kubernetes/go.mod"
  # An explicit @version on each package: a bare `go get pkg` would upgrade the module to its latest release.
  local c pkgs=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do pkgs+=("k8s.io/kubernetes/cmd/$c@${KUBE_VERSION}"); done
  (cd "$here/kubernetes" && go get "${pkgs[@]}")
}

regen_simple() {  # dir module version package...
  local dir=$1 module=$2 version=$3 p pkgs=(); shift 3
  for p in "$@"; do pkgs+=("$p@$version"); done
  printf 'module flashserve.io/toolchain/%s\n\ngo 1.25\n\nrequire %s %s\n' "$dir" "$module" "$version" > "$here/$dir/go.mod"
  (cd "$here/$dir" && go get "${pkgs[@]}")
}

if [ "${1:-}" = "--regen" ]; then
  mkdir -p "$here"/{kubernetes,etcd,kwok,helm}
  regen_kubernetes
  regen_simple etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  regen_simple kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  regen_simple helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
  exit 0
fi

if complete; then log "all tools present in $bin"; echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "error: Go is required to build the toolchain (Go >= 1.25)" >&2; exit 1; }
mkdir -p "$bin"
start=$(date +%s)

build() {  # name dir ldflags "binaries it yields" package...
  local name=$1 dir=$2 ldflags=$3 outputs=$4; shift 4
  local missing=0 b
  for b in $outputs; do [ -x "$bin/$b" ] || missing=1; done
  [ "$missing" = 1 ] || { log "$name: cached"; return; }
  log "$name: building $* (this is the slow part on a new machine)"
  local t0; t0=$(date +%s)
  # Build into a temporary directory and move into place so an interrupted build never leaves a partial binary.
  local tmp; tmp=$(mktemp -d "$bin/.build.XXXXXX")
  (cd "$here/$dir" && go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$tmp/" "$@")
  # go names etcd's binary after its module path's last element ("server").
  [ ! -e "$tmp/server" ] || mv "$tmp/server" "$tmp/etcd"
  mv "$tmp"/* "$bin/" && rmdir "$tmp"
  log "$name: done in $(( $(date +%s) - t0 ))s"
}

kv=${KUBE_VERSION#v}; major=${kv%%.*}; rest=${kv#*.}; minor=${rest%%.*}
kldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kldflags+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=${major} -X $pkg.gitMinor=${minor}"
  kldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build etcd etcd "-s -w" etcd go.etcd.io/etcd/server/v3
build kwok kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" "kwok kwokctl" \
  sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
build helm helm "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" helm helm.sh/helm/v3/cmd/helm
build kubernetes kubernetes "$kldflags" "kube-apiserver kube-controller-manager kube-scheduler kubectl" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl

complete || { echo "error: toolchain incomplete in $bin" >&2; exit 1; }
log "toolchain ready in $(( $(date +%s) - start ))s; cache size: $(du -sh "$cache_root" | cut -f1), Go caches: $(du -sh "$(go env GOMODCACHE)" "$(go env GOCACHE)" 2>/dev/null | cut -f1 | paste -sd' ')"
echo "$bin"
