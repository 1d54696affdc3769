#!/usr/bin/env bash
# Build the real node's binaries into a versioned cache outside the repository: kubelet and
# kube-scheduler (the consumer-module build of hack/build-k8s.sh), containerd, ctr and
# containerd-shim-runc-v2 (their Go module), runc (cgo, seccomp) and pause (the kubernetes
# module's build/pause/linux/pause.c, static). CNI plugins and nftables come from Debian
# (hack/system-deps.sh). Same cache discipline as build-k8s.sh: a .complete stamp the last
# step writes, binaries checked in a temporary folder before an atomic rename, a lock.
set -euo pipefail

# shellcheck source=hack/k8s-env.sh
. "$(dirname "$0")/k8s-env.sh"
# shellcheck source=hack/k8s-module.sh
. "$(dirname "$0")/k8s-module.sh"
OUT=$NODE_BINS
BINS="kubelet kube-scheduler containerd ctr containerd-shim-runc-v2 runc pause"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath

have_all() {
  for b in $BINS; do
    [ -x "$OUT/$b" ] || return 1
  done
  [ -f "$OUT/.complete" ] || return 1
}

if have_all; then
  echo "node binaries present in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-node: the Go toolchain is required (go not found)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "build-node: gcc is required (runc, pause)" >&2; exit 1; }
[ -f /usr/include/seccomp.h ] || { echo "build-node: libseccomp-dev is required (run hack/system-deps.sh)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-node: another build holds $OUT.lock; waiting for it"
  flock 9
fi
if have_all; then
  echo "node binaries present in $OUT (built by the build we waited for)"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-node-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/bin
mkdir -p "$STAGE"
rm -f "$OUT/.complete"

# --- kubelet, kube-scheduler (consumer module: see hack/k8s-module.sh)
(
  mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
  k8s_build "$STAGE" thop-node-bins kubelet kube-scheduler
  # The sandbox ("pause") container's binary, from the same module version.
  gcc -Os -static -Wall -Werror -DVERSION="v$K8S_VERSION-thop" -o "$STAGE/pause" "$K8S_SRC/build/pause/linux/pause.c"
  strip "$STAGE/pause"
)

# --- containerd, ctr, shim (go install works: containerd's go.mod has no local replaces)
CTD=github.com/containerd/containerd/v2
CTD_LD="-s -w -X $CTD/version.Version=v$CONTAINERD_VERSION -X $CTD/version.Package=$CTD"
GOBIN=$STAGE go install -tags "urfave_cli_no_docs no_btrfs" -ldflags "$CTD_LD" \
  "$CTD/cmd/containerd@v$CONTAINERD_VERSION" "$CTD/cmd/ctr@v$CONTAINERD_VERSION"
GOBIN=$STAGE go install -tags "urfave_cli_no_docs no_btrfs no_grpc" -ldflags "$CTD_LD" \
  "$CTD/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION"

# --- runc (cgo for libseccomp)
CGO_ENABLED=1 GOBIN=$STAGE go install -tags "seccomp urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=$RUNC_VERSION" "github.com/opencontainers/runc@v$RUNC_VERSION"

# Every binary must run before any of them enters the cache.
"$STAGE/kubelet" --version
"$STAGE/kube-scheduler" --version
"$STAGE/containerd" --version
"$STAGE/ctr" --version
"$STAGE/containerd-shim-runc-v2" -v | sed -n 1,2p
"$STAGE/runc" --version | sed -n 1p
"$STAGE/pause" -v
for b in $BINS; do
  cp "$STAGE/$b" "$OUT/.$b.partial"
  mv -f "$OUT/.$b.partial" "$OUT/$b"
done
echo "k8s=$K8S_VERSION containerd=$CONTAINERD_VERSION runc=$RUNC_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete"
