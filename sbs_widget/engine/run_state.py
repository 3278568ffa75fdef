"""What a run knows between two records: the only thing a restart copies, and what a run hands to the
next one (``restart.py``: a rerun with another reset set starts from a kept copy of it).

Each side owns its part: the FX side its env of torch values and their times and errors, the ONNX
side its env of values, their shapes and errors, the judge the sources of differences found so far.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class FxState:
    env: dict  # FX name -> torch value (the runner's own env: inputs, weights, values still read)
    times: dict[str, float] = dataclasses.field(default_factory=dict)  # FX name -> seconds
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # FX name -> why it failed


@dataclasses.dataclass
class OnnxState:
    env: dict = dataclasses.field(default_factory=dict)  # ONNX value -> array (freed after its last reader)
    shapes: dict[str, tuple] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # ONNX value -> why it is unavailable


@dataclasses.dataclass
class JudgeState:
    # the FX nodes (and placeholders) where a difference beyond rounding is born (``verdicts.py``)
    sources: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class RunState:
    fx: FxState
    onnx: OnnxState
    judged: JudgeState
    done: int = 0  # FX nodes run (the progress count)
    n_records: int = 0  # records yielded
