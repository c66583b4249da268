"""Every ``lbctl`` command's ``--help`` is plain text for operators.

Why a walk over the parser: descriptions are often taken from module docstrings, which are
written for developers (reStructuredText double backticks, "Why:" notes); a new command or a
docstring edit would bring them back without anyone reading every help page.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from lbctl.main import build_parser

DEVELOPER_MARKS = ("``", "Why:")


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_the_walk_reaches_nested_commands() -> None:
    paths = {" ".join(p) for p, _ in COMMANDS}
    assert {"monitor", "health", "run", "control"} <= paths
    assert any(len(p) >= 2 for p, _ in COMMANDS)  # e.g. namespaces bundles


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) or "lbctl" for p, _ in COMMANDS])
def test_help_has_no_developer_markup(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    found = [mark for mark in DEVELOPER_MARKS if mark in text]
    assert not found, f"lbctl {' '.join(path)} --help shows {found}"
