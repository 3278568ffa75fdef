"""The widget's static fallback (text/html in its mimebundle): what nbconvert, nbviewer and GitHub
show of an executed notebook, on real exports and a real kernel."""

from __future__ import annotations

import dataclasses

import nbformat
import pytest

import sbs_widget
from sbs_widget.samples import faults, zoo


@pytest.fixture(scope="module")
def faulty():
    """An MLP whose second Linear weight is 1% off in the ONNX file: one culprit."""
    ep, prog, args, _ = zoo.export("mlp", optimize=True)
    model = prog.model_proto
    weight = "layers.1.weight"
    return ep, faults.perturb_initializer(model, weight, scale=1e-2), args, weight


def test_the_mimebundle_carries_the_summary_culprits_and_worst_pairs(faulty):
    ep, model, args, weight = faulty
    w = sbs_widget.SbsWidget(ep, model, args).wait()
    data, _ = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data  # the live view stays first
    page = data["text/html"]
    assert "run 0: done" in page and "Culprits" in page and "mismatch" in page
    assert weight in page  # the culprit names the changed initializer (or its consumer)
    assert page.count("<tr>") == min(15, len([r for r in w.records if r.status != "one-sided"])) + 1


def test_a_run_not_ended_says_so_and_names_are_escaped(faulty):
    ep, model, args, _ = faulty
    records = [dataclasses.replace(r, ep_name="<script>alert(1)</script>" if i == 0 else r.ep_name)
               for i, r in enumerate(sbs_widget.run_aligned(ep, model, args))]
    page = sbs_widget.SbsWidget.from_records(records)._repr_mimebundle_()[0]["text/html"]
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    running = sbs_widget.SbsWidget(ep, model, args, autostart=False)
    running.status = "running"
    assert "had not ended" in running._repr_mimebundle_()[0]["text/html"]


def test_an_nbconvert_export_of_an_executed_notebook_shows_the_fallback(tmp_path):
    """Executed by nbclient (a real kernel), exported by nbconvert's HTML exporter: without the
    widget state saved (JupyterLab's default, nbviewer and GitHub pages alike) the page shows the
    fallback, so a reader without the widget sees the results."""
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "import sbs_widget\n"
        "from sbs_widget.samples import faults, zoo\n"
        "ep, prog, args, _ = zoo.export('mlp', optimize=True)\n"
        "bad = faults.perturb_initializer(prog.model_proto, 'layers.1.weight', scale=1e-2)\n"
        "sbs_widget.SbsWidget(ep, bad, args, title='mlp with a changed weight').wait()")]
    NotebookClient(nb, kernel_name="python3", timeout=600, store_widget_state=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    assert any("text/html" in o.get("data", {}) for o in outputs), outputs
    page, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    assert "sbs-widget-fallback" in page and "mlp with a changed weight" in page and "Culprits" in page
