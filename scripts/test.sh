#!/usr/bin/env bash
# The test command: lint, architecture check, then the whole suite (unit, Redis, Kafka, Spark,
# end to end) against services the tests start themselves on free loopback ports.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/bootstrap.sh
echo "== ruff format --check"; ruff format --check .
echo "== ruff check"; ruff check .
echo "== lint-imports (layers and the pure core)"; lint-imports
echo "== pytest"
python -m pytest "$@"
