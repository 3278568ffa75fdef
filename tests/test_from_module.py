"""From a model to a comparison in one call (``SbsWidget.from_module``, ``run_aligned``/``culprits``
with a module, ``export_module``): real torch.export and torch.onnx exports, failures named by stage."""

from __future__ import annotations

import pytest
import torch

import sbs_widget
from sbs_widget.samples import zoo


@torch.library.custom_op("sbs_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_mystery.register_fake
def _(x):
    return torch.empty_like(x)


class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # a branch on a value: torch.export cannot capture it


class Untranslatable(torch.nn.Module):
    def forward(self, x):
        return torch.ops.sbs_test.mystery(x) + 1  # captured by torch.export, unknown to torch.onnx


def test_from_module_exports_once_and_compares_with_the_users_program():
    model, args, _ = zoo.BUILDERS["mlp"]()
    w = sbs_widget.SbsWidget.from_module(model, args, title="mlp", autostart=False)
    shown: list = []
    w.observe(lambda change: shown.append((change["new"] or {}).get("current") or ""), "progress")
    w.rerun().wait()
    stages = [s for s in shown if s.startswith("exporting")]
    assert stages[0].startswith("exporting (1/2): torch.export") and stages[1].startswith("exporting (2/2): torch.onnx")
    assert w.status == "done" and w.records and not [r for r in w.records if r.status == "mismatch"]
    exported = w.exported
    assert isinstance(exported, sbs_widget.Exported)
    # the exporter's decomposed program is compared (no decomposition repeated), the user's is kept
    assert w._prepared.decomposed_ep is exported.onnx_program.exported_program
    assert w._prepared.user_ep is exported.user_ep
    before = w._prepared
    w.rerun().wait()
    assert w._prepared is before and w.exported is exported  # a rerun exports nothing again


def test_run_aligned_and_culprits_take_a_module():
    model, args, _ = zoo.BUILDERS["mlp"]()
    records = list(sbs_widget.run_aligned(model, None, args))
    assert records and {r.status for r in records} <= {"ok", "one-sided"}
    assert sbs_widget.culprits(model, None, args) == []
    with pytest.raises(sbs_widget.InputError, match="no ONNX model"):
        list(sbs_widget.run_aligned(model, "model.onnx", args))


def test_an_export_that_fails_names_its_stage():
    x = (torch.randn(4),)
    with pytest.raises(sbs_widget.ExportError, match=r"stage 1 of 2 \(torch\.export\.export") as first:
        sbs_widget.export_module(DataDependent(), x)
    assert first.value.stage == 0 and first.value.__cause__ is not None
    with pytest.raises(sbs_widget.ExportError, match=r"stage 2 of 2 \(torch\.onnx\.export") as second:
        sbs_widget.export_module(Untranslatable(), x)
    assert second.value.stage == 1 and "what to do" in str(second.value)
    w = sbs_widget.SbsWidget.from_module(DataDependent(), x)
    with pytest.raises(sbs_widget.ExportError, match="stage 1 of 2") as waited:  # the type raised, not a wrapper
        w.wait()
    assert waited.value.stage == 0 and waited.value.__cause__ is not None
    assert w.status == "error" and "stage 1 of 2" in w.message
    with pytest.raises(sbs_widget.InputError, match="torch.nn.Module"):
        sbs_widget.export_module("not a model", x)
