#!/usr/bin/env bash
# Write images/requirements.txt: the operator's runtime dependencies ([project].dependencies in
# pyproject.toml) resolved to exact versions, each with the sha256 of every file published for
# that version, which images/Dockerfile installs with `pip install --require-hashes --no-deps`.
# Run it (`make requirements-lock`) after changing the dependencies in pyproject.toml, and to take
# newer versions within their ranges; tests/unit/test_requirements_lock.py fails until the lock
# agrees with pyproject.toml.
#
# --universal: one lock for every platform the images are built for (amd64, arm64), with
# environment markers where they differ; --python-version: the images' Python (images/Dockerfile).
# Needs the package index; uv comes pinned with the dev extra (make venv).
set -euo pipefail

cd "$(dirname "$0")/.."
UV=${UV:-${VENV:-.venv}/bin/uv}

"$UV" pip compile pyproject.toml \
  --quiet \
  --universal \
  --python-version 3.11 \
  --generate-hashes \
  --no-strip-extras \
  --annotation-style split \
  --custom-compile-command "make requirements-lock" \
  --output-file images/requirements.txt \
  "$@"
