"""Moved down the flow to ``sbs_widget/engine/summary.py`` (``blame`` and ``engine.coverage`` read it).

Kept only while ``views/widget.py`` still imports it from here: import from ``sbs_widget.engine.summary``."""

from sbs_widget.engine.summary import Summary, coverable_nodes, coverage, run_verdict, summarize, verdict_line  # noqa: F401
