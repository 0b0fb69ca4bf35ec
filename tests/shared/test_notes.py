"""A problem's notes: appends recorded in the DB, the current file in the object store, refusals
the model is told, the bound on what a writer reads."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from shared.db import AttemptRow, ProblemRow, SolutionRow
from shared.db.models import NoteRow, NotesFileRow
from shared.errors import UserError
from shared.notes import append_note, read_notes, render_entry, render_notes, shorten
from shared.runtime import Runtime
from shared.settings import Settings

T0 = datetime(2026, 1, 1, 12, 0, 0)


@pytest.fixture
def runtime(tmp_path) -> Iterator[Runtime]:
    running = Runtime(Settings(home=tmp_path, notes_budget_chars=1500, note_max_chars=400))
    yield running
    running.db.dispose()


def add_problem(runtime: Runtime, name: str = "rmsnorm_h2048") -> int:
    with runtime.db.session() as session:
        row = ProblemRow(name=name, definition_json="{}", workloads_jsonl="")
        session.add(row)
        session.flush()
        return row.id


def add_attempt(runtime: Runtime, problem_id: int, status: str, sol_score: float | None = None,
                minute: int = 0, kind: str = "evaluate") -> str:
    """A solution and one attempt of it, finished `minute` minutes after T0 unless still waiting."""
    digest, attempt_id = uuid.uuid4().hex * 2, str(uuid.uuid4())
    with runtime.db.session() as session:
        session.add(SolutionRow(hash=digest, problem_id=problem_id, name="s", author="m", language="pytorch"))
        session.flush()
        waiting = status in ("PENDING", "RUNNING")
        session.add(AttemptRow(id=attempt_id, problem_id=problem_id, solution_hash=digest, status=status, device="cpu",
                               sol_score=sol_score, kind=kind, created_at=T0 + timedelta(minutes=minute),
                               finished_at=None if waiting else T0 + timedelta(minutes=minute, seconds=30)))
    return attempt_id


def stored_file(runtime: Runtime, problem_id: int) -> tuple[NotesFileRow, str]:
    with runtime.db.session() as session:
        row = session.get(NotesFileRow, problem_id)
    return row, runtime.store.get(row.notes_hash).decode()


def history(runtime: Runtime, problem_id: int) -> list[NoteRow]:
    with runtime.db.session() as session:
        return list(session.scalars(select(NoteRow).where(NoteRow.problem_id == problem_id).order_by(NoteRow.id)))


def test_a_problem_without_notes_reads_as_empty(runtime):
    assert read_notes(runtime, add_problem(runtime)) == ""


def test_an_append_is_recorded_and_its_file_is_in_the_store(runtime):
    problem_id = add_problem(runtime)
    attempt_id = add_attempt(runtime, problem_id, "INCORRECT_NUMERICAL")

    told = append_note(runtime, problem_id, "gpt-oss-120b", "  Tried a warp-per-row reduction.\r\n"
                       "**Failed**: fp32 accumulation is needed for h=2048.\n", attempt_id=attempt_id)

    row, text = stored_file(runtime, problem_id)
    assert told == f"noted (1 entry, {len(text)} chars)"
    [entry] = history(runtime, problem_id)
    assert (entry.author, entry.attempt_id, entry.shown) == ("gpt-oss-120b", attempt_id, "FULL")
    assert entry.text == "Tried a warp-per-row reduction.\n**Failed**: fp32 accumulation is needed for h=2048."
    assert text == (f"# Notes: rmsnorm_h2048\n\n### #{entry.id} · {entry.created_at:%Y-%m-%d %H:%M} UTC · "
                    f"gpt-oss-120b · attempt {attempt_id[:8]}\n{entry.text}\n")
    assert (row.entries, row.chars, row.trimmed_at) == (1, len(text), None)
    assert read_notes(runtime, problem_id) == text


def test_the_file_is_the_history_rendered_after_every_append(runtime):
    problem_id = add_problem(runtime)
    hashes = set()
    for n in range(4):
        append_note(runtime, problem_id, f"model-{n % 2}", f"finding {n}: tile {16 << n} is {'faster' if n else 'slower'}")
        row, text = stored_file(runtime, problem_id)
        hashes.add(row.notes_hash)
        entries = history(runtime, problem_id)
        assert text == render_notes("rmsnorm_h2048", entries, len(entries))
        assert row.entries == n + 1
    assert len(hashes) == 4  # a new object each time, by its content
    assert text.index("finding 0") < text.index("finding 3")  # in the order written


@pytest.mark.parametrize(("text", "why"), [
    ("", "it is empty"), ("  \n\t \n", "it is empty"),
    ("x" * 401, "401 characters, the limit is 400"),
    ("bell \x07 here", "control characters"), ("nul \x00", "control characters"),
])
def test_a_bad_note_is_refused_with_a_reason_and_nothing_is_recorded(runtime, text, why):
    problem_id = add_problem(runtime)

    told = append_note(runtime, problem_id, "m", text)

    assert told.startswith("note refused: ") and why in told
    assert history(runtime, problem_id) == []
    assert read_notes(runtime, problem_id) == ""


def test_a_note_at_the_cap_is_taken_and_tabs_and_markdown_are_kept(runtime):
    problem_id = add_problem(runtime)
    text = "| tile | ms |\n|---|---|\n|\t64 | 0.5 |\n" + "y" * (400 - 37)
    assert len(text.strip()) == 400

    assert append_note(runtime, problem_id, "m", text).startswith("noted (1 entry, ")
    assert history(runtime, problem_id)[0].text == text


def test_an_attempt_of_another_problem_is_the_callers_mistake(runtime):
    problem_id, other = add_problem(runtime), add_problem(runtime, "other")
    attempt_id = add_attempt(runtime, other, "PASSED", 0.6)

    with pytest.raises(UserError, match="not an attempt of problem"):
        append_note(runtime, problem_id, "m", "finding", attempt_id=attempt_id)
    with pytest.raises(UserError, match="not an attempt of problem"):
        append_note(runtime, problem_id, "m", "finding", attempt_id="no-such-attempt")
    assert history(runtime, problem_id) == []


def test_over_the_budget_the_model_is_told_and_reads_the_newest_entries_that_fit(runtime):
    problem_id = add_problem(runtime)
    for n in range(8):
        told = append_note(runtime, problem_id, "m", f"entry {n}: " + "z" * 300)

    assert "over the 1500-char budget" in told
    row, text = stored_file(runtime, problem_id)
    assert row.chars == len(text) > 1500 and row.entries == 8  # the planner trims it, not the append
    read = read_notes(runtime, problem_id)
    assert len(read) <= 1500
    assert read.startswith("# Notes: rmsnorm_h2048\n") and "entry 7: " in read and "entry 0: " not in read
    shown = [n for n in range(8) if f"entry {n}: " in read]
    assert shown == list(range(8 - len(shown), 8)) and len(shown) >= 3
    assert f"_{8 - len(shown)} earlier entries are not shown" in read


def test_a_shortened_entry_shows_its_first_line(runtime):
    assert shorten("Vectorised loads: 1.4x.\nDetails follow.") == "Vectorised loads: 1.4x.…"
    assert shorten("one line") == "one line"
    assert shorten("w" * 300) == "w" * 159 + "…"
    row = NoteRow(id=5, author="m", text="first\nsecond", attempt_id=None, created_at=T0)
    assert render_entry(row, "SHORT") == "### #5 · 2026-01-01 12:00 UTC · m · shortened\nfirst…\n"


def test_a_file_gone_from_the_store_reads_as_it_was_rendered_from_the_db(runtime):
    problem_id = add_problem(runtime)
    for n in range(3):
        append_note(runtime, problem_id, "m", f"finding {n}\nwith detail")
    row, text = stored_file(runtime, problem_id)
    path = runtime.store.root / row.notes_hash[:2] / row.notes_hash[2:]
    path.unlink()

    assert read_notes(runtime, problem_id) == text
    append_note(runtime, problem_id, "m", "finding 3")  # and the next append writes the file again
    assert "finding 3" in stored_file(runtime, problem_id)[1]


def test_concurrent_appends_all_reach_the_file(runtime):
    problem_id = add_problem(runtime)
    runtime.db  # opened (and migrated) once, before the threads
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for n in range(4):
                append_note(runtime, problem_id, f"writer-{writer}", f"writer {writer} finding {n}")
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    row, text = stored_file(runtime, problem_id)
    assert row.entries == 12
    assert all(f"writer {w} finding {n}" in text for w in range(3) for n in range(4))


def test_notes_in_an_s3_store(tmp_path, s3_endpoint):
    bucket = f"notes-{uuid.uuid4().hex[:12]}"
    runtime = Runtime(Settings(home=tmp_path, store_url=f"s3://{bucket}", minio_endpoint=s3_endpoint,
                               minio_access_key="test", minio_secret_key="test"))
    try:
        problem_id = add_problem(runtime)
        append_note(runtime, problem_id, "m", "stored in S3")
        row, text = stored_file(runtime, problem_id)
        assert runtime.store.exists(row.notes_hash) and "stored in S3" in text
        assert read_notes(runtime, problem_id) == text
        with runtime.db.session() as session:
            assert session.scalar(select(func.count()).select_from(NoteRow)) == 1
    finally:
        runtime.db.dispose()
