"""Security headers on every response (pages, JSON, static files, errors).

The policy allows scripts, styles and images from this site only (and the `data:` favicon), no
inline script or style: the templates load `static/*.js` and `static/*.css`, the chart is inline SVG
drawn on the server (attributes, not styles) and the leaderboard's bars are SVG too; the scripts set
styles through the DOM, which the policy allows. No page may be framed (clickjacking), no response
is sniffed into another type, and other sites see no path of ours in the Referer.
"""

from __future__ import annotations

from flask import Flask, Response

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
])
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def init_app(app: Flask) -> None:
    app.after_request(add_security_headers)


def add_security_headers(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response
