#!/usr/bin/env bash
# Builds the local cluster environment's binaries into OUT (default: <repo>/.cache/bin):
#   gpufed-k8s (multi-call: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#   etcd, kwok) with one symlink per applet, wireguard-go, metrics-server (from its own module,
#   metrics-server/go.mod, with the dependency versions upstream's release pins), and helm (from its
#   own module, helm/go.mod: `make test` lints and renders the chart deploy/charts/gpufed with it).
# Cached: a stamp over the Go sources, both go.mod/go.sum pairs, this script and the Go version decides
# whether anything is rebuilt, so a warm call returns in well under a second; Go's own build
# cache makes a rebuild after a source change a matter of a link.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/.cache/bin}
mkdir -p "$out"

# Pinned versions: the single source of truth is go.mod; the version strings baked into the
# binaries are read from it so `kubectl version` tells the truth.
k8s_version=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
ms_version=$(awk '$1=="sigs.k8s.io/metrics-server" && $2 ~ /^v/ {print $2; exit}' "$here/metrics-server/go.mod")
helm_version=$(awk '$1=="require" && $2=="helm.sh/helm/v3" {print $3; exit}' "$here/helm/go.mod")
# The least Go version that builds both modules.
need_go=$(for m in "$here/go.mod" "$here/metrics-server/go.mod" "$here/helm/go.mod"; do awk '$1=="go" {print $2; exit}' "$m"; done | sort -V | sed -n '$p')

if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is not installed; the local clusters are built from source and need Go >= $need_go (https://go.dev/doc/install)" >&2
  exit 1
fi
have_go=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n1)" != "$need_go" ]; then
  echo "error: Go $have_go is too old; building Kubernetes $k8s_version needs Go >= $need_go" >&2
  exit 1
fi
# Never let the go command try to download another toolchain: say what is missing instead.
export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

stamp=$( (cd "$here" && cat go.mod go.sum metrics-server/go.mod metrics-server/go.sum helm/go.mod helm/go.sum build.sh && find cmd -name '*.go' -print0 | sort -z | xargs -0 cat; go env GOVERSION) | sha256sum | cut -c1-16)
applets="kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok"
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ] && [ -x "$out/gpufed-k8s" ] && [ -x "$out/wireguard-go" ] && [ -x "$out/metrics-server" ] && [ -x "$out/helm" ]; then
  echo "local binaries up to date in $out (Kubernetes $k8s_version, metrics-server $ms_version, helm $helm_version)"
  exit 0
fi

major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
commit=$(awk '/^k8s.io\/kubernetes / && $2 ~ /^v/ {print $2}' "$here/go.sum" | head -n1)
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-$commit -X $pkg.buildDate=$build_date"
done

start=$(date +%s)
echo "building Kubernetes $k8s_version components, etcd, kwok, metrics-server and helm into $out (a cold build takes ~10 min on 2 cores; later builds are cached)" >&2
(cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/gpufed-k8s.new" ./cmd/gpufed-k8s)
mv -f "$out/gpufed-k8s.new" "$out/gpufed-k8s"
echo "building wireguard-go" >&2
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$out/wireguard-go.new" golang.zx2c4.com/wireguard)
mv -f "$out/wireguard-go.new" "$out/wireguard-go"
echo "building metrics-server $ms_version" >&2
ms_ldflags="-s -w -X k8s.io/client-go/pkg/version.gitVersion=$ms_version -X k8s.io/client-go/pkg/version.buildDate=$build_date"
(cd "$here/metrics-server" && go build -trimpath -ldflags "$ms_ldflags" -o "$out/metrics-server.new" sigs.k8s.io/metrics-server/cmd/metrics-server)
mv -f "$out/metrics-server.new" "$out/metrics-server"
echo "building helm $helm_version" >&2
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
(cd "$here/helm" && go build -trimpath -ldflags "$helm_ldflags" -o "$out/helm.new" helm.sh/helm/v3/cmd/helm)
mv -f "$out/helm.new" "$out/helm"
for a in $applets; do ln -sfn gpufed-k8s "$out/$a"; done
echo "$stamp" > "$out/.stamp"
echo "built in $(( $(date +%s) - start ))s: $(ls "$out" | tr '\n' ' ')" >&2
