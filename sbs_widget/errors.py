"""The exception family of sbs_widget: every error the package raises on purpose derives from SbsError."""

from __future__ import annotations


class SbsError(Exception):
    """Base class of all errors raised by sbs_widget."""


class InputError(SbsError, ValueError):
    """The inputs given to a comparison do not fit the model (count, dtype, shape, file)."""


class ModelMismatchError(SbsError, ValueError):
    """The ExportedProgram and the ONNX model do not describe the same computation."""


class LoadError(SbsError, OSError):
    """A file (.pt2, .onnx, inputs, dump) is missing, truncated or corrupt."""


class ToleranceExceeded(SbsError, AssertionError):
    """Raised by ``run_aligned(..., exc=True)`` at the first pair beyond tolerance."""

    def __init__(self, message: str, record=None):
        super().__init__(message)
        self.record = record


class SbsWidgetWarning(UserWarning):
    """Warnings emitted by sbs_widget (tests turn them into errors)."""


class ProgramMismatchWarning(SbsWidgetWarning):
    """The ONNX model's metadata says it was exported from another program than the one given (a node of
    the same name with another target or literal argument, e.g. ``approximate='tanh'``): the differences
    found are then the files' differences, not translation bugs. ``Prepared.program_mismatch`` and the
    summary say it too."""


class NothingJudgedWarning(SbsWidgetWarning):
    """The culprit search found no culprit, yet the pairs it would judge compared no finite element
    (NaN/Inf on both sides everywhere, e.g. all-NaN inputs): "no culprit" would mean nothing."""


class RunCancelled(SbsError):
    """A run ended before its end: stopped (``SbsWidget.stop()``), interrupted (Ctrl-C) or out of time.
    The records yielded before it are kept by whoever consumed them."""

    def __init__(self, message: str, reason: str = "stopped", where: str = ""):
        super().__init__(message)
        self.reason = reason  # "stopped", "interrupted" or "time limit"
        self.where = where    # what was running when it ended (an ONNX node or segment)


class RunTimeout(RunCancelled, TimeoutError):
    """The run's ``time_limit`` was reached (``run_aligned(..., time_limit=)``, CLI ``--time-limit``)."""


class ExportError(SbsError, RuntimeError):
    """Exporting a model (``from_module``) failed; ``stage``: 0 for ``torch.export.export``, 1 for
    ``torch.onnx.export``; the message names it and the original error is chained."""

    def __init__(self, message: str, stage: int):
        super().__init__(message)
        self.stage = stage
