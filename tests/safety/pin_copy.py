"""A pytest plugin (``-p tests.safety.pin_copy``) that proves a mutant run tests the copy.

Why: the package is installed in editable mode from the main work tree, so a test process could
import the unmutated ``controller`` from there and every mutant would "survive" (or be "killed")
for the wrong reason. After collection, this plugin checks that every loaded module of the
project's packages comes from ``$SAFETY_COPY_ROOT`` and stops the run (exit status 4, which the
harness reports as an error, never as a kill) if one does not. It prints where
``metadata_store.ownership_redis`` was imported from, which the harness shows for its sanity runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

PACKAGES = (
    "controller",
    "loadbalance",
    "lbctl",
    "streaming",
    "producers",
    "infra",
    "metadata_store",
    "tests",
)
WHERE_TAG = "SAFETY-WHERE"


def pytest_collection_finish(session: pytest.Session) -> None:
    root = os.environ.get("SAFETY_COPY_ROOT")
    if not root:
        return
    base = Path(root).resolve()
    store = importlib.import_module("metadata_store.ownership_redis")
    wrong = []
    for name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None)
        inside = file is None or Path(file).resolve().is_relative_to(base)
        if name.split(".")[0] in PACKAGES and not inside:
            wrong.append(f"{name} from {file}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{WHERE_TAG} metadata_store.ownership_redis={store.__file__}")
    if wrong:
        pytest.exit(f"imported outside the copy {base}: {'; '.join(wrong[:5])}", returncode=4)
