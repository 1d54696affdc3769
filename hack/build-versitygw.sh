#!/usr/bin/env bash
# Build VersityGW (Apache-2.0), the real S3-compatible server the source tests run against,
# from its Go module into a versioned cache outside the repository. Same pattern as
# hack/build-k8s.sh: skip when the cache holds a complete binary, build and check it in a
# temporary folder, rename the whole binary into place (the cache never holds a truncated
# file), and take a lock so two builds never interleave.
#
#   hack/build-versitygw.sh          build if missing, print the binary's path
#   hack/build-versitygw.sh --path   print where the binary lives (build nothing)
#
# THOP_CACHE moves the cache; VERSITYGW_BIN overrides the binary's path for the tests.
set -euo pipefail

VERSITYGW_VERSION=${VERSITYGW_VERSION:-1.8.0}
THOP_CACHE=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
OUT=$THOP_CACHE/versitygw/v$VERSITYGW_VERSION
BIN=$OUT/versitygw

if [ "${1:-}" = "--path" ]; then
  printf '%s\n' "$BIN"
  exit 0
fi

have_it() { [ -x "$BIN" ] && [ -f "$OUT/.complete" ]; }

if have_it; then
  echo "versitygw v$VERSITYGW_VERSION present in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-versitygw: the Go toolchain is required (go not found)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-versitygw: another build holds $OUT.lock; waiting for it"
  flock 9
fi
if have_it; then
  echo "versitygw v$VERSITYGW_VERSION present in $OUT (built by the build we waited for)"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-versitygw-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
rm -f "$OUT/.complete"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod"
GOBIN="$WORK/bin" go install -ldflags "-s -w" \
  "github.com/versity/versitygw/cmd/versitygw@v$VERSITYGW_VERSION"

# The binary must run before it enters the cache.
"$WORK/bin/versitygw" --version
cp "$WORK/bin/versitygw" "$OUT/.versitygw.partial"
mv -f "$OUT/.versitygw.partial" "$BIN"
echo "versitygw=$VERSITYGW_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete"
