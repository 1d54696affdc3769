#!/usr/bin/env bash
# Build images/Dockerfile's three images (operator, probe-java, probe-node) without Docker or a
# registry: local base images from Debian packages (mmdebstrap), BuildKit built from its Go
# module (hack/build-buildkit.sh) with a named context replacing each FROM, OCI archives out.
# Cached by content under $THOP_CACHE/images: an unchanged tree returns at once.
# The code is taskhandler_devenv.images (docs/images.md, "Images without a registry").
#
# The last stdout lines are one per image: `image <ref> <absolute path of the OCI archive>`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "build-images: $PY not found (make venv)" >&2; exit 1; }
if [ "$(id -u)" != 0 ]; then
  echo "build-images: BuildKit runs rootful here (runc worker, overlayfs); run as root" >&2
  exit 1
fi
bash hack/build-buildkit.sh >/dev/null
exec "$PY" -m taskhandler_devenv.images
