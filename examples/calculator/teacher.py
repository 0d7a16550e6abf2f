"""An imperfect scripted teacher: demonstrations for the supervised warm start, wrong often enough, and
systematically enough, that the warm-started model inherits habits only rewards can fix.

Defined in ``lightrail/demos/calculator/teacher.py`` (its docstring has the error rates by problem shape).
"""

from __future__ import annotations

from lightrail.demos.calculator.teacher import SYSTEMATIC, demonstration, demonstrations, shape

__all__ = ["SYSTEMATIC", "demonstration", "demonstrations", "shape"]
