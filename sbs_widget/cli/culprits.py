"""``python -m sbs_widget culprits`` and ``repro``: where the discrepancy starts, and a file to show it.

    python -m sbs_widget culprits --ep model.pt2 --onnx model.onnx --inputs inputs.pt [--json] [--top N]
    python -m sbs_widget repro --ep model.pt2 --onnx model.onnx --inputs inputs.pt --name NAME -o FOLDER [--force]

``culprits`` exits with 0 whether or not culprits are found (an empty list on a correct export): it
reports; ``check`` is the gate (exit 1 on a mismatch). It exits 1 when it cannot run (bad input; ``check``: 2).
"""

from __future__ import annotations

import argparse
import json

from sbs_widget.cli.main import check_output_folder, positive_int
from sbs_widget.cli.options import add_model_files, add_runtime, add_tolerance, report_exit_codes


def register_cli(sub) -> None:
    p = sub.add_parser("culprits", help="rank the ONNX nodes where the discrepancy starts",
                       description="Run both sides with node-local errors and name the nodes where errors "
                                   "originate, most likely first, each with a reason.",
                       epilog=report_exit_codes("the list was printed, empty or not"))
    _files(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, most likely first")
    p.add_argument("--top", type=positive_int, default=10,
                   help="how many culprits at most, a positive integer (default 10)")
    p.add_argument("--onnx-b", default=None, metavar="B",
                   help="a transformed copy of --onnx: name the nodes of B where it departs from --onnx and torch")
    p.set_defaults(func=_culprits)

    r = sub.add_parser("repro", help="write a minimal ONNX model + data + replay.py reproducing one culprit",
                       description="Cut the ONNX node (or fused group) computing NAME into its own model, "
                                   "with the torch inputs and expected outputs, and a replay.py script.",
                       epilog=report_exit_codes("the bundle was written"))
    _files(r)
    r.add_argument("--name", required=True, help="ONNX value, ONNX node or FX node name (e.g. a culprit's)")
    r.add_argument("-o", "--output", required=True,
                   help="folder to write the bundle into: a new folder (its parent must exist) or an existing "
                        "one holding no bundle file; a folder holding one is refused unless --force is given")
    r.add_argument("--force", action="store_true",
                   help="overwrite the bundle files (model.onnx, replay.py, ...) in an existing folder; other "
                        "files there are left alone")
    r.set_defaults(func=_repro)


def _files(p: argparse.ArgumentParser) -> None:
    add_model_files(p)
    add_tolerance(p)
    add_runtime(p)


def _culprits(args) -> int:
    if getattr(args, "onnx_b", None) is not None:
        from sbs_widget.cli.two_models import culprits_two

        return culprits_two(args)
    from sbs_widget.blame.culprits import culprits
    from sbs_widget.engine.entry import prepare
    from sbs_widget.safe_text import clipped, visible

    found = culprits(prepare(args.ep, args.onnx), None, args.inputs, top=args.top, atol=args.atol,
                     rtol=args.rtol, runtime=args.runtime)
    if args.json:
        # ensure_ascii (the default) writes control and bidi characters as \u escapes
        print(json.dumps([c.to_dict() for c in found], indent=1, default=float))
        return 0
    if not found:
        print(visible(found.cannot_judge) if getattr(found, "cannot_judge", None) else
              visible(found.verdict) if getattr(found, "verdict", None) else
              "no culprit: every compared value agrees within tolerance, or no node creates an error")
        return 0
    for k, c in enumerate(found, 1):
        node, value = clipped(repr(c.onnx_node)), clipped(repr(c.onnx_name))  # 100k-character names
        print(visible(f"{k}. {c.onnx_op_type} {node} -> {value} (FX {c.ep_name}, score {c.score:.2f})"))
        print(visible(f"   {c.reason}"))
    return 0


def _repro(args) -> int:
    from sbs_widget.blame.repro import BUNDLE_FILES, export_repro
    from sbs_widget.engine.entry import prepare
    from sbs_widget.safe_text import visible

    check_output_folder(args.output, BUNDLE_FILES, args.force)  # before the run
    bundle = export_repro(prepare(args.ep, args.onnx), args.inputs, args.name, args.output,
                          atol=args.atol, rtol=args.rtol)
    print(visible(f"wrote {bundle.folder}: {', '.join(bundle.files)}"))
    print(visible(f"max abs error of the piece on torch inputs: {bundle.err_abs:.3g}; run: python "
                  f"{bundle.folder}/replay.py"))
    return 0
