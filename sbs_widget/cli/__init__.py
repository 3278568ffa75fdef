"""Command line: ``python -m sbs_widget <command>``; one module per command, ``main`` collects them."""

from sbs_widget.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
