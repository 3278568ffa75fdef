"""What the user sees: the widget, its runs and rows, the offline report, the summary, safe text for outputs."""
