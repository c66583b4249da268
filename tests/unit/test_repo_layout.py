"""The files operators rely on exist and parse: compose file, Dockerfile, sample broker.conf."""

from __future__ import annotations

from pathlib import Path

import yaml

from loadbalance.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_defines_kafka_redis_and_controller_with_health_checks() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"kafka", "redis", "controller"} <= set(services)
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["redis"]
    assert "--appendonly" in services["redis"]["command"]
    assert services["controller"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_sample_broker_conf_loads() -> None:
    config, warnings = load_config(conf_text=(ROOT / "conf" / "broker.conf").read_text())
    assert warnings == []
    assert config.shedding_strategy_name == "ThresholdShedder"
