"""The core package does no I/O, reads no clock and uses no unseeded randomness.

This scans the source of ``loadbalance/`` (the AST, not the text) so a violation fails the suite
with the file and line; ``lint-imports`` separately forbids imports of the shell packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "loadbalance"

FORBIDDEN_MODULES = {
    "pyspark", "redis", "confluent_kafka", "kafka", "pandas", "pyarrow", "socket", "subprocess",
    "os", "time", "requests", "urllib", "http", "threading", "multiprocessing", "asyncio",
    "sqlite3", "shutil", "tempfile", "logging", "psutil", "lbctl", "streaming", "controller",
    "producers", "infra", "pathlib", "io", "sys", "signal", "secrets", "uuid",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}
CLOCK_ATTRS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter"}


def _core_files() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py"))


def _violations(path: Path) -> list[str]:
    return _violations_in(path.read_text(encoding="utf-8"), str(path.relative_to(CORE.parent)))


def _violations_in(source: str, name: str) -> list[str]:
    tree = ast.parse(source, filename=name)
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{where}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            if node.level == 0 and mod in FORBIDDEN_MODULES:
                found.append(f"{where}: imports from {node.module}")
            if mod == "random" and any(a.name != "Random" for a in node.names):
                found.append(f"{where}: imports module-level random functions")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_CALLS:
                found.append(f"{where}: calls {f.id}()")
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == "random" and f.attr != "Random":
                    found.append(f"{where}: unseeded random.{f.attr}()")
                if f.value.id == "random" and f.attr == "Random" and not node.args:
                    found.append(f"{where}: random.Random() without a seed")
                if f.value.id in {"datetime", "date"} and f.attr in CLOCK_ATTRS:
                    found.append(f"{where}: reads the clock via {f.value.id}.{f.attr}()")
    return found


def test_core_has_modules_to_check() -> None:
    assert len(_core_files()) >= 10


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(CORE.parent)))
def test_core_module_is_pure(path: Path) -> None:
    assert _violations(path) == []


def test_checker_catches_violations() -> None:
    """The scanner itself must flag each kind of violation, or the test above proves nothing."""
    src = (
        "import time\nimport random\nfrom datetime import datetime\n"
        "def f():\n    open('x')\n    random.random()\n    datetime.now()\n    random.Random()\n"
    )
    v = _violations_in(src, "probe.py")
    assert any("imports time" in x for x in v)
    assert any("open()" in x for x in v)
    assert any("random.random" in x for x in v)
    assert any("datetime.now" in x for x in v)
    assert any("without a seed" in x for x in v)
