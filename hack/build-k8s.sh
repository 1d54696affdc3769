#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kubectl) and helm from Go modules into a versioned
# cache outside the repository. Skips the build when the cache is complete (every
# binary present and the .complete stamp the last step writes). Binaries are built and
# checked in a temporary folder and only then moved into place, so an interrupted build
# never leaves a truncated binary in the cache; a lock keeps two builds apart.
#
# Why a consumer module: k8s.io/kubernetes requires its staging modules at
# v0.0.0 with local replaces, which `go install pkg@version` refuses; a
# consumer module that replaces each staging module with its published
# v0.X.Y release builds fine (see shared/reference/k8s-test-control-plane.md).
set -euo pipefail

# Versions and the cache path live in hack/k8s-env.sh, shared with the pytest fixture.
# shellcheck source=hack/k8s-env.sh
. "$(dirname "$0")/k8s-env.sh"
OUT=$K8S_TEST_BINS
STAGING_VERSION="v0.${K8S_VERSION#1.}"
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath

have_all() {
  for b in etcd kube-apiserver kube-controller-manager kubectl helm; do
    [ -x "$OUT/$b" ] || return 1
  done
  [ -f "$OUT/.complete" ] || return 1
}

if have_all; then
  echo "k8s test binaries present in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-k8s: the Go toolchain is required (go not found)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-k8s: another build holds $OUT.lock; waiting for it"
  flock 9
fi
if have_all; then
  echo "k8s test binaries present in $OUT (built by the build we waited for)"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-k8s-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/bin
mkdir -p "$STAGE"
# An incomplete cache may hold a truncated binary: rebuild everything (Go's build cache
# keeps that cheap) rather than trusting whatever files are there.
rm -f "$OUT/.complete"

# --- kube-apiserver, kube-controller-manager, kubectl (one build, shared packages compile once)
(
  mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
  go mod init example.invalid/thop-k8s-bins >/dev/null 2>&1
  go mod edit -go=1.26
  GOMOD=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  for m in $(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print $1}' "$GOMOD" | sort -u); do
    go mod edit -replace="$m=$m@$STAGING_VERSION"
  done
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
  for c in kube-apiserver kube-controller-manager kubectl; do
    go mod edit -tool="k8s.io/kubernetes/cmd/$c"
  done
  go mod tidy
  LD="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD="$LD -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR -X $pkg.gitTreeState=clean"
  done
  go build -ldflags "$LD" -o "$STAGE/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl
)

# --- etcd (its server/go.mod has replaces, so it must be built as a dependency)
(
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  go mod init example.invalid/thop-etcd-bin >/dev/null 2>&1
  go mod edit -go=1.26 -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION" -tool=go.etcd.io/etcd/server/v3
  go mod tidy
  go build -ldflags "-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3
)

# --- helm
(
  mkdir -p "$WORK/helm" && cd "$WORK/helm"
  go mod init example.invalid/thop-helm-bin >/dev/null 2>&1
  go mod edit -go=1.26 -require="helm.sh/helm/v3@v$HELM_VERSION" -tool=helm.sh/helm/v3/cmd/helm
  go mod tidy
  go build -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$MINOR" \
    -o "$STAGE/helm" helm.sh/helm/v3/cmd/helm
)

# Every binary must run before any of them enters the cache.
"$STAGE/kube-apiserver" --version
"$STAGE/kube-controller-manager" --version
"$STAGE/kubectl" version --client
# sed reads all input: head would close the pipe early and pipefail turns SIGPIPE into a failed build.
"$STAGE/etcd" --version | sed -n 1p
"$STAGE/helm" version --short
for b in etcd kube-apiserver kube-controller-manager kubectl helm; do
  # Copy next to the target, then rename: the cache only ever holds whole files.
  cp "$STAGE/$b" "$OUT/.$b.partial"
  mv -f "$OUT/.$b.partial" "$OUT/$b"
done
echo "k8s=$K8S_VERSION etcd=$ETCD_VERSION helm=$HELM_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete"
