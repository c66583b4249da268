"""Scripts and benchmarks build no Redis key either: they go through ``metadata_store``.

Why a second scan: ``test_keyspace_ownership`` covers the product's packages; the tools beside
them (``scripts/``, ``benchmarks/``) read the same keys, and a key spelled there
(``f"{prefix}:load:shards"``) drifts from ``metadata_store.keys`` as silently. Same AST check;
the allow-list names each exception and why. Tests are not scanned: they may read raw keys to
check what the store wrote.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_keyspace_ownership import REPO, violations

TOOL_DIRS = ("scripts", "benchmarks")
ALLOWED = {
    # a GET round trip on a key of its own ("bench:plain") is the floor lookups are measured
    # against; it builds no key of the product's keyspace
    "benchmarks/bench_lookup.py": {"client.set", "client.get", "client.pipeline", "pipe.get"},
}


def _tool_sources() -> list[Path]:
    return [f for d in TOOL_DIRS for f in sorted((REPO / d).rglob("*.py"))]


def _unallowed(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    allowed = ALLOWED.get(rel, set())
    return [
        v
        for v in violations(path.read_text(encoding="utf-8"), rel)
        if not any(f"Redis command {a}()" in v for a in allowed)
        and not ("pipe.execute()" in v and "pipe.get" in allowed)
    ]


def test_no_script_or_benchmark_builds_a_redis_key() -> None:
    files = _tool_sources()
    assert len(files) > 5, "the scan found too few tools: wrong root?"
    found = [v for f in files for v in _unallowed(f)]
    assert not found, "Redis keys or commands outside metadata_store:\n" + "\n".join(found)


def test_the_allow_list_names_only_what_is_still_there() -> None:
    """An exception that no longer matches anything is dropped, so the list stays honest."""
    for rel, allowed in ALLOWED.items():
        text = (REPO / rel).read_text(encoding="utf-8")
        seen = " ".join(violations(text, rel))
        assert all(f"{a}()" in seen for a in allowed), (rel, seen)


def test_a_key_built_in_a_script_is_found(tmp_path: Path) -> None:
    probe = 'fields = client.hgetall(f"{prefix}:load:shards")\n'
    found = violations(probe, "scripts/probe.py")
    assert any("f-string" in v for v in found) and any(".hgetall()" in v for v in found)
