"""``python -m sbs_widget check``: the comparison as a gate for CI.

    python -m sbs_widget check model.pt2 model.onnx inputs.pt [--fail-on mismatch|noise] \\
        [-o report.json] [-o report.md] [--model-explorer DIR]

Exit codes:

- 0: the ONNX model agrees with the program within tolerance (or differs by rounding alone, with
  ``--fail-on mismatch``);
- 1: mismatch: some pair beyond tolerance and beyond rounding, or a value a side failed to compute;
- 2: cannot judge: bad input (a file missing, corrupt or refused, inputs that do not fit, a model
  exported from another program, bad options), a run that ended early (``--time-limit``), or a run that
  compared nothing finite (NaN inputs);
- 3: only rounding beyond tolerance (status ``noise``), with ``--fail-on noise`` (the default).

The reports (``-o``, repeatable: ``.json`` the versioned report, ``.md`` the Markdown summary for a pull
request, ``.csv``/``.xlsx``/``.parquet``/``.html`` the records as ``compare`` writes them) are written
whatever the verdict, before the exit.
"""

from __future__ import annotations

import sys

from sbs_widget.cli.options import (
    ATOL_HELP,
    EP_HELP,
    INPUTS_HELP,
    ONNX_HELP,
    add_runtime,
    add_time_limit,
    cli_tolerance,
)

REPORTS = (".json", ".md")
BAD_INPUT = 2


def register_cli(sub) -> None:
    p = sub.add_parser("check", help="a CI gate: exit 0 agree, 1 mismatch, 2 bad input, 3 rounding only",
                       description="Compare the program and its ONNX export and exit with a code CI can read: "
                                   "0 agree, 1 mismatch (beyond tolerance and rounding), 2 cannot judge (bad "
                                   "input), 3 only rounding beyond tolerance (with --fail-on noise, the default).",
                       epilog="exit codes: 0 agree; 1 mismatch; 2 cannot judge: bad input (a file missing, corrupt "
                              "or refused, inputs that do not fit the model), a run ended early, or a usage error (a "
                              "bad option, an output format whose package is missing); 3 only rounding beyond "
                              "tolerance (--fail-on noise).")
    p.add_argument("ep", nargs="?", metavar="EP", help=EP_HELP)
    p.add_argument("onnx", nargs="?", metavar="ONNX", help=ONNX_HELP)
    p.add_argument("inputs", nargs="?", metavar="INPUTS", help=INPUTS_HELP)
    p.add_argument("--ep", dest="ep_option", metavar="EP", help="as the first argument")
    p.add_argument("--onnx", dest="onnx_option", metavar="ONNX", help="as the second argument")
    p.add_argument("--inputs", dest="inputs_option", metavar="INPUTS", help="as the third argument")
    p.add_argument("--fail-on", choices=("mismatch", "noise"), default="noise",
                   help="noise (default): anything beyond tolerance fails, rounding alone with exit code 3; "
                        "mismatch: rounding alone passes (exit 0)")
    p.add_argument("-o", "--output", action="append", default=[], metavar="FILE",
                   help="write a report, format by extension: .json (versioned report), .md (summary for a pull "
                        "request), or the records as .csv, .xlsx, .parquet, .html; repeat for several")
    p.add_argument("--model-explorer", metavar="DIR",
                   help="write Model Explorer node data (error, status, verdict per node) for the ONNX model "
                        "and the program into DIR")
    p.add_argument("--atol", type=cli_tolerance, default=None, help=ATOL_HELP)
    p.add_argument("--rtol", type=cli_tolerance, default=None, help="default: as --atol")
    p.add_argument("--node-local", action="store_true", help="also run each ONNX node on torch inputs (err_local)")
    p.add_argument("--top", type=int, default=5, help="culprits in the reports (default 5)")
    p.add_argument("--quiet", action="store_true", help="print the verdict line only")
    add_runtime(p)
    add_time_limit(p)
    p.set_defaults(func=_check)


def _pick(args, name: str):
    given, option = getattr(args, name), getattr(args, f"{name}_option")
    if given is not None and option is not None and given != option:
        return None, f"{name} given twice ({given!r} and --{name} {option!r})"
    value = given if given is not None else option
    return value, None if value is not None else f"missing {name.upper()}"


