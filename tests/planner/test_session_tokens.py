"""Tokens of LLM turns that made no attempt (`assignments.tokens`: a closing submit, a session that
only submitted) count against the campaign's token budget and in its summary."""

from __future__ import annotations

from plannerkit import add_problems, close
from services.planner.campaign import Budgets, create_campaign, list_campaigns
from services.planner.tick import tick
from shared.db import AssignmentRow, CampaignRow


def test_tokens_on_assignments_spend_the_token_budget(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = create_campaign(db, "c", [problem], "cpu", 1, 3, budgets=Budgets(tokens=1000))
    (assignment_id,) = tick(db, campaign_id, queue)
    with db.session() as session:
        session.get(AssignmentRow, assignment_id).tokens = 1200  # a session that only submitted
    close(db, assignment_id)
    assert {s.id: s.tokens for s in list_campaigns(db)}[campaign_id] == 1200
    assert tick(db, campaign_id, queue) == []
    with db.session() as session:
        campaign = session.get(CampaignRow, campaign_id)
        assert campaign.status == "STOPPED" and campaign.status_reason == "token budget spent"
