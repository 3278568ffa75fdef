"""sbs_widget: run a torch.export program and its ONNX export side by side, align their intermediate
values, measure every pair and point at the node where the difference starts."""

from __future__ import annotations

__version__ = "0.1.0"

from sbs_widget.errors import (
    InputError,
    LoadError,
    ModelMismatchError,
    RunCancelled,
    RunTimeout,
    SbsError,
    SbsWidgetWarning,
    ToleranceExceeded,
)
from sbs_widget.samples.dummy_llm import dummy_llm
from sbs_widget.records import Record, to_dataframe

__all__ = [
    "InputError",
    "LoadError",
    "ModelMismatchError",
    "Record",
    "RunCancelled",
    "RunTimeout",
    "SbsError",
    "SbsWidgetWarning",
    "ToleranceExceeded",
    "dummy_llm",
    "to_dataframe",
]

# --- engine (issue 2) ---
from sbs_widget.engine.entry import Prepared, prepare, run_aligned  # noqa: E402
from sbs_widget.engine.runtimes import Runtime, get_runtime  # noqa: E402

__all__ += ["Prepared", "Runtime", "get_runtime", "prepare", "run_aligned"]
# --- dumps (issue 3) ---
from sbs_widget.dumps.steal import ForwardStealer, load_dump, steal_forward
from sbs_widget.dumps.compare import compare_dump
from sbs_widget.strings import string_type

__all__ += ["ForwardStealer", "compare_dump", "load_dump", "steal_forward", "string_type"]
# --- widget (issue 4) ---
from sbs_widget.views.widget import SbsWidget  # noqa: E402

__all__ += ["SbsWidget"]
# --- graphs (issue 5) ---
from sbs_widget.graphs.dot import fx_graph, onnx_graph  # noqa: E402

__all__ += ["fx_graph", "onnx_graph"]
# --- culprits (issue 6) ---
from sbs_widget.blame.culprits import Culprit, ResetSuggestion, culprits, find_culprits, suggest_resets  # noqa: E402
from sbs_widget.blame.repro import ReproBundle, export_repro  # noqa: E402

__all__ += ["Culprit", "ReproBundle", "ResetSuggestion", "culprits", "export_repro", "find_culprits",
            "suggest_resets"]
