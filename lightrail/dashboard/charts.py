"""Line charts as inline SVG, drawn on the server: no charting library, no script, readable by screen readers
(``role="img"`` with a label that states the last value) and printable.

    svg = line_chart("validation success", {"val": [(0, 0.25), (1, 0.5)]})
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

__all__ = ["line_chart"]

Series = Sequence[tuple[float, float]]

_W, _H = 360, 160
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 10, 38, 26
_COLOURS = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed")


def _step(lo: float, hi: float, n: int) -> float:
    """A round tick spacing giving about ``n`` ticks over [lo, hi] (hi > lo)."""
    raw = (hi - lo) / n
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _ticks(lo: float, hi: float, n: int = 4, *, integer: bool = False) -> list[float]:
    """About ``n`` round tick values within [lo, hi]; with ``integer``, whole numbers only (steps: no 0.5)."""
    step = max(1.0, _step(lo, hi, n)) if integer else _step(lo, hi, n)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fit(title: str) -> str:
    """The title's attributes that squeeze a long one into the chart's width (11 px bold: ~6.3 px a character)
    rather than letting the SVG cut it off."""
    room = _W - 8
    return f' textLength="{room}" lengthAdjust="spacingAndGlyphs"' if len(title) * 6.3 > room else ""


def _label(value: float) -> str:
    return f"{value:.3g}"


def line_chart(title: str, series: Mapping[str, Series], *, x_label: str = "step") -> Markup:
    """An SVG of each series (x, y points, drawn in x order), with axes, ticks and a legend; the accessible name
    says the last value of each series. A chart with no points says so instead."""
    points = [p for values in series.values() for p in values if math.isfinite(p[1])]
    if not points:
        return Markup('<p class="empty">{}: nothing recorded yet</p>').format(title)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    step = _step(y0, y1, 4)  # the y axis ends on round ticks, so the highest point sits on or under the top tick
    y0, y1 = math.floor(y0 / step + 1e-9) * step, math.ceil(y1 / step - 1e-9) * step
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return _TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    last = "; ".join(f"{name} {_label(values[-1][1])} at {x_label} {_label(values[-1][0])}"
                     for name, values in series.items() if values)  # fmt: skip
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}: {escape(last)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="4" y="14" class="chart-title"{_fit(title)}>{escape(title)}</text>',
    ]
    for tick in _ticks(y0, y1):
        y = sy(tick)
        parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{_LEFT - 4}" y="{y + 3:.1f}" class="tick" text-anchor="end">{_label(tick)}</text>')
    for tick in _ticks(x0, x1, 5, integer=all(float(x).is_integer() for x in xs)):
        x = sx(tick)
        parts.append(f'<text x="{x:.1f}" y="{_H - 10}" class="tick" text-anchor="middle">{_label(tick)}</text>')
    parts.append(f'<text x="{_W - _RIGHT}" y="{_H - 1}" class="tick" text-anchor="end">{escape(x_label)}</text>')
    for i, (name, values) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        drawn = sorted(p for p in values if math.isfinite(p[1]))
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in drawn)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
        if len(drawn) == 1:
            x, y = drawn[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>')
        lx = _LEFT + 6 + 110 * i
        parts.append(f'<rect x="{lx}" y="23" width="10" height="3" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 14}" y="28" class="legend">{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
