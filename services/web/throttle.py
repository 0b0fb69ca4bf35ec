"""Wrong submit tokens, counted per client address in a sliding window (`token_failures` in the DB, so
every web process of a deployment counts together).

A client that sent `limit` wrong tokens within the last `window_s` seconds is refused (429, with
Retry-After: when its oldest counted failure leaves the window) before its token is even compared,
right or wrong: a refusal that let the right token through would tell a guesser when it found it.
Defaults (settings `token_failures_per_window`, `token_failure_window_s`): 10 per 300 s, about 2,900
guesses a day from one address. IPv6 clients count per /64, the block one host usually holds.
Behind a reverse proxy every client has the proxy's address: set `web_trusted_proxies`.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select

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


def retry_after_s(db: Database, client: str, throttle: Throttle, now: datetime | None = None) -> int | None:
    """Seconds until `client` may try a token again, or None when it may now."""
    now = now or utcnow()
    window = timedelta(seconds=throttle.window_s)
    limit = max(1, throttle.limit)
    with db.session() as session:
        times = session.scalars(select(TokenFailureRow.failed_at).where(
            TokenFailureRow.client == client, TokenFailureRow.failed_at > now - window)
            .order_by(TokenFailureRow.failed_at)).all()
    if len(times) < limit:
        return None
    frees_at = times[len(times) - limit] + window  # once this one leaves, `limit - 1` remain
    return max(1, math.ceil((frees_at - now).total_seconds()))


def record_failure(db: Database, client: str, throttle: Throttle, now: datetime | None = None) -> None:
    """Count one wrong token; failures older than the window are dropped."""
    now = now or utcnow()
    with db.session() as session:
        session.execute(delete(TokenFailureRow).where(
            TokenFailureRow.failed_at <= now - timedelta(seconds=throttle.window_s)))
        session.add(TokenFailureRow(client=client, failed_at=now))
