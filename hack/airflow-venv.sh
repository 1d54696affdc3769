#!/usr/bin/env bash
# Create the side virtualenv that holds a pinned Apache Airflow, used by the
# tests to build Airflow's real metadata schema (`airflow db migrate`) and to
# let Airflow write real Dag rows (`airflow dags reserialize`).
#
# Why a separate venv: Airflow pins many libraries (SQLAlchemy, pydantic,
# ...); installing it next to the operator would let its pins constrain ours.
#
# Idempotent: a stamp file naming the exact requirement set is written only
# after the install succeeded and `airflow version` answered; when the stamp
# matches, nothing is done. Concurrent callers (make and a pytest fixture)
# serialise on a lock file instead of installing twice into the same venv.
set -euo pipefail

AIRFLOW_VERSION=${AIRFLOW_VERSION:-3.3.2}
PYTHON=${PYTHON:-python3}
CACHE_ROOT=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
VENV=${THOP_AIRFLOW_VENV:-$CACHE_ROOT/airflow-$AIRFLOW_VERSION}
# asyncpg: Airflow 3.3 also opens an async engine; `db migrate` fails without it.
REQUIREMENTS=("apache-airflow-core==$AIRFLOW_VERSION" "psycopg2-binary" "asyncpg")
STAMP="$VENV/.thop-complete"
STAMP_TEXT="${REQUIREMENTS[*]}"

is_complete() {
  [ -x "$VENV/bin/airflow" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]
}

if is_complete; then
  echo "airflow-venv: up to date in $VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -w 900 9; then
  echo "airflow-venv: timed out after 900 s waiting for another install ($VENV.lock)" >&2
  exit 1
fi
# Another caller may have finished while we waited for the lock.
if is_complete; then
  echo "airflow-venv: up to date in $VENV"
  exit 0
fi

command -v "$PYTHON" >/dev/null || { echo "airflow-venv: $PYTHON not found" >&2; exit 1; }
echo "airflow-venv: installing ${REQUIREMENTS[*]} into $VENV (about a minute)"
start=$(date +%s)
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"

# `airflow version` writes an airflow.cfg into AIRFLOW_HOME: keep it out of ~.
check_home=$(mktemp -d "${TMPDIR:-/tmp}/thop-airflow-home.XXXXXX")
trap 'rm -rf "$check_home"' EXIT
# stderr goes to a file, not /dev/null: a broken install must say why, not exit silently.
if ! got=$(AIRFLOW_HOME="$check_home" AIRFLOW__CORE__LOAD_EXAMPLES=False "$VENV/bin/airflow" version 2>"$check_home/version.err"); then
  echo "airflow-venv: 'airflow version' failed in $VENV: $(grep -v '^[[:space:]]*$' "$check_home/version.err" | tail -n 1)" >&2
  exit 1
fi
got=$(printf '%s\n' "$got" | tail -n 1)
if [ "$got" != "$AIRFLOW_VERSION" ]; then
  echo "airflow-venv: expected 'airflow version' to print $AIRFLOW_VERSION, got '$got'" >&2
  exit 1
fi
echo "$STAMP_TEXT" >"$STAMP"
echo "airflow-venv: ready in $VENV ($(($(date +%s) - start)) s)"
