"""SbsWidget in marimo: ``marimo edit notebooks/marimo_demo.py`` (or ``marimo run`` for the app view).

marimo renders anywidgets natively once wrapped in ``mo.ui.anywidget``; a cell that reads the wrapped
element re-runs whenever the view changes a trait (a tolerance typed, a row ticked for reset).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


@app.cell
def _():
    import marimo as mo
    import torch

    import sbs_widget

    return mo, sbs_widget, torch


@app.cell
def _(sbs_widget, torch):
    # the bundled example: a small decoder, exported to ONNX on the fly
    model, inputs = sbs_widget.dummy_llm()
    onnx_program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    return inputs, onnx_program


@app.cell
def _(inputs, mo, onnx_program, sbs_widget):
    w = sbs_widget.SbsWidget(onnx_program.exported_program, onnx_program.model_proto, inputs,
                             title="dummy_llm in marimo")
    view = mo.ui.anywidget(w)
    view
    return view, w


@app.cell
def _(mo, view, w):
    # re-runs whenever the view sets a trait: the state below is read from Python
    _ = view.value
    mo.md(
        f"**From Python:** status `{w.status}` · atol `{w.atol:g}` · rtol `{w.rtol:g}` · "
        f"reset set `{sorted(w.reset_names)}` ({len(w.reset_names)}) · selected rows `{len(w.selected_rows)}` · "
        f"runs `{len(w.runs)}` · records `{len(w.records)}` · culprits `{len(w.culprits)}`"
    ).style({"font-family": "monospace"}).callout(kind="info")
    return


if __name__ == "__main__":
    app.run()
