"""What `kernelswarm up` says of the LLM endpoint: each error a writer met, printed as soon as it
is recorded (`shared.endpoints`, in Redis), and the exit code: `ENDPOINT_FAILED` when a fatal
error (a wrong key or model, no quota) stopped the run, or when writes were tried and none reached
the endpoint (every one refused or unanswered, no token spent)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import redis
from rich.console import Console
from rich.markup import escape
from sqlalchemy import func, select

from shared.db import AssignmentRow, AttemptRow, Database, utcnow
from shared.endpoints import endpoint_errors
from shared.settings import Settings

log = logging.getLogger(__name__)

ENDPOINT_FAILED = 3
HELP = {"auth": "check OPENAI_API_KEY", "model": "check KERNELSWARM_MODEL and OPENAI_BASE_URL",
        "quota": "the account behind the key has no credit left",
        "request": "the endpoint refuses the writer's requests (see worker.log)",
        "context": "set KERNELSWARM_AGENT_CONTEXT_TOKENS to the model's context",
        "rate_limit": "retried with backoff", "server": "retried with backoff",
        "unreachable": "retried with backoff; check OPENAI_BASE_URL", "timeout": "retried with backoff"}


class EndpointWatch:
    def __init__(self, settings: Settings) -> None:
        self.llm = bool(settings.openai_api_key)
        self.since, self.since_db = datetime.now(timezone.utc), utcnow()
        self._client = redis.Redis.from_url(settings.redis_url, socket_timeout=2) if settings.redis_url else None
        self.seen = 0
        self.fatal: dict | None = None

    def poll(self, elapsed: float, out: Console) -> bool:
        """Print the errors recorded since the last poll; True once a fatal one is among them."""
        if self._client is None or not self.llm:
            return False
        try:
            entries = endpoint_errors(self._client, self.since)
        except redis.RedisError as error:
            log.warning("could not read the LLM endpoint errors: %r", error)
            return False
        for entry in reversed(entries[:len(entries) - self.seen]):  # oldest new one first
            colour = "red" if entry.get("fatal") else "yellow"
            out.print(f"[{elapsed:5.0f} s] [{colour}]LLM endpoint error ({entry.get('kind')}): "
                      f"{escape(str(entry.get('message', '')))}[/{colour}] — {HELP.get(entry.get('kind'), '')}",
                      highlight=False)
            if entry.get("fatal") and self.fatal is None:
                self.fatal = entry
        self.seen = len(entries)
        return self.fatal is not None

    def exit_code(self, db: Database, campaign_id: int, out: Console) -> int:
        """`ENDPOINT_FAILED` (said why) or 0."""
        if self._client is not None:
            self._client.close()
        if not self.llm:
            return 0
        if self.fatal is not None:
            out.print(f"[red]stopped: the LLM endpoint refused the writers ({self.fatal.get('kind')}); "
                      f"{HELP.get(self.fatal.get('kind'), '')}, then run `kernelswarm up` again[/red]", highlight=False)
            return ENDPOINT_FAILED
        if self.seen and not self._reached(db, campaign_id):
            out.print("[red]no write reached the LLM endpoint: every request failed (see the errors above and "
                      "worker.log)[/red]", highlight=False)
            return ENDPOINT_FAILED
        return 0

    def _reached(self, db: Database, campaign_id: int) -> bool:
        """Whether any turn of this run was answered: an attempt an LLM wrote, or tokens on an assignment."""
        with db.session() as session:
            attempts = session.scalar(select(func.count()).select_from(AttemptRow).where(
                AttemptRow.campaign_id == campaign_id, AttemptRow.created_at >= self.since_db,
                AttemptRow.model.is_not(None)))
            tokens = session.scalar(select(func.coalesce(func.sum(AssignmentRow.tokens), 0)).where(
                AssignmentRow.campaign_id == campaign_id, AssignmentRow.created_at >= self.since_db))
        return bool(attempts) or bool(tokens)
