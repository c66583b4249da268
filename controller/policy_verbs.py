"""pulsar-admin's placement-policy verbs: ``ns-isolation-policy``, the namespaces' anti-affinity
verbs and the clusters' failure-domain verbs, over ``metadata_store.placement_policies``.

``controller.cli`` registers them with its ``--redis-url``/``--json``/configuration flags and
runs them through its ``_run`` (errors: one line naming the field, exit status 1; bad usage 2).
What they print is what pulsar-admin prints: nothing when a change succeeds, and for reads the
JSON of Pulsar's admin objects (``NamespaceIsolationData``, ``FailureDomain``, a map of them by
name, a list of namespaces, the group name as plain text).

Where pulsar-admin's meaning is kept (checked against ``CmdNamespaceIsolationPolicy``,
``CmdClusters``, ``CmdNamespaces`` and the brokers' ``ClustersBase``/``NamespacesBase``):

* ``--namespaces``, ``--primary``, ``--secondary`` are comma-separated regex lists (the flag may
  also be repeated); ``--auto-failover-policy-type`` and ``--auto-failover-policy-params``
  (``min_limit=1,usage_threshold=80``) are required, ``min_available`` being the one type.
* ``create-failure-domain`` and ``update-failure-domain`` both create or replace the domain, as
  Pulsar's do (both are one ``POST`` of the domain); a broker already in another domain is
  refused (Pulsar's 409). ``delete-failure-domain`` of a missing domain is refused (404);
  ``ns-isolation-policy delete`` of a missing policy is not an error.
* the anti-affinity verbs need the namespace to exist; ``get-anti-affinity-namespaces`` takes
  ``--tenant``/``-p`` for pulsar-admin's form (Pulsar uses it for authorization only).
* ``CLUSTER``: one Redis prefix serves one cluster; its name is recorded by the first
  ``ns-isolation-policy set`` or ``create-failure-domain``/``update-failure-domain``, and
  another name is refused afterwards ("cluster X does not exist").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from controller.admin_verbs import now_ms, require_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import InvalidInput
from loadbalance.placement.policies import MIN_AVAILABLE, NamespaceIsolationPolicy
from metadata_store.ownership_redis import RedisStore

__all__ = ["register", "register_namespace_verbs"]

Verb = Callable[[Any, str, str, Any], argparse.ArgumentParser]
Group = Callable[[Any, str, str, str], tuple[Any, Any]]

# NamespaceIsolationData field -> the flag that sets it, so an error names what was typed
_FLAGS = {
    "namespaces": "--namespaces",
    "primary": "--primary",
    "secondary": "--secondary",
    "auto_failover_policy.policy_type": "--auto-failover-policy-type",
    "auto_failover_policy.parameters": "--auto-failover-policy-params",
    "auto_failover_policy": "--auto-failover-policy-params",
}


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _comma_list(values: list[str] | None) -> list[str]:
    return [v.strip() for x in values or () for v in x.split(",") if v.strip()]


# -- ns-isolation-policy ---------------------------------------------------------------------------
def _add_cluster_and_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p.add_argument("policy_name", metavar="NAME", help="the policy's name")


def _add_set_arguments(p: argparse.ArgumentParser) -> None:
    _add_cluster_and_policy(p)
    p.add_argument(
        "--namespaces",
        action="append",
        required=True,
        metavar="REGEX[,REGEX...]",
        help="namespaces the policy covers, as regular expressions over tenant/namespace "
        "matched in full (comma separated)",
    )
    p.add_argument(
        "--primary",
        action="append",
        required=True,
        metavar="REGEX[,REGEX...]",
        help="brokers the namespaces are placed on, as regular expressions over the broker's "
        "host without its port (comma separated); when neither a primary broker nor, after "
        "failover, a secondary one is available, the bundle stays unowned",
    )
    p.add_argument(
        "--secondary",
        action="append",
        default=[],
        metavar="REGEX[,REGEX...]",
        help="brokers used as well when fewer than min_limit primary brokers are available",
    )
    p.add_argument(
        "--auto-failover-policy-type",
        required=True,
        metavar="TYPE",
        help=f"when to use the secondary brokers; the one type is {MIN_AVAILABLE}",
    )
    p.add_argument(
        "--auto-failover-policy-params",
        required=True,
        metavar="NAME=VALUE[,...]",
        help="min_limit=N (fewer available primaries than this: use the secondaries too) and "
        "usage_threshold=PERCENT (a primary above this usage does not count as available), "
        "e.g. min_limit=1,usage_threshold=80",
    )


def _failover_params(text: str) -> dict[str, str]:
    """``name=value`` pairs, comma separated (pulsar-admin's ``NameValueParameterSplitter``)."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidInput(
                "--auto-failover-policy-params", f"expected name=value, got {item!r}"
            )
        out[name.strip()] = value.strip()
    return out


