"""Pulsar's system service namespaces, which no load-balancing policy may move or reshape.

Every broker owns a heartbeat namespace (``pulsar/<cluster>/<host:port>``, or
``pulsar/<host:port>`` in the v2 form) and may own an SLA-monitor namespace
(``sla-monitor/<cluster>/<host:port>``); ``pulsar/system`` holds the extensible load manager's
own topics. Pulsar's ``NamespaceService.isSystemServiceNamespace`` names them, and its
``TopKBundles`` leaves them out of the top-bundles report, so ``TransferShedder`` never sees
them; the modular shedders skip them too, and bundle split/merge never picks them, because
moving a heartbeat namespace off its broker breaks that broker's health check.

The one definition lives in ``loadbalance.bundles`` (which also parses the v1 heartbeat and
SLA-monitor bundle names); the names here are the shedders' spelling of it, kept so that a
bundle counts as "system" in exactly the same cases for shedding, splitting and merging.
"""

from __future__ import annotations

from loadbalance.bundles import SYSTEM_NAMESPACE
from loadbalance.bundles import is_system_service_bundle as is_system_bundle
from loadbalance.bundles import is_system_service_namespace as is_system_namespace

__all__ = ["SYSTEM_NAMESPACE", "is_system_bundle", "is_system_namespace"]
