"""Command line: ``python -m sbs_widget <command> ...``.

Each command lives next to the feature it drives; this module only collects them. A feature module
exposes ``register_cli(subparsers)`` which adds its sub-parser and sets ``func`` (``args -> int``).
Building the parser imports no torch, onnx or onnxruntime: ``--help`` answers at once; a command
imports them when it runs.

Exit codes (each command's ``--help`` says its own, docs/api.md lists them all): the commands that
judge (``check``, ``deployed``) exit 0 agree, 1 differ, 2 cannot judge (bad input; ``check`` adds 3 for
rounding only); ``steal-compare`` 0 agree, 1 a mismatch or bad input (as it always did); those that
report (``compare``, ``demo``, ``culprits``, ``graph``, ``repro``) exit 0 when their report is out
whatever it says, 1 when it could not be made. Every command:
2 on a usage error (argparse, or an output format whose package is missing: said before any work),
130 on Ctrl-C. A command whose errors mean "cannot judge" sets ``error_exit=2`` in its defaults.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sbs_widget.errors import InputError

# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = (
    "sbs_widget.cli.compare",
    "sbs_widget.cli.dumps",
    "sbs_widget.cli.graphs",
    "sbs_widget.cli.culprits",
    "sbs_widget.cli.deployed",
    "sbs_widget.cli.check",
    "sbs_widget.cli.generate",
)


USAGE = 2  # argparse's own exit code on a usage error

# The package each output format needs that is not a dependency of sbs_widget (a test extra): asked before
# the run, not after it. Several names: any of them does (pandas tries pyarrow, then fastparquet).
FORMAT_PACKAGES = {".xlsx": ("openpyxl",), ".parquet": ("pyarrow", "fastparquet")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sbs_widget",
        description="Compare a torch.export program with its ONNX export, value by value.",
        epilog="exit codes: check and deployed judge: 0 agree, 1 differ, 2 cannot judge (bad input; check: 3 "
               "rounding only); steal-compare: 0 agree, 1 a mismatch or bad input; compare, demo, culprits, graph "
               "and repro report: 0 done whatever the values say, 1 could not be done (bad input); every command: 2 "
               "usage error, 130 Ctrl-C. python -m sbs_widget COMMAND --help says each command's.",
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
    from sbs_widget.safe_text import visible

    try:
        return int(args.func(args) or 0)
    except SbsError as e:  # messages quote model names: no escape sequence reaches the terminal
        print(f"error: {visible(str(e), newlines=True)}", file=sys.stderr)
        return USAGE if isinstance(e, CommandLineError) else int(getattr(args, "error_exit", 1))


class CommandLineError(InputError):
    """The command cannot run as given, like an argparse error (exit code 2): an output format whose
    package is missing."""


def check_format_package(path: str) -> None:
    """Refuse, before any work, an output format whose writer needs a package that is not installed
    (``FORMAT_PACKAGES``): ``pip install openpyxl`` rather than an ImportError after the whole run."""
    import importlib

    ext = os.path.splitext(path)[1].lower()
    names = FORMAT_PACKAGES.get(ext, ())
    for name in names:
        try:
            importlib.import_module(name)
            return
        except ImportError:
            continue
    if names:
        raise CommandLineError(f"cannot write {path!r}: writing {ext} needs the package {names[0]}, which is not "
                               f"installed: pip install {names[0]} (or write .csv, .json or .html, which need none)")


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
    check_format_package(path)


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
