#!/usr/bin/env bash
# The main job: embedded Kafka-protocol broker and Redis (unless real ones are configured),
# the streaming job, the controller and a simulated cluster, with a live monitor.
#
#   bash scripts/run.sh                      # hot_bundle on embedded services; Ctrl-C stops all
#   bash scripts/run.sh herding              # another bundled scenario
#   bash scripts/run.sh --duration 180       # end by itself and print a summary
#   bash scripts/run.sh --bootstrap-servers HOST:9092 --redis-url redis://HOST:6379/0
#   bash scripts/run.sh --fast               # in-memory simulator only (no Kafka/Spark/Redis)
#
# Logs of every process go to .lbctl/run/<time>/ (the path is printed at start and at stop).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/bootstrap.sh
exec lbctl run "$@"
