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
