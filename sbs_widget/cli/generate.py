"""``python -m sbs_widget generate``: greedy decoding on both sides, the first diverging step, and the
culprits at that step.

    python -m sbs_widget generate --ep model.pt2 --onnx model.onnx --inputs prompt.pt --steps 32 [--json]
                                  [-o steps.csv | report.html]

``--inputs``: the prompt's inputs as ``torch.save`` wrote them (a dict of keyword inputs, the cache
included when the program takes one). ``--json`` prints one object: ``first_divergence``
(``{"closed_loop": step or null, "open_loop": step or null}``, step 0 being the prompt), ``steps`` (the
figures of each) and ``culprits`` (most likely first, each with ``onnx_node`` and ``step``), found by
the lockstep run at the first diverging step (the open loop's when there is one). It reports: exit 0
whatever the steps say, 1 when it could not run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

from sbs_widget.cli.main import check_output_file, positive_int
from sbs_widget.cli.options import add_model_files, add_runtime, add_tolerance, report_exit_codes

OUTPUTS = (".csv", ".html", ".json")


def register_cli(sub) -> None:
    p = sub.add_parser("generate", help="greedy decoding on both sides: the first diverging step and its culprits",
                       description="Decode --steps tokens after the prompt on both sides, in a closed loop (each "
                                   "side its own tokens and cache) and an open loop (the ONNX side fed torch's); "
                                   "report the first diverging step and the culprits at that step.",
                       epilog=report_exit_codes("the steps were reported, diverging or not"))
    add_model_files(p, inputs_help="the prompt's inputs saved with torch.save (a dict of keyword inputs, the cache "
                                   "included when the program takes one)")
    add_tolerance(p)
    add_runtime(p)
    p.add_argument("--steps", type=positive_int, default=32, help="tokens to generate after the prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object (first_divergence, steps, culprits)")
    p.add_argument("--step", type=int, default=None,
                   help="run the lockstep with culprits at this step (default: the first diverging one)")
    p.add_argument("-o", "--output", default=None, help="write the steps (.csv, .json) or the lockstep report at "
                                                        "the step (.html)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_generate)


def _generate(args) -> int:
    check_output_file(args.output, OUTPUTS)
    from sbs_widget.engine.entry import prepare
    from sbs_widget.steps.decode import decode

    prepared = prepare(args.ep, args.onnx)
    bar = None
    if not args.quiet and not args.json:
        from tqdm import tqdm

        bar = tqdm(total=args.steps + 1, unit="step", desc="decoding", file=sys.stderr)
    progress = (lambda done, total: bar.update(done - bar.n)) if bar is not None else None
    try:
        gen = decode(prepared, args.inputs, steps=args.steps, atol=args.atol, rtol=args.rtol,
                     runtime=args.runtime, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    first = gen.first_divergence
    step = args.step if args.step is not None else first["open_loop"] if first["open_loop"] is not None \
        else first["closed_loop"]
    records, found = gen.lockstep(step) if step is not None else ([], [])
    result = {"first_divergence": first, "steps": _steps(gen),
              "culprits": [{**c.to_dict(), "step": step} for c in found]}
    _write(args.output, gen, result, records, step)
    if args.json:
        print(json.dumps(result, indent=1, default=_number))
        return 0
    _print(gen, first, found, step)
    return 0


def _steps(gen) -> list[dict]:
    out = []
    for s in gen.steps:
        row = {"step": s.step, "length": s.length, "torch_tokens": s.torch_tokens}
        for loop in ("closed", "open"):
            ls = getattr(s, loop)
            row[loop] = None if ls is None else {**dataclasses.asdict(ls), "diverges": ls.diverges}
        out.append(row)
    return out


def _number(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return float(x)


def _write(path: str | None, gen, result: dict, records: list, step: int | None) -> None:
    if path is None:
        return
    if path.endswith(".csv"):
        gen.to_dataframe().to_csv(path, index=False)
    elif path.endswith(".json"):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=_number)
    else:
        from sbs_widget.views.report import write_html_report

        title = f"sbs_widget: lockstep at decode step {step}" if step is not None else "sbs_widget: no diverging step"
        write_html_report(records, path, title=title, atol=gen.tolerance.atol, rtol=gen.tolerance.rtol,
                          prepared=gen.prepared)
    print(f"wrote {path}", file=sys.stderr)


def _print(gen, first: dict, found: list, step: int | None) -> None:
    from sbs_widget.safe_text import visible

    print(f"{len(gen.steps) - 1} steps after the prompt; first diverging step: closed loop "
          f"{first['closed_loop']}, open loop {first['open_loop']}")
    for s in gen.steps:
        marks = []
        for loop in ("closed", "open"):
            ls = getattr(s, loop)
            if ls is not None and (ls.diverges or ls.tie or ls.token_agreement < 1.0 or not ls.within_tolerance):
                marks.append(f"{loop}: max_abs={ls.max_abs:.3g} tokens {ls.token_agreement:.0%}"
                             + (" tie" if ls.tie else "") + (" DIVERGES" if ls.diverges else ""))
        if marks:
            print(f"  step {s.step}: " + "; ".join(marks))
    if step is not None:
        print(f"culprits at step {step}:")
        for c in found[:10]:
            print(f"  {visible(str(c.onnx_node))} ({visible(str(c.onnx_op_type))}) <- FX {visible(str(c.ep_name))}")
