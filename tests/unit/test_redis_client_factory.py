"""Every production Redis client comes from ``infra.redis_client.connect``.

Why a source test: a command that built its own client forgot the credentials once (the
recovery command took an authentication error for a data loss). The scan reads every module of
the product packages and fails on a client built anywhere else: a call of ``redis.Redis(...)``,
``Redis.from_url``, ``redis.from_url``, ``StrictRedis``, a connection pool, ``Sentinel`` or
``RedisCluster``, or a call of any ``X.from_url(...)`` (``RedisStore.from_url`` builds a client
from whatever keyword arguments its caller remembered). The allow-list names each exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

from infra import redis_client
from loadbalance.config import LoadBalancerConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loadbalance", "lbctl", "streaming", "controller", "producers", "infra",
            "metadata_store")  # fmt: skip
CLIENT_CLASSES = {"Redis", "StrictRedis", "ConnectionPool", "BlockingConnectionPool",
                  "Sentinel", "RedisCluster"}  # fmt: skip
# (module path, enclosing function) -> why a client may be built there
ALLOWED = {
    ("infra/redis_client.py", "connect"): "the factory itself",
    ("metadata_store/ownership_redis.py", "from_url"): (
        "RedisStore.from_url, a convenience for tests and tools (metadata_store may not import "
        "infra); no production module calls it (the second rule)"
    ),
    ("metadata_store/decider_lease.py", "from_url"): "DeciderLease.from_url, as RedisStore's",
}


def _calls(path: Path) -> list[tuple[str, str, int]]:
    """(what, enclosing function, line) of every client construction in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            )
            if isinstance(child, ast.Call):
                what = _construction(child.func)
                if what:
                    found.append((what, inner, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return found


def _construction(func: ast.expr) -> str | None:
    """``Redis(``, ``redis.Redis(``, ``X.from_url(``: a client built here; None otherwise."""
    if isinstance(func, ast.Name) and func.id in CLIENT_CLASSES:
        return func.id
    if isinstance(func, ast.Attribute) and (func.attr in CLIENT_CLASSES or func.attr == "from_url"):
        return ast.unparse(func)
    return None


def test_no_production_module_builds_a_redis_client_outside_the_factory() -> None:
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for what, func, line in _calls(path):
                if (rel, func) not in ALLOWED:
                    offenders.append(f"{rel}:{line} {what}(...) in {func or 'module'}")
    assert not offenders, (
        "build Redis clients with infra.redis_client.connect(url, config, purpose=...):\n"
        + "\n".join(offenders)
    )


def test_the_scan_sees_the_ways_a_client_is_built(tmp_path: Path) -> None:
    """The scan itself: each way of building a client is found (else the test above proves
    nothing)."""
    src = tmp_path / "m.py"
    src.write_text(
        "import redis\nfrom redis import Redis\n"
        "def f(u):\n"
        "    a = redis.Redis.from_url(u)\n    b = Redis(host='h')\n    c = redis.from_url(u)\n"
        "    d = RedisStore.from_url(u, prefix='p')\n    e = redis.ConnectionPool()\n"
        "    g = redis.sentinel.Sentinel([])\n",
        encoding="utf-8",
    )
    assert [line for _, _, line in _calls(src)] == [4, 5, 6, 7, 8, 9]


def test_connect_applies_credentials_tls_timeouts_and_a_name() -> None:
    config = LoadBalancerConfig(
        redisUsername="lb-user",
        redisPassword="pw-7",
        redisSslCaCerts="/ca.pem",
        redisSslCertfile="/c.pem",
        redisSslKeyfile="/c.key",
    )
    client = redis_client.connect("rediss://h:6380/0", config, purpose="control")
    kw = client.connection_pool.connection_kwargs
    assert (kw["username"], kw["password"]) == ("lb-user", "pw-7")
    assert (kw["ssl_ca_certs"], kw["ssl_certfile"], kw["ssl_keyfile"]) == (
        "/ca.pem", "/c.pem", "/c.key")  # fmt: skip
    assert kw["socket_timeout"] == redis_client.PROCESS_TIMEOUT_S
    assert kw["socket_connect_timeout"] == redis_client.CONNECT_TIMEOUT_S
    assert kw["client_name"] == "lbctl-control"
    assert kw["health_check_interval"] == redis_client.HEALTH_CHECK_INTERVAL_S
    probe = redis_client.connect("redis://h/0", None, purpose="health", socket_timeout=2.5)
    assert probe.connection_pool.connection_kwargs["socket_timeout"] == 2.5
    assert "password" not in probe.connection_pool.connection_kwargs
