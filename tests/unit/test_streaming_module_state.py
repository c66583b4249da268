"""No module of ``streaming/`` keeps mutable state at module level (an AST scan).

Why: a cache in a module global outlives every object that fills it, so a test cannot make a
fresh one or throw it away, and two driver views (or two stages) in one process share it. The
driver's caches belong to the objects that use them (``DriverView``'s ledger, decoded shards,
assembler and collector pause). Flagged: a module-level assignment of a dict, list or set
display or comprehension, or of a call other than a few that make immutable values; and any
``global`` statement. What is left is named below, each with why it may stay.
"""

from __future__ import annotations

import ast
from pathlib import Path

STREAMING = Path(__file__).resolve().parents[2] / "streaming"

IMMUTABLE_CALLS = frozenset(
    {
        "MappingProxyType",
        "NamedTuple",
        "TypeVar",
        "bytes",
        "frozenset",
        "logging.getLogger",
        "re.compile",
        "struct.Struct",
        "tuple",
    }
)
"""Calls whose result cannot change: their assignments are constants."""

ALLOWED: dict[tuple[str, str], str] = {
    ("schema.py", "_PYTHON_TYPES"): "a constant table of column types, never written",
    ("schema.py", "_NUMPY_DTYPES"): "a constant table of column dtypes, never written",
    ("state.py", "_ISSUES_KEY"): "bytes of a constant string",
    # Spark's Python workers keep a value between tasks only in their process's modules: these
    # are executor-side caches of the parse and state steps, never used on the driver
    ("parse.py", "_warned"): "executor: report problems logged once per worker process",
    ("parse.py", "_plans"): "executor: the parse plans of a worker process",
    ("parse.py", "_known_lists"): "executor: bundle lists a worker process has seen",
    ("parse.py", "_shard_cache"): "executor: shard numbers a worker process worked out",
    ("shard_cache.py", "WORKER_SHARD_CACHE"): "executor: shard states of a worker process",
}
"""(module file, name) -> why the assignment may stay."""


def _callee(node: ast.Call) -> str:
    return ast.unparse(node.func)


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp):
        return True
    if isinstance(value, ast.SetComp):
        return True
    return isinstance(value, ast.Call) and _callee(value) not in IMMUTABLE_CALLS


def module_state(source: str, module: str) -> list[str]:
    """The module-level mutable assignments and ``global`` statements of ``source``."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if not _is_mutable(value):
            continue
        for target in targets:
            name = ast.unparse(target)
            if name != "__all__" and (module, name) not in ALLOWED:
                found.append(f"{module}:{node.lineno} {name} = {ast.unparse(value)[:60]}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"{module}:{node.lineno} global {', '.join(node.names)}")
    return found


def test_no_streaming_module_keeps_mutable_state_at_module_level():
    found = []
    for path in sorted(STREAMING.glob("*.py")):
        found += module_state(path.read_text(), path.name)
    assert not found, (
        "module-level mutable state in streaming/ (move it into the object that uses it, or "
        "name it in ALLOWED with why): " + "; ".join(found)
    )


def test_the_scan_finds_caches_globals_and_calls_and_passes_constants():
    source = """
import logging, re
from types import MappingProxyType
log = logging.getLogger("x")
PATTERN = re.compile("a")
TABLE = MappingProxyType({"a": 1})
LIMIT = 3
NAMES = ("a", "b")
_cache = {}
_seen: set[str] = set()
_items = []
_lock = threading.Lock()
def f():
    global LIMIT
"""
    found = module_state(source, "m.py")
    assert [f.split(" ")[1] for f in found] == ["_cache", "_seen", "_items", "_lock", "global"]
