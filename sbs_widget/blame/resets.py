"""The reset search: the fewest names whose torch values, fed to the ONNX side, bring the outputs
within tolerance (each candidate set costs one rerun of the comparison)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sbs_widget import records as R
from sbs_widget.blame.culprits import as_prepared, find_culprits

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared


@dataclass
class ResetSuggestion:
    """The names whose reset brings the outputs within tolerance (``fixed``), greedy over culprits.

    ``before``/``after``: max |torch - onnx| per model output without / with the resets; ``steps``:
    ``(names reset so far, worst output error)`` for every rerun.
    """

    names: list[str]
    fixed: bool
    before: list[float | None]
    after: list[float | None]
    steps: list[tuple[list[str], float | None]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _outputs(records) -> tuple[list[float | None], bool]:
    outs = [r for r in records if r.kind == R.KIND_OUTPUT]
    return [r.err_abs for r in outs], all(r.status in (R.OK, R.NOISE) for r in outs)  # rounding is fine


def _worst(errs) -> float | None:
    known = [e for e in errs if e is not None]
    return max(known) if known else None


def suggest_resets(prepared: Prepared, inputs=(), records=None, *, kwargs=None, atol: float | None = None,
                   rtol: float | None = None, max_steps: int = 5, runtime: str = "onnxruntime") -> ResetSuggestion:
    """The smallest set of names (ONNX values with a torch twin) whose reset brings the model outputs
    within tolerance: greedily reset the top culprit not yet reset, rerun (cheap: sessions are cached
    on ``prepared``), until the outputs agree or ``max_steps``; then drop the names not needed.

    ``records``: a run of ``prepared`` on ``inputs`` with ``node_local=True`` (computed when None).

    >>> import sbs_widget
    >>> # s = sbs_widget.suggest_resets(prepared, inputs); s.names, s.before, s.after
    """
    p = as_prepared(prepared) if not isinstance(prepared, tuple) else as_prepared(*prepared)
    atol, rtol = p.tolerance(atol, rtol)

    def run(names):
        return list(p.run(inputs, kwargs, runtime=runtime, atol=atol, rtol=rtol, reset_names=names,
                          node_local=True))

    records = list(records) if records is not None else run([])
    before, ok = _outputs(records)
    if ok:
        return ResetSuggestion([], True, before, before, [])
    chosen: list[str] = []
    steps: list[tuple[list[str], float | None]] = []
    current, after = records, before
    for _ in range(max_steps):
        name = next((c.value for c in find_culprits(current, top=0, prepared=p, atol=atol, rtol=rtol)
                     if c.value and c.value not in chosen and c.value in p.index.producer), None)
        if name is None:
            break
        chosen.append(name)
        current = run(chosen)
        after, ok = _outputs(current)
        steps.append((list(chosen), _worst(after)))
        if ok:
            break
    if ok and len(chosen) > 1:  # the smallest set: drop what is not needed
        for name in list(chosen):
            trial = [n for n in chosen if n != name]
            errs, still = _outputs(run(trial))
            steps.append((trial, _worst(errs)))
            if still:
                chosen, after = trial, errs
    return ResetSuggestion(chosen, ok, before, after, steps)
