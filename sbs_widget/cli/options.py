"""The options several commands share, written once: the model files (``--ep``, ``--onnx``, ``--inputs``),
the tolerances (``--atol``, ``--rtol``), the runtime and the time limit. A command adds the groups it
takes; the types and help texts are the same in every command."""

from __future__ import annotations

import argparse
import ast
import importlib.util

from sbs_widget.engine.cancel import cli_time_limit

# No torch here, nor in any module building the parser: ``--help`` must not pay seconds for it.


def tolerance_defaults() -> dict[str, float]:
    """The default atol (= rtol) per precision, ``{"float32": 1e-4, "float16": 1e-3, "bfloat16": 8e-3}``,
    read from the constants of ``engine/tolerance.py`` without importing it (it imports torch): the help
    texts follow the engine and cannot drift from it. bfloat16's is float16's scaled by the ratio of their
    epsilons (2**-7 / 2**-10), as ``tolerance.py`` computes it."""
    try:
        spec = importlib.util.find_spec("sbs_widget.engine.tolerance")
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        constants = {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name)
                     and t.id in ("DEFAULT_ATOL", "FLOAT16_TOLERANCE")}
        f32, f16 = float(constants["DEFAULT_ATOL"]), float(constants["FLOAT16_TOLERANCE"])
        return {"float32": f32, "float16": f16, "bfloat16": f16 * 2.0 ** -7 / 2.0 ** -10}
    except (ValueError, KeyError, TypeError, OSError, SyntaxError, AttributeError):
        import torch  # the constants became expressions: ask the engine itself

        from sbs_widget.engine.tolerance import tolerance_for

        return {name: tolerance_for(getattr(torch, name)) for name in ("float32", "float16", "bfloat16")}


def short_number(value: float) -> str:
    """``1e-4`` rather than ``0.0001``: ``short_number(0.008) == "8e-3"``."""
    mantissa, exponent = f"{value:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _tolerance_help(what: str, tail: str = "") -> str:
    d = {k: short_number(v) for k, v in tolerance_defaults().items()}
    return (f"default: by the least precise floating type {what}: {d['float32']} for float32 (and float64), "
            f"{d['float16']} for float16, {d['bfloat16']} for bfloat16{tail}")


EP_HELP = "ExportedProgram file (.pt2, torch.export.save)"
ONNX_HELP = "ONNX model (.onnx; external data next to it)"
INPUTS_HELP = "inputs saved with torch.save: a tuple of args, a dict of kwargs or (args, kwargs)"
ATOL_HELP = _tolerance_help("the program computes in", "; beyond it, a float64 rerun tells rounding (noise) "
                            "from a mismatch")
DUMP_ATOL_HELP = _tolerance_help("in the dump")


def cli_tolerance(text: str) -> float:
    """argparse ``type=`` of ``--atol``/``--rtol`` (``engine.tolerance.cli_tolerance``, imported when an
    option is given, not to build the parser)."""
    from sbs_widget.engine.tolerance import cli_tolerance as check

    return check(text)


def cli_metrics(text: str) -> list[str]:
    """argparse ``type=`` of ``--metrics``: names separated by commas (``cosine,sqnr_db``), each checked
    (``engine.user_metrics``, imported when the option is given): an unknown one stops the command before
    any work, with the names there are."""
    from sbs_widget.engine.user_metrics import resolve_metrics
    from sbs_widget.errors import InputError

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no metric: pass e.g. --metrics cosine,sqnr_db")
    try:
        resolve_metrics(names)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return names


METRICS_HELP = ("figures measured beside the verdict on every compared pair, comma-separated or repeated: max_abs, "
                "max_rel, cosine, sqnr_db, nmse, top<k> (top1, top5: logits); a column each in -o and in the "
                "outputs' table printed")


def add_metrics(p: argparse.ArgumentParser) -> None:
    """``--metrics cosine,sqnr_db`` (or repeated): the names, flattened, in ``args.metrics`` (None: none)."""
    p.add_argument("--metrics", type=cli_metrics, action="append", default=None, metavar="NAMES", help=METRICS_HELP)


def metrics_of(args) -> list[str] | None:
    """The metric names ``--metrics`` gave (flattened, first occurrence kept), None without the option."""
    given = getattr(args, "metrics", None)
    if not given:
        return None
    return list(dict.fromkeys(name for names in given for name in names))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after each help, but only where there is a default to tell: none after
    an option without one (None), a flag (False) or a help that already says its default."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == [] or \
                "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# Exit codes, said in each command's --help (epilog) and in docs/api.md.
USAGE_EXIT = "2 usage error (a bad option, an output format whose package is missing)"
INTERRUPTED_EXIT = "130 interrupted (Ctrl-C)"


def report_exit_codes(done: str, *, time_limit: bool = False) -> str:
    """The epilog of a command that reports (compare, demo, culprits, graph, repro): 0 whatever the values
    (``check`` is the gate; each judging command writes its own)."""
    return (f"exit codes: 0 {done}, whatever the values say (a report, not a gate: for CI, use `check`, "
            "which exits 1 on a mismatch); 1 it could not (a file missing, corrupt or refused, inputs that do not "
            "fit the model, a model exported from another program" + (", the time limit reached" if time_limit
                                                                        else "")
            + f"); {USAGE_EXIT}; {INTERRUPTED_EXIT}.")


def add_model_files(p: argparse.ArgumentParser, *, ep: bool = True, onnx_help: str = ONNX_HELP,
                    inputs: str = "required", inputs_help: str = INPUTS_HELP) -> None:
    """``--ep`` (unless ``ep=False``), ``--onnx`` and ``--inputs``; ``inputs`` is ``"required"``,
    ``"optional"``, ``"none"`` or ``"several"`` (one file or more, required: a list in ``args.inputs``)."""
    if ep:
        p.add_argument("--ep", required=True, help=EP_HELP)
    p.add_argument("--onnx", required=True, help=onnx_help)
    if inputs == "several":
        p.add_argument("--inputs", required=True, nargs="+", metavar="FILE", help=inputs_help)
    elif inputs != "none":
        p.add_argument("--inputs", required=inputs == "required", help=inputs_help)


def add_tolerance(p: argparse.ArgumentParser, *, atol_help: str = ATOL_HELP) -> None:
    """``--atol`` and ``--rtol``: a bad value stops the command before any work (``cli_tolerance``)."""
    p.add_argument("--atol", type=cli_tolerance, default=None, help=atol_help)
    p.add_argument("--rtol", type=cli_tolerance, default=None, help="default: as --atol")


def add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", default="onnxruntime", help="onnxruntime (default) or onnx.reference")


def add_time_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=cli_time_limit, default=None, metavar="SECONDS",
                   help="end the run after this long (the records so far are written; exit code: see below)")


def write_table(df, tmp: str, ext: str) -> None:
    """``df`` as .csv or .xlsx (string cells neutralised: ``safe_text.spreadsheet_cell``) or .parquet."""
    from sbs_widget.safe_text import XLSX_MAX_CELL, spreadsheet_frame

    if ext == ".csv":
        spreadsheet_frame(df).to_csv(tmp, index=False)
    elif ext == ".xlsx":
        spreadsheet_frame(df, XLSX_MAX_CELL).to_excel(tmp, index=False)
    else:
        df.to_parquet(tmp, index=False)
