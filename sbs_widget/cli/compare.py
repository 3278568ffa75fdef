"""``python -m sbs_widget compare`` (and ``demo``): the engine from the command line.

    python -m sbs_widget compare --ep model.pt2 --onnx model.onnx --inputs inputs.pt -o diff.csv
    python -m sbs_widget demo -o report.html     # exports dummy_llm on the fly, injects a fault, compares

The output format follows the extension of ``-o``: .csv, .xlsx, .parquet or .html.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from sbs_widget.cli.options import (
    INPUTS_HELP,
    add_metrics,
    add_model_files,
    add_runtime,
    add_time_limit,
    add_tolerance,
    metrics_of,
    report_exit_codes,
)
from sbs_widget.engine.cancel import INTERRUPTED, Cancel, ctrl_c
from sbs_widget.errors import InputError, RunCancelled

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

WRITERS = (".csv", ".xlsx", ".parquet", ".html", ".json", ".md")


def register_cli(sub) -> None:
    p = sub.add_parser("compare", help="compare an ExportedProgram with its ONNX export, value by value",
                       description="Run the .pt2 program and the ONNX model in lockstep and compare every "
                                   "aligned pair of intermediate values.",
                       epilog=report_exit_codes("the comparison ran to the end (its summary printed, -o written)",
                                                time_limit=True))
    add_model_files(p, inputs="several", inputs_help=INPUTS_HELP + "; several files: one comparison per file, "
                    "then the spread of each pair's error over them, the pairs that differ on some inputs only first "
                    "(-o: one row per pair, .csv, .xlsx or .parquet; .html: the offline report with the spread)")
    _common(p)
    p.add_argument("--onnx-b", default=None, metavar="B",
                   help="a transformed copy of --onnx (simplified, optimized, float16, quantized): both against the "
                        "program in one run, each value saying which side departs (columns b_*)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="with several --inputs: worker processes (default: min(CPUs, files, 4); 0: in this process)")
    p.set_defaults(func=_compare)

    d = sub.add_parser("demo", help="export the built-in dummy_llm, inject a fault and compare",
                       description="A self-contained example: exports sbs_widget.dummy_llm() to ONNX, "
                                   "replaces one Add by Sub in the ONNX model, and compares.",
                       epilog=report_exit_codes("the demo ran to the end (the injected fault is found or not)",
                                                time_limit=True))
    d.add_argument("--no-fault", action="store_true", help="compare the correct export")
    d.add_argument("--optimize", action="store_true", help="export with optimize=True")
    _common(d)
    d.set_defaults(func=_demo)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help=f"write the records; format by extension: {', '.join(WRITERS)}")
    add_tolerance(p)
    p.add_argument("--reset", nargs="+", default=[], metavar="NAME",
                   help="FX or ONNX names whose torch value replaces the ONNX one downstream")
    p.add_argument("--node-local", action="store_true", help="also run each ONNX node on torch inputs (err_local)")
    add_metrics(p)
    add_runtime(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_time_limit(p)


def _check_output(path: str | None) -> None:
    from sbs_widget.cli.main import check_output_file

    check_output_file(path, WRITERS)  # before the run: a bad -o must not cost the whole comparison


def _compare(args) -> int:
    if args.onnx_b is not None:
        from sbs_widget.cli.two_models import compare_two

        if len(args.inputs) > 1:
            raise InputError("--onnx-b compares on one --inputs file; give one")
        _check_output(args.output)
        found = compare_two(args, args.inputs[0])
        if args.output:
            write_records(found.records, args.output)
        return 0
    if len(args.inputs) > 1:
        from sbs_widget.cli.input_sets import compare_sets

        return compare_sets(args)
    _check_output(args.output)
    from sbs_widget.engine.entry import prepare

    begin = time.perf_counter()
    prepared = prepare(args.ep, args.onnx)
    if prepared.user_ep is not None and not args.quiet:
        print(f"prepared in {time.perf_counter() - begin:.1f} s, most of it decomposing the program as "
              "torch.onnx.export does; to skip that next time, save the program it translated "
              "(torch.export.save(onnx_program.exported_program, ...)) and pass it as --ep", file=sys.stderr)
    return _run_and_report(prepared, args.inputs[0], None, args)


def _demo(args) -> int:
    _check_output(args.output)
    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples.demo import demo_pair

    ep, model, inputs, fault = demo_pair(fault=not args.no_fault, optimize=args.optimize)
    if fault:
        print(f"demo: dummy_llm exported to ONNX; injected fault: {fault}")
    args.node_local = True  # the demo ends with the culprit: node-local errors make it sharp
    args.culprits = 3
    return _run_and_report(prepare(ep, model), inputs, None, args)


def _run_and_report(prepared: Prepared, inputs, kwargs, args) -> int:
    from tqdm import tqdm

    from sbs_widget.engine.summary import summarize
    from sbs_widget.engine.tolerance import describe as describe_tolerance
    from sbs_widget.safe_text import visible

    bar = None if args.quiet else tqdm(total=prepared.n_fx_nodes, unit="node", desc="comparing", file=sys.stderr)

    def progress(done, total, name):
        if bar is not None:
            bar.n = done
            if done == total or done % 16 == 0:
                bar.set_postfix_str(visible(name[:30]), refresh=False)
                bar.refresh()

    records = []
    metrics = metrics_of(args)
    extra = {} if metrics is None else {"metrics": metrics}
    defaults = (args.atol is None, args.rtol is None)
    args.atol, args.rtol = prepared.tolerance(args.atol, args.rtol)
    # Ctrl-C and --time-limit fire the token: a runtime call in flight is terminated, the run ends
    token, ended = Cancel(getattr(args, "time_limit", None)), None
    try:
        with ctrl_c(token, lambda: _write_partial(list(records), args)):
            try:
                for rec in prepared.run(inputs, kwargs, runtime=args.runtime, atol=args.atol, rtol=args.rtol,
                                        reset_names=args.reset, node_local=args.node_local, progress=progress,
                                        cancel=token, **extra):
                    records.append(rec)
            except RunCancelled as e:
                ended = e
    finally:  # whatever happens, what was computed is written
        if bar is not None:
            bar.close()
        if args.output and records:
            write_records(records, args.output, atol=args.atol, rtol=args.rtol)
            print(f"wrote {len(records)} records to {visible(args.output)}")
    if token.reason == INTERRUPTED:  # Ctrl-C: out at once, with what was computed written above
        print(f"interrupted: {visible(str(ended or token.error()))}", file=sys.stderr)
        exit_now(130)
        return 130
    if ended is not None:  # the summary must not read as the verdict on the whole model
        print(f"stopped early: the summary below covers the {len(records)} records compared before the time "
              "limit")
    for line in summarize(records, prepared).lines():
        print(visible(line))
    print(describe_tolerance(args.atol, args.rtol, prepared.precision, defaults))
    if metrics:
        for line in metrics_table(records, metrics):
            print(line)
    if getattr(args, "culprits", 0):
        _print_culprits(records, prepared, args)
    if ended is not None:  # out of time: the summary above covers what was compared
        raise ended
    return 0


def metrics_table(records, names, limit: int = 20) -> list[str]:
    """The lines of the outputs' table: one row per output pair (the first ``limit``), one column per
    metric; the figures of every pair are in the -o file. Names as ``visible`` text.

    >>> from sbs_widget.records import Record
    >>> print("\\n".join(metrics_table([Record(ep_name="out", kind="output", metrics={"cosine": 1.0})], ["cosine"])))
    metrics of the outputs (every pair's: -o):
    output  cosine
    out     1
    """
    from sbs_widget.records import KIND_OUTPUT
    from sbs_widget.safe_text import clipped, visible

    outputs = [r for r in records if r.kind == KIND_OUTPUT and r.metrics]
    if not outputs:
        return ["metrics: no output pair was compared (every pair's figures: -o)"]
    head = ["output"] + [visible(clipped(n, 40)) for n in names]
    rows = [[visible(clipped(r.ep_name or r.onnx_name or "?", 60))]
            + [_figure((r.metrics or {}).get(n)) for n in names] for r in outputs[:limit]]
    widths = [max(len(row[k]) for row in [head] + rows) for k in range(len(head))]
    lines = ["metrics of the outputs (every pair's: -o):"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head] + rows]
    if len(outputs) > limit:
        lines.append(f"... {len(outputs) - limit} more outputs (-o)")
    return lines


def _figure(v) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}"


def exit_now(code: int) -> None:
    """As ``python -m sbs_widget``: exit without the interpreter's teardown (torch's takes seconds,
    and a thread left in a runtime call would be waited for); called in-process, do nothing."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "sbs_widget.__main__":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _write_partial(records, args) -> None:
    """Ctrl-C while a runtime call ignores terminate: what was compared is written anyway."""
    from sbs_widget.safe_text import visible

    if args.output and records:
        write_records(records, args.output, atol=args.atol, rtol=args.rtol)
        print(f"interrupted: wrote {len(records)} records to {visible(args.output)}", file=sys.stderr)