def isolation_policy_from_args(args: argparse.Namespace) -> NamespaceIsolationPolicy:
    """The ``NamespaceIsolationData`` the flags describe; ``InvalidInput`` naming the flag."""
    doc = {
        "namespaces": _comma_list(args.namespaces),
        "primary": _comma_list(args.primary),
        "secondary": _comma_list(args.secondary),
        "auto_failover_policy": {
            "policy_type": args.auto_failover_policy_type.strip(),
            "parameters": _failover_params(args.auto_failover_policy_params),
        },
    }
    try:
        return NamespaceIsolationPolicy.from_admin_json(doc, "")
    except InvalidInput as e:
        field = e.field.lstrip(".")
        for prefix in sorted(_FLAGS, key=len, reverse=True):
            if field == prefix or field.startswith((prefix + ".", prefix + "[")):
                raise InvalidInput(_FLAGS[prefix], e.reason) from None
        raise


def isolation_set(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    policy = isolation_policy_from_args(args)
    store.placement_policies.set_isolation_policy(args.cluster, args.policy_name, policy)


def isolation_get(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    policy = store.placement_policies.isolation_policy(args.cluster, args.policy_name)
    _print_json(policy.to_admin_json())


def isolation_list(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    policies = store.placement_policies.isolation_policies(args.cluster)
    _print_json({name: policies[name].to_admin_json() for name in sorted(policies)})


def isolation_delete(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    store.placement_policies.delete_isolation_policy(args.cluster, args.policy_name)


def isolation_brokers(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    """``ns-isolation-policy brokers``: every live broker with the policies naming it
    (Pulsar's ``BrokerNamespaceIsolationData``), one entry per broker and policy."""
    policies = store.placement_policies.isolation_policies(args.cluster)
    rows = []
    for broker in sorted(store.live_brokers(now_ms())):
        if args.broker is not None and broker != args.broker:
            continue
        for name in sorted(policies):
            policy = policies[name]
            primary = policy.is_primary(broker)
            if primary or policy.is_secondary(broker):
                rows.append(
                    {
                        "brokerName": broker,
                        "policyName": name,
                        "isPrimary": primary,
                        "namespaceRegex": list(policy.namespaces),
                    }
                )
    _print_json(rows)


# -- namespaces: anti-affinity groups --------------------------------------------------------------
def anti_affinity_set(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    require_namespace(store, args.namespace)
    store.placement_policies.set_anti_affinity_group(args.namespace, args.group)


def anti_affinity_get(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    require_namespace(store, args.namespace)
    group = store.placement_policies.anti_affinity_group(args.namespace)
    if args.json:
        _print_json(group)
    elif group is not None:
        print(group)


def anti_affinity_delete(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    require_namespace(store, args.namespace)
    store.placement_policies.delete_anti_affinity_group(args.namespace)


def anti_affinity_namespaces(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> None:
    _print_json(store.placement_policies.anti_affinity_namespaces(args.cluster, args.group))


# -- clusters: failure domains ---------------------------------------------------------------------
def _add_domain_arguments(p: argparse.ArgumentParser, *, brokers: bool) -> None:
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p.add_argument("--domain-name", required=True, metavar="NAME", help="the failure domain")
    if brokers:
        p.add_argument(
            "--broker-list",
            default=None,
            metavar="B1,B2,...",
            help="the brokers in the domain, comma separated, as 'brokers list' names them; a "
            "broker can be in one domain only",
        )


def domain_set(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    brokers = _comma_list([args.broker_list] if args.broker_list else [])
    store.placement_policies.set_failure_domain(args.cluster, args.domain_name, brokers)


def domain_get(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    brokers = store.placement_policies.failure_domain(args.cluster, args.domain_name)
    _print_json({"brokers": sorted(brokers)})


def domain_list(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    domains = store.placement_policies.failure_domains(args.cluster)
    _print_json({name: {"brokers": sorted(domains[name])} for name in sorted(domains)})


def domain_delete(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    store.placement_policies.delete_failure_domain(args.cluster, args.domain_name)


# -- registration ----------------------------------------------------------------------------------
def register_namespace_verbs(ns_sub: Any, verb: Verb) -> None:
    """The anti-affinity verbs of ``lbctl namespaces``."""
    p = verb(
        ns_sub,
        "set-anti-affinity-group",
        "put a namespace in an anti-affinity group: placement spreads the bundles of the "
        "group's namespaces over different brokers (and failure domains, with "
        "failureDomainsEnabled)",
        anti_affinity_set,
    )
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("--group", "-g", required=True, help="the anti-affinity group's name")
    p = verb(
        ns_sub,
        "get-anti-affinity-group",
        "print the namespace's anti-affinity group (nothing when it has none)",
        anti_affinity_get,
    )
    p.add_argument("namespace", help="tenant/namespace")
    p = verb(
        ns_sub,
        "delete-anti-affinity-group",
        "take the namespace out of its anti-affinity group",
        anti_affinity_delete,
    )
    p.add_argument("namespace", help="tenant/namespace")
    p = verb(
        ns_sub,
        "get-anti-affinity-namespaces",
        "list the namespaces in an anti-affinity group (JSON array)",
        anti_affinity_namespaces,
    )
    p.add_argument("--cluster", "-c", required=True, help="the cluster's name")
    p.add_argument("--group", "-g", required=True, help="the anti-affinity group's name")
    p.add_argument(
        "--tenant", "-p", default=None, help="accepted for pulsar-admin's form; not used"
    )


def register(subparsers: Any, verb: Verb, group: Group) -> None:
    """``lbctl ns-isolation-policy ...`` and ``lbctl clusters ...``."""
    _, iso = group(
        subparsers,
        "ns-isolation-policy",
        "namespace isolation policies: which brokers may own which namespaces "
        "(pulsar-admin ns-isolation-policy)",
        "iso_command",
    )
    p = verb(
        iso,
        "set",
        "create or replace a namespace isolation policy: bundles of the matching namespaces "
        "go to the primary brokers, to the secondary ones too when fewer than min_limit "
        "primaries are available, and never elsewhere; other namespaces keep off the "
        "policy's brokers",
        isolation_set,
    )
    _add_set_arguments(p)
    p = verb(iso, "get", "print one policy (NamespaceIsolationData JSON)", isolation_get)
    _add_cluster_and_policy(p)
    p = verb(iso, "list", "print every policy of the cluster, by name (JSON)", isolation_list)
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p = verb(iso, "delete", "delete a policy", isolation_delete)
    _add_cluster_and_policy(p)
    p = verb(
        iso,
        "brokers",
        "list the live brokers that policies name as primary or secondary (JSON)",
        isolation_brokers,
    )
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p.set_defaults(broker=None)
    p = verb(iso, "broker", "the policies that name one broker (JSON)", isolation_brokers)
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p.add_argument("--broker", required=True, help="the broker, as 'brokers list' names it")

    _, cl = group(
        subparsers,
        "clusters",
        "the cluster's failure domains: named sets of brokers that anti-affinity groups "
        "spread over (pulsar-admin clusters)",
        "clusters_command",
    )
    for name, text in (
        ("create-failure-domain", "create a failure domain (or replace it if it exists)"),
        ("update-failure-domain", "replace a failure domain's brokers (or create it)"),
    ):
        p = verb(cl, name, text, domain_set)
        _add_domain_arguments(p, brokers=True)
    p = verb(cl, "get-failure-domain", "print one domain's brokers (JSON)", domain_get)
    _add_domain_arguments(p, brokers=False)
    p = verb(cl, "list-failure-domains", "print every domain, by name (JSON)", domain_list)
    p.add_argument("cluster", metavar="CLUSTER", help="the cluster's name")
    p = verb(cl, "delete-failure-domain", "delete a failure domain", domain_delete)
    _add_domain_arguments(p, brokers=False)
