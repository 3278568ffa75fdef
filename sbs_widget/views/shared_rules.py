"""Moved down the flow to ``sbs_widget/shared_rules.py`` (``safe_text`` and ``graphs`` read it too).

Kept only while ``views/widget.py`` still imports it from here: import from ``sbs_widget.shared_rules``."""

from sbs_widget.shared_rules import *  # noqa: F403
