"""Pausing and resuming a campaign from the web. A paused campaign's planner ticks hand out nothing
(writers finish what they hold); resuming sends `planner.tick` so idle writer slots fill again."""

from __future__ import annotations

from collections.abc import Callable

from shared.db import CampaignRow, Database
from shared.errors import NotFoundError, UserError

RUNNING, PAUSED = "RUNNING", "PAUSED"
MAX_ID = 2**31 - 1  # ids are INTEGER columns: a larger one names no campaign (and overflows the driver)
ACTIONS = {"pause": (RUNNING, PAUSED), "resume": (PAUSED, RUNNING)}  # action: (from, to)

SendTick = Callable[[int], None]


class ConflictError(UserError):
    http_status = 409


def control(db: Database, campaign_id: int, action: str, send_tick: SendTick | None) -> str:
    """Apply `pause` or `resume`; returns the campaign's status. Repeating an action changes
    nothing; a STOPPED campaign stays stopped."""
    if action not in ACTIONS:
        raise NotFoundError(f"no campaign action {action!r} (pause or resume)")
    before, after = ACTIONS[action]
    if not 1 <= campaign_id <= MAX_ID:
        raise NotFoundError(f"no campaign {campaign_id}")
    with db.session() as session:
        campaign = session.get(CampaignRow, campaign_id)
        if campaign is None:
            raise NotFoundError(f"no campaign {campaign_id}")
        if campaign.status not in (before, after):
            raise ConflictError(f"campaign {campaign_id} is {campaign.status}: it cannot be {action}d")
        changed = campaign.status == before
        if changed:
            campaign.status_reason = "paused on the web" if after == PAUSED else None
        campaign.status = after
    if changed and after == RUNNING and send_tick is not None:  # after the commit: the tick reads RUNNING
        send_tick(campaign_id)
    return after
