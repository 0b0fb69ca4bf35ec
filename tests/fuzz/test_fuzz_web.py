"""Web fuzzing: form posts to /submit (valid CSRF and token, and invalid ones), bodies of
POST /api/problems, and the paths and query strings of the JSON API. Never a 5xx (the app runs with
TESTING, so an exception in a view fails the test itself); a refusal is a 4xx whose messages name
the field (the form's error list, the API's `fields`); a refused submission leaves the DB rows and
store objects as they were; an accepted one reads back from the DB as it was submitted."""

from __future__ import annotations

import html
import io
import json
import os
import re
import urllib.parse

from fuzzcases import (
    TOKEN,
    DEFINITION,
    FUZZ,
    WORKLOAD,
    count,
    damaged_text,
    dumps,
    json_values,
    jsonl,
    library_documents,
    mutated,
    texts,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from shared.db import AttemptRow, CampaignProblemRow, ProblemRow, SolutionRow
from shared.repository import problem_from_row

FILES = {"definition": "definition.json", "workloads": "workload.jsonl"}
LIBRARY = library_documents(limit=2)
ERRORS = re.compile(r'<ul class="errors" id="errors-(\w+)">(.*?)</ul>', re.S)
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def stored(web) -> tuple[int, ...]:
    """Rows of every table a submission writes, and the objects in the store."""
    with web.db.session() as session:
        rows = tuple(session.scalar(select(func.count()).select_from(table))
                     for table in (ProblemRow, SolutionRow, AttemptRow, CampaignProblemRow))
    return (*rows, sum(len(files) for _, _, files in os.walk(web.store.root)))


def form_errors(page: str) -> dict[str, list[str]]:
    return {field: [html.unescape(m) for m in re.findall(r"<li>(.*?)</li>", block, re.S)]
            for field, block in ERRORS.findall(page) if "<li>" in block}


def assert_names_its_file(fields: dict[str, list[str]]) -> None:
    """Each message sits under the field of the file it names (a file's path, then where in it)."""
    assert fields and set(fields) <= set(FILES), fields
    for field, messages in fields.items():
        assert messages and all(m.startswith(FILES[field]) for m in messages), fields
        assert all("kernelswarm-submit-" not in m for m in messages), messages  # no server paths


@st.composite
def submissions(draw: st.DrawFn) -> dict[str, str]:
    """The two texts of a problem, mutated in one of them (or neither), under a fresh name mostly."""
    definition, workloads = draw(st.sampled_from([(DEFINITION, [WORKLOAD]), *LIBRARY]))
    definition = {**definition, "name": f"fuzz_{draw(st.integers(0, 10**9))}"} if draw(st.integers(0, 5)) else \
        definition
    target = draw(st.sampled_from(["definition", "workloads", "neither", "neither"]))
    if target == "definition":
        definition = draw(mutated(definition))
    elif target == "workloads":
        workloads = draw(st.lists(st.sampled_from(workloads).flatmap(mutated), max_size=3))
    return {"definition": draw(damaged_text(dumps(definition))), "workloads": draw(damaged_text(jsonl(workloads)))}


def check_outcome(web, before: tuple[int, ...], status: int, fields: dict[str, list[str]], name: str | None) -> None:
    after = stored(web)
    event(f"submission {'accepted' if status in (200, 201) else 'refused'}")
    if status in (200, 201):
        assert [a - b for a, b in zip(after, before)] == [1, 1, 1, 1, 1], (before, after)
        check_stored(web, name)
        return
    assert status == 400, status
    assert_names_its_file(fields)
    assert after == before, (before, after)


def check_stored(web, name: str) -> None:
    """The problem as recorded loads again, and its page and JSON render."""
    with web.db.session() as session:
        problem = problem_from_row(session.scalars(select(ProblemRow).where(ProblemRow.name == name)).one())
    assert problem.name == name and problem.workloads
    client = web.client()
    assert client.get(f"/api/problems/{name}").status_code == 200
    assert client.get(f"/problems/{name}").status_code == 200


def form_client(web):
    """One client per test: its session's CSRF token, and logged in by its first post."""
    if not hasattr(web, "form"):
        web.form = web.client()
        page = web.form.get("/submit").get_data(as_text=True)
        web.csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    return web.form, web.csrf


def encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=700, **FUZZ)
@given(data=st.data())
def test_submit_form(web, data):
    count("web.submit_form")
    client, csrf = form_client(web)
    fields = data.draw(submissions())
    form = {"csrf_token": csrf, "token": TOKEN}
    for field, text in fields.items():
        how = data.draw(st.sampled_from(["text", "text", "text", "file", "file", "bad file"]))
        if how == "text":  # a browser sends text boxes as UTF-8: no lone surrogates
            form[field] = encoded(text).decode("utf-8", "replace")
        else:
            raw = encoded(text) if how == "file" else encoded(text)[:50] + b"\xc3\x28\xff"
            form[f"{field}_file"] = (io.BytesIO(raw), FILES[field])
    before = stored(web)
    response = client.post("/submit", data=form, content_type="multipart/form-data")
    page = response.get_data(as_text=True)
    fresh = re.search(r'name="csrf_token" value="([^"]+)"', page)
    if fresh:  # the first post logs the session in, which starts it afresh with a new CSRF token
        web.csrf = fresh.group(1)
    errors = form_errors(page)
    if response.status_code == 200:
        assert 'id="submitted"' in page and not errors
    name = re.search(r'href="/problems/([^"]+)"', page) if response.status_code == 200 else None
    check_outcome(web, before, response.status_code, errors, name and urllib.parse.unquote(name.group(1)))


