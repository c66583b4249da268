"""``BrokerVersionFilterTest`` restated: ``preferLaterVersions`` keeps the brokers on the latest
semantic version; a missing or unparseable version disables the filter (every candidate stays,
as ``ModularLoadManagerImpl`` restores the set on ``BrokerFilterBadVersionException``)."""

from __future__ import annotations

import itertools

from loadbalance.placement.version_filter import latest_version_brokers, parse_version
from tests.conformance.placement_rules_fixtures import FULL, selector, view

BROKERS = ["broker1", "broker2", "broker3"]


def test_latest_version_number() -> None:
    """BrokerVersionFilterTest.testLatestVersion: 1.2.0 over 1.1.0 over 1.0.0, and a release
    over its own snapshot."""
    versions = {"broker1": "1.2.0", "broker2": "1.1.0", "broker3": "1.0.0"}
    assert latest_version_brokers(BROKERS, versions) == ["broker1"]
    versions = {"broker1": "1.2.0-SNAPSHOT", "broker2": "1.2.0", "broker3": "1.1.9"}
    assert latest_version_brokers(BROKERS, versions) == ["broker2"]


def test_same_versions_keep_every_broker() -> None:
    """BrokerVersionFilterTest: brokers on one version all stay (build metadata ignored)."""
    versions = {"broker1": "2.10.1", "broker2": "2.10.1", "broker3": "2.10.1+build.7"}
    assert latest_version_brokers(BROKERS, versions) == BROKERS


def test_invalid_or_missing_version_disables_the_filter() -> None:
    """BrokerVersionFilterTest.testInvalidVersionString / a report without a version string."""
    assert latest_version_brokers(BROKERS, {"broker1": "1.2.0", "broker2": "1.1.0"}) == BROKERS
    bad = {"broker1": "1.2.0", "broker2": "1.1", "broker3": "1.0.0"}
    assert latest_version_brokers(BROKERS, bad) == BROKERS
    assert parse_version("01.2.3") is None and parse_version("1.2.3-01") is None


def test_empty_broker_list() -> None:
    """BrokerVersionFilterTest: an empty candidate set stays empty."""
    assert latest_version_brokers([], {}) == []


def test_pre_release_precedence() -> None:
    """Semantic Versioning 2.0 precedence, which java-semver implements."""
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2"]
    order += ["1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    for older, newer in itertools.pairwise(order):
        names = ["a", "b"]
        assert latest_version_brokers(names, {"a": older, "b": newer}) == ["b"], (older, newer)


def test_lookup_prefers_later_versions_only_when_the_knob_is_on() -> None:
    """ModularLoadManagerImpl's filter pipeline: with preferLaterVersions a lookup goes to the
    upgraded broker; without it, both old and new brokers take bundles."""
    versions = {"broker1": "3.0.0", "broker2": "3.1.0"}
    v = view(["broker1", "broker2"], versions=versions)
    on = selector(v, preferLaterVersions=True)
    assert {on.select(f"t/ns{i}/{FULL}") for i in range(20)} == {"broker2"}
    off = selector(v, preferLaterVersions=False)
    assert {off.select(f"t/ns{i}/{FULL}") for i in range(20)} == {"broker1", "broker2"}
