"""Line charts as SVG, drawn on the server (no script in the browser).

:func:`line_chart` takes named series of ``(time, value)`` points and returns SVG
markup: a polyline per series (``class="series"``, ``data-points`` its number of
points), y-axis ticks formatted by ``fmt``, the time span on the x axis, and a legend.
Every piece of text is escaped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

from fabric.api.console.series import Point

#: Series colours, told apart in colour and in dash pattern.
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#854d0e", "#be185d")
DASHES = ("", "6 3", "2 3", "8 3 2 3")

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 84, 12, 30, 28


def _ticks(top: float, binary: bool = False) -> list[float]:
    """Five round y values from 0 to at least ``top`` (``binary``: round in KiB, MiB, ...)."""
    if top <= 0:
        return [0.0, 1.0]
    if binary and top >= 1024:
        unit = 1024.0
        while top / unit >= 1024:
            unit *= 1024
        return [v * unit for v in _ticks(top / unit)]
    raw = top / 4
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    while magnitude > raw:
        magnitude /= 10
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude * 4 >= top)
    return [step * i for i in range(5)]


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[Point]]],
    fmt: Callable[[float], str] = lambda v: f"{v:g}",
    y_max: float | None = None,
    binary: bool = False,
) -> Markup:
    points = [p for _, pts in series for p in pts]
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT + 18 * ((len(series) + 2) // 3)}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" data-points="{len(points)}">',
        f"<title>{escape(title)}</title>",
        f'<text class="ctitle" x="{LEFT}" y="16">{escape(title)}</text>',
    ]
    if not points:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">no samples yet</text>')
    else:
        t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
        top = y_max if y_max is not None else max(v for _, v in points)
        ticks = _ticks(top, binary)
        top = ticks[-1] or 1.0
        span = (t1 - t0) or 1.0

        def x(t: float) -> float:
            return LEFT + (t - t0) / span * w

        def y(v: float) -> float:
            return TOP + h - min(max(v, 0.0), top) / top * h

        for v in ticks:
            parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + w}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
            parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(fmt(v))}</text>')
        parts.append(
            f'<text class="tick" x="{LEFT}" y="{HEIGHT - 8}">{escape(time.strftime("%H:%M:%S", time.localtime(t0)))}</text>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT + w}" y="{HEIGHT - 8}" text-anchor="end">'
            f'{escape(time.strftime("%H:%M:%S", time.localtime(t1)))}</text>'
        )
        for i, (name, pts) in enumerate(series):
            if not pts:
                continue
            colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(
                f'<polyline class="series" data-series="{escape(name)}" data-points="{len(pts)}" fill="none" '
                f'stroke="{colour}" stroke-width="2"{dash_attr} points="{coords}"/>'
            )
            if len(pts) == 1:
                t, v = pts[0]
                parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>')
    for i, (name, pts) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        lx, ly = LEFT + (i % 3) * 190, HEIGHT + 6 + 18 * (i // 3)
        last = escape(fmt(pts[-1][1])) if pts else "–"
        parts.append(f'<rect x="{lx}" y="{ly}" width="12" height="4" fill="{colour}"/>')
        parts.append(f'<text class="legend" x="{lx + 16}" y="{ly + 6}">{escape(name)}: {last}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
