"""sbs_widget: run a torch.export program and its ONNX export side by side, align their intermediate
values, measure every pair and point at the node where the difference starts."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sbs_widget.errors import (
    ExportError,
    InputError,
    LoadError,
    ModelMismatchError,
    NothingJudgedWarning,
    ProgramMismatchWarning,
    RunCancelled,
    RunTimeout,
    SbsError,
    SbsWidgetWarning,
    ToleranceExceeded,
)
from sbs_widget.version import __version__ as __version__

# The rest is imported on first use (PEP 562): ``import sbs_widget`` (and ``python -m sbs_widget --help``)
# does not pay for torch, onnx and onnxruntime. Each name: the module defining it.
_LAZY = {
    "Culprit": "sbs_widget.blame.culprits",
    "culprits": "sbs_widget.blame.culprits",
    "find_culprits": "sbs_widget.blame.culprits",
    "ReproBundle": "sbs_widget.blame.repro",
    "export_repro": "sbs_widget.blame.repro",
    "ResetSuggestion": "sbs_widget.blame.resets",
    "suggest_resets": "sbs_widget.blame.resets",
    "check_deployed": "sbs_widget.deployed.check",
    "Coverage": "sbs_widget.engine.coverage",
    "coverage": "sbs_widget.engine.coverage",
    "DeployedRuntime": "sbs_widget.deployed.runtime",
    "compare_dump": "sbs_widget.dumps.compare",
    "ForwardStealer": "sbs_widget.dumps.steal",
    "load_dump": "sbs_widget.dumps.steal",
    "steal_forward": "sbs_widget.dumps.steal",
    "Prepared": "sbs_widget.engine.entry",
    "prepare": "sbs_widget.engine.entry",
    "run_aligned": "sbs_widget.engine.entry",
    "Runtime": "sbs_widget.engine.runtimes",
    "Tolerance": "sbs_widget.engine.tolerance",
    "get_runtime": "sbs_widget.engine.runtimes",
    "Report": "sbs_widget.gate.report",
    "load_report": "sbs_widget.gate.report",
    "write_report": "sbs_widget.gate.report",
    "fx_graph": "sbs_widget.graphs.dot",
    "onnx_graph": "sbs_widget.graphs.dot",
    "Exported": "sbs_widget.load.export",
    "export_module": "sbs_widget.load.export",
    "Record": "sbs_widget.records",
    "to_dataframe": "sbs_widget.records",
    "dummy_llm": "sbs_widget.samples.dummy_llm",
    "string_type": "sbs_widget.strings",
    "SbsWidget": "sbs_widget.views.widget",
    "ModelsComparison": "sbs_widget.twomodels.compare",
    "compare_models": "sbs_widget.twomodels.compare",
}

if TYPE_CHECKING:  # the names as type checkers and IDEs see them
    from sbs_widget.blame.culprits import Culprit, culprits, find_culprits
    from sbs_widget.blame.repro import ReproBundle, export_repro
    from sbs_widget.blame.resets import ResetSuggestion, suggest_resets
    from sbs_widget.deployed.check import check_deployed
    from sbs_widget.deployed.runtime import DeployedRuntime
    from sbs_widget.dumps.compare import compare_dump
    from sbs_widget.dumps.steal import ForwardStealer, load_dump, steal_forward
    from sbs_widget.engine.coverage import Coverage, coverage
    from sbs_widget.engine.entry import Prepared, prepare, run_aligned
    from sbs_widget.engine.runtimes import Runtime, get_runtime
    from sbs_widget.engine.tolerance import Tolerance
    from sbs_widget.gate.report import Report, load_report, write_report
    from sbs_widget.graphs.dot import fx_graph, onnx_graph
    from sbs_widget.load.export import Exported, export_module
    from sbs_widget.records import Record, to_dataframe
    from sbs_widget.samples.dummy_llm import dummy_llm
    from sbs_widget.strings import string_type
    from sbs_widget.twomodels.compare import ModelsComparison, compare_models
    from sbs_widget.views.widget import SbsWidget


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:  # ``import sbs_widget`` used to import these: ``sbs_widget.engine.entry`` still works
        package = importlib.import_module(f"{__name__}.{name}")
        for module in dict.fromkeys(_LAZY.values()):
            if module.startswith(f"{package.__name__}."):
                importlib.import_module(module)
        return package
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


_SUBPACKAGES = frozenset(m.split(".")[1] for m in _LAZY.values())

__all__ = [
    "Coverage",
    "Culprit",
    "ExportError",
    "Exported",
    "ForwardStealer",
    "InputError",
    "LoadError",
    "ModelMismatchError",
    "ModelsComparison",
    "NothingJudgedWarning",
    "Prepared",
    "ProgramMismatchWarning",
    "Record",
    "ReproBundle",
    "ResetSuggestion",
    "RunCancelled",
    "RunTimeout",
    "Runtime",
    "SbsError",
    "SbsWidget",
    "SbsWidgetWarning",
    "Tolerance",
    "ToleranceExceeded",
    "check_deployed",
    "DeployedRuntime",
    "compare_dump",
    "compare_models",
    "coverage",
    "culprits",
    "dummy_llm",
    "export_module",
    "export_repro",
    "find_culprits",
    "fx_graph",
    "get_runtime",
    "load_dump",
    "onnx_graph",
    "prepare",
    "run_aligned",
    "steal_forward",
    "string_type",
    "suggest_resets",
    "to_dataframe",
    "Report",
    "load_report",
    "write_report",
]
