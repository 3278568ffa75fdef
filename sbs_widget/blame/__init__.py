"""Naming the culprit: ranking the nodes where a difference starts, the reset search, repro bundles."""
