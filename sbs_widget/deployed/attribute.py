"""Which part of the deployed setting makes the whole-model run worse, one session per step, with a
logarithmic number of steps: bisection over the optimization levels, then over candidate sets
(transformers to disable, config entries to remove) for the smallest set that removes the difference."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import onnx

from sbs_widget.deployed.result import Cause, FusedNode, Step, worse, worst
from sbs_widget.deployed.settings import CPU, CREATES, INSERTED, LEVELS, NOT_COMPUTING, TRANSFORMERS, Setting

_KNOWN = {name for names in TRANSFORMERS.values() for name in names}
_LOOKS_LIKE = re.compile(r"^[A-Z][A-Za-z0-9]*(Fusion|Transformer|Elimination|Folding|Remover)(L[12])?$")


class Attribution:
    """``errors_of(setting, save) -> (errors, optimized model path, failure)`` runs one session."""

    def __init__(self, setting: Setting, written, errors_of: Callable, deployed_model: str | None, failure: str,
                 original: str | None = None):
        self.setting = setting
        self.original = original  # the model file as written: the graph level DISABLE runs
        self.written = written
        self.errors_of = errors_of
        self.steps: list[Step] = []
        self.models: dict[Setting, str | None] = {setting: deployed_model}
        self._known: dict[Setting, bool] = {setting: True}
        self.failure = failure
        # the setting whose optimized graph shows the cause with the fewest other fusions (the guilty
        # level, for an optimizer): where ``locate`` looks
        self.guilty_setting: Setting = setting

    def differs(self, what: str, s: Setting) -> bool:
        """One step (memoized: a setting already run is not run again)."""
        if s not in self._known:
            errors, optimized, failure = self.errors_of(s, True)
            self._known[s] = worse(errors, self.written)
            self.models[s] = optimized
            self.steps.append(Step(what, s.describe() + (f" (failed: {failure})" if failure else ""),
                                   self._known[s], worst(errors)))
        return self._known[s]

    @property
    def guilty_model(self) -> str | None:
        return self.models.get(self.guilty_setting)

    def run(self, localize: bool = True) -> tuple[Cause, list[Step], list[FusedNode]]:
        s = self.setting
        others = [p for p in s.providers if p != CPU and p not in NOT_COMPUTING]
        cpu = dataclasses.replace(s, providers=(CPU,))
        if others:
            if not self.differs("the deployed setting on CPU only", cpu):
                guilty = others[0] if len(others) == 1 else next(
                    (p for p in others if self.differs(f"{p} against CPU", dataclasses.replace(s, providers=(p, CPU)))),
                    "+".join(others))
                return Cause("provider", provider=guilty), self.steps, []
        s = cpu
        self._known.setdefault(s, True)
        if s.config:
            bare = dataclasses.replace(s, config=())
            if not self.differs("without the session config entries", bare):
                entries = list(s.config)
                self._known[bare] = False

                def fixed_by(removed: list) -> bool:
                    kept = tuple(e for e in entries if e not in removed)
                    return not self.differs(f"without {len(removed)} of the entries",
                                            dataclasses.replace(s, config=kept))

                return Cause("session-option", config=smallest(entries, fixed_by)), self.steps, []
            s = bare
        return self._optimizer(s, localize)

    def _optimizer(self, s: Setting, localize: bool) -> tuple[Cause, list[Step], list[FusedNode]]:
        top = LEVELS.index(s.level)
        if top == 0:
            note = "optimizations off and still worse: the session attributes " + \
                ", ".join(f"{k}={v}" for k, v in s.attributes)
            return Cause("session-option", note=note), self.steps, []
        lo, hi = 0, top  # lo: as written (good), hi: known to differ
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.differs(f"level {LEVELS[mid]}", dataclasses.replace(s, level=LEVELS[mid])):
                hi = mid
            else:
                lo = mid
        level = LEVELS[hi]
        at_level = dataclasses.replace(s, level=level)
        self.guilty_setting = at_level
        self.differs(f"level {level}", at_level)  # known unless hi == top: then memoized
        below = self.original if lo == 0 else self.models.get(dataclasses.replace(s, level=LEVELS[lo]))
        candidates, shown = self._candidates(lo, hi, self.models.get(at_level), below)

        def fixed_by(disabled: list) -> bool:
            return not self.differs(f"level {level} without {', '.join(disabled[:3])}"
                                    f"{'...' if len(disabled) > 3 else ''} ({len(disabled)})",
                                    dataclasses.replace(at_level, disabled=tuple(sorted({*disabled, *s.disabled}))))

        if not fixed_by(candidates):
            note = (f"disabling its {len(candidates)} known transformers does not remove the difference: the cause "
                    "is a transformer or kernel this list lacks")
            return Cause("optimizer", level=level, note=note), self.steps, []
        if shown and len(shown) < len(candidates) and fixed_by(shown):
            candidates = shown  # one step that usually saves several: the graph names its fusion
        guilty = smallest(candidates, fixed_by)
        fused = []
        if localize:
            good = self.models.get(dataclasses.replace(at_level, disabled=tuple(sorted({*guilty, *s.disabled}))))
            fused = fused_nodes(self.models.get(at_level), good, guilty)
        return Cause("optimizer", level=level, transformers=guilty), self.steps, fused

    def _candidates(self, lo: int, hi: int, bad_model: str | None, good_model: str | None) -> tuple[list, list]:
        """(all candidates, those the optimized graph at the guilty level shows): the transformers whose
        names the new nodes and initializers carry (``ConvBnFusion_W_...``, ``.../MatMulScaleFusion/``),
        or whose fused op types they have; then the others the level adds, then those of lower levels."""
        seen = []
        bad, good = _graph(bad_model), _graph(good_model)
        for name, (op, inputs) in bad.items():
            if name in good and good[name] == (op, inputs):
                continue
            for text in (name, *inputs):
                seen.extend(_named_in(text))
            seen.extend(CREATES.get(op, ()))
        shown = list(dict.fromkeys(seen))
        for level in LEVELS[lo + 1:hi + 1]:
            seen.extend(TRANSFORMERS.get(level, ()))
        for level in LEVELS[1:lo + 1]:
            seen.extend(TRANSFORMERS.get(level, ()))
        return list(dict.fromkeys(seen)), shown


_BY_LOWER = {name.lower(): name for name in _KNOWN}


def _named_in(text: str) -> list[str]:
    """The transformer names a node or initializer name carries, in any case (onnxruntime writes
    ``ConvBnFusion`` for ``ConvBNFusion``)."""
    found = []
    for part in re.split(r"[/_:.]", text):
        known = _BY_LOWER.get(part.lower()) or _BY_LOWER.get(part.lower() + "l1")
        if known:
            found.append(known)
        elif _LOOKS_LIKE.match(part):
            found.append(part)
    return found


def smallest(candidates: list, fixed_by: Callable[[list], bool]) -> list:
    """The smallest set (found greedily: one member per bisection) whose removal fixes, knowing that
    removing all of ``candidates`` fixes and removing none does not. Each member costs about
    log2(len(candidates)) calls; ``fixed_by`` should memoize."""
    must: list = []
    pool = list(candidates)
    while pool:
        lo, hi = 0, len(pool)  # fixed_by(must + pool[:lo]) is False, fixed_by(must + pool[:hi]) True
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fixed_by(must + pool[:mid]):
                hi = mid
            else:
                lo = mid
        must.append(pool[hi - 1])
        pool = pool[:hi - 1]
        if not pool or fixed_by(must):
            break
    return must


def _graph(path: str | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Node name -> (op type, inputs) of a saved optimized model; {} when there is none."""
    if not path:
        return {}
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - a missing or unreadable optimized model only loses candidates
        return {}
    return {n.name: (n.op_type, tuple(n.input)) for n in model.graph.node}


