"""Arithmetic word problems with exact answers, generated from a seed (no data set to download).

Each task is ``{"question": str, "answer": int, "expression": str}``; the held-out split never shares a problem with
training. Defined in ``lightrail/demos/calculator/data.py`` (``lightrail demo`` uses it); configs name it here::

    data: examples.calculator.data:make_splits
"""

from __future__ import annotations

from lightrail.demos.calculator.data import ITEMS, NAMES, ONE_STEP, TWO_STEP, make_splits

__all__ = ["ITEMS", "NAMES", "ONE_STEP", "TWO_STEP", "make_splits"]
