"""The submit token (`KERNELSWARM_SUBMIT_TOKEN`): a new one, and the refusal of a weak one at start.

The token is the only credential of the web app, so it must be random and long: at least
`MIN_TOKEN_CHARS` characters. A length alone does not catch `aaaa…` or `abcabc…`, so the check also
refuses a token that repeats a shorter string or whose crude entropy estimate (length x log2 of its
distinct characters) is below `MIN_TOKEN_BITS`. `secrets.token_urlsafe(32)` (43 characters, 256 random
bits, estimate about 210) and a 32-character hex token (`openssl rand -hex 16`, 128 random bits,
estimate about 120) pass; a word repeated, a short password padded, a keyboard row do not. The
estimate cannot tell a random token from a long memorable one: make tokens with `new_token()`.
"""

from __future__ import annotations

import math
import secrets

from shared.errors import UserError

MIN_TOKEN_CHARS = 32
MIN_TOKEN_BITS = 96  # the crude estimate above: 32 characters of 8 or more distinct symbols pass
HOW_TO_MAKE_ONE = ("make one with `kernelswarm token` (or `python -c 'import secrets; "
                   "print(secrets.token_urlsafe(32))'`) and set KERNELSWARM_SUBMIT_TOKEN to it, or leave "
                   "KERNELSWARM_SUBMIT_TOKEN empty to turn submitting off")


def new_token() -> str:
    """43 URL-safe characters, 256 random bits."""
    return secrets.token_urlsafe(32)


def weakness(token: str) -> str | None:
    """Why `token` is too weak to guard the web app, or None when it is not."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"it has {len(token)} characters; at least {MIN_TOKEN_CHARS} random ones are required"
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        return "it must be printable ASCII without spaces (it travels in an HTTP header)"
    if token in (token + token)[1:-1]:
        return "it repeats a shorter string"
    distinct = len(set(token))
    if len(token) * math.log2(distinct) < MIN_TOKEN_BITS:
        return f"it uses only {distinct} distinct characters: it is not random"
    return None


def check_submit_token(token: str | None) -> None:
    """At start: refuse a submit token that is set but weak (UserError, with what to do). None or
    empty: submitting is off, which is allowed."""
    if not token:
        return
    reason = weakness(token)
    if reason is not None:
        raise UserError(f"KERNELSWARM_SUBMIT_TOKEN is too weak: {reason}; {HOW_TO_MAKE_ONE}")
