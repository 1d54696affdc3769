#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kubectl) and helm from Go modules into a versioned
# cache outside the repository. Skips the build when the cache is complete (every
# binary present and the .complete stamp the last step writes). Binaries are built and
# checked in a temporary folder and only then moved into place, so an interrupted build
# never leaves a truncated binary in the cache; a lock keeps two builds apart.
#
# kube-apiserver and friends come from a consumer module (hack/k8s-module.sh says why).
set -euo pipefail

# Versions and the cache path live in hack/k8s-env.sh, shared with the pytest fixture.
# shellcheck source=hack/k8s-env.sh
. "$(dirname "$0")/k8s-env.sh"
# shellcheck source=hack/k8s-module.sh
. "$(dirname "$0")/k8s-module.sh"
OUT=$K8S_TEST_BINS
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
  k8s_build "$STAGE" thop-k8s-bins kube-apiserver kube-controller-manager kubectl
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
