"""Every ``lbctl`` command shown in the README's code blocks still parses, and its ``--help``
runs: a renamed or removed flag fails here before an operator copies the command.

``bash scripts/run.sh ARGS`` is ``lbctl run ARGS``. Each command is parsed exactly as written
(the parser refuses an unknown flag or a bad value) without being run, and the help of its
command path (``lbctl stream --help``, ``lbctl infra up --help``) must exit 0.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from lbctl.main import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands(text: str) -> list[list[str]]:
    """The argv (after ``lbctl``) of each command line in the fenced code blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        if not re.match(r"\s*(bash scripts/run\.sh|(\.venv/bin/)?lbctl)\b", line):
            continue
        words = shlex.split(line.split(" #")[0])
        if words[:2] == ["bash", "scripts/run.sh"]:
            out.append(["run", *words[2:]])
        elif words and re.fullmatch(r"(\.venv/bin/)?lbctl", words[0]):
            out.append(words[1:])
    return out


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _command_path(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The leading words of ``argv`` that name (sub)commands."""
    path: list[str] = []
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        path.append(word)
        parser = subs[0].choices[word]
    return path


def test_the_readme_shows_the_by_hand_commands() -> None:
    names = {argv[0] for argv in COMMANDS}
    assert {"run", "stream", "control", "simulate", "monitor", "infra"} <= names


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_a_readme_command_parses_and_its_help_runs(argv: list[str], capsys) -> None:
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on an unknown flag or a bad value
        pytest.fail(f"lbctl {' '.join(argv)} no longer parses: {capsys.readouterr().err}")
        raise AssertionError from e
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*_command_path(parser, argv), "--help"])
    assert done.value.code == 0
    assert "usage: lbctl" in capsys.readouterr().out
