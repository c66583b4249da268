"""One typed, frozen configuration with Pulsar's knob names and defaults.

Attributes are the snake_case of Pulsar's names (acronyms as one word:
``loadBalancerCPUResourceWeight`` -> ``load_balancer_cpu_resource_weight``); Pulsar's camelCase
name is the alias, so a ``broker.conf`` key, an ``LB_<name>`` environment variable and a
``--set name=value`` all use the name a Pulsar operator knows. Defaults are those of
Pulsar's ``ServiceConfiguration`` (docs/pulsar-parity.md lists where this one differs).

Deviations and additions (each says so in its description):

* ``loadBalancerSplitDebounceEnabled`` (ours, off): the modular manager splits without a
  debounce; turning it on applies the extensible manager's
  ``loadBalancerNamespaceBundleSplitConditionHitCountThreshold``.
* The merge knobs, ``loadBalancerBrokerReportTimeoutSeconds``, the lease and registration TTLs,
  and the service settings (Kafka, Redis, topic names, size limits) are ours.
* Recognised Pulsar knobs that nothing here reads (``INERT_KNOBS``: the extensible manager's
  ownership-channel knobs, ``loadManagerClassName``, ``loadBalancerDebugModeEnabled``, ...) are
  fields, so a broker.conf that sets them loads, but each says why it is inert: ``config show``
  marks it, and a value other than the default gets one warning naming the knob. Every other
  knob is read by some code path (``tests/unit/test_knobs_in_force.py`` checks).
* ``loadBalancerLoadSheddingStrategy`` / ``loadBalancerLoadPlacementStrategy`` accept Pulsar's full
  class names and the short names; our own strategies are registered in ``KNOWN_SHEDDERS`` and
  ``KNOWN_PLACEMENTS``.

Secrets (``redisUrl``, ``redisPassword``, ``kafkaSaslPassword``, ``kafkaSslKeyPassword``) are
validated into ``SecretText``: a ``str`` (so every client that was handed one keeps working and
the value reaches redis-py and librdkafka unchanged) whose ``repr`` is masked, so a secret that
lands in a traceback, a pydantic error, a debugger or a ``%r`` log line shows ``******`` (a URL
shows ``redis://user:******@host``). ``config show`` masks them too, and ``build_config`` never
quotes a secret's value in an error. Deviation from pydantic's ``SecretStr``: ``str(secret)`` is
the value, because the shell modules pass these settings straight to clients.

``kafka_client_settings()`` and ``redis_client_kwargs()`` turn the security knobs into the
settings of librdkafka (confluent-kafka, the Python Spark source; prefix them with ``kafka.``
for Spark's built-in source) and redis-py, so every client is configured from one place.

Pure: parsing takes text and mappings; the shell (``infra/config_loading.py``) reads files and the
environment.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

KNOWN_SHEDDERS = {
    "ThresholdShedder",
    "OverloadShedder",
    "UniformLoadShedder",
    "TransferShedder",
    "ProjectedUsageShedder",
}
KNOWN_PLACEMENTS = {
    "LeastLongTermMessageRate",
    "LeastResourceUsageWithWeight",
    "RoundRobinBrokerSelector",
    "LeastProjectedUsage",
}
SECRET_MASK = "******"

# Deprecated Pulsar spellings -> current name.
DEPRECATED_ALIASES = {
    "loadBalancerBandwithInResourceWeight": "loadBalancerBandwidthInResourceWeight",
    "loadBalancerBandwithOutResourceWeight": "loadBalancerBandwidthOutResourceWeight",
    "loadBalancerMaxNumberOfBrokerTransfersPerCycle": "loadBalancerMaxNumberOfBrokerSheddingPerCycle",
    "loadBalanceUnloadDelayInSeconds": "loadBalanceSheddingDelayInSeconds",
}


_URL_AUTH_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<auth>.*)@(?P<rest>[^@]*)$")


def redact_url(url: str) -> str:
    """``redis://user:******@host:6379/0``: a URL with its password masked, all else kept.

    The userinfo runs to the *last* ``@`` (an unencoded ``@`` in a password must not leak the
    rest of it); a userinfo without ``:`` is a user name and stays.
    """
    m = _URL_AUTH_RE.match(url)
    if m is None:
        return url
    auth = m.group("auth")
    if ":" not in auth:
        return url
    user = auth.split(":", 1)[0]
    return f"{m.group('scheme')}{user}:{SECRET_MASK}@{m.group('rest')}"


class SecretText(str):
    """A secret setting: a ``str`` whose ``repr`` is masked (see the module docstring)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(SECRET_MASK) if self else "''"

    def reveal(self) -> str:
        """The plain value, for handing to a client."""
        return str.__str__(self)


