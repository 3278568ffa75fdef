"""Command line: ``python -m sbs_widget <command> ...``.

Each command lives next to the feature it drives; this module only collects them. A feature module
exposes ``register_cli(subparsers)`` which adds its sub-parser and sets ``func`` (``args -> int``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = (
    "sbs_widget.cli_compare",
    "sbs_widget.cli_dumps",
    "sbs_widget.cli_graphs",
    "sbs_widget.cli_culprits",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sbs_widget",
        description="Compare a torch.export program with its ONNX export, value by value.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that feature is not part of this build
                continue
            raise
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .errors import SbsError

    try:
        return int(args.func(args) or 0)
    except SbsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
