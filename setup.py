"""The compiled part of sbs_widget: ``sbs_widget/engine/_compare.c``, the error figures of float32 pairs.

Optional: without a C compiler the build skips it and ``metrics`` compares in numpy (same figures,
about 2.5x slower on a run's comparisons). Everything else is declared in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: a fused multiply-add would round the tolerance test unlike numpy does.
flags = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]

setup(ext_modules=[Extension("sbs_widget.engine._compare", ["sbs_widget/engine/_compare.c"], extra_compile_args=flags,
                             optional=True)])
