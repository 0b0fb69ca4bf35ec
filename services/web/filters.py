"""Jinja filters for figures that may be missing: a missing figure shows as an em dash."""

from __future__ import annotations

from datetime import datetime

from flask import Flask
from markupsafe import Markup

MISSING = Markup("—")

# The filters return Markup: their text holds no HTML specials, so autoescaping can skip it (a
# leaderboard of a thousand rows formats ten thousand figures).


def init_app(app: Flask) -> None:
    app.jinja_env.filters.update(num=num, speedup=speedup, pct=pct, when=when, minute=minute, short=short,
                               bar_pct=bar_pct)


def num(value: float | None, digits: int = 3) -> Markup:
    return MISSING if value is None else Markup(f"{value:.{digits}f}")


def speedup(value: float | None) -> Markup:
    return MISSING if value is None else Markup(f"{value:.2f}x")


def pct(value: float | None) -> Markup:
    return MISSING if value is None else Markup(f"{100 * value:.0f}%")


def bar_pct(score: float) -> Markup:
    """A score in [0, 1] as a percentage without its sign: the width of a bar in a 100-wide viewBox."""
    return Markup(f"{100 * min(max(score, 0.0), 1.0):.1f}")


def when(value: datetime | None) -> Markup:
    return MISSING if value is None else Markup(value.strftime("%Y-%m-%d %H:%M:%S"))


def minute(value: datetime | None) -> Markup:
    return MISSING if value is None else Markup(value.strftime("%Y-%m-%d %H:%M"))


def short(value: str | None, length: int = 8) -> str:
    return MISSING if not value else value[:length]
