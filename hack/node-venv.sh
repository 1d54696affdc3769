#!/usr/bin/env bash
# Create the virtualenv the process node runs the `taskhandler-operator` image from.
#
# Why a second venv: the node runs containers as their runAsUser (non-root, e.g. 65532). The
# project venv's interpreter links into pyenv under /root, which is mode 700, so a non-root
# container cannot exec it. This venv is built from Debian's /usr/bin/python3 in a world-readable
# folder outside /root.
#
# Why a copy of the source: containers run in a private mount namespace where the pod's volumes
# are bind-mounted (an emptyDir on /tmp, /bundle, ...). An editable install pointing into a
# checkout under such a path (a clone in /tmp) would vanish inside the pod. So the package is
# installed editable from a copy inside this venv ($VENV/src), refreshed on every call when the
# checkout's sources changed, and a probe pod still runs the code under test.
#
# Idempotent and cached: stamps name pyproject.toml's digest and the worktree (the install) and
# the sources' digest (the copy); when they match nothing is done. Concurrent callers serialise
# on a lock file. Prints the venv's bin dir last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${THOP_NODE_PYTHON:-/usr/bin/python3}
ROOT=${THOP_NODE_VENV_ROOT:-/var/cache/taskhandler-operator}
KEY=$(printf '%s\n%s\n' "$REPO" "$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)" | sha256sum | cut -c1-12)
VENV=${THOP_NODE_VENV:-$ROOT/node-venv-$KEY}
SRC="$VENV/src"
STAMP="$VENV/.thop-complete"
STAMP_TEXT="$REPO $KEY from-copy"  # "from-copy": installed from $SRC, not the checkout

# What the copy holds: the project metadata and the package, without bytecode caches.
sources_digest() {
  (
    cd "$REPO"
    find pyproject.toml README.md operator -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
      | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
  )
}
DIGEST=$(sources_digest)

is_complete() {
  [ -x "$VENV/bin/taskhandler-operator" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] \
    && [ -f "$SRC/.thop-digest" ] && [ "$(cat "$SRC/.thop-digest")" = "$DIGEST" ]
}

# Replace $SRC by a fresh copy of the checkout's sources (new folder first, then swap).
copy_sources() {
  local next="$VENV/src.next" old="$VENV/src.old"
  rm -rf "$next" "$old"
  mkdir -p "$next"
  tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - pyproject.toml README.md operator \
    | tar -C "$next" -xf -
  echo "$DIGEST" >"$next/.thop-digest"
  chmod -R a+rX "$next"
  [ -d "$SRC" ] && mv "$SRC" "$old"
  mv "$next" "$SRC"
  rm -rf "$old"
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
mkdir -p "$VENV"
copy_sources
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$VENV/bin/taskhandler-operator" ]; then
  # Installed before with the same pyproject.toml: the editable install reads the new copy.
  echo "$VENV/bin"
  exit 0
fi
echo "node-venv: installing the package into $VENV" >&2
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$SRC" >&2
"$VENV/bin/taskhandler-operator" --help >/dev/null
chmod -R a+rX "$VENV"
echo "$STAMP_TEXT" >"$STAMP"
echo "$VENV/bin"
