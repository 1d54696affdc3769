#!/usr/bin/env bash
# Build BuildKit (buildkitd + buildctl) and the runc its worker runs RUN steps with, from their
# Go modules, into a versioned cache outside the repository; hack/build-images.sh uses them to
# build images/Dockerfile without Docker or a registry. Same pattern as hack/build-k8s.sh: skip
# when the .complete stamp is there, build and check in a temporary folder, move whole files
# into place, a lock keeps two builds apart.
#
#   hack/build-buildkit.sh          build if needed, then print the bin dir
#   hack/build-buildkit.sh --dir    print the bin dir only
set -euo pipefail

BUILDKIT_VERSION=${BUILDKIT_VERSION:-0.34.2}
RUNC_VERSION=${RUNC_VERSION:-1.5.3}
THOP_CACHE=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
OUT=$THOP_CACHE/buildkit/v$BUILDKIT_VERSION-runc$RUNC_VERSION

if [ "${1:-}" = "--dir" ]; then
  printf '%s\n' "$OUT"
  exit 0
fi

have_all() {
  for b in buildkitd buildctl runc; do
    [ -x "$OUT/$b" ] || return 1
  done
  [ -f "$OUT/.complete" ] || return 1
}

if have_all; then
  echo "buildkit present in $OUT" >&2
  printf '%s\n' "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-buildkit: the Go toolchain is required (go not found)" >&2; exit 1; }
# runc's seccomp support links libseccomp (cgo).
[ -f /usr/include/seccomp.h ] || { echo "build-buildkit: libseccomp-dev is required (make system-deps)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-buildkit: another build holds $OUT.lock; waiting for it" >&2
  flock 9
fi
if have_all; then
  echo "buildkit present in $OUT (built by the build we waited for)" >&2
  printf '%s\n' "$OUT"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-buildkit-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/bin
mkdir -p "$STAGE"
rm -f "$OUT/.complete"
export GOTOOLCHAIN=local GOFLAGS=-trimpath GOBIN=$STAGE

# buildkit's go.mod has exclude directives, which `go install pkg@version` refuses: build it as a
# dependency of a throwaway consumer module (as hack/build-k8s.sh does for Kubernetes). Static
# and cgo-free like the upstream release binaries.
(
  mkdir -p "$WORK/buildkit" && cd "$WORK/buildkit"
  go mod init example.invalid/thop-buildkit-bins >/dev/null 2>&1
  go mod edit -go=1.26.8 -require="github.com/moby/buildkit@v$BUILDKIT_VERSION" \
    -tool=github.com/moby/buildkit/cmd/buildkitd -tool=github.com/moby/buildkit/cmd/buildctl
  go mod tidy >&2
  CGO_ENABLED=0 go build \
    -ldflags "-s -w -X github.com/moby/buildkit/version.Version=v$BUILDKIT_VERSION" \
    -o "$STAGE/" github.com/moby/buildkit/cmd/buildkitd github.com/moby/buildkit/cmd/buildctl >&2
)
# runc as shared/reference/real-node.md builds it: cgo for libseccomp.
CGO_ENABLED=1 go install -tags "seccomp urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=$RUNC_VERSION" \
  "github.com/opencontainers/runc@v$RUNC_VERSION" >&2

# Every binary must run before any of them enters the cache.
"$STAGE/buildkitd" --version >&2
"$STAGE/buildctl" --version >&2
"$STAGE/runc" --version >&2
for b in buildkitd buildctl runc; do
  cp "$STAGE/$b" "$OUT/.$b.partial"
  mv -f "$OUT/.$b.partial" "$OUT/$b"
done
echo "buildkit=$BUILDKIT_VERSION runc=$RUNC_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete" >&2
printf '%s\n' "$OUT"
