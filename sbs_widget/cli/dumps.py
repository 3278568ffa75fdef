"""``python -m sbs_widget steal-compare``: compare a dump of module outputs with an ONNX model."""

from __future__ import annotations

import argparse
import collections

from sbs_widget.cli.options import DUMP_ATOL_HELP, INTERRUPTED_EXIT, USAGE_EXIT, add_model_files, add_tolerance


def register_cli(subparsers) -> None:
    """Add the ``steal-compare`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "steal-compare",
        help="compare the module outputs of a steal_forward dump with an ONNX model, module by module",
        description="Compare each module output stored by steal_forward(dump_file=...) with the ONNX value "
                    "ending that module's scope (torch.onnx.export(..., dynamo=True) models).",
        epilog="exit codes: 0 every module output compared agrees; 1 a module output is a mismatch, or the "
               "comparison could not run (a dump or model missing, corrupt or refused: the error line says which); "
               f"{USAGE_EXIT}; {INTERRUPTED_EXIT}.",
    )
    p.add_argument("--dump", required=True, help="dump file written by steal_forward")
    add_model_files(p, ep=False, onnx_help="ONNX model exported with dynamo=True", inputs="none")
    p.add_argument("-o", "--output", help="write one row per record; format by extension: .csv, .xlsx, .parquet")
    add_tolerance(p, atol_help=DUMP_ATOL_HELP)
    p.add_argument("--root-iteration", type=int, default=0, help="which call of the top-level module to use")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from sbs_widget.cli.compare import write_records
    from sbs_widget.cli.main import check_output_file
    from sbs_widget.dumps.compare import compare_dump
    from sbs_widget.records import MISMATCH, OK
    from sbs_widget.safe_text import visible

    check_output_file(args.output, (".csv", ".xlsx", ".parquet"))  # before the work, not after
    records = list(compare_dump(args.dump, args.onnx, atol=args.atol, rtol=args.rtol,
                                root_iteration=args.root_iteration))
    if args.output:
        write_records(records, args.output)  # complete or absent; spreadsheet cells neutralised
    counts = collections.Counter(r.status for r in records)
    print(f"{len(records)} module output(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    first = next((r for r in records if r.status == MISMATCH), None)
    if first is None:
        print("no mismatch" if counts.get(OK) == len(records) else "no mismatch among compared values")
        return 0
    print(visible(f"first mismatch: {first.ep_name} (ONNX {first.onnx_name}, {first.onnx_op_type}) "
                  f"err_abs={first.err_abs} {first.comment}".rstrip()))
    return 1
