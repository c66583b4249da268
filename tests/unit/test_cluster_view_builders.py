"""Every ``ClusterView`` of the product is made in ``loadbalance/view.py``.

Why: the fast simulator, the streaming job's driver, the snapshot reader and ``lbctl decide``
must hand the policies the same kind of view (the same wrapping, the same per-broker time
averages), or a decision could depend on who built the view. ``build_view`` and
``with_preallocated`` are the only constructors; this scan fails on a direct ``ClusterView(...)``
call anywhere else in the packages (tests may build fixtures as they like).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loadbalance", "metadata_store", "infra", "streaming", "controller", "producers",
            "lbctl")  # fmt: skip
BUILDER = ROOT / "loadbalance" / "view.py"


def _constructions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name == "ClusterView":
                lines.append(node.lineno)
    return lines


def test_only_loadbalance_view_constructs_a_cluster_view() -> None:
    found = {
        str(p.relative_to(ROOT)): lines
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p != BUILDER and (lines := _constructions(p))
    }
    assert found == {}, f"build the view with loadbalance.view.build_view: {found}"
    assert _constructions(BUILDER), "the scan must see the constructor where it is"
