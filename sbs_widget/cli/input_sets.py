"""``python -m sbs_widget compare`` with several ``--inputs`` files: one comparison per file
(``steps.input_sets.compare_input_sets``, in worker processes), then the spread of each pair's error over them,
the input-dependent pairs first; ``-o`` writes one row per pair with its worst input (.csv, .xlsx, .parquet), or
the offline HTML report (.html: the view of every pair's worst record with its spread as columns, then the spread,
the input-dependent pairs and the culprits grouped across the inputs as plain text).

    python -m sbs_widget compare --ep m.pt2 --onnx m.onnx --inputs short.pt long.pt padded.pt -o spread.csv
"""

from __future__ import annotations

import os
import sys

from sbs_widget.errors import InputError

SPREAD_WRITERS = (".csv", ".xlsx", ".parquet", ".html")


def compare_sets(args) -> int:
    from sbs_widget.cli.main import check_output_file
    from sbs_widget.cli.options import metrics_of
    from sbs_widget.safe_text import visible

    check_output_file(args.output, SPREAD_WRITERS)
    if args.workers is not None and args.workers < 0:
        raise InputError(f"--workers {args.workers}: give a number of processes, 0 to run in this process")
    for path in args.inputs:  # a missing file is said before any worker starts
        if not os.path.isfile(path):
            raise InputError(f"inputs file not found: {path!r}")
    from sbs_widget.steps.input_sets import compare_input_sets

    def progress(done, total):
        if not args.quiet:
            print(f"input sets: {done}/{total} compared", file=sys.stderr, flush=True)

    metrics = metrics_of(args)
    extra = {} if metrics is None else {"metrics": metrics}
    result = compare_input_sets(args.ep, args.onnx, list(args.inputs), max_workers=args.workers, atol=args.atol,
                                rtol=args.rtol, node_local=args.node_local, runtime=args.runtime,
                                reset_names=tuple(args.reset), progress=progress, **extra)
    for line in result.lines():
        print(visible(line))
    if args.output:
        write_spread(result, args.output, title=f"{args.ep} vs {args.onnx}: {len(result)} input sets",
                     reset_names=tuple(args.reset))
        print(f"wrote {len(result.pairs)} pairs to {visible(args.output)}")
    if len(result.failed) == len(result):
        raise InputError(f"every input set failed; the first: {result.errors[0]}")
    return 0


def write_spread(result, path: str, *, title: str | None = None, reset_names=()) -> None:
    """One row per pair (``InputSets.to_dataframe``), or the offline HTML report of the spread
    (``views.report.write_sets_report``: every model string rendered as text); the file complete or not at
    all; CSV and xlsx cells neutralised as ``write_records`` does."""
    from sbs_widget.safe_text import atomic_path

    ext = os.path.splitext(path)[1].lower()
    with atomic_path(path) as tmp:
        if ext == ".html":
            from sbs_widget.views.report import write_sets_report

            write_sets_report(result, tmp, title=title or f"input sets: {len(result)} compared",
                              reset_names=reset_names)
            return
        from sbs_widget.cli.options import write_table

        write_table(result.to_dataframe(), tmp, ext)
