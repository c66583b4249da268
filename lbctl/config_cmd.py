"""``lbctl config show``: print the effective configuration, knob by knob (of a named preset
with ``--preset``, ``lbctl.presets``).

How the configuration is loaded (``broker.conf``, ``LB_*`` environment variables, ``--set``;
problems reported in one line that names the knob, exit code 2) is ``infra.config_loading``,
shared with every long-running process; this module is only the command.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from infra.config_loading import add_config_arguments, load_from_args
from lbctl.presets import preset_path
from loadbalance.config import ConfigError, config_rows, knob_status


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("config", help="inspect the effective configuration")
    sub = p.add_subparsers(dest="config_command", metavar="VERB")
    show = sub.add_parser(
        "show",
        help="print every knob with its value, default and meaning (secrets masked)",
        description="Print the effective configuration: defaults < --config file (or --preset) "
        "< LB_* "
        "environment variables < --set overrides. Secrets are shown as ******. Status 'inert' "
        "marks a recognised Pulsar knob that has no effect here; its meaning says why.",
    )
    add_config_arguments(show)
    show.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="show a named preset (conf/NAME.conf, e.g. demo: the settings lbctl run uses) "
        "instead of --config",
    )
    show.add_argument("--json", action="store_true", help="print a JSON object knob -> value")
    show.set_defaults(func=run_show)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])


def run_show(args: argparse.Namespace) -> int:
    if getattr(args, "preset", None) is not None:
        try:
            args.config = preset_path(args.preset)
        except ValueError as e:
            print(f"lbctl config: {e}", file=sys.stderr)
            return 2
    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"lbctl config: {e}", file=sys.stderr)
        return 2
    rows = config_rows(config)
    if args.json:
        print(json.dumps({k: v for k, v, _, _ in rows}, indent=2, sort_keys=True))
        return 0
    table = Table(title="Effective configuration", show_lines=False)
    for col in ("knob", "value", "default", "status", "meaning"):
        table.add_column(col, overflow="fold")
    for knob, value, default, desc in rows:
        status = knob_status(knob).split(":", 1)[0]
        style = "dim" if status == "inert" else "bold" if value != default else None
        table.add_row(knob, value, default, status, desc, style=style)
    Console(width=200).print(table)
    return 0
