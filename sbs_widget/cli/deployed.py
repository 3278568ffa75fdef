"""``python -m sbs_widget deployed``: the ONNX model run as deployed against torch and as written, and
the optimizer, config entry or provider named when the deployed run is worse.

    python -m sbs_widget deployed --ep model.pt2 --onnx model.onnx --inputs inputs.pt \
        [--opt-level disable|basic|extended|layout|all] [--provider NAME ...] [--config KEY=VALUE ...]
        [--repro DIR] [--json]

Exits with 0 when the verdict is ``same``, 1 otherwise (``export``: the model as written already differs).
"""

from __future__ import annotations

import json

from sbs_widget.cli.options import add_model_files, add_tolerance


def register_cli(sub) -> None:
    p = sub.add_parser("deployed", help="run the ONNX model as deployed and name the setting that changes it",
                       description="Run the whole ONNX model as written (optimizations off) and as deployed "
                                   "(level, config entries, providers), compare both with torch, and bisect "
                                   "the setting that makes the deployed run worse.")
    add_model_files(p)
    add_tolerance(p)
    p.add_argument("--opt-level", default="all", choices=("disable", "basic", "extended", "layout", "all"),
                   help="the deployed graph optimization level (default: all, onnxruntime's default)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a session config entry of the deployment, e.g. session.set_denormal_as_zero=1 "
                        "(repeat for several)")
    p.add_argument("--provider", action="append", default=[], metavar="NAME",
                   help="an execution provider of the deployment, e.g. CUDAExecutionProvider (default: CPU)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="most seconds one session may take")
    p.add_argument("--repro", default=None, metavar="DIR",
                   help="when the deployment is at fault: write the subgraph as written where the difference "
                        "starts, its inputs and a replay.py showing both settings into DIR")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_deployed)


def _deployed(args) -> int:
    from sbs_widget.deployed.check import check_deployed
    from sbs_widget.deployed.settings import parse_config
    from sbs_widget.views.safe_text import visible

    options = {"level": args.opt_level, "config": parse_config(args.config)}
    result = check_deployed(args.ep, args.onnx, args.inputs, session_options=options,
                            providers=args.provider or None, atol=args.atol, rtol=args.rtol, timeout=args.timeout,
                            repro=args.repro)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=float))  # ensure_ascii escapes control characters
    else:
        print(visible(result.summary(), newlines=True))
    return 0 if result.verdict == "same" else 1
