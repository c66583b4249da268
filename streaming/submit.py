"""``python -m streaming.submit`` / ``spark-submit streaming/submit.py``: the ``lbctl stream``
options without the ``lbctl`` front.

Why a module of its own: ``streaming.cli`` (the command) builds on ``streaming.job`` (the
query), so the script that starts the command cannot live in ``streaming.job`` without the two
importing each other.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

if __package__ in (None, ""):  # spark-submit streaming/submit.py: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streaming.cli import add_stream_arguments, run_stream  # after the path fix above


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streaming.submit", description="run the streaming job (see lbctl stream --help)"
    )
    add_stream_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_stream(args)


if __name__ == "__main__":
    sys.exit(main())
