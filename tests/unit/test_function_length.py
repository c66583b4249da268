"""No long functions: at most 60 lines in the shell, at most 80 in the pure core.

Why: a function that mixes several concerns (the controller loop once held consumer setup,
signals, sweep timing, recovery gating, back-off, offset commits and metrics in one body) is
read only by scrolling and changed only by luck. A limit keeps each piece small enough to name.
The core's policies follow Pulsar's long methods closely, so it gets a looser limit.

A function's length is its source span from ``def`` to its last line (docstring, comments and
nested functions included; decorators not), read from the AST. A function that must stay longer
is listed in ``EXCEPTIONS`` with the reason; an entry that no longer needs it fails the test,
so the list cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL = ("streaming", "controller", "producers", "lbctl", "infra", "metadata_store")
CORE = ("loadbalance",)
SHELL_LIMIT = 60
CORE_LIMIT = 80

EXCEPTIONS: dict[str, str] = {
    # "package/module.py:qualified.name": "why it stays longer",
}


def _functions(packages: tuple[str, ...]) -> dict[str, int]:
    """``path:qualified.name`` -> length in lines, for every function of ``packages``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    out[f"{path}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", path)
            else:
                visit(child, prefix, path)

    for package in packages:
        for file in sorted((REPO / package).rglob("*.py")):
            path = file.relative_to(REPO).as_posix()
            visit(ast.parse(file.read_text(encoding="utf-8"), path), "", path)
    return out


def _too_long(packages: tuple[str, ...], limit: int) -> dict[str, int]:
    return {
        name: n for name, n in _functions(packages).items() if n > limit and name not in EXCEPTIONS
    }


def test_no_shell_function_is_longer_than_60_lines() -> None:
    found = _too_long(SHELL, SHELL_LIMIT)
    assert not found, (
        f"functions over {SHELL_LIMIT} lines (split them into named helpers, or list one in "
        f"EXCEPTIONS with the reason): {sorted(found.items(), key=lambda x: -x[1])}"
    )


def test_no_core_function_is_longer_than_80_lines() -> None:
    found = _too_long(CORE, CORE_LIMIT)
    assert not found, f"core functions over {CORE_LIMIT} lines: {found}"


def test_every_listed_exception_is_still_needed() -> None:
    lengths = _functions(SHELL + CORE)
    stale = {
        name
        for name in EXCEPTIONS
        if lengths.get(name, 0) <= (CORE_LIMIT if name.startswith(CORE) else SHELL_LIMIT)
    }
    assert not stale, f"EXCEPTIONS entries no longer over the limit (remove them): {stale}"


def test_the_scan_sees_nested_functions_and_methods() -> None:
    """The scan must not miss what it is meant to limit: methods and nested functions."""
    names = _functions(("controller",))
    assert "controller/loop.py:Runner.run" in names
    assert "controller/reconciler.py:decision_events.ev" in names
    assert "controller/reconciler.py:Reconciler.reconcile" in names
