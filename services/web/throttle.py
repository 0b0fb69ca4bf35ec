"""Wrong submit tokens, counted per client address in a sliding window (`token_failures` in the DB, so
every web process of a deployment counts together).

A client that sent `limit` wrong tokens within the last `window_s` seconds is refused (429, with
Retry-After: when its oldest counted failure leaves the window) before its token is even compared,
right or wrong: a refusal that let the right token through would tell a guesser when it found it.
Defaults (settings `token_failures_per_window`, `token_failure_window_s`): 10 per 300 s, about 2,900
guesses a day from one address. IPv6 clients count per /64, the block one host usually holds.
Behind a reverse proxy every client has the proxy's address: set `web_trusted_proxies`.

Checking and counting are one step (`take_turn`, one transaction that holds the client's lock): a
comparison is counted as a failure before the token is compared, and uncounted (`give_back`) when
the token was right. Concurrent requests of one client therefore compare at most `limit` tokens per
window, however many arrive at once; read-then-record would let all of them through the check
before any was recorded.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from shared.db import Database, TokenFailureRow, utcnow


@dataclass(frozen=True)
class Throttle:
    limit: int  # failures allowed per window (at least 1)
    window_s: float


def client_of(address: str | None) -> str:
    """The key a client's failures are counted under: its IPv4 address, or its IPv6 /64."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d from a dual-stack socket: the IPv4 client
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(frozen=True)
class Turn:
    """What `take_turn` decided: compare the token (`failure_id`, the failure counted in advance), or
    refuse for `retry_after_s` seconds."""

    failure_id: int | None = None
    retry_after_s: int | None = None


def retry_after_s(db: Database, client: str, throttle: Throttle, now: datetime | None = None) -> int | None:
    """Seconds until `client` may try a token again, or None when it may now."""
    now = now or utcnow()
    with db.session() as session:
        return _wait_s(session, client, throttle, now)


def _wait_s(session: Session, client: str, throttle: Throttle, now: datetime) -> int | None:
    window = timedelta(seconds=throttle.window_s)
    limit = max(1, throttle.limit)
    times = session.scalars(select(TokenFailureRow.failed_at).where(
        TokenFailureRow.client == client, TokenFailureRow.failed_at > now - window)
        .order_by(TokenFailureRow.failed_at)).all()
    if len(times) < limit:
        return None
    frees_at = times[len(times) - limit] + window  # once this one leaves, `limit - 1` remain
    return max(1, math.ceil((frees_at - now).total_seconds()))


def take_turn(db: Database, client: str, throttle: Throttle, now: datetime | None = None) -> Turn:
    """One atomic step: refuse `client` when it is at its limit, else count a failure now (the
    caller compares the token, then `give_back`s the failure if the token was right)."""
    now = now or utcnow()
    with db.session() as session:
        _lock_client(session, client)
        _drop_old(session, throttle, now)
        wait_s = _wait_s(session, client, throttle, now)
        if wait_s is not None:
            return Turn(retry_after_s=wait_s)
        failure = TokenFailureRow(client=client, failed_at=now)
        session.add(failure)
        session.flush()
        return Turn(failure_id=failure.id)


def give_back(db: Database, failure_id: int) -> None:
    """Uncount the failure `take_turn` counted: the token was right."""
    with db.session() as session:
        session.execute(delete(TokenFailureRow).where(TokenFailureRow.id == failure_id))


def _lock_client(session: Session, client: str) -> None:
    """Held until the session ends; other requests of the same client wait. PostgreSQL: an advisory
    lock keyed by the client; SQLite: a write first takes the database's write lock (`_drop_old`)."""
    if session.get_bind().dialect.name == "postgresql":
        digest = hashlib.sha256(f"token_failures:{client}".encode()).digest()
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                        {"key": int.from_bytes(digest[:8], "big", signed=True)})


def _drop_old(session: Session, throttle: Throttle, now: datetime) -> None:
    session.execute(delete(TokenFailureRow).where(
        TokenFailureRow.failed_at <= now - timedelta(seconds=throttle.window_s)))


def record_failure(db: Database, client: str, throttle: Throttle, now: datetime | None = None) -> None:
    """Count one wrong token; failures older than the window are dropped."""
    now = now or utcnow()
    with db.session() as session:
        _drop_old(session, throttle, now)
        session.add(TokenFailureRow(client=client, failed_at=now))
