"""sbs_widget: run a torch.export program and its ONNX export side by side, align their intermediate
values, measure every pair and point at the node where the difference starts."""

from __future__ import annotations

__version__ = "0.1.0"

from sbs_widget.blame.culprits import Culprit, culprits, find_culprits
from sbs_widget.blame.repro import ReproBundle, export_repro
from sbs_widget.blame.resets import ResetSuggestion, suggest_resets
from sbs_widget.deployed.check import check_deployed
from sbs_widget.deployed.runtime import DeployedRuntime
from sbs_widget.dumps.compare import compare_dump
from sbs_widget.dumps.steal import ForwardStealer, load_dump, steal_forward
from sbs_widget.engine.entry import Prepared, prepare, run_aligned
from sbs_widget.engine.runtimes import Runtime, get_runtime
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
from sbs_widget.gate.report import Report, load_report, write_report
from sbs_widget.graphs.dot import fx_graph, onnx_graph
from sbs_widget.load.export import Exported, export_module
from sbs_widget.records import Record, to_dataframe
from sbs_widget.samples.dummy_llm import dummy_llm
from sbs_widget.strings import string_type
from sbs_widget.views.widget import SbsWidget

__all__ = [
    "Culprit",
    "ExportError",
    "Exported",
    "ForwardStealer",
    "InputError",
    "LoadError",
    "ModelMismatchError",
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
    "ToleranceExceeded",
    "check_deployed",
    "DeployedRuntime",
    "compare_dump",
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