def fused_nodes(bad_path: str | None, good_path: str | None, guilty: list[str]) -> list[FusedNode]:
    """The nodes the guilty transformers made (present with them on and absent with them off, or
    kept under their name with other inputs or another op, as a Conv that absorbed a BatchNormalization),
    each with the nodes it replaced (those absent with them on, connected to it through shared values)."""
    if not bad_path or not good_path:
        return []
    bad = {n.name: n for n in onnx.load(bad_path, load_external_data=False).graph.node}
    good = {n.name: n for n in onnx.load(good_path, load_external_data=False).graph.node}
    changed = [n for name, n in bad.items()
               if name not in good or (good[name].op_type, list(good[name].input)) != (n.op_type, list(n.input))]
    removed = [n for name, n in good.items() if name not in bad]
    makes = set(guilty)
    real = [n for n in changed if not n.name.startswith(INSERTED)] or changed
    created = [n for n in real if makes & set(_named_in(n.name)) or makes & set(CREATES.get(n.op_type, ()))] \
        or real
    out = []
    for node in created:
        boundary = set(node.input) | set(node.output)
        group, values = [], set(boundary)
        grown = True
        while grown:  # the removed nodes connected to the fused node through removed values
            grown = False
            for r in removed:
                if r.name not in group and values & (set(r.input) | set(r.output)):
                    group.append(r.name)
                    values |= set(r.output) - set(node.input)
                    grown = True
        prefix = node.name.split("/")[0]
        if prefix != node.name and prefix in good and prefix not in group:
            group.insert(0, prefix)
        if node.name in good and node.name not in group:
            group.insert(0, node.name)  # kept its name: it replaced its former self too
        out.append(FusedNode(node.name, node.op_type, group))
    return out
