"""Server-side syntax highlighting with Pygments (a dependency of rich); colours in static/highlight.css."""

from __future__ import annotations

from functools import lru_cache

from markupsafe import Markup, escape
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import PythonLexer, TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

CSS_CLASS = "hl"
MAX_HIGHLIGHT_BYTES = 200_000  # larger sources are shown plain: highlighting them costs too long

_FORMATTER = HtmlFormatter(cssclass=CSS_CLASS)


def highlight(code: str, filename: str = "reference.py") -> Markup:
    """`code` as a `<div class="hl"><pre>` block with token classes; plain when it is very large."""
    if len(code) > MAX_HIGHLIGHT_BYTES:
        return Markup(f'<div class="{CSS_CLASS}"><pre>{escape(code)}</pre></div>')
    return _highlighted(code, filename)


@lru_cache(maxsize=256)  # the same references and best sources are shown again and again
def _highlighted(code: str, filename: str) -> Markup:
    return Markup(pygments_highlight(code, _lexer(filename), _FORMATTER))


def _lexer(filename: str) -> Lexer:
    if filename.endswith(".py"):
        return PythonLexer()
    try:
        return get_lexer_for_filename(filename)
    except ClassNotFound:
        return TextLexer()


def stylesheet() -> str:
    """The rules behind the token classes (written once to static/highlight.css)."""
    return HtmlFormatter(style="friendly").get_style_defs(f".{CSS_CLASS}")
