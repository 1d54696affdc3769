#!/usr/bin/env bash
# Build kstatus-compute (hack/kstatus/main.go): a tiny program that prints what
# sigs.k8s.io/cli-utils' kstatus library (status.Compute, the health Flux, Argo CD's kstatus
# users and `kubectl wait`-style tooling read) says about one object read from stdin. The tests
# feed it real TaskHandlerBundles from the control plane. Same pattern as hack/build-k8s.sh:
# skip when the cache is complete, build and check in a temporary folder, rename into place,
# and a lock keeps two builds apart. The cache key includes the source's hash, so an edited
# main.go is rebuilt.
#
#   hack/build-kstatus.sh          build if missing
#   hack/build-kstatus.sh --path   print where the binary lives (build nothing)
#
# THOP_CACHE moves the cache; KSTATUS_BIN overrides the binary's path for the tests.
set -euo pipefail

CLI_UTILS_VERSION=${CLI_UTILS_VERSION:-0.37.2}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/kstatus/main.go
THOP_CACHE=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
SUM=$(sha256sum "$SRC" | cut -c1-12)
OUT=$THOP_CACHE/kstatus/v$CLI_UTILS_VERSION-$SUM
BIN=$OUT/kstatus-compute

if [ "${1:-}" = "--path" ]; then
  printf '%s\n' "$BIN"
  exit 0
fi

have_it() { [ -x "$BIN" ] && [ -f "$OUT/.complete" ]; }

if have_it; then
  echo "kstatus-compute (cli-utils v$CLI_UTILS_VERSION) present in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-kstatus: the Go toolchain is required (go not found)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-kstatus: another build holds $OUT.lock; waiting for it"
  flock 9
fi
if have_it; then
  echo "kstatus-compute present in $OUT (built by the build we waited for)"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-kstatus-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
rm -f "$OUT/.complete"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
(
  cd "$WORK"
  go mod init example.invalid/thop-kstatus >/dev/null 2>&1
  go mod edit -go=1.26 -require="sigs.k8s.io/cli-utils@v$CLI_UTILS_VERSION"
  cp "$SRC" main.go
  go mod tidy
  go build -ldflags "-s -w" -o "$WORK/kstatus-compute" .
)

# The binary must answer before it enters the cache: an object without conditions is Current.
echo '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","generation":1}}' \
  | "$WORK/kstatus-compute" | grep -q '"status":"Current"'
cp "$WORK/kstatus-compute" "$OUT/.kstatus-compute.partial"
mv -f "$OUT/.kstatus-compute.partial" "$BIN"
echo "cli-utils=$CLI_UTILS_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete"
