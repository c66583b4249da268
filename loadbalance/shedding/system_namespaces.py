"""Pulsar's system service namespaces, which no load-balancing policy may move or reshape.

Every broker owns a heartbeat namespace (``pulsar/<cluster>/<host:port>``, or
``pulsar/<host:port>`` in the v2 form) and may own an SLA-monitor namespace
(``sla-monitor/<cluster>/<host:port>``); ``pulsar/system`` holds the extensible load manager's
own topics. Pulsar's ``NamespaceService.isSystemServiceNamespace`` names them, and its
``TopKBundles`` leaves them out of the top-bundles report, so ``TransferShedder`` never sees
them; the modular shedders skip them too, and bundle split/merge never picks them, because
moving a heartbeat namespace off its broker breaks that broker's health check.
"""

from __future__ import annotations

import re

SYSTEM_NAMESPACE = "pulsar/system"
HEARTBEAT_NAMESPACE_PATTERN = re.compile(r"pulsar/[^/]+/([^:]+:\d+)")
HEARTBEAT_NAMESPACE_PATTERN_V2 = re.compile(r"pulsar/([^:]+:\d+)")
SLA_NAMESPACE_PATTERN = re.compile(r"sla-monitor/[^/]+/([^:]+:\d+)")


def is_system_namespace(namespace: str) -> bool:
    """``NamespaceService.isSystemServiceNamespace`` (whole-string matches, as Java's
    ``Matcher.matches``)."""
    return (
        namespace == SYSTEM_NAMESPACE
        or SLA_NAMESPACE_PATTERN.fullmatch(namespace) is not None
        or HEARTBEAT_NAMESPACE_PATTERN.fullmatch(namespace) is not None
        or HEARTBEAT_NAMESPACE_PATTERN_V2.fullmatch(namespace) is not None
    )


def is_system_bundle(bundle: str) -> bool:
    """Whether a bundle name (``<namespace>/<range>``) lies in a system namespace. A cheap
    prefix test comes first: this runs for every bundle of a shedding broker."""
    if not (bundle.startswith("pulsar/") or bundle.startswith("sla-monitor/")):
        return False
    return is_system_namespace(bundle.rpartition("/")[0])
