"""The options several commands share, written once: the model files (``--ep``, ``--onnx``, ``--inputs``),
the tolerances (``--atol``, ``--rtol``), the runtime and the time limit. A command adds the groups it
takes; the types and help texts are the same in every command."""

from __future__ import annotations

import argparse

from sbs_widget.engine.cancel import cli_time_limit
from sbs_widget.engine.tolerance import cli_tolerance

EP_HELP = "ExportedProgram file (.pt2, torch.export.save)"
ONNX_HELP = "ONNX model (.onnx; external data next to it)"
INPUTS_HELP = "inputs saved with torch.save: a tuple of args, a dict of kwargs or (args, kwargs)"
ATOL_HELP = "default: 1e-4, or 3e-2 for a float16 program (the precision it computes in)"


def add_model_files(p: argparse.ArgumentParser, *, ep: bool = True, onnx_help: str = ONNX_HELP,
                    inputs: str = "required", inputs_help: str = INPUTS_HELP) -> None:
    """``--ep`` (unless ``ep=False``), ``--onnx`` and ``--inputs``; ``inputs`` is ``"required"``,
    ``"optional"`` or ``"none"``."""
    if ep:
        p.add_argument("--ep", required=True, help=EP_HELP)
    p.add_argument("--onnx", required=True, help=onnx_help)
    if inputs != "none":
        p.add_argument("--inputs", required=inputs == "required", help=inputs_help)


def add_tolerance(p: argparse.ArgumentParser, *, atol_help: str = ATOL_HELP) -> None:
    """``--atol`` and ``--rtol``: a bad value stops the command before any work (``cli_tolerance``)."""
    p.add_argument("--atol", type=cli_tolerance, default=None, help=atol_help)
    p.add_argument("--rtol", type=cli_tolerance, default=None, help="default: as --atol")


def add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", default="onnxruntime", help="onnxruntime (default) or onnx.reference")


def add_time_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=cli_time_limit, default=None, metavar="SECONDS",
                   help="end the run after this long (the records so far are written; exit code 1)")
