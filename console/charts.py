"""The console's charts: stacked bars as SVG geometry computed on the server.

The templates (``_chart.html``) draw the rectangles this returns: no JavaScript, nothing
from a CDN, nothing the content security policy would have to allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from signals_app.models import Outcome


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    plot_left: int
    plot_bottom: int
    max_value: int
    bars: list[Bar]
    labels: list[tuple[float, str]]
    legend: list[tuple[str, str]]


def stacked_bar_chart(
    columns: Sequence[tuple[str, Mapping[str, int]]],
    series: Sequence[tuple[str, str]],
    *,
    label_every: int = 1,
    width: int = 760,
    height: int = 200,
) -> Chart:
    """One stacked bar a column, one colour a series; scaled to the largest column."""
    left, bottom, top = 40, 20, 10
    plot_height = height - bottom - top
    slot = (width - left) / max(len(columns), 1)
    max_value = max((sum(values.values()) for _, values in columns), default=0)
    scale = plot_height / max_value if max_value else 0.0
    bars: list[Bar] = []
    labels: list[tuple[float, str]] = []
    for index, (label, values) in enumerate(columns):
        x = left + index * slot
        y = float(height - bottom)
        for key, color in series:
            value = values.get(key, 0)
            if value:
                bar_height = value * scale
                y -= bar_height
                geometry = (round(x + 1, 1), round(y, 1), round(slot - 2, 1), round(bar_height, 1))
                bars.append(Bar(*geometry, color=color, title=f"{label}: {value} {key}"))
        if index % label_every == 0:
            labels.append((round(x + slot / 2, 1), label))
    return Chart(width, height, left, height - bottom, max_value, bars, labels, list(series))


OUTCOME_COLORS = [
    (Outcome.ATTRIBUTED.label, "#3a7d44"),
    (Outcome.GATED.label, "#d9822b"),
    (Outcome.NO_TARGET.label, "#8a8a8a"),
    (Outcome.PENDING.label, "#417690"),
]
CHANGE_COLORS = [("leaves", "#ba2121"), ("rejoins", "#3a7d44")]
