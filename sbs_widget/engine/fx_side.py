"""The FX side of a lockstep run (``FxSide``): the decomposed program run node by node on the run's
inputs (``fx_runner.FxRunner``), each node's time and error kept, torch values freed once neither
side reads them any more."""

from __future__ import annotations

import torch

from sbs_widget.engine.cancel import Cancel
from sbs_widget.engine.fx_runner import FxRunner
from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.run_state import FxState


class FxSide:
    """Owns the torch values of a run (``state.env``, the runner's) and the runner stepping through them."""

    def __init__(self, p: PreparedPair, device: torch.device, cancel: Cancel):
        self.p = p
        self.runner = FxRunner(p.decomposed_ep, p.schedule.small_fx_nodes, p.cache.fx_plans.setdefault(device, {}),
                               device)
        self.runner.hand_back_pages(p.cache.weight_files)
        self.runner.cancel = cancel  # checked by the torch side's loops too (fx_runner._CheckedHop)
        self.state = FxState(self.runner.env)

    @property
    def env(self) -> dict:
        return self.state.env

    @property
    def position(self) -> int:
        return self.runner.position

    def run_to(self, stop: int, release: dict[str, int],
               segment: int) -> tuple[list[tuple[int, float]], dict, str | None]:
        """Run up to node ``stop`` included: ``(position, seconds)`` per node run, the values of
        constant-folded twins (kept to be compared after the stretch), and the error of a node that
        failed (then ``position`` is past the end: nothing downstream can run on the torch side)."""
        s = self.p.schedule
        times: list[tuple[int, float]] = []
        kept: dict[str, object] = {}
        error = self.runner.run_to(stop, times, s.fx_frees, release, segment, s.fx_folded, kept)
        if error is not None:
            node = self.p.fx_nodes[self.runner.position - 1]
            self.state.errors[node.name] = error
        return times, kept, error

    def failed_node(self) -> torch.fx.Node:
        """The node that failed last (``run_to`` returned its error)."""
        return self.p.fx_nodes[self.runner.position - 1]

    def release(self, names, release: dict[str, int], segment: int) -> None:
        """Free torch values among ``names`` that neither side needs any more."""
        pos = self.runner.position
        env = self.runner.env
        last_use, position = self.p.schedule.fx_last_use, self.p.fx_position
        for name in names:
            if name in env and last_use.get(name, -1) < pos and release.get(name, -1) <= segment \
                    and position[name] < pos:
                del env[name]
