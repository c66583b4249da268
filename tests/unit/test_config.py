"""Configuration: Pulsar's names and defaults, sources and precedence, validation, secrets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from lbctl import config_cmd
from loadbalance.config import (
    ConfigError,
    LoadBalancerConfig,
    config_markdown,
    config_rows,
    load_config,
    parse_broker_conf,
)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_pulsars() -> None:
    c = LoadBalancerConfig()
    assert c.load_balancer_shedding_interval_minutes == 1
    assert c.load_balancer_shedding_grace_period_minutes == 30
    assert c.load_balancer_broker_overloaded_threshold_percentage == 85
    assert c.load_balancer_history_resource_percentage == 0.9
    assert c.load_balancer_broker_threshold_shedder_percentage == 10
    assert c.load_balancer_namespace_bundle_max_topics == 1000
    assert c.load_balancer_namespace_bundle_max_msg_rate == 30000
    assert c.load_balancer_namespace_maximum_bundles == 128
    assert c.load_balancer_cpu_resource_weight == 1.0
    assert c.load_balancer_memory_resource_weight == 0.0
    assert c.load_balance_shedding_delay_in_seconds == 180
    assert c.load_balancer_broker_load_target_std == 0.25
    assert c.shedding_strategy_name == "ThresholdShedder"
    assert c.placement_strategy_name == "LeastLongTermMessageRate"
    assert c.default_namespace_bundle_split_algorithm == "range_equally_divide"


def test_pulsar_names_irregular_spellings_and_deprecated_aliases() -> None:
    c, _ = load_config(
        overrides={
            "loadBalancerCPUResourceWeight": "2",
            "loadBalanceSheddingDelayInSeconds": "60",
            "loadBalancerBandwithOutResourceWeight": "0.5",
            "loadBalancerBrokerLoadDataTTLInSeconds": "600",
        }
    )
    assert c.load_balancer_cpu_resource_weight == 2.0
    assert c.load_balance_shedding_delay_in_seconds == 60
    assert c.load_balancer_bandwidth_out_resource_weight == 0.5
    assert c.load_balancer_broker_load_data_ttl_in_seconds == 600


def test_broker_conf_parsing_keeps_unknown_keys_aside() -> None:
    text = """
    # a real broker.conf has hundreds of keys
    zookeeperServers=zk:2181
    loadBalancerSheddingIntervalMinutes = 5
    loadBalancerLoadSheddingStrategy=org.apache.pulsar.broker.loadbalance.impl.OverloadShedder
    loadBalancerEnabled=
    supportedNamespaceBundleSplitAlgorithms=range_equally_divide,topic_count_equally_divide
    """
    assert parse_broker_conf(text)["loadBalancerSheddingIntervalMinutes"] == "5"
    c, warnings = load_config(conf_text=text)
    assert c.load_balancer_shedding_interval_minutes == 5
    assert c.shedding_strategy_name == "OverloadShedder"
    assert c.load_balancer_enabled is True  # empty value = default
    assert c.supported_namespace_bundle_split_algorithms == (
        "range_equally_divide",
        "topic_count_equally_divide",
    )
    assert warnings == [
        "broker.conf: ignoring 1 key(s) that are not load-balancer settings "
        "(e.g. zookeeperServers); --verbose lists them"
    ]


def test_precedence_conf_then_env_then_overrides() -> None:
    conf = "loadBalancerSheddingIntervalMinutes=2\nloadBalancerSheddingGracePeriodMinutes=7"
    env = {
        "LB_loadBalancerSheddingIntervalMinutes": "3",
        "LB_LOAD_BALANCER_SHEDDING_GRACE_PERIOD_MINUTES": "8",
        "PATH": "/usr/bin",
    }
    c, _ = load_config(conf_text=conf, env=env)
    assert c.load_balancer_shedding_interval_minutes == 3
    assert c.load_balancer_shedding_grace_period_minutes == 8
    c, _ = load_config(
        conf_text=conf, env=env, overrides={"loadBalancerSheddingIntervalMinutes": "4"}
    )
    assert c.load_balancer_shedding_interval_minutes == 4


def test_unknown_override_names_the_key_and_suggests() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"loadBalancerSheddingIntervalMinute": "1"})
    assert e.value.knob == "loadBalancerSheddingIntervalMinute"
    assert "did you mean loadBalancerSheddingIntervalMinutes" in str(e.value)


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("loadBalancerHistoryResourcePercentage", "1.5"),
        ("loadBalancerBrokerOverloadedThresholdPercentage", "150"),
        ("loadBalancerSheddingIntervalMinutes", "0"),
        ("loadBalancerCPUResourceWeight", "-1"),
        ("loadBalancerSheddingEnabled", "maybe"),
        ("loadBalancerLoadSheddingStrategy", "NoSuchShedder"),
        ("defaultNamespaceBundleSplitAlgorithm", "halve"),
        ("loadBalancerNamespaceMaximumBundles", "many"),
    ],
)
def test_bad_values_fail_naming_the_knob(knob: str, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(overrides={knob: value})
    assert e.value.knob == knob
    assert str(e.value).startswith(f"{knob}: ")


def test_config_is_frozen() -> None:
    c = LoadBalancerConfig()
    with pytest.raises(ValidationError):
        c.load_balancer_enabled = False  # type: ignore[misc]


def test_secrets_never_shown() -> None:
    c, _ = load_config(
        overrides={
            "redisPassword": "hunter2",
            "kafkaSaslPassword": "s3cret",
            "redisUrl": "redis://admin:topsecret@redis:6379/0",
        }
    )
    rows = config_rows(c)
    text = repr(c) + str(c) + json.dumps(rows)
    for secret in ("hunter2", "s3cret", "topsecret"):
        assert secret not in text
    assert dict((k, v) for k, v, _, _ in rows)["redisUrl"] == "redis://admin:******@redis:6379/0"
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"redisPassword": "hunter2", "redisKeyPrefix": ""})
    assert "hunter2" not in str(e.value)


def test_docs_table_is_up_to_date() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert doc == config_markdown(), "run: python scripts/gen_config_doc.py"


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    config_cmd.register(sub)
    args = parser.parse_args(["config", "show", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_config_show_json_and_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LB_redisPassword", "pw-from-env")
    conf = tmp_path / "broker.conf"
    conf.write_text("loadBalancerSheddingIntervalMinutes=9\nbrokerServicePort=6650\n")
    code, out, err = _show(capsys, "--config", str(conf), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["loadBalancerSheddingIntervalMinutes"] == "9"
    assert doc["redisPassword"] == "******"
    assert "brokerServicePort" in err
    code, out, _ = _show(capsys, "--set", "loadBalancerSheddingGracePeriodMinutes=12")
    assert code == 0 and "loadBalancerSheddingGracePeriodMinutes" in out and "12" in out
    assert "pw-from-env" not in out
    code, _, err = _show(capsys, "--set", "nope=1")
    assert code == 2 and "nope" in err


def test_non_load_balancer_keys_give_one_summary_line_and_verbose_lists_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from infra.config_loading import add_config_arguments, load_from_args

    others = [f"someBrokerSetting{i}=x" for i in range(40)]
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "\n".join(
            [
                *others,
                "loadBalancerSheddingIntervalMinutse=3",  # a typo of a load-balancer knob
                "loadManagerClassName=org.apache.pulsar.broker.loadbalance.impl."
                "ModularLoadManagerImpl",
                "loadBalancerDebugModeEnabled=true",
                "preferLaterVersions=true",
            ]
        )
    )
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    load_from_args(parser.parse_args(["--config", str(conf)]))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "lbctl: warning: broker.conf: ignoring unknown key loadBalancerSheddingIntervalMinutse "
        "(did you mean loadBalancerSheddingIntervalMinutes?)",
        "lbctl: warning: broker.conf: ignoring 40 key(s) that are not load-balancer settings "
        "(e.g. someBrokerSetting0); --verbose lists them",
    ]
    load_from_args(parser.parse_args(["--config", str(conf), "--verbose"]))
    verbose = capsys.readouterr().err
    for i in range(40):
        assert f"(not a load-balancer setting): someBrokerSetting{i}\n" in verbose
    for key in ("loadManagerClassName", "loadBalancerDebugModeEnabled"):
        assert f"lbctl: note: broker.conf: {key}=" in verbose
    assert "BrokerLoadData" in verbose


def test_infinite_or_nan_knob_values_are_refused_naming_the_knob() -> None:
    """ "inf" passes "> 0" and would break the millisecond arithmetic of a TTL or interval."""
    import pytest

    from loadbalance.config import ConfigError, load_config

    for knob in ("loadBalancerOwnershipLeaseTtlSeconds", "loadBalancerSheddingIntervalMinutes"):
        for value in ("inf", "-inf", "nan", "1e400"):
            with pytest.raises(ConfigError, match=knob):
                load_config(overrides={knob: value})