def _print_culprits(records, prepared: Prepared, args) -> None:
    from sbs_widget.blame.culprits import find_culprits
    from sbs_widget.safe_text import clipped, visible

    found = find_culprits(records, top=args.culprits, prepared=prepared, atol=args.atol, rtol=args.rtol)
    if not found:
        print(visible(f"culprits: {found.cannot_judge}") if found.cannot_judge else
              "culprits: none (every difference beyond tolerance is rounding)" if "rounding only" in
              (found.verdict or "") else "culprits: none (every difference is within tolerance)")
    for rank, c in enumerate(found, 1):
        print(visible(f"culprit {rank}: {c.onnx_op_type} node {clipped(repr(c.onnx_node))} (value "
                      f"{clipped(repr(c.onnx_name))}, module "
                      f"{c.module or '-'}): {c.reason}"))


def write_records(records, path: str, *, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """Write records to ``path``, format chosen by extension (.csv, .xlsx, .parquet, .html).

    The file appears complete or not at all (written aside, then renamed). CSV and xlsx string cells
    are neutralised (``safe_text.spreadsheet_cell``): no formula, no control character; parquet and
    html keep the names exact (typed columns; the page renders text, never markup)."""
    from sbs_widget.cli.options import write_table
    from sbs_widget.records import to_dataframe
    from sbs_widget.safe_text import atomic_path

    ext = os.path.splitext(path)[1].lower()
    if ext not in WRITERS:
        raise InputError(f"cannot write {path!r}: use one of {', '.join(WRITERS)}")
    with atomic_path(path) as tmp:
        if ext in (".json", ".md"):  # the versioned JSON report, the Markdown summary (gate/report.py)
            from sbs_widget.gate.report import build_report

            build_report(records, atol=atol, rtol=rtol).write(tmp)
            return
        if ext == ".html":
            from sbs_widget.views.report import write_html_report

            write_html_report(records, tmp, atol=atol, rtol=rtol)
            return
        write_table(to_dataframe(records).drop(columns=["histogram"]), tmp, ext)

