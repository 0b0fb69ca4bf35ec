"""The bugs the fuzz tests found, one example each: before their fixes each raised something other
than a FormatError (a 500 on the web), or stored a problem that could not be read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzzcases import DEFINITION, TOKEN, WORKLOAD, jsonl
from sqlalchemy import func, select

from shared.db import ProblemRow
from shared.errors import FormatError
from shared.schema import Definition, load_problem, parse_model

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def folder(tmp_path: Path, definition: str, workloads: str | bytes) -> Path:
    (tmp_path / "definition.json").write_text(definition)
    if isinstance(workloads, bytes):
        (tmp_path / "workload.jsonl").write_bytes(workloads)
    else:
        (tmp_path / "workload.jsonl").write_text(workloads)
    return tmp_path


def with_axis(expression: str) -> str:
    definition = json.loads(json.dumps(DEFINITION))
    definition["axes"]["m"]["expression"] = expression
    return json.dumps(definition)


REFUSED = {  # name: (definition.json, workload.jsonl, what the one-line message says)
    "integer of 5000 digits": ('{"name": ' + "1" * 5000 + "}", jsonl([WORKLOAD]),
                               "definition.json: invalid JSON: Exceeds the limit"),
    "nesting deeper than the decoder": ("[" * 100_000, jsonl([WORKLOAD]), "definition.json: invalid JSON: nested too deeply"),
    "division by zero": (with_axis("n // 0"), jsonl([WORKLOAD]), "cannot be evaluated: integer division or modulo by zero"),
    "float overflow": (with_axis("10.0 ** 400"), jsonl([WORKLOAD]), "is too large"),
    "huge power": (with_axis("9 ** 9 ** 9"), jsonl([WORKLOAD]), "is too large"),  # was minutes of CPU
    "min of one number": (with_axis("min(n)"), jsonl([WORKLOAD]), "'int' object is not iterable"),
    "expression syntax": (with_axis("n +"), jsonl([WORKLOAD]), "$.axes: axis expression 'n +' is not an expression"),
    "negative axis": (with_axis("n - 100"), jsonl([WORKLOAD]), "axis `m` = 'n - 100' is negative (-84)"),
    "constraint nested too deeply": (json.dumps({**DEFINITION, "constraints": ["-" * 200_000 + "n"]}), jsonl([WORKLOAD]),
                                     "is not a Python expression: nested too deeply"),
    "reference nested too deeply": (json.dumps({**DEFINITION, "reference": "x = " + "-" * 200_000 + "1\n"}),
                                    jsonl([WORKLOAD]), "reference is not valid Python: nested too deeply"),
    "NaN tolerance": (json.dumps(DEFINITION), jsonl([{**WORKLOAD, "tolerance": {"max_atol": float("nan")}}]),
                      "$.tolerance.max_atol: Input should be a finite number"),
    "infinite scalar": (json.dumps(DEFINITION), jsonl([{**WORKLOAD, "inputs": {
        **WORKLOAD["inputs"], "eps": {"type": "scalar", "value": float("inf")}}}]), "$.inputs.eps.value.float"),
    "lone surrogate": (json.dumps({**DEFINITION, "description": "\ud800"}), jsonl([WORKLOAD]),
                       "$.description: a string holds a lone surrogate"),
    "workloads not UTF-8": (json.dumps(DEFINITION), b'{"uuid": "\xff"}\n', "workload.jsonl: not UTF-8 text (byte 10)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_a_format_error(tmp_path, case):
    definition, workloads, expected = REFUSED[case]
    with pytest.raises(FormatError) as error:
        load_problem(folder(tmp_path, definition, workloads), with_seeds=False)
    assert expected in str(error.value)
    assert len(str(error.value)) < 1000  # the offending text is cut, not echoed whole


def test_a_key_with_a_newline_stays_on_one_line():
    with pytest.raises(FormatError) as error:
        parse_model(Definition, {**DEFINITION, "a\nb": 1}, "d")
    assert str(error.value) == 'd: $["a\\nb"]: Extra inputs are not permitted'


def test_a_line_separator_inside_a_workload_string_is_not_a_line_break(tmp_path):
    workload = {**WORKLOAD, "uuid": "w\u2028one"}
    text = json.dumps(workload, ensure_ascii=False) + "\n"
    assert load_problem(folder(tmp_path, json.dumps(DEFINITION), text), with_seeds=False).workloads[0].uuid == "w\u2028one"


# --- the web ------------------------------------------------------------------------------------------------


def submit_api(web, definition: str, workloads: str):
    return web.client().post("/api/problems", json={"definition": definition, "workloads": workloads}, headers=BEARER)


def test_api_body_nested_too_deeply_is_a_400(web):
    response = web.client().post("/api/problems", data=b"[" * 200_000, content_type="application/json",
                                 headers=BEARER)
    assert response.status_code == 400 and '"definition"' in response.get_json()["error"]


def test_api_text_with_a_lone_surrogate_is_a_400(web):
    text = json.dumps(DEFINITION)
    response = submit_api(web, text + "\ud800", jsonl([WORKLOAD]))
    assert response.status_code == 400
    assert response.get_json()["fields"] == {
        "definition": [f"definition.json is not UTF-8 text: character {len(text)} is a lone surrogate"]}


@pytest.mark.parametrize(("change", "field", "expected"), [
    ({"description": "x\u0000y"}, "definition", "definition.json: $.description: must not contain a NUL character"),
    ({"op_type": "o" * 65}, "definition", "definition.json: $.op_type: longer than 64 characters"),
    ({"description": "\ud800"}, "definition", "$.description: a string holds a lone surrogate"),
    ({"uuid": "u" * 65}, "workloads", "workload.jsonl: workload 1: $.uuid: must be at most 64 characters"),
])
def test_what_the_db_cannot_hold_is_refused_before_it_is_written(web, change, field, expected):
    definition = {**DEFINITION, **{k: v for k, v in change.items() if k != "uuid"}}
    workload = {**WORKLOAD, **{k: v for k, v in change.items() if k == "uuid"}}
    response = submit_api(web, json.dumps(definition), jsonl([workload]))
    assert response.status_code == 400
    assert expected in response.get_json()["fields"][field][0]
    with web.db.session() as session:
        assert session.scalar(select(func.count()).select_from(ProblemRow)) == 1  # the seeded one only


@pytest.mark.parametrize("value", ["1" * 5000, str(2**70), "2147483648"])
def test_a_campaign_number_past_the_ids_is_a_400(web, value):
    response = web.client().get(f"/api/leaderboard?campaign={value}")
    assert response.status_code == 400 and "positive integer up to 2147483647" in response.get_json()["error"]


def test_controlling_a_campaign_number_past_the_ids_is_a_404(web):
    response = web.client().post(f"/api/campaigns/{2**70}/pause", headers=BEARER)
    assert response.status_code == 404 and response.get_json()["error"] == f"no campaign {2**70}"


@pytest.mark.parametrize("path", ["/api/problems/%00", "/problems/a%00b", "/api/attempts/%00"])
def test_a_nul_in_a_path_is_a_404(web, path):
    """PostgreSQL refuses NUL in a text parameter: the lookup must never be sent (it was a 500)."""
    assert web.client().get(path).status_code == 404
