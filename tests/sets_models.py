"""The input-set test model: a Linear-ReLU-Linear-LayerNorm with a dynamic sequence length, and an ONNX
export whose ReLU output is zeroed past position 8 (a fault only long inputs show)."""

from __future__ import annotations

import torch
from engine_models import export_module

from sbs_widget.samples import faults

LENGTHS = (4, 8, 12, 16)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.norm = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.fc2(torch.relu(self.fc1(x))) + x)


def length_fault():
    """``(ep, the correct ONNX program, the faulty ModelProto, one input set per length)``."""
    x = torch.randn(2, 12, 16)
    ep, prog = export_module(Net().eval(), (x,), dynamic_shapes={"x": {1: torch.export.Dim("seq", max=256)}})
    bad = faults.zero_beyond(prog.model_proto, "relu", length=8)
    gen = torch.Generator().manual_seed(3)
    return ep, prog, bad, [(torch.randn(2, s, 16, generator=gen),) for s in LENGTHS]
