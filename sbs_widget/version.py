"""The package's version, in a module of its own: what the package builds on can read it without
importing the package's root (which sits at the top of the import flow)."""

__version__ = "0.1.0"
