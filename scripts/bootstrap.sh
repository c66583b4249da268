#!/usr/bin/env bash
# Creates (or refreshes) the project's own virtual environment in .venv and installs the
# project with its test extras. Sourced by scripts/run.sh and scripts/test.sh so that a fresh
# machine with only Python >= 3.10 and Java 17 needs nothing installed by hand.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LBCTL_VENV:-$repo_root/.venv}"
python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
if [ -z "$python_bin" ]; then
  echo "bootstrap: no python3 (>= 3.10) on PATH" >&2; exit 2
fi
"$python_bin" - <<'PY' || { echo "bootstrap: Python >= 3.10 is required" >&2; exit 2; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY
if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: warning: no 'java' on PATH; Spark needs Java 17" >&2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "bootstrap: creating virtual environment in $venv" >&2
  "$python_bin" -m venv "$venv"
fi
stamp="$venv/.lbctl-installed"
want="$(cat "$repo_root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing dependencies (first run takes about a minute)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo_root[embedded,plots,test]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
# Apache Kafka and Spark's Kafka connector from Maven Central, once (nothing is fetched again
# while the cache holds the pinned jars; infra/jars.py)
"$venv/bin/python" -m infra.jars fetch
