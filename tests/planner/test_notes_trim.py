"""The planner trims a problem's notes to the budget: the newest entries and those a result
supports stay, the rest are shortened or dropped from the file, the DB keeps every entry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from plannerkit import Attempts, add_problems
from sqlalchemy import select

from kernelswarm.launcher import RedisServer
from services.planner.notes import Candidate, Support, choose_shown, supports, trim_campaign_notes, trim_notes
from services.planner.tasks import register
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AttemptRow, CampaignProblemRow, CampaignRow, ProblemRow
from shared.db.models import NoteRow, NotesFileRow
from shared.notes import append_note, read_notes, render_notes
from shared.runtime import Runtime
from shared.settings import Settings

BUDGET = 2000
PADDING = "; ".join(f"measured {n}" for n in range(25))  # about 300 characters of detail


@pytest.fixture
def runtime(tmp_path) -> Iterator[Runtime]:
    running = Runtime(Settings(home=tmp_path, notes_budget_chars=BUDGET))
    yield running
    running.db.dispose()


def in_file(runtime: Runtime, problem_id: int) -> tuple[dict[str, str], str]:
    """Each entry's `shown`, by its first word, and the file's text."""
    with runtime.db.session() as session:
        rows = session.scalars(select(NoteRow).where(NoteRow.problem_id == problem_id).order_by(NoteRow.id)).all()
        digest = session.get(NotesFileRow, problem_id).notes_hash
    return {r.text.split()[0]: r.shown for r in rows}, runtime.store.get(digest).decode()


def test_choose_keeps_the_newest_then_the_best_supported():
    c = [Candidate(1, Support.RECORD, 500, 60), Candidate(2, Support.UNSUPPORTED, 500, 60),
         Candidate(3, Support.EVIDENCE, 500, 60), Candidate(4, Support.UNSUPPORTED, 500, 60),
         Candidate(5, Support.UNSUPPORTED, 300, 60), Candidate(6, Support.UNSUPPORTED, 300, 60)]

    shown = choose_shown(c, budget=1900, overhead=100)

    # the newest: 6 and 5 (600 of 1900 // 3), not 4; then the record 1 and the evidence 3 in full
    # (200 left); the unsupported 4 (newer) and 2 shortened
    assert shown == {6: "FULL", 5: "FULL", 1: "FULL", 3: "FULL", 4: "SHORT", 2: "SHORT"}


def test_choose_drops_what_does_not_fit_even_shortened():
    c = [Candidate(n, Support.UNSUPPORTED, 400, 100) for n in range(1, 7)]

    shown = choose_shown(c, budget=1200, overhead=100)

    # the newest in full (400 of 1200 // 3), the next newest in full while it fits, then shortened
    assert shown == {6: "FULL", 5: "FULL", 4: "SHORT", 3: "SHORT", 2: "SHORT", 1: "DROPPED"}


def test_support_comes_from_the_linked_attempt(runtime):
    [problem_id] = add_problems(runtime.db, 1)
    attempts = Attempts(runtime.db)
    first = attempts.add(problem_id, None, "PASSED", sol_score=0.55, minute=1)
    failed = attempts.add(problem_id, None, "COMPILE_ERROR", minute=2, message="error: expected ';'")
    record = attempts.add(problem_id, None, "PASSED", sol_score=0.71, minute=3)
    slower = attempts.add(problem_id, None, "PASSED", sol_score=0.60, minute=4)
    pending = attempts.add(problem_id, None, "PENDING", minute=5)
    profile = attempts.add(problem_id, None, "PASSED", minute=6)
    with runtime.db.session() as session:
        session.get(AttemptRow, profile).kind = "profile"
    links = {"first": first, "failed": failed, "record": record, "slower": slower, "pending": pending,
             "profile": profile, "none": None}
    for word, attempt_id in links.items():
        append_note(runtime, problem_id, "m", f"{word} note", attempt_id=attempt_id)

    with runtime.db.session() as session:
        rows = session.scalars(select(NoteRow).order_by(NoteRow.id)).all()
        found = {r.text.split()[0]: s for r, s in zip(rows, supports(session, problem_id, rows).values())}
    assert found == {"first": Support.RECORD, "failed": Support.EVIDENCE, "record": Support.RECORD,
                     "slower": Support.EVIDENCE, "pending": Support.UNSUPPORTED, "profile": Support.EVIDENCE,
                     "none": Support.UNSUPPORTED}


def test_trim_keeps_the_newest_and_the_supported_and_the_db_keeps_everything(runtime):
    [problem_id] = add_problems(runtime.db, 1)
    attempts = Attempts(runtime.db)
    record = attempts.add(problem_id, None, "PASSED", sol_score=0.8, minute=1)
    failed = attempts.add(problem_id, None, "INCORRECT_NUMERICAL", minute=2)
    plan = [("record", record), ("idea1", None), ("failed", failed), ("idea2", None), ("idea3", None),
            ("idea4", None), ("idea5", None), ("latest", None)]
    for word, attempt_id in plan:
        append_note(runtime, problem_id, "qwen3-coder", f"{word}: the finding\n{PADDING}", attempt_id=attempt_id)
    assert len(read_notes(runtime, problem_id)) <= BUDGET  # bounded before the trim too
    before, text = in_file(runtime, problem_id)
    assert len(text) > BUDGET and set(before.values()) == {"FULL"}

    assert trim_notes(runtime, problem_id)

    shown, text = in_file(runtime, problem_id)
    assert len(text) <= BUDGET
    # the newest in a third of the budget (latest); the supported (record, failed); the unsupported,
    # newest first, in full while they fit (idea5), then shortened while that fits, else dropped
    assert shown == {"latest:": "FULL", "record:": "FULL", "failed:": "FULL", "idea5:": "FULL", "idea4:": "SHORT",
                     "idea3:": "SHORT", "idea2:": "SHORT", "idea1:": "DROPPED"}
    assert "idea2: the finding…\n" in text and "idea2: the finding\n" not in text and "idea1:" not in text
    assert "_1 earlier entry is not shown and 3 are shortened, to keep the notes within budget" in text
    assert len(shown) == len(plan)  # every entry is still in the DB
    with runtime.db.session() as session:
        rows = session.scalars(select(NoteRow).where(NoteRow.problem_id == problem_id, NoteRow.shown != "DROPPED")
                               .order_by(NoteRow.id)).all()
        file_row = session.get(NotesFileRow, problem_id)
        name = session.get(ProblemRow, problem_id).name
    assert text == render_notes(name, list(rows), len(plan))
    assert file_row.trimmed_at is not None and file_row.entries == len(rows) and file_row.chars == len(text)
    assert text.index("record: ") < text.index("failed: ") < text.index("latest: ")  # in the order written
    assert read_notes(runtime, problem_id) == text
    assert not trim_notes(runtime, problem_id)  # under the budget now: nothing to do


def test_a_dropped_entry_stays_dropped_and_new_ones_keep_coming_in(runtime):
    [problem_id] = add_problems(runtime.db, 1)
    for n in range(20):
        append_note(runtime, problem_id, "m", f"n{n}: {PADDING}")
        trim_notes(runtime, problem_id)
        shown, text = in_file(runtime, problem_id)
        assert len(text) <= BUDGET and shown[f"n{n}:"] == "FULL"
    assert shown["n0:"] == "DROPPED"
    assert "earlier entries are not shown" in text


def test_a_budget_too_small_for_any_entry_drops_them_once(tmp_path):
    runtime = Runtime(Settings(home=tmp_path, notes_budget_chars=120))
    try:
        [problem_id] = add_problems(runtime.db, 1)
        for n in range(3):
            append_note(runtime, problem_id, "m", f"n{n}: {PADDING}")

        assert trim_notes(runtime, problem_id)
        assert set(in_file(runtime, problem_id)[0].values()) == {"DROPPED"}
        assert not trim_notes(runtime, problem_id)  # still over (the title and the line), nothing left to do
        assert len(read_notes(runtime, problem_id)) <= 120
    finally:
        runtime.db.dispose()


def test_the_campaign_trims_only_its_problems_over_the_budget(runtime):
    over, under, elsewhere = add_problems(runtime.db, 3)
    with runtime.db.session() as session:
        campaign = CampaignRow(name="c", device="cpu", status="RUNNING")
        session.add(campaign)
        session.flush()
        for position, problem_id in enumerate((over, under)):
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=position))
        campaign_id = campaign.id
    for problem_id, count in ((over, 9), (under, 1), (elsewhere, 9)):
        for n in range(count):
            append_note(runtime, problem_id, "m", f"n{n}: {PADDING}")
    untouched = {p: in_file(runtime, p)[1] for p in (under, elsewhere)}

    assert trim_campaign_notes(runtime, campaign_id) == [over]

    assert len(in_file(runtime, over)[1]) <= BUDGET
    assert {p: in_file(runtime, p)[1] for p in (under, elsewhere)} == untouched
    assert trim_campaign_notes(runtime, campaign_id) == []


def test_the_planners_tick_task_trims(runtime, tmp_path):
    """The `planner.tick` task, as the sweeper sends it every `sweep_every_s` for each running campaign."""
    server = RedisServer(tmp_path / "redis")
    try:
        settings = runtime.settings.model_copy(update={"redis_url": server.url})
        runtime = Runtime(settings)
        app = make_celery(settings, name="notes-test")
        register(app, runtime)
        [problem_id] = add_problems(runtime.db, 1)
        with runtime.db.session() as session:
            campaign = CampaignRow(name="c", device="cpu", status="RUNNING", writers=0)
            session.add(campaign)
            session.flush()
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=0))
            campaign_id = campaign.id
        for n in range(9):
            append_note(runtime, problem_id, "m", f"n{n}: {PADDING}")
        assert len(in_file(runtime, problem_id)[1]) > BUDGET

        assert app.tasks[PLAN_TICK].run(campaign_id) == []  # no writer slot: nothing assigned

        assert len(in_file(runtime, problem_id)[1]) <= BUDGET
        runtime.db.dispose()
        app.close()
    finally:
        server.stop()
