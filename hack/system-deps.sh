#!/usr/bin/env bash
# Install the system packages the tests need when they are missing (Debian).
# Go, Java and Node.js come with the machine; PostgreSQL server binaries,
# openssl and git are installed from Debian's packages if absent.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v openssl >/dev/null || missing+=(openssl)
command -v git >/dev/null || missing+=(git)
# The process node's venv (hack/node-venv.sh) is built from Debian's python3.
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "system-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
for tool in go java javac node; do
  command -v "$tool" >/dev/null || { echo "system-deps: $tool is required and not on PATH" >&2; exit 1; }
done
