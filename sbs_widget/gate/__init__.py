"""The comparison as a pass/fail check, for test suites and CI: one verdict on a run's records
(``verdict.py``), a versioned JSON report and a Markdown summary (``report.py``, ``markdown.py``), and
per-node overlays for Model Explorer (``explorer.py``). ``sbs_widget.testing.assert_aligned`` and
``python -m sbs_widget check`` use them."""
