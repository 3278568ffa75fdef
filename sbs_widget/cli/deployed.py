"""``python -m sbs_widget deployed``: the ONNX model run as deployed against torch and as written, and
the optimizer, config entry or provider named when the deployed run is worse.

    python -m sbs_widget deployed --ep model.pt2 --onnx model.onnx --inputs inputs.pt \
        [--opt-level disable|basic|extended|layout|all] [--provider NAME ...] [--config KEY=VALUE ...]
        [--repro DIR] [--json]

Exits with 0 when the verdict is ``same``, 1 otherwise (``export``: the model as written already differs),
2 when it cannot judge (bad input, an unknown ``--config`` key), as ``check`` does.
"""

from __future__ import annotations

import argparse
import json
import sys

from sbs_widget.cli.options import INTERRUPTED_EXIT, add_model_files, add_tolerance


def register_cli(sub) -> None:
    p = sub.add_parser("deployed", help="run the ONNX model as deployed and name the setting that changes it",
                       description="Run the whole ONNX model as written (optimizations off) and as deployed "
                                   "(level, config entries, providers), compare both with torch, and bisect "
                                   "the setting that makes the deployed run worse.",
                       epilog="exit codes: 0 verdict same (the deployed run is as close to torch as the model as "
                              "written); 1 any other verdict (export: the model as written already differs; optimizer, "
                              "session-option, provider: the deployment does); 2 cannot judge, as for check: bad input "
                              "(a file missing, corrupt or refused, inputs that do not fit the model, a provider this "
                              f"onnxruntime lacks) or a usage error (a bad option, an unknown --config key); "
                              f"{INTERRUPTED_EXIT}.")
    add_model_files(p)
    add_tolerance(p)
    p.add_argument("--opt-level", default="all", choices=("disable", "basic", "extended", "layout", "all"),
                   help="the deployed graph optimization level (default: all, onnxruntime's default)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", type=config_entry,
                   help="a session config entry of the deployment, e.g. session.set_denormal_as_zero=1 "
                        "(repeat for several); an unknown key is refused (onnxruntime would ignore it)")
    p.add_argument("--provider", action="append", default=[], metavar="NAME",
                   help="an execution provider of the deployment, e.g. CUDAExecutionProvider (default: CPU)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="most seconds one session may take")
    p.add_argument("--repro", default=None, metavar="DIR",
                   help="when the deployment is at fault: write the subgraph as written where the difference "
                        "starts, its inputs and a replay.py showing both settings into DIR")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_deployed, error_exit=2)  # 1 is "the deployment differs": bad input must not read as it


def config_entry(text: str) -> str:
    """argparse ``type=`` of ``--config``: ``KEY=VALUE`` with a key onnxruntime knows. onnxruntime takes any
    key and ignores the ones it does not know: a typo would silently test the default setting."""
    from sbs_widget.deployed.settings import KNOWN_CONFIG

    key, sep, _ = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE: write e.g. session.set_denormal_as_zero=1")
    if key not in KNOWN_CONFIG:
        import difflib

        close = difflib.get_close_matches(key, KNOWN_CONFIG, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise argparse.ArgumentTypeError(
            f"unknown session config key {key!r}: {hint}the known keys are {', '.join(KNOWN_CONFIG)} (another "
            "entry: check_deployed(session_options={'config': {...}}) from Python takes any)")
    return text


def _deployed(args) -> int:
    from sbs_widget.deployed.check import check_deployed
    from sbs_widget.deployed.settings import parse_config
    from sbs_widget.safe_text import visible

    options = {"level": args.opt_level, "config": parse_config(args.config)}
    result = check_deployed(args.ep, args.onnx, args.inputs, session_options=options,
                            providers=args.provider or None, atol=args.atol, rtol=args.rtol, timeout=args.timeout,
                            repro=args.repro)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=float))  # ensure_ascii escapes control characters
    else:
        print(visible(result.summary(), newlines=True))
    notes = _next_steps(result, args)
    for line in notes:  # with --json, beside the JSON (stderr), so that stdout stays one document
        print(visible(line), file=sys.stderr if args.json else sys.stdout)
    return 0 if result.verdict == "same" else 1


def _next_steps(result, args) -> list[str]:
    """What to do after the verdict, and why ``--repro DIR`` wrote nothing when it did not."""
    lines = []
    if result.verdict == "export":
        lines.append("next: the ONNX model as written already differs from the program, before any deployment "
                     "setting; find the node where it starts with the lockstep: python -m sbs_widget culprits "
                     f"--ep {args.ep} --onnx {args.onnx} --inputs {args.inputs} (or compare -o diff.html for every "
                     "value)")
    if args.repro and not result.repro:
        why = {"same": "verdict same: the deployment agrees, there is no difference to reproduce",
               "export": "the model as written already differs: the deployment is not at fault; python -m "
                         "sbs_widget repro --name NAME writes a bundle for a culprit node",
               "provider": "verdict provider: bundles are written for the optimizer and session-option "
                           "verdicts, whose start is located"}.get(
            result.verdict, "the node where the difference starts could not be located")
        lines.append(f"--repro {args.repro}: nothing written ({why})")
    return lines
