"""The SOL history chart as inline SVG, drawn on the server from the DB's data: every finished attempt
a point (PASSED ones at their figure; along the bottom, PARTIAL ones as hollow diamonds and failed
ones as crosses), the best so far a step line, reference lines at the baseline and the hardware
limit, and a legend under the time axis. Hovering a point names the attempt (an SVG <title>, which
static/chart.js turns into a tooltip)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

from services.web.problem_data import History, HistoryPoint
from shared.repository import PARTIAL

WIDTH, HEIGHT = 860, 280
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 14, 44
FAIL_BAND = 18  # px under the plot where attempts without a figure (failed, partial) sit
LEGEND = (("pass", "passed"),
          ("partial", "partial: passed the workloads it ran, not all (a tuner rung, never a record)"),
          ("fail", "failed"), ("best", "best so far"))
LEGEND_CHAR_PX = 5.6  # about the width of a character of the legend's 11 px text
BAND_Y = HEIGHT - BOTTOM - FAIL_BAND / 2


@dataclass(frozen=True)
class Scale:
    t0: float
    t1: float
    y_max: float

    def x(self, at: datetime) -> float:
        span = self.t1 - self.t0
        fraction = (at.timestamp() - self.t0) / span if span > 0 else 0.5
        return LEFT + fraction * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        bottom = HEIGHT - BOTTOM - FAIL_BAND
        return bottom - min(value, self.y_max) / self.y_max * (bottom - TOP)


def history_svg(history: History, label: str) -> Markup:
    """The chart; `label` names the metric on the y axis."""
    points = history.points
    if not points:
        return Markup('<p class="muted">No finished attempts yet.</p>')
    times = [p.at.timestamp() for p in points]
    values = [p.value for p in points if p.value is not None]
    y_max = 1.0 if history.metric == "sol_score" else _nice_ceiling(max(values + [1.0]) * 1.1)
    scale = Scale(min(times), max(times), y_max)
    parts = [
        f'<svg class="history" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)} of every attempt over time, best so far as a step line">',
        *_axes(scale, history.metric, label, points),
        _step_line(scale, points),
        *(_point(scale, p, history.metric) for p in points),
        *_legend(),
        "</svg>",
    ]
    return Markup("\n".join(parts))


def _nice_ceiling(value: float) -> float:
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _axes(scale: Scale, metric: str, label: str, points: list[HistoryPoint]) -> list[str]:
    left, right, bottom = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM
    out = [f'<line class="axis" x1="{left}" y1="{TOP}" x2="{left}" y2="{bottom}"/>',
           f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>']
    for i in range(5):
        value = scale.y_max * i / 4
        y = scale.y(value)
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    marks = [(0.5, "baseline T_b"), (1.0, "hardware limit")] if metric == "sol_score" else [(1.0, "reference")]
    for value, name in marks:
        y = scale.y(value)
        out.append(f'<line class="mark" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        out.append(f'<text class="mark-label" x="{right - 4}" y="{y - 4:.1f}" text-anchor="end">{name}</text>')
    first, last = points[0].at, points[-1].at
    out.append(f'<text class="tick" x="{left}" y="{bottom + 16}">{first:%Y-%m-%d %H:%M}</text>')
    if last != first:
        out.append(f'<text class="tick" x="{right}" y="{bottom + 16}" text-anchor="end">{last:%Y-%m-%d %H:%M}</text>')
    out.append(f'<text class="axis-label" x="{(left + right) / 2}" y="{bottom + 16}" text-anchor="middle">'
               f'attempts over time (UTC)</text>')
    out.append(f'<text class="axis-label" x="12" y="{(TOP + bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(TOP + bottom) / 2})">{escape(label)}</text>')
    return out


def _step_line(scale: Scale, points: list[HistoryPoint]) -> str:
    path, current = [], None
    for point in points:
        if point.best_so_far is None or point.best_so_far == current:
            continue
        x, y = scale.x(point.at), scale.y(point.best_so_far)
        path.append(f"M{x:.1f},{y:.1f}" if current is None else f"H{x:.1f}V{y:.1f}")
        current = point.best_so_far
    if not path:
        return ""
    path.append(f"H{scale.x(points[-1].at):.1f}")
    return f'<path class="best" d="{"".join(path)}"/>'


def _point(scale: Scale, point: HistoryPoint, metric: str) -> str:
    x = scale.x(point.at)
    figure = f"{point.value:.3f}" if metric == "sol_score" and point.value is not None else (
        f"{point.value:.2f}x" if point.value is not None else "")
    tip = escape(f"attempt {point.attempt_id[:8]} · {point.status} {figure} · {point.at:%Y-%m-%d %H:%M:%S}")
    href = f"#attempt-{escape(point.attempt_id)}"
    attributes = f'data-attempt="{escape(point.attempt_id)}"'
    if point.value is not None:
        shape = _marker("pass", x, scale.y(point.value), "pt", attributes, tip)
    else:
        shape = _marker("partial" if point.status == PARTIAL else "fail", x, BAND_Y, "pt", attributes, tip)
    return f'<a href="{href}">{shape}</a>'


def _marker(kind: str, x: float, y: float, prefix: str, attributes: str = "", tip: str = "") -> str:
    """The shape of a point of `kind` (pass, partial or fail) centred on (x, y), of classes `pt pt-<kind>`
    on the chart and `key key-<kind>` in the legend (`prefix`), which is no point to hover or count."""
    classes = f"{prefix} {prefix}-{kind}"
    title = f"<title>{tip}</title>" if tip else ""
    extra = f" {attributes}" if attributes else ""
    if kind == "pass":
        return f'<circle class="{classes}" cx="{x:.1f}" cy="{y:.1f}" r="4"{extra}>{title}</circle>'
    if kind == "partial":
        return f'<path class="{classes}" d="M{x:.1f},{y - 4:.1f}l4,4l-4,4l-4,-4z"{extra}>{title}</path>'
    return f'<path class="{classes}" d="M{x - 3:.1f},{y - 3:.1f}l6,6m0,-6l-6,6"{extra}>{title}</path>'


def _legend() -> list[str]:
    """One row under the time axis: a sample of each marker and of the step line, with its meaning."""
    out, x, y = ['<g class="legend">'], float(LEFT), HEIGHT - 10
    for kind, meaning in LEGEND:
        if kind == "best":
            out.append(f'<path class="key key-best" d="M{x - 5:.1f},{y:.1f}h10"/>')
        else:
            out.append(_marker(kind, x, y, "key"))
        out.append(f'<text class="tick" x="{x + 9:.1f}" y="{y + 4:.1f}">{escape(meaning)}</text>')
        x += 9 + len(meaning) * LEGEND_CHAR_PX + 18
    out.append("</g>")
    return out