def _check(args) -> int:
    from sbs_widget.cli.compare import WRITERS
    from sbs_widget.cli.main import check_output_file
    from sbs_widget.errors import SbsError
    from sbs_widget.safe_text import visible

    def bad(text: str) -> int:
        print(f"error: {visible(text, newlines=True)}", file=sys.stderr)
        print("exit code 2 (cannot judge: bad input)", file=sys.stderr)
        return BAD_INPUT

    files, problems = {}, []
    for name in ("ep", "onnx", "inputs"):
        files[name], problem = _pick(args, name)
        if problem:
            problems.append(problem)
    if problems:
        return bad("; ".join(problems) + ": python -m sbs_widget check EP ONNX INPUTS")
    if args.top < 0:
        return bad("--top must be 0 or more")
    try:
        for path in args.output:  # before the run: a bad -o must not cost the whole comparison
            check_output_file(path, tuple(dict.fromkeys(REPORTS + WRITERS)))
        return _run(args, files)
    except SbsError as e:
        return bad(str(e))
    except Exception as e:  # a crash is no verdict on the model: never exit 1 (mismatch) or 0 for it
        import traceback

        traceback.print_exc()
        return bad(f"the comparison failed: {type(e).__name__}: {e}")


def _run(args, files) -> int:
    from sbs_widget.blame.culprits import find_culprits
    from sbs_widget.blame.finer import refine_culprits
    from sbs_widget.engine.cancel import Cancel
    from sbs_widget.engine.entry import prepare
    from sbs_widget.errors import RunCancelled
    from sbs_widget.gate.report import build_report
    from sbs_widget.gate.verdict import MISMATCH, judge
    from sbs_widget.load.readers import load_inputs
    from sbs_widget.safe_text import visible
    from sbs_widget.testing import failure_message

    prepared = prepare(files["ep"], files["onnx"])
    atol, rtol = prepared.tolerance(args.atol, args.rtol)
    inputs, kwargs = load_inputs(files["inputs"], None)
    records, ended = [], None
    token = Cancel(args.time_limit)
    try:
        for rec in prepared.run(inputs, kwargs, runtime=args.runtime, atol=atol, rtol=rtol,
                                node_local=args.node_local, cancel=token):
            records.append(rec)
    except RunCancelled as e:
        ended = e
    verdict = judge(records, cannot_judge=f"the run ended early ({e_text(ended)}) after {len(records)} records"
                    if ended is not None else None)
    culprits = []
    if verdict.outcome == MISMATCH and args.top:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            culprits = find_culprits(records, top=args.top, prepared=prepared, atol=atol, rtol=rtol)
            try:
                culprits = refine_culprits(culprits, prepared, inputs, kwargs, atol, rtol)
            except Exception:  # the culprits as found are still an answer
                pass
    message = failure_message(records, verdict, culprits, atol=atol, rtol=rtol, fail_on=args.fail_on,
                              precision=prepared.precision, top=min(args.top, 3) or 1)
    code = verdict.exit_code(args.fail_on)
    sources = {"ep": files["ep"], "onnx": files["onnx"], "inputs": files["inputs"]}
    report = build_report(records, culprits=list(culprits), prepared=prepared, atol=atol, rtol=rtol,
                          fail_on=args.fail_on, runtime=args.runtime, node_local=args.node_local, sources=sources,
                          verdict=verdict, message=message)
    for path in args.output:
        if path.lower().endswith(REPORTS):
            report.write(path)
        else:
            from sbs_widget.cli.compare import write_records

            write_records(records, path, atol=atol, rtol=rtol)
        if not args.quiet:
            print(f"wrote {visible(path)}")
    if args.model_explorer:
        from sbs_widget.gate.explorer import write_model_explorer

        written = write_model_explorer(records, files["onnx"], args.model_explorer, culprits=list(culprits))
        if not args.quiet:
            print(f"wrote {len(written)} Model Explorer node data files into {visible(args.model_explorer)}")
    print(message if not args.quiet else message.splitlines()[0])
    print(f"exit code {code}")
    return code


def e_text(e) -> str:
    from sbs_widget.safe_text import clipped

    return clipped(str(e), 200)
