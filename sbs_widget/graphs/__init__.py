"""Graphviz renderings of both graphs: the graph spec, DOT building, the graphs page."""
