"""The notes section of a problem's page and its JSON: the current file, the history of entries
with authors and times, everything a writer wrote escaped."""

from __future__ import annotations

import json
import re

import pytest
from notes_campaign import BUDGET_CHARS, SESSIONS, run_campaign

from services.planner.notes import trim_notes
from shared.db.models import NotesFileRow
from shared.notes import append_note, read_notes
from shared.runtime import Runtime
from shared.settings import Settings

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)> & "quotes"'


@pytest.fixture
def runtime(db, store, tmp_path):
    """A Runtime on the web test's DB and store, as a writer and the planner hold them."""
    running = Runtime(Settings(home=tmp_path, database_url=db.url, store_url=f"file://{store.root}",
                               notes_budget_chars=900))
    yield running
    running.db.dispose()


@pytest.fixture
def problem(seed) -> tuple[str, int]:
    return "rmsnorm_h4096", seed.problem("rmsnorm_h4096", op_type="rmsnorm")


def section(html: str) -> str:
    return re.search(r'<section id="notes">(.*?)</section>', html, re.S).group(1)


def test_a_problem_without_notes_says_so(client, problem):
    html = section(client.get(f"/problems/{problem[0]}").get_data(as_text=True))

    assert ">Notes<" in html and "No notes yet." in html
    assert 'id="notes-file"' not in html and 'id="note-history"' not in html


def test_the_page_shows_the_notes_file_and_who_wrote_what_when(client, problem, runtime, seed):
    name, problem_id = problem
    attempt_id = seed.attempt(problem_id, "PASSED", sol_score=0.7, speedup=1.9, minute=1)
    append_note(runtime, problem_id, "gpt-oss-120b", "Two passes over the row: memory-bound at 1.1x.")
    append_note(runtime, problem_id, "qwen3-coder", "One pass per row: 1.9x, SOL 0.70.", attempt_id=attempt_id)

    html = section(client.get(f"/problems/{name}").get_data(as_text=True))

    file_text = re.search(r'<pre class="notes" id="notes-file">(.*?)</pre>', html, re.S).group(1)
    assert file_text.startswith(f"# Notes: {name}\n")
    assert "gpt-oss-120b\nTwo passes over the row: memory-bound at 1.1x." in file_text
    assert f"qwen3-coder · attempt {attempt_id[:8]}\nOne pass per row" in file_text
    assert "2 of 2 entries are in the file" in html
    assert "history: the latest 2 of 2 entries" in html
    rows = re.findall(r'<tr id="note-(\d+)">(.*?)</tr>', html, re.S)
    assert [int(i) for i, _ in rows] == [2, 1]  # newest first
    newest = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)]
    assert newest[0] == "#2" and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", newest[1])
    assert newest[2:5] == ["qwen3-coder", attempt_id[:8], "in full"]
    assert f'href="/api/attempts/{attempt_id}"' in rows[0][1]
    assert 'href="/api/problems/rmsnorm_h4096/notes"' in html


def test_a_writers_html_is_escaped_in_the_file_and_the_history(client, problem, runtime):
    name, problem_id = problem
    append_note(runtime, problem_id, '<b>model</b>', HOSTILE)

    html = client.get(f"/problems/{name}").get_data(as_text=True)

    assert "<script>alert" not in html and "<img src=x" not in html and "<b>model</b>" not in html
    notes = section(html)
    assert notes.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt; "
                       "&amp; &#34;quotes&#34;") == 2  # the file and the history's text
    assert "&lt;b&gt;model&lt;/b&gt;" in notes


def test_trimmed_notes_say_what_each_entry_became(client, problem, runtime):
    name, problem_id = problem
    for n in range(6):
        append_note(runtime, problem_id, "m", f"finding {n}\n" + "detail " * 30)
    assert trim_notes(runtime, problem_id)

    html = section(client.get(f"/problems/{name}").get_data(as_text=True))

    shown = re.findall(r"<td>(in full|shortened|dropped)</td>", html)
    assert len(shown) == 6 and shown[0] == "in full" and shown[-1] == "dropped"
    kept = shown.count("in full") + shown.count("shortened")
    assert f"{kept} of 6 entries are in the file, trimmed " in html
    assert "earlier entr" in html and "not shown" in html


def test_the_json_has_every_entry_newest_first(client, problem, runtime):
    name, problem_id = problem
    for n in range(3):
        append_note(runtime, problem_id, f"model-{n}", f"finding {n}")

    body = json.loads(client.get(f"/api/problems/{name}/notes").get_data(as_text=True))

    assert body["problem"] == name and body["entries_total"] == 3 and body["entries_shown"] == 3
    assert [e["text"] for e in body["history"]] == ["finding 2", "finding 1", "finding 0"]
    assert [e["author"] for e in body["history"]] == ["model-2", "model-1", "model-0"]
    assert all(e["shown"] == "FULL" and e["attempt_id"] is None for e in body["history"])
    assert body["notes"].startswith(f"# Notes: {name}\n") and body["error"] is None
    assert client.get("/api/problems/no-such-problem/notes").status_code == 404


def test_a_notes_file_missing_from_the_store_is_said_and_the_history_still_shows(client, problem, runtime, store):
    name, problem_id = problem
    append_note(runtime, problem_id, "m", "kept in the DB")
    with runtime.db.session() as session:
        digest = session.get(NotesFileRow, problem_id).notes_hash
    (store.root / digest[:2] / digest[2:]).unlink()

    html = section(client.get(f"/problems/{name}").get_data(as_text=True))

    assert "The notes file cannot be read: object " in html and "not in the store" in html
    assert "kept in the DB" in html  # the history's text


def test_a_scripted_campaign_leaves_notes_that_the_next_writers_read(tmp_path):
    """The campaign of the screenshot, without a browser: each session's brief carries the notes of
    the sessions before it, each `note` is answered, the planner's trim leaves the file in budget."""
    campaign = run_campaign(tmp_path)
    try:
        requests = campaign.endpoint.requests
        briefs = [r["messages"][1]["content"] for r in requests if len(r["messages"]) == 2]  # a session's first
        assert len(briefs) == len(SESSIONS)
        for n, brief in enumerate(briefs):
            written = [s.note.splitlines()[0] for s in SESSIONS[:n]]
            assert all(first in brief for first in written), n
            assert SESSIONS[n].note.splitlines()[0] not in brief
        answers = [m["content"] for r in requests for m in r["messages"] if m["role"] == "tool"
                   and m["content"].startswith("noted (")]
        assert len(set(answers)) == len(SESSIONS)
        assert campaign.trimmed == [campaign.problem_id]
        notes = read_notes(campaign.runtime, campaign.problem_id)
        assert len(notes) <= BUDGET_CHARS and SESSIONS[-1].note.splitlines()[0] in notes
    finally:
        campaign.close()
