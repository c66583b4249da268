"""Nothing outside ``metadata_store`` builds a Redis key or talks Redis commands.

Why: every key family and its stored format has one owner (``metadata_store.keys`` lists them);
a key spelled again elsewhere drifts from the table, and a command sent from elsewhere writes a
format nobody owns. The check reads the source (AST): it flags f-strings that put ``:`` after a
key prefix (``f"{prefix}:..."``, ``f"{store.p}:..."``), string literals that start with a
family's ``:name``, calls of Redis data commands (``hset``, ``xadd``, ``eval``,
``register_script``, ...), generic commands (``get``/``set``/``delete``) on something named like
a Redis client, and reach-ins to a store's client or prefix (``store.r``, ``store.p``).
``infra/embedded.py`` starts the embedded Redis and may ping it; nothing else is exempt.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("loadbalance", "infra", "streaming", "controller", "producers", "lbctl")
OWNER = "metadata_store"
EXEMPT = {"infra/embedded.py"}

# Redis data commands as redis-py spells them; none of these names is common on other objects.
REDIS_COMMANDS = frozenset(
    [
        "hset",
        "hget",
        "hgetall",
        "hmget",
        "hdel",
        "hkeys",
        "hvals",
        "hexists",
        "hincrby",
        "hsetnx",
        "hlen",
        "xadd",
        "xrange",
        "xrevrange",
        "xread",
        "xreadgroup",
        "xdel",
        "xtrim",
        "xlen",
        "eval",
        "evalsha",
        "register_script",
        "script_load",
        "smembers",
        "sadd",
        "srem",
        "sismember",
        "scard",
        "zadd",
        "zrange",
        "zrem",
        "zscore",
        "lpush",
        "rpush",
        "lrange",
        "scan_iter",
        "incr",
        "incrby",
        "decr",
        "setnx",
        "getset",
        "mget",
        "mset",
        "pexpire",
    ]
)
# Commands whose names other objects share: flagged only on a receiver named like a client.
GENERIC_COMMANDS = frozenset({"get", "set", "delete", "exists", "pipeline", "time", "execute"})
# A bare ``r`` is too often a dict to count; ``self.r`` / ``x.r`` (a client attribute) counts.
CLIENT_NAMES = re.compile(r"^(client|redis|redis_client|pipe|pipeline|conn)$")
PREFIX_NAMES = re.compile(r"^(p|prefix|key_prefix|redis_key_prefix)$")
FAMILIES = [
    "namespaces",
    "ns",
    "lease",
    "owned",
    "fence",
    "broker",
    "brokers",
    "epoch",
    "outcomes",
    "outcome-stream",
    "event-outbox",
    "prealloc",
    "recovery",
    "recovery-log",
    "load",
    "stream",
]
FAMILY_LITERAL = re.compile(r"^:(" + "|".join(map(re.escape, FAMILIES)) + r")(:|$)")


def _name(node: ast.AST) -> str | None:
    """The last name of ``x``, ``a.b.x``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def violations(source: str, where: str) -> list[str]:
    """What in ``source`` builds a Redis key or sends a Redis command (one line each)."""
    out: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for a, b in itertools.pairwise(parts):
                if (
                    isinstance(a, ast.FormattedValue)
                    and PREFIX_NAMES.match(_name(a.value) or "")
                    and isinstance(b, ast.Constant)
                    and str(b.value).startswith(":")
                ):
                    out.append(f"{line}: f-string builds a key from a prefix")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if FAMILY_LITERAL.match(node.value):
                out.append(f"{line}: literal {node.value!r} is a key family's name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            cmd = node.func.attr
            receiver = _name(node.func.value) or ""
            client_attr = isinstance(node.func.value, ast.Attribute) and receiver == "r"
            if cmd in REDIS_COMMANDS:
                out.append(f"{line}: Redis command .{cmd}()")
            elif cmd in GENERIC_COMMANDS and (CLIENT_NAMES.match(receiver) or client_attr):
                out.append(f"{line}: Redis command {receiver}.{cmd}()")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("r", "p")
            and (_name(node.value) or "").endswith("store")
        ):
            out.append(f"{line}: reach-in to a store's .{node.attr}")
    return out


def _sources() -> list[Path]:
    files = [f for pkg in PACKAGES for f in sorted((REPO / pkg).rglob("*.py"))]
    return [f for f in files if f.relative_to(REPO).as_posix() not in EXEMPT]


def test_no_module_outside_the_metadata_store_builds_a_redis_key_or_sends_a_command() -> None:
    files = _sources()
    assert len(files) > 50, "the scan found too few modules: wrong root?"
    found = [
        v
        for f in files
        for v in violations(f.read_text(encoding="utf-8"), f.relative_to(REPO).as_posix())
    ]
    assert not found, "Redis keys or commands outside metadata_store:\n" + "\n".join(found)


def test_the_metadata_store_itself_is_what_the_scan_would_flag() -> None:
    """The owner does build keys and send commands: if the scan saw nothing there, it would be
    blind, not the tree clean."""
    flagged = {
        f.name
        for f in sorted((REPO / OWNER).glob("*.py"))
        if violations(f.read_text(encoding="utf-8"), f.name)
    }
    assert {"keys.py", "ownership_redis.py", "outcomes.py", "progress.py"} <= flagged, flagged


def test_each_shape_of_a_key_or_command_is_flagged() -> None:
    cases = {
        'k = f"{store.p}:outcomes"': "f-string",
        'k = f"{prefix}:stream:progress"': "f-string",
        'k = prefix + ":stream:pending"': "literal",
        "client.delete(k)": "client.delete",
        "pipe.get(k)": "pipe.get",
        "self.r.set(k, 1)": "r.set",
        "x.hset(k, 'a', 1)": ".hset",
        "x.xadd(k, {})": ".xadd",
        "x.eval('return 1', 0)": ".eval",
        "x.register_script('return 1')": ".register_script",
        "store.r.close()": "reach-in",
        "self.store.p": "reach-in",
    }
    for code, what in cases.items():
        found = violations(code, "case")
        assert found and what in found[0], (code, found)
    harmless = 'r.get("a"); s.delete(); f"{bootstrap}|{prefix}"; "P:stream:progress"'
    assert violations(harmless, "case") == []
