"""The import graph of the first-party packages has no cycle, between packages or modules.

Why beside ``lint-imports``: the layers contract forbids imports that go up, but two modules of
one package may still import each other, and a cycle is what made imports move into function
bodies. grimp (import-linter's graph builder) sees imports anywhere in a module, inside
functions included, so a cycle hidden in a function body counts too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp
import pytest

PACKAGES = (
    "loadbalance",
    "infra",
    "metadata_store",
    "streaming",
    "controller",
    "producers",
    "lbctl",
)


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package(module: str) -> str:
    return module.split(".", 1)[0]


@pytest.fixture(scope="module")
def module_edges() -> dict[str, set[str]]:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    return {
        m: {i for i in graph.find_modules_directly_imported_by(m) if _package(i) in PACKAGES}
        for m in graph.modules
        if _package(m) in PACKAGES
    }


def test_the_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_every_package_is_in_the_graph(module_edges: dict[str, set[str]]) -> None:
    assert {_package(m) for m in module_edges} == set(PACKAGES)


def test_no_import_cycle_between_packages(module_edges: dict[str, set[str]]) -> None:
    packages: dict[str, set[str]] = {}
    for module, imported in module_edges.items():
        for other in imported:
            if _package(other) != _package(module):
                packages.setdefault(_package(module), set()).add(_package(other))
    cycles = strongly_connected(packages)
    witnesses = {
        (a, b): sorted(
            (m, i) for m, imp in module_edges.items() for i in imp
            if _package(m) == a and _package(i) == b
        )[:3]
        for c in cycles for a in c for b in packages.get(a, ()) if b in c
    }  # fmt: skip
    assert cycles == [], f"packages importing each other: {cycles}; imports: {witnesses}"


def test_no_import_cycle_between_modules(module_edges: dict[str, set[str]]) -> None:
    cycles = strongly_connected(module_edges)
    assert cycles == [], f"modules importing each other (directly or in a ring): {cycles}"
