"""Command line: ``python -m sbs_widget <command> ...``.

Each command lives next to the feature it drives; this module only collects them. A feature module
exposes ``register_cli(subparsers)`` which adds its sub-parser and sets ``func`` (``args -> int``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = (
    "sbs_widget.cli.compare",
    "sbs_widget.cli.dumps",
    "sbs_widget.cli.graphs",
    "sbs_widget.cli.culprits",
    "sbs_widget.cli.deployed",
    "sbs_widget.cli.check",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sbs_widget",
        description="Compare a torch.export program with its ONNX export, value by value.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from sbs_widget.errors import SbsError
    from sbs_widget.views.safe_text import visible

    try:
        return int(args.func(args) or 0)
    except SbsError as e:  # messages quote model names: no escape sequence reaches the terminal
        print(f"error: {visible(str(e), newlines=True)}", file=sys.stderr)
        return 1


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (1, 2, ...)")
    return value


def check_output_file(path: str | None, extensions: tuple[str, ...]) -> None:
    """Refuse, before any work, an output file that cannot be written: unknown extension, a folder,
    a missing or read-only parent folder."""
    from sbs_widget.errors import InputError

    if not path:
        return
    ext = os.path.splitext(path)[1].lower()
    if ext not in extensions:
        raise InputError(f"cannot write {path!r}: the format follows the extension, use one of "
                         f"{', '.join(extensions)}")
    if os.path.isdir(path):
        raise InputError(f"cannot write {path!r}: it is a folder; give a file name such as "
                         f"{os.path.join(path, 'out' + extensions[0])!r}")
    _check_parent(path)


def check_output_folder(path: str, files: tuple[str, ...], force: bool) -> None:
    """Refuse, before any work, an output folder that cannot receive ``files``: a file in the way, a
    missing or read-only parent, or (without ``force``) a folder already holding one of ``files``."""
    from sbs_widget.errors import InputError

    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"cannot write into {path!r}: it is a file, not a folder; give a new folder name")
    if os.path.isdir(path):
        # (a link among them counts: it is replaced by the new file, never written through)
        clash = [f for f in files if os.path.lexists(os.path.join(path, f))]
        if clash and not force:
            raise InputError(f"{path!r} already holds {', '.join(clash)}: give a new folder, or --force "
                             "to overwrite those files")
        taken = [os.path.join(path, f) for f in clash]
        folders = [f for f, p in zip(clash, taken) if not os.path.islink(p) and os.path.isdir(p)]
        if folders:
            raise InputError(f"cannot write {', '.join(folders)} into {path!r}: a folder has that name; remove it "
                             "or give another folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"cannot write into {path!r}: the folder is not writable")
        return
    _check_parent(path)


def _check_parent(path: str) -> None:
    from sbs_widget.errors import InputError

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"cannot write {path!r}: the folder {parent!r} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {path!r}: the folder {parent!r} is not writable")
