#!/usr/bin/env bash
# Create the virtualenv the process node runs the `taskhandler-operator` image from.
#
# Why a second venv: the node runs containers as their runAsUser (non-root, e.g. 65532). The
# project venv's interpreter links into pyenv under /root, which is mode 700, so a non-root
# container cannot exec it. This venv is built from Debian's /usr/bin/python3 in a world-readable
# folder outside /root, with the package installed editable from this worktree (which is
# world-readable too), so a probe pod runs the code under test.
#
# Idempotent and cached: a stamp names pyproject.toml's digest and the worktree; when it matches
# nothing is done. Concurrent callers serialise on a lock file. Prints the venv's bin dir last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${THOP_NODE_PYTHON:-/usr/bin/python3}
ROOT=${THOP_NODE_VENV_ROOT:-/var/cache/taskhandler-operator}
KEY=$(printf '%s\n%s\n' "$REPO" "$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)" | sha256sum | cut -c1-12)
VENV=${THOP_NODE_VENV:-$ROOT/node-venv-$KEY}
STAMP="$VENV/.thop-complete"
STAMP_TEXT="$REPO $KEY"

is_complete() {
  [ -x "$VENV/bin/taskhandler-operator" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]
}

if is_complete; then
  echo "$VENV/bin"
  exit 0
fi
mkdir -p "$ROOT"
chmod 755 "$ROOT"
exec 9>"$VENV.lock"
flock -w 900 9 || { echo "node-venv: timed out waiting for $VENV.lock" >&2; exit 1; }
if is_complete; then
  echo "$VENV/bin"
  exit 0
fi
[ -x "$PYTHON" ] || { echo "node-venv: $PYTHON not found (make system-deps installs python3-venv)" >&2; exit 1; }
echo "node-venv: installing the package into $VENV" >&2
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$REPO" >&2
"$VENV/bin/taskhandler-operator" --help >/dev/null
chmod -R a+rX "$VENV"
echo "$STAMP_TEXT" >"$STAMP"
echo "$VENV/bin"