class SecretUrl(SecretText):
    """A URL that may carry a password: ``repr`` keeps everything but the password."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact_url(self.reveal()))


Secret = Annotated[str, AfterValidator(SecretText)]
SecretURL = Annotated[str, AfterValidator(SecretUrl)]


class ConfigError(ValueError):
    """A knob has a bad value or an unknown name; ``knob`` is its Pulsar name."""

    def __init__(self, knob: str, message: str) -> None:
        super().__init__(f"{knob}: {message}")
        self.knob = knob


def _f(default: Any, description: str, *, alias: str, secret: bool = False, **kw: Any) -> Any:
    extra = {"secret": True} if secret else None
    return Field(default, alias=alias, description=description, json_schema_extra=extra, **kw)


_PCT = {"ge": 0, "le": 100}
_POS = {"gt": 0}
_NONNEG = {"ge": 0}


class LoadBalancerConfig(BaseModel):
    """Every knob the policies, the streaming job and the controller read."""

    # allow_inf_nan=False: an infinite TTL or interval would pass "> 0" and then break the
    # arithmetic that turns it into milliseconds; no knob means "infinite" by inf
    model_config = ConfigDict(
        frozen=True, populate_by_name=True, extra="forbid", allow_inf_nan=False
    )

    # -- switches --------------------------------------------------------------------------
    load_balancer_enabled: bool = _f(
        True, "Master switch of the load manager.", alias="loadBalancerEnabled"
    )
    load_balancer_shedding_enabled: bool = _f(
        True, "Run the shedding (unload) step.", alias="loadBalancerSheddingEnabled"
    )
    load_balancer_auto_bundle_split_enabled: bool = _f(
        True, "Split hot bundles automatically.", alias="loadBalancerAutoBundleSplitEnabled"
    )
    load_balancer_auto_unload_split_bundles_enabled: bool = _f(
        True,
        "The controller leaves the children of a split free, to be placed on their next "
        "lookup (Pulsar's splitAndOwnBundle with unload); off: each child is leased to the "
        "parent's owner right after the split.",
        alias="loadBalancerAutoUnloadSplitBundlesEnabled",
    )
    load_balancer_load_shedding_strategy: str = _f(
        "org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder",
        "Shedding strategy: Pulsar class name or short name (ThresholdShedder, OverloadShedder, UniformLoadShedder, TransferShedder, ProjectedUsageShedder).",
        alias="loadBalancerLoadSheddingStrategy",
    )
    load_balancer_load_placement_strategy: str = _f(
        "org.apache.pulsar.broker.loadbalance.impl.LeastLongTermMessageRate",
        "Placement strategy: Pulsar class name or short name (LeastLongTermMessageRate, LeastResourceUsageWithWeight, RoundRobinBrokerSelector, LeastProjectedUsage).",
        alias="loadBalancerLoadPlacementStrategy",
    )
    # -- reporting -------------------------------------------------------------------------
    load_balancer_report_update_min_interval_millis: int = _f(
        5000,
        "How often a broker checks whether to publish a report, ms.",
        alias="loadBalancerReportUpdateMinIntervalMillis",
        **_POS,
    )
    load_balancer_report_update_threshold_percentage: float = _f(
        10,
        "Publish a report when a figure changed by more than this, percent.",
        alias="loadBalancerReportUpdateThresholdPercentage",
        **_PCT,
    )
    load_balancer_report_update_max_interval_minutes: float = _f(
        15,
        "Publish a report at least this often, minutes.",
        alias="loadBalancerReportUpdateMaxIntervalMinutes",
        **_POS,
    )
    load_balancer_host_usage_check_interval_minutes: float = _f(
        1,
        "How often Pulsar's broker samples its host usage, minutes.",
        alias="loadBalancerHostUsageCheckIntervalMinutes",
        **_POS,
    )
    load_balancer_override_broker_nic_speed_gbps: float | None = _f(
        None,
        "NIC speed the broker agent measures bandwidth against, Gbit/s; empty: the speed the "
        "OS reports (Pulsar's meaning). The agent's --nic-speed-mbps overrides it.",
        alias="loadBalancerOverrideBrokerNicSpeedGbps",
        **_POS,
    )
    # -- shedding --------------------------------------------------------------------------
    load_balancer_shedding_interval_minutes: float = _f(
        1,
        "Interval between shedding cycles, minutes.",
        alias="loadBalancerSheddingIntervalMinutes",
        **_POS,
    )
    load_balancer_shedding_grace_period_minutes: float = _f(
        30,
        "A bundle moved within this period is not moved again, minutes.",
        alias="loadBalancerSheddingGracePeriodMinutes",
        **_NONNEG,
    )
    load_balancer_broker_overloaded_threshold_percentage: float = _f(
        85,
        "A broker above this usage is overloaded (OverloadShedder, placement re-check), percent.",
        alias="loadBalancerBrokerOverloadedThresholdPercentage",
        **_PCT,
    )
    load_balancer_balanced_max_over_mean: float = _f(
        1.10,
        "Ours: the cluster counts as balanced while the busiest broker's usage is at most this "
        "multiple of the mean usage (Cruise Control's default balance threshold), each "
        "isolation pool against its own mean; used by the run summary, the balance scoreboard "
        "and lbctl monitor. For our shedder (ProjectedUsageShedder) it is both the trigger (it "
        "moves bundles only in a pool with a broker above it, or an overloaded broker) and "
        "where shedding aims (each broker it sheds stops loadBalancerSheddingStopMargin inside "
        "it, and no move takes a destination past it unless it relieves an overloaded broker).",
        alias="loadBalancerBalancedMaxOverMean",
        ge=1,
    )
    load_balancer_shedding_stop_margin: float = _f(
        0.02,
        "Ours: our shedder (ProjectedUsageShedder) sheds a broker until it is this far inside "
        "loadBalancerBalancedMaxOverMean (the band less this, x the mean; 1.08 by default); each "
        "move is still chosen to settle the broker at the band less 0.04 when one move can. A "
        "further move for the last hundredths costs a whole move that report noise undoes.",
        alias="loadBalancerSheddingStopMargin",
        **_NONNEG,
    )
    load_balancer_in_flight_move_timeout_seconds: float = _f(
        960,
        "Ours: a move the reports do not show yet is projected into the next cycles' usage "
        "until its source and destination reports show it, or for at most this long: every "
        "live broker reports at least every loadBalancerReportUpdateMaxIntervalMinutes (15), "
        "so a move still not shown after that (plus a cycle) did not happen, s.",
        alias="loadBalancerInFlightMoveTimeoutSeconds",
        **_POS,
    )
    load_balancer_history_resource_percentage: float = _f(
        0.9,
        "Weight of history in the broker usage average, 0..1.",
        alias="loadBalancerHistoryResourcePercentage",
        ge=0,
        le=1,
    )
    load_balancer_broker_threshold_shedder_percentage: float = _f(
        10,
        "ThresholdShedder: shed from brokers above the average by this, percent.",
        alias="loadBalancerBrokerThresholdShedderPercentage",
        **_PCT,
    )
    load_balancer_bundle_unload_min_throughput_threshold: float = _f(
        10,
        "ThresholdShedder: do not shed less than this throughput, MB/s.",
        alias="loadBalancerBundleUnloadMinThroughputThreshold",
        **_NONNEG,
    )
    lower_boundary_shedding_enabled: bool = _f(
        False,
        "ThresholdShedder: also shed when a broker is below average minus the threshold.",
        alias="lowerBoundarySheddingEnabled",
    )
    load_balancer_cpu_resource_weight: float = _f(
        1.0,
        "Weight of CPU in the weighted max usage.",
        alias="loadBalancerCPUResourceWeight",
        **_NONNEG,
    )
    load_balancer_memory_resource_weight: float = _f(
        0.0,
        "Weight of heap memory in the weighted max usage (deprecated in Pulsar 3.0, default 0).",
        alias="loadBalancerMemoryResourceWeight",
        **_NONNEG,
    )
    load_balancer_direct_memory_resource_weight: float = _f(
        0.0,
        "Weight of direct memory in the weighted max usage.",
        alias="loadBalancerDirectMemoryResourceWeight",
        **_NONNEG,
    )
    load_balancer_bandwidth_in_resource_weight: float = _f(
        1.0,
        "Weight of inbound bandwidth in the weighted max usage.",
        alias="loadBalancerBandwidthInResourceWeight",
        **_NONNEG,
    )
    load_balancer_bandwidth_out_resource_weight: float = _f(
        1.0,
        "Weight of outbound bandwidth in the weighted max usage.",
        alias="loadBalancerBandwidthOutResourceWeight",
        **_NONNEG,
    )
    load_balancer_msg_rate_difference_shedder_threshold: float = _f(
        50,
        "UniformLoadShedder: shed when max/min msg rate differ by more than this, percent (<=0 disables).",
        alias="loadBalancerMsgRateDifferenceShedderThreshold",
    )
    load_balancer_msg_throughput_multiplier_difference_shedder_threshold: float = _f(
        4,
        "UniformLoadShedder: shed when max/min throughput ratio exceeds this (<=0 disables).",
        alias="loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold",
    )
    max_unload_percentage: float = _f(
        0.2,
        "UniformLoadShedder: fraction of (max - min) to move per cycle.",
        alias="maxUnloadPercentage",
        gt=0,
        le=1,
    )
    min_unload_message: float = _f(
        1000,
        "UniformLoadShedder: minimum msg rate to move, msg/s.",
        alias="minUnloadMessage",
        **_NONNEG,
    )
    min_unload_message_throughput: float = _f(
        1048576,
        "UniformLoadShedder: minimum throughput to move, bytes/s.",
        alias="minUnloadMessageThroughput",
        **_NONNEG,
    )
    max_unload_bundle_num_per_shedding: int = _f(
        -1,
        "UniformLoadShedder: at most this many bundles per cycle (-1 = unlimited).",
        alias="maxUnloadBundleNumPerShedding",
        ge=-1,
    )
    # -- placement -------------------------------------------------------------------------
    load_balancer_average_resource_usage_difference_threshold_percentage: float = _f(
        10,
        "LeastResourceUsageWithWeight: a candidate must be this far below average, percent.",
        alias="loadBalancerAverageResourceUsageDifferenceThresholdPercentage",
        **_PCT,
    )
    load_balancer_broker_max_topics: int = _f(
        50000,
        "Brokers with more topics are not placement candidates.",
        alias="loadBalancerBrokerMaxTopics",
        **_POS,
    )
    load_balancer_distribute_bundles_evenly_enabled: bool = _f(
        True,
        "Prefer brokers with the fewest bundles of the namespace.",
        alias="loadBalancerDistributeBundlesEvenlyEnabled",
    )
    prefer_later_versions: bool = _f(
        False,
        "Pulsar's BrokerVersionFilter: place bundles only on the candidates whose report's "
        "brokerVersionString is the latest semantic version; when any candidate's version is "
        "missing or unparseable, every candidate stays (Pulsar's fallback).",
        alias="preferLaterVersions",
    )
    failure_domains_enabled: bool = _f(
        False,
        "Spread the namespaces of an anti-affinity group over failure domains too "
        "(clusters create-failure-domain) before spreading them over brokers.",
        alias="failureDomainsEnabled",
    )
    load_balancer_placement_projected_overload_check_enabled: bool = _f(
        False,
        "Ours: refuse a destination the bundle's estimated load (its averages, or its share of "
        "its closest ancestor's) would push past loadBalancerBrokerOverloadedThresholdPercentage "
        "on that broker's own capacity while another candidate would stay below it; off: "
        "Pulsar's re-check of the chosen broker's current usage only.",
        alias="loadBalancerPlacementProjectedOverloadCheckEnabled",
    )
    # -- split -----------------------------------------------------------------------------
    load_balancer_namespace_bundle_max_topics: int = _f(
        1000,
        "Split a bundle with more topics than this.",
        alias="loadBalancerNamespaceBundleMaxTopics",
        **_POS,
    )
    load_balancer_namespace_bundle_max_sessions: int = _f(
        1000,
        "Split a bundle with more producers+consumers than this (<=0 disables).",
        alias="loadBalancerNamespaceBundleMaxSessions",
    )
    load_balancer_namespace_bundle_max_msg_rate: float = _f(
        30000,
        "Split a bundle whose long-term msg rate in+out exceeds this, msg/s.",
        alias="loadBalancerNamespaceBundleMaxMsgRate",
        **_POS,
    )
    load_balancer_namespace_bundle_max_bandwidth_mbytes: float = _f(
        100,
        "Split a bundle whose long-term throughput in+out exceeds this, MB/s.",
        alias="loadBalancerNamespaceBundleMaxBandwidthMbytes",
        **_POS,
    )
    load_balancer_namespace_maximum_bundles: int = _f(
        128,
        "No automatic split beyond this many bundles per namespace.",
        alias="loadBalancerNamespaceMaximumBundles",
        **_POS,
    )
    default_number_of_namespace_bundles: int = _f(
        4, "Bundles of a new namespace.", alias="defaultNumberOfNamespaceBundles", **_POS
    )
    default_namespace_bundle_split_algorithm: str = _f(
        "range_equally_divide",
        "Split algorithm of automatic splits.",
        alias="defaultNamespaceBundleSplitAlgorithm",
    )
    supported_namespace_bundle_split_algorithms: tuple[str, ...] = _f(
        (
            "range_equally_divide",
            "topic_count_equally_divide",
            "specified_positions_divide",
            "flow_or_qps_equally_divide",
        ),
        "Split algorithms operators may choose.",
        alias="supportedNamespaceBundleSplitAlgorithms",
    )
    flow_or_qps_difference_threshold_percentage: float = _f(
        10,
        "flow_or_qps_equally_divide: split only this far above the maximum, percent.",
        alias="flowOrQpsDifferenceThresholdPercentage",
        **_NONNEG,
    )
    load_balancer_split_interval_minutes: float = _f(
        1,
        "Interval between split checks, minutes.",
        alias="loadBalancerSplitIntervalMinutes",
        **_POS,
    )
    load_balancer_max_number_of_bundles_to_split_per_cycle: int = _f(
        10,
        "At most this many splits per cycle.",
        alias="loadBalancerMaxNumberOfBundlesToSplitPerCycle",
        **_POS,
    )
    load_balancer_namespace_bundle_split_condition_hit_count_threshold: int = _f(
        3,
        "Split debounce: consecutive hits needed (with loadBalancerSplitDebounceEnabled).",
        alias="loadBalancerNamespaceBundleSplitConditionHitCountThreshold",
        **_NONNEG,
    )
    load_balancer_split_debounce_enabled: bool = _f(
        False,
        "Ours: apply the split hit-count debounce (the modular manager has none).",
        alias="loadBalancerSplitDebounceEnabled",
    )
    namespace_bundle_unloading_timeout_ms: int = _f(
        60000,
        "How long an unload or transfer may hold its bundle before the controller applies it, "
        "from the decision's time, ms; past it the controller gives up and records the "
        "outcome rejected ('unload timed out'), the bundle staying with its owner. Pulsar "
        "bounds the owner's unload by it; here the release itself never waits.",
        alias="namespaceBundleUnloadingTimeoutMs",
        **_POS,
    )
    # -- extensible load manager (TransferShedder) ----------------------------------------
    load_balancer_broker_load_target_std: float = _f(
        0.25,
        "TransferShedder: shed while the std of broker usage exceeds this.",
        alias="loadBalancerBrokerLoadTargetStd",
        **_NONNEG,
    )
    load_balancer_shedding_condition_hit_count_threshold: int = _f(
        3,
        "TransferShedder: consecutive hits before shedding.",
        alias="loadBalancerSheddingConditionHitCountThreshold",
        **_NONNEG,
    )
    load_balancer_transfer_enabled: bool = _f(
        True,
        "Move shed bundles straight to a chosen destination (transfer) instead of a plain unload.",
        alias="loadBalancerTransferEnabled",
    )
    load_balancer_max_number_of_broker_shedding_per_cycle: int = _f(
        3,
        "TransferShedder: at most this many broker pairs per cycle.",
        alias="loadBalancerMaxNumberOfBrokerSheddingPerCycle",
        **_POS,
    )
    load_balance_shedding_delay_in_seconds: float = _f(
        180,
        "TransferShedder: cool-down after a move before shedding again, s.",
        alias="loadBalanceSheddingDelayInSeconds",
        **_NONNEG,
    )
    load_balancer_broker_load_data_ttl_in_seconds: float = _f(
        1800,
        "TransferShedder: ignore broker data older than this, s.",
        alias="loadBalancerBrokerLoadDataTTLInSeconds",
        **_POS,
    )
    load_balancer_max_number_of_bundles_in_bundle_load_report: int = _f(
        10,
        "Top-K bundles considered per broker (-1 = all).",
        alias="loadBalancerMaxNumberOfBundlesInBundleLoadReport",
        ge=-1,
    )
    load_balancer_shedding_bundles_with_policies_enabled: bool = _f(
        False,
        "TransferShedder: shed a bundle whose namespace has an isolation policy or an "
        "anti-affinity group, and only to a broker those policies allow; off: such bundles are "
        "not shed at all. The modular shedders' policy guards apply either way.",
        alias="loadBalancerSheddingBundlesWithPoliciesEnabled",
    )
    load_balancer_in_flight_service_unit_state_waiting_time_in_millis: int = _f(
        30000,
        "Extensible manager: in-flight ownership changes older than this are repaired, ms.",
        alias="loadBalancerInFlightServiceUnitStateWaitingTimeInMillis",
        **_POS,
    )
    load_balancer_service_unit_state_monitor_interval_in_seconds: float = _f(
        60,
        "Extensible manager: interval of the ownership channel's monitor, s.",
        alias="loadBalancerServiceUnitStateMonitorIntervalInSeconds",
        **_POS,
    )
    load_balancer_service_unit_state_tombstone_delay_time_in_seconds: float = _f(
        3600,
        "Extensible manager: delay before split parents are tombstoned in the ownership "
        "channel, s.",
        alias="loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds",
        **_NONNEG,
    )
    # -- Pulsar broker settings recognised here (see INERT_KNOBS) ------------------------------
    load_manager_class_name: str = _f(
        "org.apache.pulsar.broker.loadbalance.impl.ModularLoadManagerImpl",
        "Pulsar's choice of load manager class.",
        alias="loadManagerClassName",
    )
    load_balancer_debug_mode_enabled: bool = _f(
        False, "Pulsar's verbose load-manager logging.", alias="loadBalancerDebugModeEnabled"
    )
    load_balancer_resource_quota_update_interval_minutes: float = _f(
        15,
        "How often Pulsar's leader writes bundle data and time averages to its metadata "
        "store, minutes.",
        alias="loadBalancerResourceQuotaUpdateIntervalMinutes",
        **_POS,
    )
    # -- ours: merge, liveness, leases -----------------------------------------------------
    load_balancer_merge_enabled: bool = _f(
        False,
        "Ours: merge cold adjacent bundles of one broker (Pulsar never merges).",
        alias="loadBalancerMergeEnabled",
    )
    load_balancer_merge_max_msg_rate: float = _f(
        1000,
        "Ours: both bundles' long-term msg rate below this to merge, msg/s.",
        alias="loadBalancerMergeMaxMsgRate",
        **_NONNEG,
    )
    load_balancer_merge_max_bandwidth_mbytes: float = _f(
        10,
        "Ours: both bundles' long-term throughput below this to merge, MB/s.",
        alias="loadBalancerMergeMaxBandwidthMbytes",
        **_NONNEG,
    )
    load_balancer_merge_max_topics: int = _f(
        100,
        "Ours: merged bundle may hold at most this many topics.",
        alias="loadBalancerMergeMaxTopics",
        **_NONNEG,
    )
    load_balancer_max_number_of_bundles_to_merge_per_cycle: int = _f(
        4,
        "Ours: at most this many merges per cycle.",
        alias="loadBalancerMaxNumberOfBundlesToMergePerCycle",
        **_NONNEG,
    )
    load_balancer_broker_report_timeout_seconds: float = _f(
        60,
        "Ours: a broker silent this long is gone for the streaming job, s.",
        alias="loadBalancerBrokerReportTimeoutSeconds",
        **_POS,
    )
    load_balancer_ownership_lease_ttl_seconds: float = _f(
        30,
        "Ours: ownership lease TTL in Redis, s.",
        alias="loadBalancerOwnershipLeaseTtlSeconds",
        **_POS,
    )
    load_balancer_decider_lease_ttl_ms: int = _f(
        15000,
        "Ours: TTL of the decider lease the streaming job's decision stage holds in Redis, ms "
        "(renewed every batch; three batch intervals of lbctl stream's default 5 s trigger). "
        "A job that cannot renew it publishes nothing; another job takes it once it expires.",
        alias="loadBalancerDeciderLeaseTtlMs",
        **_POS,
    )
    load_balancer_broker_registration_ttl_seconds: float = _f(
        30,
        "Ours: broker registration TTL in Redis, s.",
        alias="loadBalancerBrokerRegistrationTtlSeconds",
        **_POS,
    )
    lease_clock_drift_bound: float = _f(
        0.001,
        "Ours: bound on the rate error between a broker's monotonic clock and Redis's clock "
        "(1000 ppm: two NTP-slewed clocks at the kernel's 500 ppm limit in opposite "
        "directions); a broker stops serving a bundle at t0 + ttl * (1 - this) - "
        "leaseStopMarginMs after the send time t0 of its last successful renewal.",
        alias="leaseClockDriftBound",
        ge=0,
        lt=0.5,
    )
    lease_stop_margin_ms: int = _f(
        1000,
        "Ours: time a broker is given to stop serving a bundle before its lease can lapse in "
        "real time (the broker's poll of the agent's serving file plus closing the bundle), ms.",
        alias="leaseStopMarginMs",
        **_NONNEG,
    )
    # -- services (ours) -------------------------------------------------------------------
    kafka_bootstrap_servers: str = _f(
        "", "Kafka bootstrap servers; empty = the embedded broker.", alias="kafkaBootstrapServers"
    )
    kafka_security_protocol: str = _f(
        "",
        "Kafka security.protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).",
        alias="kafkaSecurityProtocol",
    )
    kafka_sasl_mechanism: str = _f(
        "",
        "Kafka sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).",
        alias="kafkaSaslMechanism",
    )
    kafka_sasl_username: str = _f("", "Kafka SASL user name.", alias="kafkaSaslUsername")
    kafka_sasl_password: Secret = _f(
        "", "Kafka SASL password (secret).", alias="kafkaSaslPassword", secret=True
    )
    kafka_ssl_ca_location: str = _f("", "CA file for Kafka TLS.", alias="kafkaSslCaLocation")
    kafka_ssl_certificate_location: str = _f(
        "",
        "Client certificate for Kafka mutual TLS (ssl.certificate.location).",
        alias="kafkaSslCertificateLocation",
    )
    kafka_ssl_key_location: str = _f(
        "", "Client key for Kafka mutual TLS (ssl.key.location).", alias="kafkaSslKeyLocation"
    )
    kafka_ssl_key_password: Secret = _f(
        "",
        "Password of the Kafka client key (ssl.key.password, secret).",
        alias="kafkaSslKeyPassword",
        secret=True,
    )
    redis_url: SecretURL = _f(
        "",
        "Redis URL (redis:// or rediss://); empty = the embedded server. A password in it is masked.",
        alias="redisUrl",
        secret=True,
    )
    redis_username: str = _f("", "Redis ACL user name.", alias="redisUsername")
    redis_password: Secret = _f("", "Redis password (secret).", alias="redisPassword", secret=True)
    redis_ssl_ca_certs: str = _f(
        "", "CA file for Redis TLS (rediss:// URLs).", alias="redisSslCaCerts"
    )
    redis_ssl_certfile: str = _f(
        "", "Client certificate for Redis mutual TLS.", alias="redisSslCertfile"
    )
    redis_ssl_keyfile: str = _f("", "Client key for Redis mutual TLS.", alias="redisSslKeyfile")
    redis_key_prefix: str = _f(
        "lb", "Prefix of every Redis key.", alias="redisKeyPrefix", min_length=1
    )
    redis_allow_evicting_policy: bool = _f(
        False,
        "Ours: let lbctl control, stream and run start on a Redis whose maxmemory-policy may "
        "evict keys (anything but noeviction); an evicted lease or namespace is ownership "
        "silently lost, so they refuse it unless this is on.",
        alias="redisAllowEvictingPolicy",
    )
    load_reports_topic: str = _f(
        "lb-load-reports", "Kafka topic of load reports.", alias="loadReportsTopic", min_length=1
    )
    decisions_topic: str = _f(
        "lb-decisions", "Kafka topic of decisions.", alias="decisionsTopic", min_length=1
    )
    dead_letters_topic: str = _f(
        "lb-dead-letters",
        "Kafka topic of rejected records.",
        alias="deadLettersTopic",
        min_length=1,
    )
    ownership_events_topic: str = _f(
        "lb-ownership-events",
        "Kafka topic of ownership changes.",
        alias="ownershipEventsTopic",
        min_length=1,
    )
    topic_partitions: int = _f(
        4, "Partitions of the topics the product creates.", alias="topicPartitions", **_POS
    )
    max_report_bytes: int = _f(
        1048576,
        "Reports larger than this are rejected before parsing, bytes.",
        alias="maxReportBytes",
        **_POS,
    )
    max_decision_bytes: int = _f(
        65536,
        "Decisions larger than this are rejected before parsing, bytes.",
        alias="maxDecisionBytes",
        **_POS,
    )

    @field_validator("load_balancer_load_shedding_strategy")
    @classmethod
    def _known_shedder(cls, v: str) -> str:
        if _short(v) not in KNOWN_SHEDDERS:
            raise ValueError(f"unknown shedding strategy {v!r}; known: {sorted(KNOWN_SHEDDERS)}")
        return v

    @field_validator("load_balancer_load_placement_strategy")
    @classmethod
    def _known_placement(cls, v: str) -> str:
        if _short(v) not in KNOWN_PLACEMENTS:
            raise ValueError(f"unknown placement strategy {v!r}; known: {sorted(KNOWN_PLACEMENTS)}")
        return v

    @field_validator("default_namespace_bundle_split_algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        from loadbalance.split_algorithms import ALL_ALGORITHMS

        if v not in ALL_ALGORITHMS:
            raise ValueError(f"unknown split algorithm {v!r}; known: {list(ALL_ALGORITHMS)}")
        return v

    @property
    def overloaded_threshold(self) -> float:
        """``loadBalancerBrokerOverloadedThresholdPercentage`` as a fraction of a broker, the
        unit every load figure of the policies is in."""
        return self.load_balancer_broker_overloaded_threshold_percentage / 100.0

    @property
    def shedding_strategy_name(self) -> str:
        return _short(self.load_balancer_load_shedding_strategy)

    @property
    def placement_strategy_name(self) -> str:
        return _short(self.load_balancer_load_placement_strategy)

    def kafka_client_settings(self) -> dict[str, str]:
        """librdkafka security settings that are set (``security.protocol``, SASL, SSL).

        For confluent-kafka clients and the Python Spark source as they are; for Spark's
        built-in Kafka source, prefix each key with ``kafka.``.
        """
        pairs = (
            ("security.protocol", self.kafka_security_protocol),
            ("sasl.mechanism", self.kafka_sasl_mechanism),
            ("sasl.username", self.kafka_sasl_username),
            ("sasl.password", self.kafka_sasl_password),
            ("ssl.ca.location", self.kafka_ssl_ca_location),
            ("ssl.certificate.location", self.kafka_ssl_certificate_location),
            ("ssl.key.location", self.kafka_ssl_key_location),
            ("ssl.key.password", self.kafka_ssl_key_password),
        )
        return {k: str.__str__(v) for k, v in pairs if v}

    def redis_client_kwargs(self) -> dict[str, str]:
        """redis-py keyword arguments for ACL user, password and TLS files that are set.

        They go beside the URL (``redis.Redis.from_url(url, **kwargs)``); redis-py lets them
        override credentials in the URL.
        """
        pairs = (
            ("username", self.redis_username),
            ("password", self.redis_password),
            ("ssl_ca_certs", self.redis_ssl_ca_certs),
            ("ssl_certfile", self.redis_ssl_certfile),
            ("ssl_keyfile", self.redis_ssl_keyfile),
        )
        return {k: str.__str__(v) for k, v in pairs if v}

    def secret_values(self) -> list[str]:
        """The non-empty secret values (and a URL's password), for log redaction."""
        out = []
        for name in SECRET_FIELDS:
            value = str.__str__(getattr(self, name))
            if not value:
                continue
            if name == "redis_url":
                m = _URL_AUTH_RE.match(value)
                if m is None or ":" not in m.group("auth"):
                    continue
                value = m.group("auth").split(":", 1)[1]
            out.append(value)
        return out

    def __repr__(self) -> str:
        return f"LoadBalancerConfig({len(type(self).model_fields)} knobs, secrets masked)"

    __str__ = __repr__


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


FIELDS = LoadBalancerConfig.model_fields
ALIAS_TO_FIELD = {f.alias: name for name, f in FIELDS.items() if f.alias}
SECRET_FIELDS = {
    name
    for name, f in FIELDS.items()
    if (f.json_schema_extra or {}).get("secret")  # type: ignore[union-attr]
}
_UPPER_TO_ALIAS = {re.sub(r"(?<!^)(?=[A-Z])", "_", a).upper(): a for a in ALIAS_TO_FIELD}
_UPPER_TO_ALIAS.update({name.upper(): FIELDS[name].alias for name in FIELDS})


# Pulsar knobs that are recognised (an operator's broker.conf carries them, ``config show``
# lists them) but that nothing here reads, with why: ``config show`` marks them inert, and a
# configuration that sets one to anything but its default gets one warning naming it.
INERT_KNOBS: dict[str, str] = {
    "loadManagerClassName": (
        "the streaming controller is the load manager; it reads the reports of all three "
        "Pulsar managers (Simple: LoadReport, Modular: LocalBrokerData, Extensible: "
        "BrokerLoadData, which names no bundles) and applies loadBalancerLoadSheddingStrategy "
        "/ loadBalancerLoadPlacementStrategy"
    ),
    "loadBalancerDebugModeEnabled": (
        "every decision carries its inputs and reason, and logging is set with lbctl "
        "--log-level DEBUG"
    ),
    "loadBalancerResourceQuotaUpdateIntervalMinutes": (
        "the streaming job keeps bundle data and time averages in its checkpointed state and "
        "writes the load snapshot to Redis every batch"
    ),
    "loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds": (
        "ownership is Redis leases and a split replaces its parent in one atomic script, so "
        "nothing is left to tombstone"
    ),
    "loadBalancerInFlightServiceUnitStateWaitingTimeInMillis": (
        "every ownership change is one atomic Redis script, so none is ever left in flight; "
        "a lease its owner stops renewing expires (loadBalancerOwnershipLeaseTtlSeconds) and "
        "the controller's sweep places its bundle again"
    ),
    "loadBalancerServiceUnitStateMonitorIntervalInSeconds": (
        "there is no ownership channel to monitor; the controller sweeps expired leases every "
        "lbctl control --sweep-interval-s"
    ),
    "loadBalancerHostUsageCheckIntervalMinutes": (
        "the broker agent samples host usage at every report check "
        "(loadBalancerReportUpdateMinIntervalMillis), so a report never carries older usage"
    ),
}
# A key with one of these prefixes is meant for the load balancer: if it is unknown, it is
# probably a typo and gets a warning of its own, with a suggestion.
_LOAD_BALANCER_PREFIXES = ("loadBalancer", "loadBalance", "loadManager")


def parse_broker_conf(text: str) -> dict[str, str]:
    """Pulsar's ``key=value`` format: ``#`` comments, blank lines; empty value = default."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        if value:
            out[key] = value
    return out


def _canonical(key: str) -> str | None:
    """The Pulsar alias of a knob given by alias, deprecated alias or attribute name."""
    key = DEPRECATED_ALIASES.get(key, key)
    if key in ALIAS_TO_FIELD:
        return key
    if key in FIELDS:
        return FIELDS[key].alias
    return None


def _coerce(alias: str, raw: str) -> Any:
    ann = FIELDS[ALIAS_TO_FIELD[alias]].annotation
    if ann is bool:
        low = raw.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(alias, f"must be true or false, got {raw!r}")
    if ann == tuple[str, ...]:
        return tuple(x.strip() for x in raw.split(",") if x.strip())
    return raw


def knob_text(value: Any) -> str:
    """A knob value (from JSON or Python: bool, number, list of names) as the text ``--set`` and
    broker.conf carry, which ``_coerce`` reads back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _suggest(key: str) -> str:
    names = list(ALIAS_TO_FIELD) + list(DEPRECATED_ALIASES)
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass(frozen=True)
class ConfigLoad:
    """What loading found besides the configuration: ``warnings`` (one line each, short: a
    stock Pulsar broker.conf gives one summary line, not dozens), ``ignored_keys`` (broker.conf
    keys with no meaning here, for ``--verbose``), ``notes`` (inert Pulsar knobs the
    broker.conf names, with why they are inert here) and ``inert`` (one line per inert knob
    set to anything but its default, from any source: the loader logs each as a warning)."""

    warnings: tuple[str, ...] = ()
    ignored_keys: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    inert: tuple[str, ...] = ()


def load_config(
    *,
    conf_text: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> tuple[LoadBalancerConfig, list[str]]:
    """Defaults < broker.conf < environment (``LB_<name>``) < overrides; returns warnings too."""
    config, found = load_config_details(conf_text=conf_text, env=env, overrides=overrides)
    return config, list(found.warnings)


def load_config_details(
    *,
    conf_text: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> tuple[LoadBalancerConfig, ConfigLoad]:
    """``load_config`` with the details: which broker.conf keys were ignored, and notes."""
    values: dict[str, Any] = {}
    warnings: list[str] = []
    ignored: list[str] = []
    notes: list[str] = []
    for key, raw in parse_broker_conf(conf_text or "").items():
        alias = _canonical(key)
        if alias in INERT_KNOBS:
            notes.append(f"broker.conf: {key}={raw}: has no effect here: {INERT_KNOBS[alias]}")
        if alias is None:
            if key.startswith(_LOAD_BALANCER_PREFIXES):
                warnings.append(f"broker.conf: ignoring unknown key {key}{_suggest(key)}")
            else:
                ignored.append(key)
            continue
        values[alias] = _coerce(alias, raw)
    if ignored:
        warnings.append(
            f"broker.conf: ignoring {len(ignored)} key(s) that are not load-balancer settings "
            f"(e.g. {ignored[0]}); --verbose lists them"
        )
    for var, raw in (env or {}).items():
        if not var.startswith("LB_"):
            continue
        name = var[3:]
        alias = _canonical(name) or _UPPER_TO_ALIAS.get(name.upper())
        if alias is None:
            warnings.append(f"environment: ignoring unknown variable {var}")
            continue
        values[alias] = _coerce(alias, raw)
    for key, raw in (overrides or {}).items():
        alias = _canonical(key)
        if alias is None:
            raise ConfigError(key, f"unknown knob{_suggest(key)}")
        values[alias] = _coerce(alias, raw) if isinstance(raw, str) else raw
    config = build_config(values)
    found = ConfigLoad(tuple(warnings), tuple(ignored), tuple(notes), inert_settings(config))
    return config, found


def inert_settings(config: LoadBalancerConfig) -> tuple[str, ...]:
    """One line per inert knob (``INERT_KNOBS``) set to something other than its default."""
    out = []
    for alias, reason in INERT_KNOBS.items():
        name = ALIAS_TO_FIELD[alias]
        value = getattr(config, name)
        if value != FIELDS[name].default:
            out.append(f"{alias}={mask_value(name, value)} has no effect here: {reason}")
    return tuple(out)


def knob_status(alias: str) -> str:
    """``in force``, or ``inert: <why>`` for a recognised knob nothing here reads."""
    reason = INERT_KNOBS.get(alias)
    return "in force" if reason is None else f"inert: {reason}"


def build_config(values: Mapping[str, Any]) -> LoadBalancerConfig:
    """Validate values keyed by Pulsar name; the first error names its knob (never a secret)."""
    try:
        return LoadBalancerConfig(**values)
    except ValidationError as e:
        err = e.errors(include_input=False, include_url=False)[0]
        loc = str(err["loc"][0]) if err["loc"] else "config"
        alias = _canonical(loc) or loc
        msg = err["msg"]
        if ALIAS_TO_FIELD.get(alias) not in SECRET_FIELDS and alias in values:
            msg = f"{msg}, got {values[alias]!r}"
        raise ConfigError(alias, msg) from None


def mask_value(name: str, value: Any) -> str:
    """Render a value for display with secrets masked (a URL keeps all but its password)."""
    if value is None:  # an optional knob left empty, as broker.conf writes it
        return ""
    if name in SECRET_FIELDS and value:
        if name == "redis_url":
            return redact_url(str.__str__(value))
        return SECRET_MASK
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def config_rows(
    config: LoadBalancerConfig, *, mask_secrets: bool = True
) -> list[tuple[str, str, str, str]]:
    """(Pulsar name, value, default, description) for every knob."""
    rows = []
    for name, f in FIELDS.items():
        value = getattr(config, name)
        shown = mask_value(name, value) if mask_secrets else str(value)
        desc = f.description or ""
        reason = INERT_KNOBS.get(f.alias or name)
        if reason is not None:
            desc = f"Inert here: {reason}. (Pulsar: {desc})"
        rows.append((f.alias or name, shown, mask_value(name, f.default), desc))
    return rows


def config_markdown() -> str:
    """The configuration table of ``docs/configuration.md``."""
    lines = [
        "# Configuration",
        "",
        "Generated from `loadbalance/config.py` by `scripts/gen_config_doc.py`; do not edit.",
        "Knob names and defaults are Pulsar's unless the meaning says *Ours*.",
        "",
        "| knob | default | meaning |",
        "| --- | --- | --- |",
    ]
    for alias, _, default, desc in config_rows(LoadBalancerConfig()):
        lines.append(f"| `{alias}` | `{default}` | {desc} |")
    return "\n".join(lines) + "\n"