@settings(max_examples=500, **FUZZ)
@given(data=st.data(), csrf=st.sampled_from(["valid", "missing", "other", "fuzz"]),
       token=st.sampled_from(["valid", "missing", "fuzz"]), logged_in=st.booleans())
def test_submit_form_csrf_and_token(web, data, csrf, token, logged_in):
    """Without the session's CSRF token nothing happens (400); without the token or a login, a
    401 beside the token field; either way nothing is stored."""
    count("web.submit_form_auth")
    client = web.client()
    page = client.get("/submit").get_data(as_text=True)
    valid = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    if logged_in:  # logging in starts a fresh session: a new CSRF token
        client.post("/login", data={"csrf_token": valid, "token": TOKEN})
        valid = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/submit").get_data(as_text=True)).group(1)
    form = {"definition": data.draw(st.one_of(texts, st.just(dumps(DEFINITION)))),
            "workloads": data.draw(st.one_of(texts, st.just(jsonl([WORKLOAD]))))}
    form["definition"] = dumps({**json.loads(dumps(DEFINITION)), "name": f"auth_{data.draw(st.integers(0, 10**9))}"}) \
        if form["definition"] == dumps(DEFINITION) else form["definition"]
    if csrf != "missing":
        form["csrf_token"] = {"valid": valid, "other": "x" * len(valid)}.get(csrf) or data.draw(texts)
    if token != "missing":
        form["token"] = TOKEN if token == "valid" else data.draw(texts.filter(lambda t: t != TOKEN))
    form = {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in form.items()}
    before = stored(web)
    response = client.post("/submit", data=form, content_type="multipart/form-data")
    status, page = response.status_code, response.get_data(as_text=True)
    if csrf != "valid" and form.get("csrf_token") != valid:
        assert status == 400 and "CSRF" in page
        assert stored(web) == before
    elif token != "valid" and not logged_in:
        assert status == 401 and form_errors(page).get("token") == ["wrong or missing token"]
        assert stored(web) == before
    else:
        errors = form_errors(page)
        name = json.loads(form["definition"]).get("name") if status == 200 else None
        check_outcome(web, before, status, errors, name)


# --- the API -----------------------------------------------------------------------------------------------


