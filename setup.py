"""The compiled parts of sbs_widget: ``sbs_widget/engine/_compare.c``, the error figures of float32 pairs,
and ``sbs_widget/engine/_noise.c``, the rounding verdict of a float32 pair against its float64 reference.

Optional: without a C compiler the build skips them and ``metrics``/``noise`` compute in numpy (same
figures, about 2.5x slower on a run's comparisons, ~5x on a verdict). Everything else is declared in
pyproject.toml.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: a fused multiply-add would round the tolerance test unlike numpy does.
flags = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]

setup(ext_modules=[Extension(f"sbs_widget.engine.{name}", [f"sbs_widget/engine/{name}.c"], extra_compile_args=flags,
                             optional=True) for name in ("_compare", "_noise")])
