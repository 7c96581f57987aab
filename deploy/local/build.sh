#!/usr/bin/env bash
# Builds the local cluster environment's binaries into OUT (default: <repo>/.cache/bin):
#   gpufed-k8s (multi-call: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#   etcd, kwok, dra-publisher) with one symlink per applet, wireguard-go, metrics-server (from its own module,
#   metrics-server/go.mod, with the dependency versions upstream's release pins), and helm (from its
#   own module, helm/go.mod: `make test` lints and renders the chart deploy/charts/gpufed with it), and
#   kueue, Kueue's manager (from its own module, kueue/go.mod, with the dependency versions Kueue's
#   release pins; gpufed/localenv/kueue.py reads Kueue's CRDs, RBAC and webhooks from that module), and
#   jobset, JobSet's controller manager (from its own module, jobset/go.mod, with the dependency versions
#   JobSet's release pins; gpufed/localenv/jobset.py reads its CRD, RBAC and webhooks from that module),
#   and vk-e2e.test, virtual-kubelet's own end-to-end suite (from its own module, vke2e/go.mod, at the
#   virtual-kubelet release it pins; tests/e2e/test_vk_upstream.py runs it against a virtual node).
# Cached: a stamp over the Go sources, every go.mod/go.sum pair, this script and the Go version decides
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
kueue_version=$(awk '$1=="require" && $2=="sigs.k8s.io/kueue" {print $3; exit}' "$here/kueue/go.mod")
jobset_version=$(awk '$1=="require" && $2=="sigs.k8s.io/jobset" {print $3; exit}' "$here/jobset/go.mod")
# The least Go version that builds every module.
need_go=$(for m in "$here/go.mod" "$here/metrics-server/go.mod" "$here/helm/go.mod" "$here/kueue/go.mod" "$here/jobset/go.mod" "$here/vke2e/go.mod"; do awk '$1=="go" {print $2; exit}' "$m"; done | sort -V | sed -n '$p')

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

stamp=$( (cd "$here" && cat go.mod go.sum metrics-server/go.mod metrics-server/go.sum helm/go.mod helm/go.sum kueue/go.mod kueue/go.sum jobset/go.mod jobset/go.sum vke2e/go.mod vke2e/go.sum build.sh && find cmd vke2e -name '*.go' -print0 | sort -z | xargs -0 cat; go env GOVERSION) | sha256sum | cut -c1-16)
applets="kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok dra-publisher"
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ] && [ -x "$out/gpufed-k8s" ] && [ -x "$out/wireguard-go" ] && [ -x "$out/metrics-server" ] && [ -x "$out/helm" ] && [ -x "$out/kueue" ] && [ -x "$out/jobset" ] && [ -x "$out/vk-e2e.test" ]; then
  echo "local binaries up to date in $out (Kubernetes $k8s_version, metrics-server $ms_version, helm $helm_version, kueue $kueue_version, jobset $jobset_version, virtual-kubelet e2e suite)"
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
echo "building Kubernetes $k8s_version components, etcd, kwok, metrics-server, helm, kueue and jobset into $out (a cold build takes ~14 min on 2 cores, Kueue ~6 of them, JobSet ~1; later builds are cached)" >&2
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
# Helm's release builds stamp the Kubernetes version its client libraries speak (what `helm template`
# assumes without --kube-version, checked against a chart's kubeVersion); a plain build says 1.20.
helm_k8s=$(awk '$1=="k8s.io/client-go" {print $2; exit}' "$here/helm/go.mod" | sed 's/^v0\.\([0-9]*\)\..*/\1/')
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
helm_ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_k8s"
(cd "$here/helm" && go build -trimpath -ldflags "$helm_ldflags" -o "$out/helm.new" helm.sh/helm/v3/cmd/helm)
mv -f "$out/helm.new" "$out/helm"
echo "building kueue $kueue_version" >&2
# Kueue's manager, upstream's cmd/kueue/main.go with one line changed: with internal certificate
# management off it reads the metrics endpoint's certificate from the fixed path
# /etc/kueue/metrics/certs (a Secret mounted into its Pod upstream); a local cluster runs it as a
# plain process without root, so GPUFED_KUEUE_METRICS_CERT_DIR may name that directory (unset:
# upstream's path). The patched file is built as this module's ./cmd/kueue through a build overlay
# (Go refuses overlays of files in the module cache); nothing is written into the checkout.
# `go list -m` names a module's directory only once it is in the module cache: download it first.
kueue_src=$(cd "$here/kueue" && go mod download sigs.k8s.io/kueue && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
if [ -z "$kueue_src" ] || [ ! -d "$kueue_src/cmd/kueue" ]; then
  echo "error: kueue $kueue_version: its module source is not in the Go module cache (go mod download failed?)" >&2
  exit 1
fi
kueue_tmp=$(mktemp -d)
trap 'rm -rf "$kueue_tmp"' EXIT
sed 's|^\(\s*metricsCertPath := "/etc/kueue/metrics/certs"\)$|\1; if d := os.Getenv("GPUFED_KUEUE_METRICS_CERT_DIR"); d != "" { metricsCertPath = d }|' \
  "$kueue_src/cmd/kueue/main.go" > "$kueue_tmp/main.go"
if [ "$(ls "$kueue_src/cmd/kueue")" != main.go ] || [ "$(grep -c GPUFED_KUEUE_METRICS_CERT_DIR "$kueue_tmp/main.go")" != 1 ]; then
  echo "error: kueue $kueue_version: cmd/kueue is no longer the one main.go setting metricsCertPath that build.sh patches" >&2
  exit 1
fi
printf '{"Replace":{"%s":"%s"}}\n' "$here/kueue/cmd/kueue/main.go" "$kueue_tmp/main.go" > "$kueue_tmp/overlay.json"
kueue_ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
kueue_ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitCommit=module-$kueue_version -X sigs.k8s.io/kueue/pkg/version.BuildDate=$build_date"
(cd "$here/kueue" && go build -trimpath -overlay "$kueue_tmp/overlay.json" -ldflags "$kueue_ldflags" -o "$out/kueue.new" ./cmd/kueue)
mv -f "$out/kueue.new" "$out/kueue"
echo "building jobset $jobset_version" >&2
# JobSet's controller manager, upstream's main package unchanged: its configuration file names the
# webhook and metrics certificate directories, so it runs as a plain process as it is.
jobset_ldflags="-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$jobset_version -X sigs.k8s.io/jobset/pkg/version.GitCommit=module-$jobset_version"
(cd "$here/jobset" && go build -trimpath -ldflags "$jobset_ldflags" -o "$out/jobset.new" sigs.k8s.io/jobset)
mv -f "$out/jobset.new" "$out/jobset"
vk_version=$(awk '$1=="require" && $2=="github.com/virtual-kubelet/virtual-kubelet" {print $3; exit}' "$here/vke2e/go.mod")
echo "building virtual-kubelet $vk_version's end-to-end suite" >&2
(cd "$here/vke2e" && go test -c -tags e2e -trimpath -ldflags "-s -w" -o "$out/vk-e2e.test.new" .)
mv -f "$out/vk-e2e.test.new" "$out/vk-e2e.test"
for a in $applets; do ln -sfn gpufed-k8s "$out/$a"; done
echo "$stamp" > "$out/.stamp"
echo "built in $(( $(date +%s) - start ))s: $(ls "$out" | tr '\n' ' ')" >&2
