"""``python -m sbs_widget graph``: both graphs, painted by a comparison, in one offline HTML page."""

from __future__ import annotations

from sbs_widget.cli.options import HelpFormatter, add_model_files, add_tolerance, report_exit_codes


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "graph",
        help="write the FX and ONNX graphs, painted by error, to a self-contained HTML page",
        description="Draw the decomposed torch.export program and its ONNX model side by side; with "
        "--inputs, run the comparison first and paint every node by its error.",
        epilog=report_exit_codes("the page was written"),
        formatter_class=HelpFormatter,  # "(default: ...)" only where there is one
    )
    add_model_files(p, onnx_help="ONNX model (.onnx) exported from that program", inputs="optional",
                    inputs_help="inputs saved with torch.save (tuple of args, dict of kwargs or both); "
                                "without it the graphs are drawn unpainted")
    p.add_argument("-o", "--output", default="graphs.html", help="HTML file to write (.html or .htm; the "
                   "graphs are drawn by the page, there is no image output)")
    add_tolerance(p)
    p.add_argument("--title", default=None, help="the page's title (default: EP vs ONNX, the file names)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from sbs_widget.cli.main import check_output_file
    from sbs_widget.engine.entry import prepare  # the decomposed program: records name its nodes, not the user's
    from sbs_widget.graphs.page import write_graphs_html
    from sbs_widget.load.readers import load_inputs
    from sbs_widget.safe_files import output_path
    from sbs_widget.safe_text import visible

    check_output_file(args.output, (".html", ".htm"))  # g.png, a missing folder: said before the run
    prepared = prepare(args.ep, args.onnx)
    records = []
    if args.inputs:
        inputs, kwargs = load_inputs(args.inputs, None)
        records = list(prepared.run(args=inputs, kwargs=kwargs, atol=args.atol, rtol=args.rtol))
    with output_path(args.output) as tmp:  # complete or absent; a link at the name is replaced
        write_graphs_html(tmp, prepared, records, title=args.title or f"{args.ep} vs {args.onnx}")
    bad = sum(r.status != "ok" for r in records)
    print(visible(f"wrote {args.output} ({len(records)} records, {bad} not ok)"))
    return 0