@st.composite
def api_bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    """(body, content type): a submission as the API takes it, any JSON value, or no JSON at all."""
    kind = draw(st.sampled_from(["submission", "submission", "submission", "json", "deep", "huge", "bytes"]))
    if kind == "submission":
        body = draw(submissions())
        if draw(st.integers(0, 4)) == 0:
            body = draw(mutated(body))
        return encoded(dumps(body)), "application/json"
    if kind == "json":
        return encoded(dumps(draw(json_values))), draw(st.sampled_from(["application/json", "text/plain"]))
    if kind == "deep":
        depth = draw(st.sampled_from([500, 5000, 200_000]))
        return b'{"definition": ' + b"[" * depth + b"]" * depth + b"}", "application/json"
    if kind == "huge":
        return b'{"definition": ' + b"7" * draw(st.sampled_from([4000, 5000])) + b', "workloads": ""}', \
            "application/json"
    return draw(st.binary(max_size=64)), draw(st.sampled_from(["application/json", "application/x-www-form-urlencoded"]))


@settings(max_examples=1200, **FUZZ)
@given(body=api_bodies(), auth=st.sampled_from(["bearer", "bearer", "bearer", "none", "wrong", "basic"]))
def test_api_submit(web, body, auth):
    count("web.api_submit")
    data, content_type = body
    headers = {"bearer": BEARER, "none": {}, "wrong": {"Authorization": "Bearer nope"},
               "basic": {"Authorization": f"Basic {TOKEN}"}}[auth]
    before = stored(web)
    response = web.client().post("/api/problems", data=data, content_type=content_type, headers=headers)
    status, answer = response.status_code, response.get_json()
    assert status in (201, 400, 401), status
    if auth != "bearer":
        assert status == 401 and stored(web) == before
        return
    if status == 201:
        check_outcome(web, before, status, {}, answer["name"])
        return
    assert answer["status"] == 400 and answer["error"]
    if "fields" in answer:
        check_outcome(web, before, status, answer["fields"], None)
    else:  # not {"definition": "...", "workloads": "..."}: the error says what to send
        assert '"definition"' in answer["error"] and '"workloads"' in answer["error"]
        assert stored(web) == before


def quoted(text: str) -> str:
    return urllib.parse.quote(encoded(text), safe="")


@settings(max_examples=1500, **FUZZ)
@given(data=st.data(), where=st.sampled_from(["leaderboard", "problem", "problem_page", "attempt", "attempt_file",
                                              "campaign"]))
def test_api_paths_and_queries(web, data, where):
    """What the API reads from a path or a query string: a JSON 4xx when it names nothing."""
    count(f"web.api.{where}")
    value = data.draw(st.one_of(texts, st.integers(-5, 10**30).map(str), st.just("1" * 5000),
                                st.just(str(web.campaign_id)), st.just("existing")))
    client = web.client()
    if where == "leaderboard":
        response = client.get(f"/api/leaderboard?campaign={quoted(value)}")
    elif where == "problem":
        response = client.get(f"/api/problems/{quoted(value)}")
    elif where == "problem_page":
        response = client.get(f"/problems/{quoted(value)}/{data.draw(st.sampled_from(['', 'solution.json']))}")
    elif where == "attempt":
        response = client.get(f"/api/attempts/{quoted(value)}")
    elif where == "attempt_file":
        response = client.get(f"/api/attempts/{quoted(value)}/{data.draw(st.sampled_from(['solution.json', 'traces.jsonl']))}")
    else:
        number = data.draw(st.one_of(st.integers(0, 2**80), st.just(web.campaign_id)))
        action = data.draw(st.one_of(st.sampled_from(["pause", "resume"]), texts))
        response = client.post(f"/api/campaigns/{number}/{quoted(action)}", headers=BEARER)
    status = response.status_code
    event(f"status {status}")
    assert status < 500, (status, response.get_data(as_text=True)[:300])
    if response.request.path.startswith("/api/") and status >= 400:
        answer = response.get_json()
        assert answer["status"] == status and answer["error"], answer
