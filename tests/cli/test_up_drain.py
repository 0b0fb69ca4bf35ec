"""On stop, `kernelswarm up` waits for the attempts in flight: its campaign's, and those without a
campaign recorded while it ran (a problem's reference check submitted on the web)."""

from __future__ import annotations

import io
import time
import uuid
from datetime import datetime, timedelta

import pytest
from rich.console import Console
from sqlalchemy import select

from kernelswarm import up
from kernelswarm.launcher import Services
from shared.db import AttemptRow, CampaignRow, Database, ProblemRow, SolutionRow, utcnow
from shared.settings import Settings

START = datetime(2026, 12, 1, 12, 0)


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/up.db")
    yield database
    database.dispose()


def add_attempt(db: Database, campaign_id: int | None, status: str, created_at: datetime) -> str:
    digest = uuid.uuid4().hex * 2
    with db.session() as session:
        problem = session.scalars(select(ProblemRow)).one()
        session.add(SolutionRow(hash=digest, problem_id=problem.id, name=digest[:6], author="tests",
                                language="pytorch"))
        session.flush()
        attempt = AttemptRow(id=str(uuid.uuid4()), problem_id=problem.id, solution_hash=digest, device="cpu",
                             campaign_id=campaign_id, status=status, created_at=created_at)
        session.add(attempt)
        return attempt.id


def test_the_drain_counts_the_campaigns_attempts_and_those_without_a_campaign_since_up_started(db):
    with db.session() as session:
        session.add(ProblemRow(name="p", op_type="gemm", definition_json="{}", workloads_jsonl=""))
        ours, other = CampaignRow(name="up", status="STOPPED", device="cpu"), CampaignRow(name="x", device="cpu")
        session.add_all([ours, other])
        session.flush()
        ours_id, other_id = ours.id, other.id
    add_attempt(db, ours_id, "RUNNING", START + timedelta(minutes=1))
    add_attempt(db, ours_id, "PASSED", START + timedelta(minutes=1))
    add_attempt(db, None, "PENDING", START + timedelta(minutes=2))  # submitted on the web while `up` ran
    add_attempt(db, None, "RUNNING", START - timedelta(hours=1))  # from before: the sweep's, not this drain's
    add_attempt(db, other_id, "PENDING", START + timedelta(minutes=1))

    assert up._in_flight(db, ours_id, START) == 2


def test_the_drain_ends_at_once_when_nothing_is_in_flight(tmp_path, db):
    services = Services(Settings(home=tmp_path), tmp_path / "logs")
    started = time.monotonic()
    up._drain(db, 1, utcnow(), services, Console(file=io.StringIO()))
    assert time.monotonic() - started < 1


def test_the_drain_gives_up_after_its_grace_and_says_how_many_are_left(tmp_path, db, monkeypatch):
    """What is still in flight after GRACE_S is returned, so that `up` kills the busy workers at once
    instead of waiting for their warm shutdown as well."""
    with db.session() as session:
        session.add(ProblemRow(name="p", op_type="gemm", definition_json="{}", workloads_jsonl=""))
        campaign = CampaignRow(name="up", status="PAUSED", device="cpu")
        session.add(campaign)
        session.flush()
        campaign_id = campaign.id
    add_attempt(db, campaign_id, "RUNNING", utcnow())
    monkeypatch.setattr(up, "GRACE_S", 0.0)
    shown = io.StringIO()
    assert up._drain(db, campaign_id, START, Services(Settings(home=tmp_path), tmp_path / "logs"),
                     Console(file=shown)) == 1
    assert "waiting" not in shown.getvalue()
