#!/usr/bin/env bash
# The main job: embedded Kafka-protocol broker and Redis (unless real ones are configured),
# the streaming job, the controller and a simulated cluster, with a live monitor.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/bootstrap.sh
exec lbctl run "$@"
