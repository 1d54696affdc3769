#!/usr/bin/env bash
# Build promtool, Prometheus' own rule checker and rule unit-test runner, from the Prometheus Go
# module (github.com/prometheus/prometheus, Apache-2.0). The tests run the chart's rendered
# PrometheusRule through `promtool check rules` and evaluate every alert with `promtool test
# rules` against series made from the operator's real /metrics output. Same pattern as
# hack/build-kstatus.sh: skip when the cache is complete, build and check in a temporary folder,
# rename into place, and a lock keeps two builds apart.
#
#   hack/build-promtool.sh          build if missing
#   hack/build-promtool.sh --path   print where the binary lives (build nothing)
#
# THOP_CACHE moves the cache; PROMTOOL_BIN overrides the binary's path for the tests.
set -euo pipefail

# Go module v0.3XY.Z is Prometheus 3.XY.Z.
PROMETHEUS_MODULE_VERSION=${PROMETHEUS_MODULE_VERSION:-0.316.0}
THOP_CACHE=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
OUT=$THOP_CACHE/promtool/v$PROMETHEUS_MODULE_VERSION
BIN=$OUT/promtool

if [ "${1:-}" = "--path" ]; then
  printf '%s\n' "$BIN"
  exit 0
fi

have_it() { [ -x "$BIN" ] && [ -f "$OUT/.complete" ]; }

if have_it; then
  echo "promtool (prometheus module v$PROMETHEUS_MODULE_VERSION) present in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-promtool: the Go toolchain is required (go not found)" >&2; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-promtool: another build holds $OUT.lock; waiting for it"
  flock 9
fi
if have_it; then
  echo "promtool present in $OUT (built by the build we waited for)"
  exit 0
fi
start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/thop-promtool-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
rm -f "$OUT/.complete"

IFS=. read -r _ minor patch <<<"$PROMETHEUS_MODULE_VERSION"
PROMETHEUS_VERSION="$((minor / 100)).$((minor % 100)).$patch"
# A module of our own that requires Prometheus at the pinned version, so every dependency is the
# version Prometheus' go.mod asks for (v0.316.0 needs Go 1.26.7 or later). The remove_all_sd tag
# leaves out the service-discovery plugins, which rule checks and rule tests never use. The first
# build takes minutes (about 35 on a loaded 2-core machine); later runs find the cache.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod"
(
  cd "$WORK"
  go mod init example.invalid/thop-promtool >/dev/null 2>&1
  go mod edit -require="github.com/prometheus/prometheus@v$PROMETHEUS_MODULE_VERSION"
  go build -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    -o "$WORK/promtool" github.com/prometheus/prometheus/cmd/promtool
)

# The binary must check a rule before it enters the cache.
printf 'groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n' > "$WORK/rules.yaml"
"$WORK/promtool" check rules "$WORK/rules.yaml" >/dev/null
cp "$WORK/promtool" "$OUT/.promtool.partial"
mv -f "$OUT/.promtool.partial" "$BIN"
echo "prometheus=$PROMETHEUS_VERSION module=v$PROMETHEUS_MODULE_VERSION built_seconds=$(( $(date +%s) - start ))" > "$OUT/.complete"
cat "$OUT/.complete"
